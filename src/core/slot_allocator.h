// SlotAllocator: DymGPU's slot-based sharing of device memory (Park et al., "DymGPU: Dynamic
// Memory Management for Sharing GPUs in Virtualized Clouds", Sections II-III).
//
// Model. The shared memory space is cut into M slots (64 MB each in the paper; 54 slots of high
// global graphics memory). Tenant i (a vGPU) needs S_i contiguous slots and is placed at a start
// P_i, so it covers [P_i, P_i + S_i). Tenants may overlap: a slot covered by two or more tenants
// is *shared*. The physical translation table holds, per slot, the entries of one tenant (the
// slot's *owner*). When the device switches to tenant T, every slot of T's range whose owner is
// not T must be copied in (gScale's private-to-physical GTT copy, Section II-A) and T becomes its
// owner. Exclusive slots are therefore copied at most once; shared slots are copied whenever
// another sharer ran in between. That copy count is the cost DymGPU minimises.
//
// Placement policies (SlotPolicy):
//   baseline     gScale as described in Section II-A: for every candidate start p, score(p) =
//                Σ_{s=p}^{p+S-1} w(s) with w(s) = 0 for an unoccupied slot and a very large
//                weight W for an occupied one; the lowest score wins, the leftmost on ties. A
//                tenant is placed once, never moved; no idle detection.
//   size         Size-based greedy, Fig. 5 (Section III-B). Sort by S_i non-increasing; place
//                V_0, V_1, ... left to right from slot 0 while each fits without sharing
//                (V_0..V_{K-1}); place V_K at the rightmost end (P_K = M - S_K), which overlaps
//                V_{K-1} in the shared region L = [P_K, P_{K-1} + S_{K-1}); place V_{K+1}..V_{N-1}
//                on top of it at P_K. New tenant: on top of L when S <= |L|, otherwise whichever
//                of "on top of L" and "reallocate everything" shares fewer slots. Terminated
//                tenant: reallocate everything when it held a slot nobody else shared.
//   utilization  Utilization-based greedy, Fig. 6. Sort by average utilisation non-increasing;
//                place left to right while each fits without sharing (V_0..V_{K-1}); place the
//                rest at the rightmost end (P_j = M - S_j). Re-placed every 20 s from the
//                utilisation averaged over the last 20 s; the termination rule is Fig. 5's.
// Both DymGPU policies run the monitor (Section III-A): utilisation sampled every second and
// averaged over 20 s; a tenant unused for 20 s is idle and treated as terminated (removed from
// the layout); its next switch-in places it again as a new tenant. Every decision here that
// the paper leaves open is listed in docs/policies.md (slots section).
//
// Cost accounting: a switch copies the stale slots of the incoming tenant (switch copies); a
// re-placement that changes P_i copies S_i slots to the new position (move copies) and the moved
// tenant owns its new range afterwards.
//
// Invariants (checked by tests): every placed tenant satisfies 0 <= P_i and P_i + S_i <= M;
// occupancy[s] equals the number of placed tenants covering s; owner[s] is kNoTenant or a placed
// tenant covering s; an idle tenant is not placed and owns nothing.
//
// Pure and single-threaded: time is an argument, no clocks, no I/O, no randomness. The owner
// (the simulator or the daemon's memory manager) calls it from one thread.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string_view>
#include <vector>

#include "common/ids.h"
#include "common/status.h"
#include "common/time.h"

namespace gmux::core {

enum class SlotPolicy { kBaseline, kSize, kUtilization };

// "baseline", "size", "utilization".
std::string_view SlotPolicyName(SlotPolicy policy);
// Inverse of SlotPolicyName; kInvalidArgument naming the choices otherwise.
Result<SlotPolicy> ParseSlotPolicy(std::string_view name);

// gScale's weight for an occupied slot (Section II-A: "deliberately set to a very large value").
// Free slots add 0, so any W > 0 selects the same start; W only keeps the paper's score visible.
inline constexpr double kGScaleOccupiedWeight = 1e9;

struct SlotAllocatorOptions {
  int32_t slots = 54;                      // M; the paper's 3456 MB of shared high GM / 64 MB
  SlotPolicy policy = SlotPolicy::kSize;
  // Baseline only: add W once per occupant instead of once per occupied slot. The paper's text
  // says once per occupied slot (the default); the per-occupant variant spreads piles evenly.
  bool baseline_weight_per_occupant = false;
  // DymGPU monitor (size and utilization; the baseline never evicts).
  bool idle_detection = true;
  Duration idle_threshold = std::chrono::seconds(20);      // Section III-A
  Duration monitor_period = std::chrono::seconds(1);       // sampling and idle check period
  Duration utilization_window = std::chrono::seconds(20);  // averaging window
  // Utilization policy: periodic re-placement (Section III-B); zero disables it.
  Duration replacement_period = std::chrono::seconds(20);
  // Apply a periodic re-placement only when it lowers Σ_i u_i · shared_i (utilisation times the
  // tenant's shared slots), the quantity Fig. 6 exists to reduce; otherwise keep the layout and
  // save the move copies. The paper re-places unconditionally (false).
  bool replacement_only_if_better = true;

