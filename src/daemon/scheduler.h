// Scheduler: the broker's one scheduling thread. It owns one core::Policy per device (each
// tenant is one V-channel of it), every worker's control channel, the count of dispatches in
// flight per device, and the watchdog.
//
// Flow: a worker sends ctl::Ready for each command whose dependencies allow it to run (the
// worker holds the rest; worker_queue.h). The scheduler submits it to its device's policy as a
// CommandBlock of the worker's tenant. Whenever a device has fewer than `inflight_per_device`
// dispatches in flight, it asks the policy to Pick() and sends the chosen command (or chunk of
// it) to its worker as ctl::Release; the worker's ctl::Done goes back to the policy with the
// measured device time (capped by the wall time the broker saw, so a worker cannot claim more
// than it could have used; see docs/policies.md).
//
// Express dispatch (docs/policies.md): when a worker sends work for a device no other tenant has
// used for kExpressQuiet, and the device's policy says a lone tenant is never held back or split
// (Policy::ExpressOk), the scheduler grants that worker express on the device (ctl::kExpress):
// the worker starts its commands itself and reports them as express Ready records, which the
// scheduler accounts with Policy::Express() and tracks in flight like any release. Where the
// policy allows it (Policy::ExpressSharedOk), the tenant's other sessions' workers join the
// grant as they send work, each with an equal share of the device's in-flight slots, and
// where it keeps no state between tenants (Policy::ExpressAcrossTenantsOk: fifo, rr), other
// tenants' workers join too; at most kMaxExpressSessions active workers share. Other work for
// that device revokes the grant; it is held here, not given to the policy, until every holder
// confirms (ctl::kExpressEnd), so the policy never sees work it must order while someone
// bypasses Pick(). A holder that does not confirm within its command time limit is dropped
// like a watchdog case.
//
// The thread polls every worker's channel and its own mailbox's eventfd, so a release and a
// completion each cost one wake-up. A worker that closes its channel, sends anything malformed,
// or holds a device past its tenant's command time limit (the watchdog) is dropped: its blocks
// leave the policies, its dispatches stop counting, and `on_worker_gone` tells the broker (which
// kills and reaps the process).
//
// Monitoring (Kang & Yu Section 4.2), event-based: per tenant, work-items submitted (total),
// completed (processed) and not yet completed (remaining), plus the number of active tenants
// (work pending or in flight); also commands, dispatches, device time and worker deaths.
// Status() returns it. Every public method is thread-safe (it posts to the scheduler thread).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/policy.h"
#include "core/slot_allocator.h"
#include "core/lease_pool.h"
#include "daemon/config.h"
#include "daemon/control.h"
#include "daemon/mailbox.h"

namespace gmux::daemon {

class Scheduler {
 public:
  // Why a worker was dropped (for the broker's log and `gmux status`).
  enum class GoneReason { kClosed, kMalformed, kWatchdog, kStopped };
  using WorkerGone = std::function<void(uint64_t session, pid_t pid, GoneReason why)>;

  // One policy per device, built from `spec` (spec.device is filled per device from `devices`).
  // `per_device` replaces `spec` (name and params) for the devices it names.
  static Result<std::unique_ptr<Scheduler>> Create(
      const core::PolicySpec& spec, const std::vector<core::DeviceInfo>& devices,
      uint32_t inflight_per_device,
      const std::map<uint32_t, core::PolicySpec>& per_device = {}, bool express = true);
  ~Scheduler();

  void Start(WorkerGone on_worker_gone = nullptr);
  void Stop();

