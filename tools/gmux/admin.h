// `gmux usage` (the usage ledger) and `gmux tenant` (tenants at run time); docs/operations.md,
// "Usage ledger" and "Tenants at run time".
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace gmux::cli {

struct UsageOptions {
  std::string socket;  // empty: $GMUX_SOCKET or the default
  std::string ledger;  // read this SQLite file directly instead of asking gmuxd
  std::string since, until, tenant;
  bool rows = false;   // every booked interval instead of sums per tenant and device
  bool json = false, csv = false;
};

// "2026-11-26", "2026-11-26 13:00[:00]" (local time), "@UNIX", "now", or a duration back from
// now ("90m", "2h", "1d"; see ParseDuration), in Unix seconds; nullopt when it is none of these.
std::optional<double> ParseTimePoint(const std::string& text);

int RunUsage(const UsageOptions& o);

struct TenantOptions {
  std::string socket;
  std::string name;
  std::optional<double> weight, fps_target;
  std::vector<int64_t> uids;
  std::optional<int64_t> slurm_job;
  std::vector<std::string> tokens;
  std::string memory_quota;         // bytes, or "4GiB" etc. as in the config
  std::vector<std::string> limits;  // KEY=VALUE, any [limits] key
  bool json = false;
};

// action: list, add, set, remove.
int RunTenant(const std::string& action, const TenantOptions& o);

}  // namespace gmux::cli

namespace gmux::cli {

// `gmux token hash`: the token read from stdin (one line) as the config stores it hashed.
// `gmux token new`: a fresh random token and its hashed form.
int RunTokenHash(bool json);
int RunTokenNew(bool json);

}  // namespace gmux::cli
