// CreditPolicy: VMCG's virtual multi-channel credit fair scheduling (Tan et al., TPDS 2019,
// Sections 4-5, Eq. (1)-(2), Algorithm 1, Table 1), with credits charged in device time.
//
// Algorithm as implemented (docs/policies.md, "credit", has the numbers and every decision):
//
//   V-channels.  Every tenant i owns a FIFO of pending command blocks (Section 3); req[i] is its
//     length. NUM_i (Table 1) is the peak number of the tenant's blocks outstanding (queued or
//     executing) during the last interval, capped at num_cap. The default cap of 1 makes NUM_i an
//     activity indicator: a raw count gives a tenant that keeps 4 blocks queued 2.5× the credits
//     of an equally weighted one that keeps 1 queued, which breaks weighted fairness
//     (num_cap = blocks_per_round restores the paper's demand-proportional credits).
//
//   Eq. (2), normalised.  At every replenishment, for the tenants active in the last interval:
//       f_i      = e^{b_i · m_i} + NUM_i                              (numerator of Eq. 2)
//       CREDIT_i = CREDIT · w_i · f_i / Σ_j w_j · f_j                 (Eq. 2, scaled by weight)
//     b_i = BW_i / BW and m_i = MSIZE_i / MSIZE are the tenant's bus-bandwidth occupancy and
//     device-memory share in [0, 1], so the exponent is in [0, 1] (the paper's reference term
//     e^{BW·MSIZE} becomes e^1) and nothing overflows. The denominator is the weighted sum of
//     numerators so that Σ_i CREDIT_i = CREDIT exactly (the literal denominator e + Σ NUM_j makes
//     the CREDIT_i sum to more than CREDIT once there are three or more tenants).
//     credit2[i] (RALC_i) holds CREDIT_i; credit1[i] (RMNC_i) the remaining credits.
//
//   Credits are device time.  Eq. (1) states the same share as an entitlement to GPU time TIME_i
//     of TIME, so one credit is worth TIME_G / CREDIT of device time, and a completed block is
//     charged its measured device time (not 1 credit per block: with 1 credit per 4-block round a
//     tenant whose blocks are 10× longer gets 10× the device time per credit; option
//     charge_per_round restores the literal rule for comparison). credit1 never goes negative:
//     the part of a charge that exceeds credit1 is recorded as debt and repaid from the next
//     reallocation before credit1 rises above 0.
//
//   Time slices (Section 5.1, Algorithm 1 steps 1-13).  cpu_i is the CPU time the tenant
//     consumed in the last polling period (deltas of ReportCpuTime); tenants are sorted by cpu_i
//     descending (DomID_Num) and t_i = cpu_i / cpu_max × slice_max (16 ms), at least slice_min;
//     with no CPU reports every slice is slice_max. The slice bounds the device time of one turn.
//
//   Rounds (Algorithm 1 steps 15-33).  status[i] = 1 iff credit1[i] > 0. Tenants take turns in
//     DomID_Num order, skipping status-0 tenants and tenants with nothing pending. A turn
//     dispatches whole blocks from the head of the V-channel: at most blocks_per_round (4), and
//     no further block once the turn's device time reaches t_i. Like Algorithm 1, status is
//     evaluated when the turn starts; blocks charged past credit1 within the turn become debt.
//
//   Replenishment (Section 4.2).  Two triggers, both "a replenishment event":
//     (a) the interval TIME_G has elapsed since the previous replenishment (TIME_G = time_g when
//         set, else the sum of the active tenants' slices: one polling period), counted in
//         device time served, so an interval hands out exactly the device time it lasted (with
//         time_g_wall it is a wall-clock timer, which over-allocates whenever the device idles);
//     (b) a tenant with credit1 = 0 has pending blocks and the device has spare capacity: no
//         tenant with credit1 > 0 has a block pending or executing, and none went quiet less than
//         idle_grace ago (a tenant between two closed-loop submissions is not spare capacity).
//     A replenishment recomputes slices, the DomID_Num order and Eq. (2), then adds credit2[i] to
//     every tenant (repaying debt first); a tenant with nothing pending is capped at
//     (1 + carry_intervals) · credit2[i] so idle tenants cannot bank a burst. A tenant with
//     credit1 = 0 therefore gets exactly credit2[i] (the paper's rule); one with credits left
//     keeps them, so neither the timer's phase nor a long block of another tenant costs it.
//     Trigger (b) adds as many allocations as needed for one pending tenant to reach credit1 > 0.
//
//   Slices and closed loops (not in the paper; docs/policies.md, credit, "Slices and closed
//     loops"), on by default (owed_first, split_kernels):
//     - splittable kernels run in chunks of about ChunkTarget() of device time (the shortest
//       whole-block time among the tenants that want the device, in [chunk_min, slice_max]),
//       sized from the tenant's measured device time per work-item, whenever another tenant
//       wants the device; alone, blocks run whole;
//     - a tenant that went quiet less than its grace ago (4 × its measured think time, in
//       [idle_grace, think_grace_max]) still wants the device: its credits are not capped, its
//       capacity is not spare, and a chunk target counts its launches;
//     - each dispatch goes to the eligible tenant with the most of its allocation left
//       (credit1 / credit2), and while a thinking tenant is owed more than that one and a
//       dispatch is running, nothing more is queued (Pick() holds until its grace ends).
//
// Invariants (checked by tests/core/credit_policy_test.cc and policy_property_test.cc):
//   - credit1[i] ≥ 0 and debt[i] ≥ 0, never both > 0.
//   - Blocks of one tenant are dispatched whole, in Submit() order.
//   - No starvation: a tenant with pending blocks and credits gets a turn within one round; one
//     without credits is replenished by (b) at the latest when every credit holder has finished
//     its work plus idle_grace, or by (a) once TIME_G of device time has been served.
//   - With every tenant backlogged, each tenant's device time over an allocation cycle is
//     CREDIT_i (+/- one block), so shares follow w_i · f_i; with equal f_i, they follow weight.
//
// Not thread-safe: one owner (the simulator or the daemon's scheduler thread) calls it.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <set>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "core/policy.h"