  // `command_time_limit` 0: no watchdog for this tenant.
  void AddTenant(TenantId tenant, double weight, const std::string& name = "",
                 Duration command_time_limit = Duration(0));
  void RemoveTenant(TenantId tenant);  // drops its queued blocks
  // A tenant's weight and command time limit change at run time; its queued work stays.
  void SetTenant(TenantId tenant, double weight, Duration command_time_limit);
  // A worker serving session `session` of `tenant` (process `pid`, 0 for in-process tests) on
  // the control channel `fd`, which the scheduler owns and closes from now on.
  void AddWorker(uint64_t session, TenantId tenant, int fd, pid_t pid);
  // Counts a worker death for `gmux status` (the broker learns the cause when it reaps).
  void CountWorkerDeath(TenantId tenant, bool watchdog);
  // Sends a worker its session's new share of the tenant's limits (ctl::kLimits).
  void SetLimits(uint64_t session, const ctl::Limits& limits);
  // Device memory (control.h, kMemReserve): the bytes of each device gmuxd manages (0: no
  // limit) and a tenant's quota per device (0: none). Reservations are answered against both.
  void SetMemoryCapacity(uint32_t device, uint64_t bytes);
  void SetMemoryQuota(TenantId tenant, uint64_t bytes);
  // Oversubscription (DymGPU, docs/policies.md "Device memory"): the device's managed capacity
  // is cut into slots of `slot_bytes`; tenants may
  // together reserve more than the capacity (each alone at most all of it), and before a
  // tenant's command is released the tenants whose slot windows overlap its own are moved off
  // the device (ctl::kEvict) once nothing of theirs runs there. `options.slots` is the managed
  // capacity in slots. `swap_batch` > 0: a tenant whose data was brought in keeps the device
  // for swap_batch × what that cost (its commands picked out of turn, paid for from its later
  // turns), so that moves are amortised (0: none). kInvalidArgument for options the allocator
  // refuses or a negative swap_batch.
  gmux::Status EnableSlots(uint32_t device, const core::SlotAllocatorOptions& options,
                           uint64_t slot_bytes, double swap_batch = 0);

  // The device pool (BioCloud, docs/operations.md "Device pool"; scheduler_pool.cc): the
  // backend devices in `devices` are lent whole, one tenant at a time, by a core::LeasePool
  // (implicit leases asked by workers with ctl::kLeaseAsk, explicit ones by `gmux lease`),
  // reclaimed when idle, with the attach and detach hooks of `options`. `names` are the backend
  // devices' names (by index, for the hooks). Call before Start(). kInvalidArgument for options
  // the pool refuses.
  gmux::Status EnablePool(const std::vector<uint32_t>& devices, const PoolOptions& options,
                          const std::vector<std::string>& names);
  // `gmux lease` (control connections; JSON answers, {"error": ...} on refusal). Thread-safe.
  // Acquire: an explicit, pinned lease for `tenant` (named `name`), for `for_s` seconds (0: until
  // released), on backend device `device` (-1: any of the pool); the answer names the lease.
  // Release: the lease `id` (a waiting request is cancelled); only its tenant's callers or an
  // admin. List: the pool's devices, leases and waiters (only `only`'s when given) and its
  // figures.
  std::string LeaseAcquire(TenantId tenant, const std::string& name, double for_s,
                           int device = -1);
  std::string LeaseRelease(TenantId caller, bool admin, uint64_t id);
  std::string LeaseList(std::optional<TenantId> only);

  // Commands submitted and not yet completed (all tenants).
  uint64_t Outstanding() const { return outstanding_.load(); }

  // Cumulative usage of one tenant on one device since gmuxd started: what the ledger books
  // (ledger.h). Memory and lease time are integrated up to the moment of the call.
  struct UsageCounters {
    double device_s = 0;       // measured START->END of its dispatches (and its swap-ins)
    uint64_t commands = 0;     // commands submitted for the device
    uint64_t bytes = 0;        // bytes of its transfer commands (reads, writes, copies, fills)
    double memory_byte_s = 0;  // integral of the device memory it reserved, byte-seconds
    double lease_s = 0;        // time it held the device whole (pool leases)
  };
  struct UsageRow {
    std::string tenant;
    uint32_t device = 0;
    UsageCounters counters;
  };
  // Every tenant x device with anything counted. Waits for the scheduler thread (at most ~2 s;
  // nullopt then, or when stopped).
  std::optional<std::vector<UsageRow>> Usage();

