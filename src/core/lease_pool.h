// LeasePool: BioCloud's pool of exclusively leased devices (Jo et al., Section 3).
//
// Algorithm (Section 3.2, GPU-Admin; Section 3.3, GPU-Manager):
//   - The pool registers every device as free (3.2). A device is leased to one tenant at a time,
//     exclusively, like a GPU passed through to one VM.
//   - Requests (the five ManagerListener messages of 3.2.1):
//       (1) explicit allocate by a user   RequestExplicit  -> a pinned lease (3.3.3: "not
//                                                             deallocated automatically")
//       (2) explicit release by a user    ReleaseExplicit
//       (3) implicit allocate on the tenant's first API use (WrapCUDA's checkgpuon())
//                                         RequestImplicit
//       (4) implicit release when the tenant's program ends
//                                         ProgramEnd
//       (5) disconnect                    Disconnect (releases everything, cancels a wait)
//   - No free device: the request waits; waiters are served in order of waiting time, longest
//     first (3.2.1, last paragraph). Equal waiting times are served in request order.
//   - PoolChecker (3.2.2): every `check_period` (5 s in the paper) on a fixed grid
//     origin + k * check_period, k >= 1, every non-pinned lease that is ready, not in use, and
//     whose last activity lies `idle_threshold` (10 s) or more in the past is reclaimed.
//   - Attach (hot plug-in) and detach (hot plug-out) take `attach_time` and `detach_time`
//     (1.3 s each, Table 3). While attaching or detaching a device is neither free nor usable.
//     A device freed by a detach goes straight to the longest waiter.
//
// Invariants:
//   - A tenant holds at most one lease (waiting, attaching or ready) at a time.
//   - Every device is in exactly one state: free, attaching (owner), leased (owner) or detaching.
//   - A device is free only while nobody waits for it (a free device and a waiter without a
//     preference never coexist after a call returns). An explicit request may name a device
//     (`gmux lease acquire --device N`, not in the paper): it waits for that one, and later
//     waiters may take other free devices meanwhile.
//   - Pinned leases are never reclaimed by the checker; a lease in use (BeginUse without EndUse)
//     is never reclaimed either.
//   - Time passed to the pool never goes backwards (calls with an earlier time are rejected).
//
// Pure: no clocks, no I/O, no threads. The owner (the simulator, or the daemon's scheduler
// thread) calls Advance(now) at NextTimer() (or any later time) and carries out the PoolEvents it
// drains with TakeEvents(): e.g. "attach device 2 to tenant 7 now, ready at t + 1.3 s". Not
// thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <queue>
#include <set>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/ids.h"
#include "common/status.h"
#include "common/time.h"

namespace gmux::core {

struct LeasePoolOptions {
  uint32_t devices = 1;                                          // pool size, >= 1
  Duration check_period = std::chrono::seconds(5);               // PoolChecker period, > 0
  Duration idle_threshold = std::chrono::seconds(10);            // reclaim limit, >= 0
  Duration attach_time = std::chrono::milliseconds(1300);        // hot plug-in, >= 0
  Duration detach_time = std::chrono::milliseconds(1300);        // hot plug-out, >= 0
  TimePoint origin{};  // the pool's start: checks at origin + k * check_period; no call earlier

