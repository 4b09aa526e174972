// gmuxd's log: spdlog to stderr, one line per event an operator cares about (session start
// and end with tenant and pid, worker deaths, watchdog kills, leases, config reloads, tenant
// changes, refused connections). Under systemd, stderr goes to the journal.
#pragma once

#include <string>
#include <string_view>

namespace gmux::daemon {

// Makes stderr the default logger's sink, named `program`, at `level` (debug, info, warn,
// error; anything else: info). Safe to call again (a reload changes the level).
void InitLog(std::string_view program, const std::string& level);

}  // namespace gmux::daemon