namespace gmux::core {

// Parameters of the credit policy (PolicySpec.params keys in parentheses).
struct CreditPolicyOptions {
  double credits_per_interval = 100;       // CREDIT: credits handed out per interval (credits_per_interval)
  Duration time_g{0};                      // TIME_G; 0 = one polling period, Σ active slices (time_g_ms)
  Duration slice_max = std::chrono::milliseconds(16);  // largest time slice (slice_max_ms)
  Duration slice_min = std::chrono::milliseconds(1);   // floor of CPU-derived slices (slice_min_ms)
  int64_t blocks_per_round = 4;            // blocks a turn may dispatch (blocks_per_round)
  int64_t num_cap = 1;                     // cap on NUM_i in Eq. (2) (num_cap)
  double carry_intervals = 1;              // unused allocations a tenant may bank (carry_intervals)
  Duration idle_grace = std::chrono::milliseconds(1);  // quiet time before a credit holder's
                                                       // capacity counts as spare (idle_grace_ms)
  bool charge_per_round = false;           // paper-literal: 1 credit per turn (charge_per_round)
  bool time_g_wall = false;                // TIME_G counts wall time, not device time (time_g_wall)
  // Bounded slices and closed loops (docs/policies.md, credit, "Slices and closed loops").
  bool owed_first = true;                  // next dispatch: most credit left (owed_first)
  bool split_kernels = true;               // cut splittable kernels into chunks (split_kernels)
  Duration chunk{0};                       // chunk target; 0 = adaptive (chunk_ms)
  Duration chunk_min = std::chrono::microseconds(500);  // floor of the adaptive target (chunk_min_ms)
  Duration think_grace_max = std::chrono::milliseconds(4);  // cap on a tenant's think grace
                                                            // (think_grace_max_ms)