  // kInvalidArgument naming the field when a value is out of range.
  Status Validate() const;
};

enum class LeaseKind { kImplicit, kPinned };

enum class ReleaseReason { kUser, kProgramEnd, kDisconnect, kIdle };
std::string_view ReleaseReasonName(ReleaseReason reason);

enum class LeaseStatus {
  kNone,       // no lease and no request
  kWaiting,    // queued for a device
  kAttaching,  // a device is being attached; usable at ready_at
  kReady,      // the tenant holds a usable device
};

// A tenant's lease as the caller sees it.
struct LeaseView {
  LeaseStatus status = LeaseStatus::kNone;
  LeaseKind kind = LeaseKind::kImplicit;
  DeviceId device = 0;        // valid for kAttaching and kReady
  TimePoint requested_at{};   // when the current request was made (kWaiting, kAttaching, kReady)
  TimePoint ready_at{};       // kAttaching: when it becomes usable; kReady: when it became usable
};

enum class PoolEventKind {
  kAttachStarted,   // start hot plug-in of `device` into `tenant`; usable at `done`
  kAttachFinished,  // `device` is usable by `tenant` from `at`
  kDetachStarted,   // start hot plug-out of `device` from `tenant`; back in the pool at `done`
  kDetachFinished,  // `device` is back in the pool (and may be re-attached at once)
};
std::string_view PoolEventKindName(PoolEventKind kind);

// A decision the caller acts on. Events are produced in time order.
struct PoolEvent {
  PoolEventKind kind = PoolEventKind::kAttachStarted;
  TimePoint at{};    // when it happens
  TimePoint done{};  // *Started: when the operation completes; *Finished: equals `at`
  DeviceId device = 0;
  TenantId tenant = kNoTenant;
  ReleaseReason reason = ReleaseReason::kUser;  // detach events only
};

// Per-tenant accounting. Waiting time follows the paper's Fig. 8: from the request to the moment
// the device is usable, hot plug-in included.
struct TenantLeaseStats {
  uint64_t requests = 0;      // requests that had to be served (not no-ops on a held lease)
  uint64_t grants = 0;        // leases that became ready
  uint64_t reclaimed = 0;     // leases the checker took back
  Duration total_wait{0};     // Σ (ready − requested) over grants
  Duration queue_wait{0};     // Σ (attach start − requested) over grants (no plug-in time)
  Duration max_wait{0};
  Duration leased{0};         // time holding a ready lease
  Duration in_use{0};         // time with at least one BeginUse open
  double MeanWaitSeconds() const {
    return grants == 0 ? 0.0 : ToSeconds(total_wait) / static_cast<double>(grants);
  }
};

struct DeviceLeaseStats {
  Duration free{0}, attaching{0}, leased{0}, detaching{0};
};

struct PoolMetrics {
  std::vector<std::pair<TenantId, TenantLeaseStats>> tenants;  // ascending tenant id
  std::vector<DeviceLeaseStats> devices;                       // by device id
  // From the first request to the last release (the end of the last lease's use, detach not
  // included); 0 before any release.
  Duration makespan{0};
  // Over [origin, now] and all devices: fraction of device-time leased and ready, in use, and
  // spent in hot plug-in/out.
  double leased_fraction = 0;
  double in_use_fraction = 0;
  double plug_fraction = 0;
};

class LeasePool {
 public:
  // kInvalidArgument when `options` does not validate.
  static Result<LeasePool> Create(const LeasePoolOptions& options);

  const LeasePoolOptions& options() const { return options_; }

  // Registers a tenant. kAlreadyExists if known; kInvalidArgument for kNoTenant.
  Status AddTenant(TenantId tenant, TimePoint now);
  // Disconnects and forgets a tenant (its statistics go with it). kNotFound if unknown.
  Status RemoveTenant(TenantId tenant, TimePoint now);

  // Message (3): implicit allocation on first API use. A no-op returning the current view when
  // the tenant already waits or holds a lease. Errors: kNotFound (unknown tenant),
  // kInvalidArgument (time went backwards).
  Result<LeaseView> RequestImplicit(TenantId tenant, TimePoint now);
  // Message (1): explicit, pinned allocation. Upgrades a waiting or held implicit lease to pinned.
  // `device`: that device only (it waits while the device is not free). Errors: kNotFound
  // (unknown tenant, or no such device), kAlreadyExists (already pinned), kFailedPrecondition
  // (`device` named while the tenant already holds or waits for another), kInvalidArgument
  // (time).
  Result<LeaseView> RequestExplicit(TenantId tenant, TimePoint now,
                                    std::optional<DeviceId> device = std::nullopt);
  // Message (2): the user gives `device` back. A release during hot plug-in takes effect when the
  // plug-in completes. Errors: kNotFound (unknown tenant or device id out of range),
  // kPermissionDenied (the device is another tenant's lease), kFailedPrecondition (the tenant
  // holds no lease on it: never leased, or already released), kInvalidArgument (time).
  Status ReleaseExplicit(TenantId tenant, DeviceId device, TimePoint now);
  // Message (4): the tenant's program ended. Releases a non-pinned lease (or cancels a pending
  // implicit request); a pinned lease stays. OK when there is nothing to release.
  // Errors: kNotFound, kInvalidArgument (time).
  Status ProgramEnd(TenantId tenant, TimePoint now);
  // Message (5): the tenant's connection is gone. Releases any lease, pinned included, and
  // cancels a pending request. Errors: kNotFound, kInvalidArgument (time).
  Status Disconnect(TenantId tenant, TimePoint now);

  // Usage reports (what the PoolChecker's usage query returns in the paper). NoteActivity marks an
  // instant of use; BeginUse/EndUse bracket a stretch of use (a running kernel) during which the
  // lease is never idle. Errors: kNotFound, kFailedPrecondition (no ready lease; EndUse without
  // BeginUse), kInvalidArgument (time).
  Status NoteActivity(TenantId tenant, TimePoint now);
  Status BeginUse(TenantId tenant, TimePoint now);
  Status EndUse(TenantId tenant, TimePoint now);