  // A JSON object describing the devices (policy, dispatches in flight), the tenants' counters
  // (only `only`'s when given) and the scheduler thread's own cost per dispatch
  // (docs/operations.md, "gmux status"). Waits for the scheduler thread (at most ~2 s).
  std::string Status(std::optional<TenantId> only = std::nullopt);

 private:
  Scheduler() = default;
  struct Worker {
    uint64_t evict_epoch = 0;  // the last kEvict sent
    uint64_t session = 0;
    TenantId tenant = 0;
    int fd = -1;
    pid_t pid = 0;
    std::unordered_map<uint64_t, BlockId> blocks;  // the worker's command id -> our block
    std::vector<ctl::Release> out;                 // releases not yet sent
    std::vector<ctl::Express> express_out;         // grants and revokes not yet sent
    std::vector<uint64_t> queued_on;               // per device: its blocks in the policy
    std::vector<TimePoint> active_on;              // per device: its last Ready or Done there
    std::vector<uint64_t> mem_held;                // per device: memory reserved, not given back
    std::optional<TimePoint> stopped_since;        // first seen stopped while others waited
    uint64_t pool_contexts = 0;                    // its session's live contexts on the pool
    std::vector<ctl::LeaseAnswer> lease_out;       // pool answers not yet sent
    std::vector<ctl::LeaseLost> lost_out;          // ended leases not yet told
    bool dead = false;
  };
  struct Queued {
    Worker* worker = nullptr;
    uint64_t cmd = 0;
    uint32_t device = 0;
    uint64_t work_items = 0;
    bool unsplit_kernel = false;  // a kernel the worker could not offer for splitting
  };
  struct Flight {
    Worker* worker = nullptr;
    uint64_t cmd = 0;
    BlockId block = 0;
    TenantId tenant = 0;
    core::WorkRange range;
    bool last = true;
    TimePoint released{};
    bool unsplit_kernel = false;
  };
  // Data moved off a device and back (oversubscription), per device and per tenant.
  struct SwapCounters {
    uint64_t evictions = 0, restores = 0, bytes_out = 0, bytes_in = 0;
    uint64_t on_demand_restores = 0;  // single allocations brought back outside a command
    double swap_out_s = 0, swap_in_s = 0;
    void Add(const ctl::Swapped& r);  // one worker's report (a move of nothing counts nothing)
  };
  // A release held until the tenants in the way are moved off the device.
  struct Switch {
    core::Dispatch pick;
    Queued q;
    std::vector<TenantId> victims;
    std::unordered_map<uint64_t, uint64_t> waiting;  // session -> kEvict epoch not answered yet
    bool asked = false;                               // kEvict sent
    TimePoint since{};
    TimePoint asked_at{};                             // when kEvict was sent
    std::vector<TenantId> came_back;  // victims whose data was back only by on-demand restores
  };
  struct ExpressHolder {
    Worker* worker = nullptr;
    uint32_t slots = 0;  // the share it was last sent
    TimePoint since{};   // granted (nothing it starts under the grant started earlier)
  };
  struct DeviceState {
    std::unique_ptr<core::Policy> policy;
    uint64_t dispatches = 0;
    double busy_s = 0;  // device time of the dispatches completed here (every tenant's)
    std::unordered_map<BlockId, Queued> queued;  // in the policy
    std::deque<Flight> inflight;                 // in release order
    TimePoint head_since{};                      // when the oldest dispatch became the oldest
    // Express: the workers holding the grant (or being revoked; of one tenant unless the
    // policy allows several), each with the slots it was last sent; the grant's epoch, when
    // the revoke was sent, and other workers' Ready records held until every holder confirms.
    std::vector<ExpressHolder> express;
    uint64_t express_epoch = 0;
    bool revoking = false;
    TimePoint revoke_since{};
    std::vector<std::pair<Worker*, ctl::Ready>> held;
    std::unordered_map<TenantId, TimePoint> last_active;  // last Ready or Done per tenant
    uint64_t mem_capacity = 0;  // 0: no limit
    uint64_t mem_used = 0;      // reserved by every tenant
    // Oversubscription: the slot layout, each placed tenant's slot count, the tenants whose data
    // is on the device (as far as the broker knows), a release waiting for evictions, and what
    // moved.
    std::optional<core::SlotAllocator> slots;
    uint64_t slot_bytes = 0;
    std::unordered_map<TenantId, int32_t> slot_need;
    std::unordered_map<TenantId, bool> resident;
    std::optional<Switch> switching;
    uint64_t switches_waited = 0;  // releases that waited for evictions
    SwapCounters swaps;
    // Swap batching: the tenant whose data was just brought in keeps the device until `until`
    // (swap_batch × what bringing it in cost), waiting through its think gaps up to `hold`.
    struct Batch {
      TenantId tenant = 0;
      TimePoint start{}, until{};
      Duration cost{0};  // eviction wait + swap-in time measured for this switch
    };
    std::optional<Batch> batch;
    TimePoint hold_until{};     // the device is held idle for the batch's tenant until then
    uint64_t batches = 0;       // batches started
    uint64_t batched = 0;       // dispatches picked out of turn for a batch
    Duration batch_held{0};     // device time held idle for batches' tenants (upper bound)
    Duration last_switch_wait{0};
  };