  // kInvalidArgument when slots < 1, a period or window <= 0, or replacement_period < 0.
  Status Validate() const;
};

struct SlotCounters {
  int64_t switches = 0;        // switches to a different tenant
  int64_t switch_copies = 0;   // slots copied in by switches
  int64_t moves = 0;           // placed tenants whose start changed in a re-placement
  int64_t move_copies = 0;     // slots copied because their tenant moved (S_i per move)
  int64_t reallocations = 0;   // full re-placements (Fig. 5 or Fig. 6 over all placed tenants)
  int64_t idle_evictions = 0;  // tenants treated as terminated because idle
  int64_t skipped_replacements = 0;  // periodic re-placements that would not have helped
  int64_t total_copies() const { return switch_copies + move_copies; }
};

// One tenant as a placement algorithm sees it.
struct SlotItem {
  TenantId id = 0;
  int32_t need = 1;          // S_i, in [1, M]
  double utilization = 0;    // average utilisation in [0, 1] (Fig. 6 only)
};

// Result of a full placement: starts[i] is P_i of items[i]. shared_start is P_K, the start of the
// shared region L (nullopt when every tenant fits without sharing).
struct SlotLayout {
  std::vector<int32_t> starts;
  std::optional<int32_t> shared_start;
};

// Fig. 5. Ties in S_i keep the lower id first. Precondition: 1 <= need <= slots for every item.
SlotLayout SizeBasedLayout(int32_t slots, const std::vector<SlotItem>& items);
// Fig. 6. Ties in utilisation put the larger S_i first, then the lower id. Same precondition.
SlotLayout UtilizationBasedLayout(int32_t slots, const std::vector<SlotItem>& items);
// gScale (Section II-A): the start p in [0, M - need] minimising Σ w(s), leftmost on ties.
// `occupancy[s]` is the number of tenants covering slot s. Precondition: 1 <= need <= size.
int32_t GScaleStart(const std::vector<int32_t>& occupancy, int32_t need, bool weight_per_occupant);
// The gScale score of every candidate start (index p), in units of kGScaleOccupiedWeight.
std::vector<double> GScaleScores(const std::vector<int32_t>& occupancy, int32_t need,
                                 bool weight_per_occupant);
// Number of slots covered by two or more of the ranges [starts[i], starts[i] + needs[i]).
int32_t CountSharedSlots(int32_t slots, const std::vector<int32_t>& needs,
                         const std::vector<int32_t>& starts);

// Σ_i utilization_i · (slots of tenant i covered by another tenant too): the expected copies per
// unit time, up to a constant, when switch-ins are proportional to utilisation.
double WeightedSharedSlots(int32_t slots, const std::vector<SlotItem>& items,
                           const std::vector<int32_t>& starts);

// Per-tenant view for reports.
struct SlotTenantInfo {
  TenantId id = 0;
  int32_t need = 0;
  std::optional<int32_t> start;  // nullopt while idle (not placed)
  double utilization = 0;        // current windowed average
  int64_t switch_ins = 0;
  int64_t copies = 0;            // switch copies of this tenant
  int64_t moves = 0;
};

class SlotAllocator {
 public:
  // kInvalidArgument when options.Validate() fails.
  static Result<SlotAllocator> Create(const SlotAllocatorOptions& options);

  // A new tenant (vGPU created) needing `slots` contiguous slots, placed by the policy's
  // new-tenant rule. Errors: kAlreadyExists (id known), kInvalidArgument (slots < 1 or > M).
  Status AddTenant(TenantId id, int32_t slots, TimePoint now);
  // The tenant terminated: removed from the layout (termination rule) and forgotten.
  // Errors: kNotFound.
  Status RemoveTenant(TenantId id, TimePoint now);