  // Runs every internal timer due at or before `now` (plug-in/out completions, checker rounds),
  // in time order. Errors: kInvalidArgument (time went backwards).
  Status Advance(TimePoint now);
  // When Advance() next has something to do: the earliest plug-in/out completion or, while a
  // reclaimable lease (ready, not pinned, not in use) exists, the next checker round. nullopt: nothing until the next request.
  std::optional<TimePoint> NextTimer() const;

  // Drains the decisions made since the last call, in time order.
  std::vector<PoolEvent> TakeEvents();

  // The tenant's lease (kNone for unknown tenants).
  LeaseView Lease(TenantId tenant) const;
  size_t waiting() const { return waiters_.size(); }
  size_t free_devices() const { return free_.size(); }
  // Devices leased to a tenant (attaching or ready).
  size_t leased_devices() const { return leased_count_; }
  TimePoint now() const { return now_; }

  // Accounting up to `now` (earlier values are clamped to the time of the last call). Does not
  // run timers: call Advance(now) first when plug-in/out or checker rounds may be due.
  PoolMetrics Metrics(TimePoint now) const;

 private:
  enum class DeviceState { kFree, kAttaching, kLeased, kDetaching };
  struct Device {
    DeviceState state = DeviceState::kFree;
    TenantId owner = kNoTenant;   // kAttaching/kLeased: holder; kDetaching: previous holder
    TimePoint since{};            // when the current state began
    bool release_pending = false; // released while attaching: detach when attach finishes
    ReleaseReason pending_reason = ReleaseReason::kUser;
    DeviceLeaseStats stats;
  };
  struct TenantState {
    LeaseStatus status = LeaseStatus::kNone;
    LeaseKind kind = LeaseKind::kImplicit;
    DeviceId device = 0;
    TimePoint requested_at{};
    TimePoint ready_at{};
    uint64_t wait_seq = 0;          // position key in waiters_ while kWaiting
    std::optional<DeviceId> want;   // the device an explicit request named (kWaiting)
    TimePoint last_activity{};
    uint32_t uses = 0;              // open BeginUse count
    TimePoint use_since{};
    TenantLeaseStats stats;
  };
  struct Timer {
    TimePoint at;
    uint64_t seq;
    DeviceId device;
    bool operator>(const Timer& o) const { return at != o.at ? at > o.at : seq > o.seq; }
  };
  // Waiters ordered by waiting time, longest first: (requested_at, arrival sequence).
  using WaitKey = std::pair<TimePoint, uint64_t>;

  explicit LeasePool(const LeasePoolOptions& options);

  Status CheckTime(TimePoint now) const;
  Result<TenantState*> Find(TenantId tenant);
  Result<LeaseView> Request(TenantId tenant, LeaseKind kind, TimePoint now,
                            std::optional<DeviceId> device = std::nullopt);
  // Releases whatever `t` holds or waits for, at `now`.
  void ReleaseHeld(TenantId tenant, TenantState& t, ReleaseReason reason, TimePoint now);
  void SetDeviceState(DeviceId d, DeviceState state, TenantId owner, TimePoint now);
  void StartAttach(DeviceId d, TenantId tenant, TimePoint now);
  void StartDetach(DeviceId d, ReleaseReason reason, TimePoint now);
  void FinishTimer(DeviceId d, TimePoint now);
  void RunCheck(TimePoint at);
  void GrantFreeDevices(TimePoint now);
  void CloseUse(TenantState& t, TimePoint now);
  bool Reclaimable(const TenantState& t) const;
  TimePoint FirstCheckAtOrAfter(TimePoint t) const;
  LeaseView ViewOf(const TenantState& t) const;

  LeasePoolOptions options_;
  TimePoint now_{};
  std::vector<Device> devices_;
  std::unordered_map<TenantId, TenantState> tenants_;
  std::set<DeviceId> free_;
  std::set<std::pair<WaitKey, TenantId>> waiters_;
  std::priority_queue<Timer, std::vector<Timer>, std::greater<>> timers_;
  uint64_t seq_ = 0;
  TimePoint next_check_{};
  size_t candidates_ = 0;  // leases the checker may reclaim: ready, non-pinned, not in use
  size_t leased_count_ = 0;
  std::optional<TimePoint> first_request_;
  std::optional<TimePoint> last_release_;
  std::vector<PoolEvent> events_;
};

}  // namespace gmux::core
