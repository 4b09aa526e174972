// Scheduler: the daemon's one scheduling thread. It owns one core::Policy per device (each
// tenant is one V-channel of it), the tenants' staging lists, and the count of commands in
// flight per device.
//
// Flow: a session Submit()s a Command. It waits in its tenant's staging list while it cannot
// yet be handed to a device: while it depends on a user event not yet set, on a command still
// staged, or on a command of another device not yet dispatched. Then it is submitted to its
// device's policy as a CommandBlock. Whenever a device has fewer than `inflight_per_device`
// commands in flight, the scheduler asks the policy to Pick() and hands the chosen command to
// that device's Executor; the executor's completion goes back to the policy with the measured
// device time. Every public method is thread-safe (it posts to the scheduler thread).
//
// Reordering happens only where the policy puts it: across tenants. A tenant's commands reach
// its V-channel in the order the session decoded them, a command enters the policy only once
// every event it depends on (wait list, queue order, barriers) is no longer staged, and a policy
// never reorders inside one tenant (policy.h). A splittable launch may be dispatched as several
// chunks (Dispatch::range); it stays in `queued` until its last chunk is dispatched, counts once
// in Outstanding(), and each chunk's measured START->END goes to Policy::Complete().
//
// Monitoring (Kang & Yu Section 4.2), event-based: per tenant, work-items submitted (total),
// completed (processed) and not yet completed (remaining), plus the number of active tenants
// (work pending or in flight); also commands, dispatches and device time. Status() returns it.
#pragma once

#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/policy.h"
#include "daemon/command.h"
#include "daemon/executor.h"
#include "daemon/mailbox.h"

namespace gmux::daemon {

class Scheduler {
 public:
  // One policy per device, built from `spec` (spec.device is filled per device from `devices`).
  // `per_device` replaces `spec` (name and params) for the devices it names.
  static Result<std::unique_ptr<Scheduler>> Create(
      const core::PolicySpec& spec, const std::vector<core::DeviceInfo>& devices,
      uint32_t inflight_per_device,
      const std::map<uint32_t, core::PolicySpec>& per_device = {});
  ~Scheduler();

  void Start();
  // Stops the thread and the executors (after what is in flight finishes).
  void Stop();

  void AddTenant(TenantId tenant, double weight, const std::string& name = "");
  void RemoveTenant(TenantId tenant);  // drops its staged and queued commands
  void Submit(std::shared_ptr<Command> cmd);
  void Submit(std::vector<std::shared_ptr<Command>> cmds);  // in order, one hand-over
  void Rescan();  // a user event was set: staged commands may now be released

  // Commands submitted and not yet completed (all tenants).
  uint64_t Outstanding() const { return outstanding_.load(); }

  // A JSON object describing the devices (policy, commands in flight), every tenant's counters
  // and the scheduler thread's own cost per dispatch (docs/operations.md, "gmux status").
  // Waits for the scheduler thread (at most ~2 s; "{}" when it does not answer).
  std::string Status();

 private:
  Scheduler() = default;
  struct DeviceState {
    std::unique_ptr<core::Policy> policy;
    uint64_t dispatches = 0;
    std::unique_ptr<Executor> executor;
    uint32_t inflight = 0;
    std::unordered_map<BlockId, std::shared_ptr<Command>> queued;  // in the policy
  };

  void Loop();
  TimePoint Now() const;
  void Release();        // staging -> policies
  void Pump();           // policies -> executors
  bool Blocked(const Command& c) const;
  void OnComplete(uint32_t device, const std::vector<core::Completion>& done);
  void Accept(std::shared_ptr<Command> c);

  uint32_t inflight_limit_ = 4;
  Mailbox mailbox_;
  std::thread thread_;
  std::chrono::steady_clock::time_point epoch_ = std::chrono::steady_clock::now();
  std::atomic<uint64_t> outstanding_{0};
  std::atomic<bool> stop_{false};
  // Scheduler-thread state.
  std::vector<DeviceState> devices_;
  std::map<TenantId, std::deque<std::shared_ptr<Command>>> staging_;
  struct TenantStats {
    std::string name;
    double weight = 1;
    uint64_t commands = 0;            // released to a policy
    uint64_t completed = 0;           // commands whose last dispatch completed
    uint64_t dispatches = 0;          // chunks and whole commands
    uint64_t total_items = 0;         // kernel work-items submitted
    uint64_t processed_items = 0;     // kernel work-items completed
    uint64_t inflight = 0;            // dispatches on a device now
    double device_time_s = 0;         // sum of measured START->END
  };
  std::map<TenantId, TenantStats> tenants_;
  std::string StatusNow() const;
  // Cost of the scheduler thread itself: its CPU time handling submissions and completions.
  uint64_t busy_ns_ = 0;
  uint64_t dispatches_ = 0;
  BlockId next_block_ = 1;
};

}  // namespace gmux::daemon