  Status Validate() const;
};

// Reads CreditPolicyOptions from spec.params (keys and defaults above); kInvalidArgument names
// the parameter that is out of range or unknown.
Result<CreditPolicyOptions> CreditPolicyOptionsFromSpec(const PolicySpec& spec);

// What a test or a report may read about one tenant.
struct CreditTenantView {
  double credit1 = 0;     // remaining credits (RMNC_i)
  double credit2 = 0;     // last reallocation CREDIT_i (RALC_i)
  double debt = 0;        // credits charged beyond credit1, repaid from the next reallocation
  int status = 0;         // 1 iff credit1 > 0
  Duration slice{0};      // t_i
  double eq2_factor = 0;  // f_i = e^{b_i m_i} + NUM_i at the last replenishment
  size_t pending = 0;     // req[i]
  size_t in_flight = 0;
  Duration think{0};      // measured think time (moving average of completion-to-submit gaps)
  Duration grace{0};      // how long it counts as backlogged after going quiet
  Duration block_time{0}; // moving average of device time per whole block
  uint64_t chunks = 0;    // dispatches that ran part of a block
  Duration unsplit_kernel_time{0};  // device time of kernels that could not be split
};

class CreditPolicy final : public Policy {
 public:
  enum class Trigger { kInterval, kSpareCapacity };

  CreditPolicy(const CreditPolicyOptions& options, const DeviceInfo& device);

  std::string_view name() const override { return "credit"; }
  void AddTenant(const Tenant& tenant, TimePoint now) override;
  void SetWeight(TenantId tenant, double weight, TimePoint now) override;
  void RemoveTenant(TenantId tenant, TimePoint now) override;
  void Submit(const CommandBlock& block, TimePoint now) override;
  void Complete(const Completion& done, TimePoint now) override;
  void Tick(TimePoint now) override;
  std::optional<Dispatch> Pick(TimePoint now) override;
  std::optional<Dispatch> PickTenant(TenantId tenant, TimePoint now) override;
  bool PicksOutOfTurn() const override { return true; }
  std::optional<TimePoint> NextTimer() const override;
  void ReportCpuTime(TenantId tenant, Duration cumulative_cpu, TimePoint now) override;
  void ReportMemory(TenantId tenant, uint64_t bytes, TimePoint now) override;
  size_t Pending(TenantId tenant) const override;
  // Express while no other tenant has work: a tenant with credit runs at once, and one without
  // would be replenished by trigger (b) unless another credit holder is within idle_grace.
  bool ExpressOk(TenantId tenant, TimePoint now) const override;
  void Express(const CommandBlock& block, TimePoint now) override;

  // Introspection for tests and reports. Precondition for View: the tenant was added.
  CreditTenantView View(TenantId tenant) const;
  Duration time_g() const { return Duration(time_g_ns_); }
  // Device time one credit is worth in the current interval (TIME_G / CREDIT).
  Duration credit_value() const;
  uint64_t replenishments(Trigger trigger) const {
    return trigger == Trigger::kInterval ? interval_replenishments_ : spare_replenishments_;
  }
  // Tenant ids in DomID_Num order (descending CPU time) as of the last replenishment.
  std::vector<TenantId> Order() const;
  // Device time a dispatch of a splittable kernel aims at now (options.chunk, or adaptive).
  Duration ChunkTarget(TimePoint now) const;