  // The device pool (scheduler_pool.cc).
  struct PoolAsk {
    Worker* worker = nullptr;
    uint64_t seq = 0;
    TimePoint deadline{};
  };
  struct PoolTenant {
    uint64_t lease = 0;                // the current request's or lease's id (0: none)
    bool pinned = false;
    std::optional<TimePoint> expires;  // an explicit lease's --for
    uint32_t device = UINT32_MAX;      // pool index while attaching or held
    bool usable = false;               // the attach hook ran: its workers may use the device
    TimePoint requested{};
    std::vector<PoolAsk> asks;         // workers waiting for the device
    std::optional<TimePoint> reclaimed_at;  // its last lease was reclaimed when idle
    uint64_t grants = 0, reclaims = 0, timeouts = 0, hook_failures = 0;
    double grant_latency_s = 0;        // Σ request -> usable over grants
    double reacquire_s = 0;            // Σ reclaim -> usable again, over re-acquires
    double reacquire_latency_s = 0;    // Σ the re-acquire's ask -> usable
    uint64_t reacquires = 0;
  };
  struct PoolDevice {
    uint32_t backend = 0;              // the backend device index
    TenantId holder = kNoTenant;       // attaching or leased to
    TimePoint held_since{};            // when `holder` got it (lease time for the ledger)
    // The previous holder's workers still moving their data off (session -> kLeaseLost epoch);
    // the next holder gets the device once they are done.
    std::unordered_map<uint64_t, uint64_t> draining;
    TimePoint drain_since{};
    TenantId drained_from = kNoTenant;
    std::string drain_reason;
    bool attach_waiting = false;       // a grant waits for the drain or the detach hook
    bool hook_running = false;
    uint64_t hook_serial = 0;          // the attach/detach hook run that may answer
  };
  struct Pool {
    std::optional<core::LeasePool> lease;
    PoolOptions options;
    std::vector<PoolDevice> devices;
    std::vector<std::string> names;    // backend device names, by backend index
    std::map<TenantId, PoolTenant> tenants;
    uint64_t next_lease = 1;
    double attach_hook_s = 0, detach_hook_s = 0;  // the pool's attach cost, measured
    uint64_t attach_hooks = 0, detach_hooks = 0, hook_failures = 0;
    struct Hook {
      std::thread thread;
      std::shared_ptr<std::atomic<bool>> finished;
    };
    std::vector<Hook> hooks;  // hook runs (joined once finished, and at Stop())
  };
  bool PoolDeviceIndex(uint32_t backend, uint32_t& index) const;
  PoolTenant& PoolTenantOf(TenantId tenant);
  void OnLeaseAsk(Worker& w, const std::vector<ctl::LeaseAsk>& asks);
  void OnPoolContexts(Worker& w, uint64_t count);
  // Carries out the LeasePool's decisions (attach, detach) made since the last call.
  void PoolEvents();
  void PoolAttach(uint32_t index);            // the drain is over: run the attach hook or grant
  void PoolGranted(uint32_t index);           // the device is usable by its holder
  void PoolRefuse(TenantId tenant, ctl::LeaseVerdict why);
  void PoolDrained(uint32_t index);           // the previous holder's data is off
  void PoolTick();                            // timers: waits, --for, checker, drains
  std::optional<TimePoint> PoolNextTimer() const;
  void PoolWorkerGone(Worker& w);
  void PoolSwapped(Worker& w, const ctl::Swapped& r);
  bool PoolReadyAllowed(const Worker& w, uint32_t device) const;
  void PoolNoteActivity(TenantId tenant);
  // Runs `command` (sh -c) with `env` on a thread of its own, bounded by the hook timeout; `done`
  // runs on the scheduler thread with whether it succeeded and what it printed on failure.
  void RunHook(const std::string& command, std::vector<std::string> env,
               std::function<void(bool ok, double secs, const std::string& why)> done);
  std::string LeaseListNow(std::optional<TenantId> only) const;
  std::string PoolStatus() const;