  // The device switches to `id` at `now`. Returns the slots copied in (0 when `id` is already
  // the active tenant). An idle tenant is placed again first (new-tenant rule). Errors: kNotFound.
  Result<int64_t> SwitchTo(TenantId id, TimePoint now);
  // `id` used the device during [start, end): feeds utilisation and idle detection. An idle
  // tenant is placed again. Errors: kNotFound, kInvalidArgument (end < start).
  Status RecordUse(TenantId id, TimePoint start, TimePoint end);

  // Monitor duties up to `now`: one utilisation sample and an idle check per monitor period
  // boundary crossed, and the periodic re-placement (utilization policy). Call it at least once
  // per monitor period; a late call folds the elapsed periods into one sample.
  void Tick(TimePoint now);

  // Queries.
  bool Contains(TenantId id) const { return tenants_.count(id) != 0; }
  // P_i; kNotFound (unknown) or kFailedPrecondition (idle, not placed).
  Result<int32_t> StartOf(TenantId id) const;
  // Windowed average utilisation in [0, 1]; 0 for unknown tenants and before any sample.
  double Utilization(TenantId id) const;
  // Slots covered by two or more placed tenants.
  int32_t SharedSlots() const;
  // P_K of the size policy's shared region, if one exists.
  std::optional<int32_t> SharedRegionStart() const { return anchor_; }
  // |L|: the run of shared slots starting at P_K (0 when there is none).
  int32_t SharedRegionLength() const;
  const std::vector<int32_t>& occupancy() const { return occupancy_; }
  const std::vector<TenantId>& owners() const { return owner_; }
  TenantId active() const { return active_; }
  const SlotCounters& counters() const { return counters_; }
  const SlotAllocatorOptions& options() const { return options_; }
  size_t size() const { return tenants_.size(); }
  // All tenants in id order.
  std::vector<SlotTenantInfo> Tenants() const;

 private:
  struct Sample {
    TimePoint end;
    Duration length;
    Duration busy;
  };
  struct State {
    int32_t need = 0;
    int32_t start = -1;  // -1 while idle
    TimePoint last_use{};
    Duration busy_since_sample{0};
    std::deque<Sample> samples;
    int64_t switch_ins = 0;
    int64_t copies = 0;
    int64_t moves = 0;
  };

  explicit SlotAllocator(const SlotAllocatorOptions& options);

  bool dymgpu() const { return options_.policy != SlotPolicy::kBaseline; }
  double AverageUtilization(const State& s) const;
  // Places an unplaced tenant by the policy's new-tenant rule.
  void PlaceNew(TenantId id, State& s);
  // Takes a placed tenant out of the layout. Returns whether it held a slot nobody else shared
  // (the termination rule's trigger for a full re-placement, which the caller then runs).
  bool Unplace(TenantId id, State& s);
  void EnsureStarted(TimePoint now);
  // Fig. 5 / Fig. 6 over every placed tenant; moves are counted. With `only_if_better`, the new
  // layout is applied only when it lowers the utilisation-weighted shared slots.
  void ReallocateAll(bool only_if_better = false);
  void ApplyLayout(const std::vector<TenantId>& ids, const SlotLayout& layout);
  void Cover(int32_t start, int32_t need, int32_t delta);
  std::optional<int32_t> FirstFreeRun(int32_t need) const;
  int32_t SharedRunFrom(int32_t start) const;
  // Shared slots if a tenant of `need` were added at `start` to the current layout.
  int32_t SharedSlotsWith(int32_t start, int32_t need) const;
  std::vector<SlotItem> PlacedItems(std::optional<TenantId> extra) const;

  SlotAllocatorOptions options_;
  std::map<TenantId, State> tenants_;  // ordered: deterministic iteration
  std::vector<int32_t> occupancy_;     // tenants covering each slot
  std::vector<TenantId> owner_;        // whose entries each slot holds, kNoTenant if none
  std::optional<int32_t> anchor_;      // P_K (size policy)
  TenantId active_ = kNoTenant;
  TimePoint last_sample_{};
  TimePoint next_sample_{};
  TimePoint next_replacement_{};
  bool started_ = false;
  SlotCounters counters_;
};

}  // namespace gmux::core