 private:
  struct Entry {
    BlockId block;
    uint64_t work_items;
    uint64_t granule;      // work-items per chunk step; 0: dispatched whole
    uint64_t next = 0;     // first work-item not yet dispatched
    bool kernel = false;
  };
  struct TenantState {
    Tenant info;
    uint64_t join_seq = 0;
    std::deque<Entry> channel;  // the V-channel
    size_t in_flight = 0;
    // Credits, in nanoseconds of device time.
    int64_t credit1_ns = 0;
    int64_t credit2_ns = 0;
    int64_t debt_ns = 0;
    double eq2_factor = 0;
    // Inputs of Eq. (2) for the current interval.
    size_t peak_outstanding = 0;
    uint64_t copy_bytes = 0;
    uint64_t memory_bytes = 0;
    bool active = false;  // submitted or had work outstanding in the current interval
    TimePoint quiet_since{};  // when its last outstanding block completed
    bool quiet = true;        // nothing pending or in flight since quiet_since
    bool ever_quiet = false;  // quiet_since is set
    int64_t think_ns = 0;     // moving average of quiet_since -> next Submit gaps
    int64_t block_ns = 0;     // moving average of device time per whole block
    int64_t open_block_ns = 0;  // device time of the block whose chunks are completing
    double item_ns = 0;       // moving average of kernel device time per work-item
    uint64_t chunks = 0;
    int64_t unsplit_kernel_ns = 0;
    std::vector<BlockId> unsplit_in_flight;  // dispatched kernels that could not be split
    // Time slice inputs.
    int64_t cpu_cumulative_ns = 0;
    int64_t cpu_period_start_ns = 0;
    int64_t slice_ns = 0;
    int64_t est_block_ns = 0;  // moving average of device time per block (in-flight estimate)
    uint32_t rank = 0;         // position in order_
    bool eligible = false;     // in eligible_: credit1 > 0 and pending > 0
    bool claiming = false;     // counted in claiming_: credit1 > 0 and (pending or in flight)
  };

  void AdvanceTo(TimePoint now);
  void Replenish(TimePoint now, Trigger trigger);
  void ComputeSlicesAndOrder();
  void ComputeAllocations(TimePoint now);
  void TopUp(TenantState& t, int64_t amount_ns, TimePoint now);
  void Charge(TenantState& t, int64_t cost_ns);
  void Refresh(TenantState& t);
  void RebuildSets();
  bool CanContinueTurn(const TenantState& t) const;
  Dispatch DispatchHead(TenantId id, TenantState& t, TimePoint now, bool may_split = true);
  std::optional<TenantId> NextEligible() const;
  std::optional<TenantId> MostOwed() const;
  int64_t GraceNs(const TenantState& t) const;
  bool Thinking(const TenantState& t, TimePoint now) const;
  // Work queued or running, or within its think grace.
  bool WantsDevice(const TenantState& t, TimePoint now) const;
  bool OthersActive(TenantId id, TimePoint now) const;
  // The earliest end of a thinking credit holder's grace (nullopt: none is thinking).
  std::optional<TimePoint> HolderGraceEnd(TimePoint now, TenantId except = kNoTenant) const;
  static double Owed(const TenantState& t);
  size_t total_in_flight_ = 0;
  TimePoint hold_until_{};  // a Pick() held a slot for a thinking tenant until then

  CreditPolicyOptions options_;
  DeviceInfo device_;
  std::unordered_map<TenantId, TenantState> tenants_;
  uint64_t next_join_seq_ = 0;

  std::vector<TenantId> order_;       // DomID_Num: rank -> tenant (kNoTenant for removed)
  std::set<uint32_t> eligible_;       // ranks of tenants with status 1 and pending blocks
  size_t claiming_ = 0;               // tenants with credit1 > 0 and work pending or executing
  size_t total_pending_ = 0;

  // The current (turn_open_) or most recent turn: one tenant's up-to-blocks_per_round dispatches.
  TenantId turn_tenant_ = kNoTenant;
  int64_t turn_blocks_ = 0;
  int64_t turn_used_ns_ = 0;
  uint32_t cursor_rank_ = UINT32_MAX;  // rank of the last tenant that had a turn

  bool started_ = false;  // the first call fixes the first interval's start
  bool turn_open_ = false;
  TimePoint interval_start_{};
  TimePoint interval_end_{};
  int64_t time_g_ns_ = 0;
  int64_t served_ns_ = 0;  // device time completed since the last replenishment
  TimePoint last_now_{};
  uint64_t interval_replenishments_ = 0;
  uint64_t spare_replenishments_ = 0;
};

}  // namespace gmux::core
