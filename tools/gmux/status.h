// `gmux status`: asks a running gmuxd for its scheduler state over the daemon's socket (a Stats
// request; the reply's `scheduler` field is JSON, see docs/operations.md).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace gmux::cli {

// The daemon's scheduler JSON. `socket` empty: $GMUX_SOCKET, else the default socket.
// `gmux lease`'s request (LeaseOp in gmux.capnp).
struct LeaseArgs {
  std::string action, tenant;
  uint64_t id = 0;
  double for_s = 0;
  int device = -1;
};

// `gmux frames`'s request (FramesOp in gmux.capnp).
struct FramesArgs {
  std::string action, policy, renderer, tenant;
  double fps = 0;
};

// `gmux usage` and `gmux tenant`'s request (AdminOp in gmux.capnp): a command and its JSON.
struct AdminArgs {
  std::string command, args;
};

// The socket a control request goes to: `socket`, else $GMUX_SOCKET, else the default.
std::string ControlSocketPath(const std::string& socket);

// One request on a control connection to gmuxd at `socket` (empty: $GMUX_SOCKET or the default):
// Stats (the scheduler's JSON, with the frame agents under "frames") without `lease` or
// `frames`, else the lease or frames operation's JSON answer.
Result<std::string> ControlRequest(const std::string& socket, const char* client,
                                   const std::optional<LeaseArgs>& lease,
                                   const std::optional<FramesArgs>& frames = std::nullopt,
                                   const std::optional<AdminArgs>& admin = std::nullopt);

// ControlRequest's answer as a JSON object, or nullopt with `error` set: the request failed,
// the answer is not a JSON object, or it is one with an "error" member.
std::optional<nlohmann::json> ControlJson(const std::string& socket, const char* client,
                                          const std::optional<LeaseArgs>& lease,
                                          const std::optional<AdminArgs>& admin,
                                          std::string& error);

// `gmux frames list|policy|target`: prints the answer (a table, or JSON); the exit status.
int RunFrames(const std::string& socket, const FramesArgs& args, bool json);
// The frame agents' table of `gmux status` and `gmux frames list` (`frames`: their JSON).
void PrintFrames(const nlohmann::json& frames);
Result<std::string> QuerySchedulerStatus(const std::string& socket);

// `gmux status [--json]`: prints a table (or the JSON); returns the exit status.
int RunStatus(const std::string& socket, bool json);

}  // namespace gmux::cli
