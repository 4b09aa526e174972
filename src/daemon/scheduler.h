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
#pragma once

#include <atomic>
#include <deque>
#include <map>
#include <memory>
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
  static Result<std::unique_ptr<Scheduler>> Create(const core::PolicySpec& spec,
                                                   const std::vector<core::DeviceInfo>& devices,
                                                   uint32_t inflight_per_device);
  ~Scheduler();

  void Start();
  // Stops the thread and the executors (after what is in flight finishes).
  void Stop();

  void AddTenant(TenantId tenant, double weight);
  void RemoveTenant(TenantId tenant);  // drops its staged and queued commands
  void Submit(std::shared_ptr<Command> cmd);
  void Submit(std::vector<std::shared_ptr<Command>> cmds);  // in order, one hand-over
  void Rescan();  // a user event was set: staged commands may now be released

  // Commands submitted and not yet completed (all tenants).
  uint64_t Outstanding() const { return outstanding_.load(); }

 private:
  Scheduler() = default;
  struct DeviceState {
    std::unique_ptr<core::Policy> policy;
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
  std::map<TenantId, bool> tenants_;
  BlockId next_block_ = 1;
};

}  // namespace gmux::daemon
