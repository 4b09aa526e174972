// `gmux status`: asks a running gmuxd for its scheduler state over the daemon's socket (a Stats
// request; the reply's `scheduler` field is JSON, see docs/operations.md).
#pragma once

#include <string>

#include "common/status.h"

namespace gmux::cli {

// The daemon's scheduler JSON. `socket` empty: $GMUX_SOCKET, else the default socket.
Result<std::string> QuerySchedulerStatus(const std::string& socket);

// `gmux status [--json]`: prints a table (or the JSON); returns the exit status.
int RunStatus(const std::string& socket, bool json);

}  // namespace gmux::cli
