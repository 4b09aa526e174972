// FrameHub: gmuxd's frame-rate SLA controller (vGASA, Zhang et al., Sections 2-3) for the frame
// agents (libgmux-frame.so) of unmodified GL programs.
//
// The broker identifies an agent's connection like any other (its peer uid picks the tenant) and
// hands the socket here. One thread serves every agent:
//   - per agent, a core::FrameController (the PI of Eqs. 3-8): at each controlled frame the agent
//     reports its CPU time and gets the sleep before Present (Eq. 1 with the PI's command F);
//     with no finite reference the agent only reports, in batches, and never waits;
//   - per device group (agents whose GL_RENDERER is the same), a core::SlaPolicy (none, SA, FSA,
//     ESA) that every control period measures each agent's frame rate and device usage (its
//     Present execution times over the period) and sets the references.
// The agents' reports are the inputs, bounded by the daemon's clock (times move forward, at most
// 100 000 frames per second, no more Present or CPU time in total than has elapsed); a software
// renderer's usage is read from the kernel (/proc/PID/stat of the connection's peer), not taken
// from the agent. What an agent can still misstate is its own frames, and under `present` usage
// its own Present times, which ESA's common rate for its group uses (docs/policies.md). A malformed message, a bound broken, or an agent
// that does not read its replies ends that agent's connection only.
//
// Thread-safe: Adopt, Status and Op may be called from any thread.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/ids.h"
#include "common/status.h"
#include "daemon/config.h"

namespace gmux::daemon {

class FrameHub {
 public:
  struct AgentInfo {
    TenantId tenant = 0;
    std::string tenant_name;
    uid_t uid = 0;
    pid_t pid = 0;
    std::string program;
    std::string renderer;
    double fps_target = 0;  // the tenant's configured target; 0: the criterion
  };

  // kInvalidArgument for options the controller or a policy refuses.
  // `tenants`: the config's tenant names (targets may be set for them before they connect).
  static Result<std::unique_ptr<FrameHub>> Create(const FramesOptions& options,
                                                  uint32_t max_per_uid,
                                                  const std::vector<std::string>& tenants = {});
  ~FrameHub();

  Status Start();
  void Stop();

  // Takes ownership of `fd` (a connected agent whose hello was answered). An error (and `fd`
  // closed) when max_agents or the per-uid limit is reached.
  Status Adopt(int fd, const AgentInfo& info);
  // Whether Adopt would take one more agent of `uid` now (the broker asks before its hello reply,
  // so a refused agent is told why).
  Status CanAdopt(uid_t uid) const;

  size_t AgentCount() const;
  // The tenants' configured FPS targets changed (SIGHUP, `gmux tenant`): name -> target (0: the
  // criterion). Connected agents follow at the next control period; run-time overrides from
  // `gmux frames target` stay.
  void SetTenantTargets(const std::map<std::string, double>& targets);
  // JSON: the policies and every agent (only `tenant`'s when given).
  std::string StatusJson(std::optional<TenantId> tenant) const;
  // The same as a JSON value (caller holds mu_).
  std::string StatusJsonLocked(std::optional<TenantId> tenant) const;
  // `gmux frames`: "list", "policy" (admins), "target" (admins). JSON answer; {"error": ...}.
  std::string Op(const std::string& action, const std::string& policy,
                 const std::string& renderer, const std::string& tenant, double fps, bool admin,
                 std::optional<TenantId> caller);

 private:
  struct Agent;
  struct Group;
  explicit FrameHub(const FramesOptions& options, uint32_t max_per_uid);
  void Loop();
  void Wake();  // the loop looks again (new agent, changed policy, stop)
  // Reads what `a` sent; false: drop it.
  bool OnReadable(Agent& a);
  bool OnMessage(Agent& a, const std::vector<uint8_t>& frame);
  bool Send(Agent& a, uint64_t seq, uint64_t sleep_ns, bool controlled);
  void Tick();
  Group& GroupFor(const std::string& renderer);
  Status CanAdoptLocked(uid_t uid) const;
  std::string PolicyFor(const std::string& renderer) const;
  double TargetOf(const Agent& a) const;
  void Drop(Agent& a, const std::string& why);

  FramesOptions options_;
  uint32_t max_per_uid_;
  int wake_pipe_[2] = {-1, -1};
  std::thread thread_;
  std::atomic<bool> stopping_{false};

  mutable std::mutex mu_;  // guards everything below
  std::vector<std::unique_ptr<Agent>> agents_;
  std::map<std::string, std::unique_ptr<Group>> groups_;   // by renderer
  // Run-time policy overrides (gmux frames policy), newest first, before the config's.
  std::vector<std::pair<std::string, std::string>> policy_overrides_;
  std::map<std::string, double> target_overrides_;  // by tenant name (known tenants only)
  std::set<std::string> known_tenants_;
  bool dirty_ = false;  // an Op changed references: re-run the policies now
  uint64_t next_id_ = 1;
  uint64_t dropped_ = 0;
  std::chrono::steady_clock::time_point period_start_;
};

}  // namespace gmux::daemon