  void Loop();
  TimePoint Now() const;
  // A point of the host's steady clock on the policies' clock (Now()'s).
  TimePoint OnPolicyClock(std::chrono::steady_clock::time_point t) const;
  void Pump();
  void OnMessage(Worker& w, const ctl::Message& m);
  void OnReady(Worker& w, const std::vector<ctl::Ready>& ready);
  void OnDone(Worker& w, const std::vector<ctl::Done>& done);
  void OnMemReserve(Worker& w, const std::vector<ctl::MemReserve>& asks);
  void OnSwapped(Worker& w, const std::vector<ctl::Swapped>& swapped);
  // Oversubscription. The tenant's slot count now (from its reservations), placed again when
  // it changed; whether its release must wait (the victims to move off first); moving on a
  // waiting release; the monitor's idle evictions; asking a tenant's workers to evict.
  int32_t SlotNeed(const DeviceState& d, TenantId tenant) const;
  std::vector<TenantId> PrepareSwitch(uint32_t device, TenantId tenant);
  bool AdvanceSwitch(uint32_t device);
  std::vector<Worker*> WaitingWorkers(const Switch& sw);  // the workers whose move it waits for
  // Swap batching: the batch's next dispatch out of turn, or nullopt with `hold` set when the
  // device waits for the batch's tenant (thinking), or nullopt and the batch over.
  std::optional<core::Dispatch> BatchPick(uint32_t device, bool& hold);
  Duration BatchLength(Duration cost) const;  // swap_batch x cost, at most kMaxBatch
  void SlotMonitor();
  void AskEvict(uint32_t device, TenantId tenant, Switch* sw);
  void Release(uint32_t device, const core::Dispatch& pick, const Queued& q);
  // Gives back `bytes` of `w`'s reservation on `device` (at most what it holds).
  void FreeMemory(Worker& w, uint32_t device, uint64_t bytes);
  // A policy block for `r`, counted as submitted (outstanding, the tenant's counters).
  core::CommandBlock NewBlock(const Worker& w, const ctl::Ready& r);
  void Submit(Worker& w, const ctl::Ready& r);
  void StartExpress(Worker& w, const ctl::Ready& r);
  void MaybeGrant(Worker& w, uint32_t device);
  void Revoke(uint32_t device);
  void EndExpress(uint32_t device);  // the grant is over: the held work goes to the policy
  static bool Holds(const DeviceState& d, const Worker& w) { return HolderOf(d, w) != nullptr; }
  // `w`'s entry among the device's express holders (nullptr: not one).
  static const ExpressHolder* HolderOf(const DeviceState& d, const Worker& w);
  // Workers (of `tenant`, if given) that sent or finished work on `device` within kExpressQuiet.
  size_t ActiveWorkers(std::optional<TenantId> tenant, uint32_t device, TimePoint now) const;
  // Whether `w` (not a holder) may join the device's express holders now.
  bool MayJoinExpress(const DeviceState& d, const Worker& w, uint32_t device, TimePoint now) const;
  static bool HeldBy(const DeviceState& d, TenantId tenant);  // a holder of `tenant`
  // `w` holds express on `device` no longer (it confirmed a revoke, or is gone): the last
  // holder's leaving ends the grant, otherwise the others share its slots.
  void LeaveExpress(Worker& w, uint32_t device);
  // Sends each holder its share of the device's `inflight_per_device` where it changed.
  void ShareSlots(uint32_t device);
  void Drop(Worker& w, GoneReason why);
  void Watchdog();
  // Whether `w` has been stopped (SIGSTOP) for kStoppedGrace while others wait for it; ends it
  // then (with a message naming `what` it was waited for) and returns true.
  bool EndIfStopped(Worker& w, const char* what);
  // Records `f` as in flight on `d` and counts the dispatch.
  void Dispatched(DeviceState& d, const Flight& f);
  // Sends what the socket takes now of `records` to `w` and keeps the rest for the next round.
  template <typename T>
  void SendPending(Worker& w, ctl::Type type, std::vector<T>& records);
  void SendReleases();

  uint32_t inflight_limit_ = 4;
  double swap_batch_ = 0;  // 0: no swap batching
  bool express_enabled_ = true;
  Mailbox mailbox_;
  std::thread thread_;
  WorkerGone on_worker_gone_;
  std::chrono::steady_clock::time_point epoch_ = std::chrono::steady_clock::now();
  std::atomic<uint64_t> outstanding_{0};
  std::atomic<bool> stop_{false};
  int epoll_fd_ = -1;
  // Scheduler-thread state.
  std::vector<DeviceState> devices_;
  std::unordered_map<uint64_t, std::unique_ptr<Worker>> workers_;  // by session
  struct TenantStats {
    std::string name;
    double weight = 1;
    Duration command_time_limit{0};
    uint64_t commands = 0;            // released to a policy
    uint64_t completed = 0;           // commands whose last dispatch completed
    uint64_t dispatches = 0;          // chunks and whole commands
    uint64_t express = 0;             // of which started by express
    uint64_t total_items = 0;         // kernel work-items submitted
    uint64_t processed_items = 0;     // kernel work-items completed
    uint64_t inflight = 0;            // dispatches on a device now
    double device_time_s = 0;         // sum of measured START->END
    double unsplit_kernel_s = 0;      // of which kernels that could not be split
    uint64_t worker_deaths = 0;       // workers that died or were killed
    uint64_t watchdog_kills = 0;      // of which by the watchdog
    uint64_t sessions = 0;            // workers connected now
    bool in_policy = false;           // has V-channels (a session is or was connected)
    uint64_t memory_quota = 0;        // per device; 0: none
    std::vector<uint64_t> mem_used;   // per device: reserved by its workers now
    std::vector<uint64_t> mem_peak;   // per device: the most ever reserved at once
    uint64_t mem_refused = 0;         // reservations refused (quota or capacity)
    // Oversubscription: moves of its data off the devices and back, and swap-in time not yet
    // charged (added to its next completion's device time there).
    SwapCounters swaps;
    std::vector<uint64_t> swap_charge_ns;  // per device
    double evict_wait_s = 0;               // moves off a device charged to it (made for it, or
                                           // of its own data brought back on demand)
    std::vector<uint8_t> came_back;        // per device: data brought back outside a command
    std::vector<UsageCounters> usage;      // per device, for the ledger
    std::vector<TimePoint> mem_since;      // per device: mem_used integrated up to here
  };
  // The tenant's usage counters on `device` (grown as needed).
  UsageCounters& UsageOf(TenantStats& t, size_t device);
  // Integrates the tenant's reserved memory on `device` up to now (before it changes).
  void AccrueMemory(TenantStats& t, size_t device);
  std::map<TenantId, TenantStats> tenants_;
  uint64_t worker_deaths_ = 0;
  Pool pool_;
  std::string StatusNow(std::optional<TenantId> only) const;
  // Cost of the scheduler thread itself: its CPU time handling submissions and completions.
  uint64_t busy_ns_ = 0;
  uint64_t dispatches_ = 0;
  BlockId next_block_ = 1;
};

}  // namespace gmux::daemon
