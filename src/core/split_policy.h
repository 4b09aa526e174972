// SplitPolicy: Kang & Yu's thread-split scheduling (Section 4.2-4.4, Eq. (1), Eq. (2),
// Algorithms 1 and 2).
//
// Instead of launching every work-item of a kernel at once (FIFO), each tenant's splittable kernel
// is cut into chunks ("thread groups") and the tenants take turns on the device, one chunk each
// per scheduling round. The chunk sizes are steered by each tenant's GPU usage time so that every
// tenant gets an equal share.
//
// Algorithm as implemented (docs/policies.md, "split", has the numbers and every decision):
//   Monitor (4.2): per tenant, work-items submitted (total), completed (processed) and not yet
//     completed (remaining), plus the number of active tenants N: tenants with a block pending
//     or in flight. A tenant joins the schedule when a block arrives and leaves it when its work is
//     done (nothing pending, nothing in flight).
//   Round: one pass over the ring of active tenants in join order; each gets at most one dispatch
//     (one chunk, or one whole block when the head block is not a splittable kernel).
//   Usage (4.3, Eq. (1)): when every dispatch of round r has completed,
//       usage_i += runtime_i * (1 + items_i / items_r)
//     where items_i is the tenant's work-items dispatched in round r and items_r the sum over all
//     dispatches of round r (copies and markers count their runtime with items 0).
//   First chunk size (Eq. (2)): size = floor(cores * beta / N / 64) * 64, with the device's
//     wavefront width in place of 64, rounded down again to a multiple of the block's local size,
//     and never below one such granule. A tenant joining the schedule starts at this size.
//   Later sizes (Algorithm 2): when round r closes, for each tenant i that ran a chunk of a
//   splittable kernel (a short last chunk counts at the scale that would plan its size)
//       size_i(r + 2) = size_i(r) + gain * (fair_r - u_i(r)) * items_i(r) / u_i(r)
//     where u_i(r) is its Eq. (1) charge in round r and fair_r the mean charge of round r. The
//     size is kept as a scale of the Eq. (2) base so that it follows N when tenants come and go,
//     and the scale is clamped to [min_scale, max_scale]. Round r + 1 runs with the sizes decided
//     at r - 1 (or Eq. (2)), so a decision is computed one round ahead and applied two rounds later.
//   Throttle (Algorithm 1, lines 24-27): when round r closes, a tenant whose cumulative usage
//     exceeds throttle_ratio (2) times the least usage among active tenants sits out round r + 2,
//     exactly one round (it cannot sit out two rounds in a row).
//   One active tenant: nothing is split and no usage is recorded; its blocks run whole.
//
// Invariants:
//   - Per-tenant order (policy.h): a tenant's blocks are dispatched in Submit() order; a block's
//     chunks are contiguous and ascending; the next block starts only after the last chunk.
//   - Every chunk but a block's last one has a size that is a positive multiple of
//     lcm(wavefront width, local size), so every chunk starts and ends on work-group boundaries.
//   - Only kernels with Splittable::kYes and work_items divisible into whole work-groups are split.
//   - Work-conserving: Pick() returns nullopt only when no tenant has a block pending.
//
// Not thread-safe; owned by one driver (the simulator or the daemon's scheduler thread).
#pragma once

#include <cstdint>
#include <deque>
#include <limits>
#include <optional>
#include <unordered_map>
#include <vector>

#include "core/policy.h"

namespace gmux::core {

struct SplitPolicyOptions {
  // Eq. (2) beta: the device is given cores * beta work-items per round in the first rounds.
  double beta = 1024;
  // Eq. (2) "Number of GPU Cores". 0: compute_units * wavefront_width of the device (one
  // wavefront of lanes per compute unit; 32 CUs x 64 = 2048 for the paper's Radeon RX 570).
  uint64_t cores = 0;
  // Device facts (from PolicySpec.device). A wavefront width of 0 means the default 64.
  uint64_t compute_units = 1;
  uint64_t wavefront_width = 64;
  // Algorithm 2: fraction of the measured usage gap corrected per decision (1 = the paper's
  // formula, which corrects the whole gap).
  double gain = 1.0;
  // Algorithm 1 line 24: sit out when usage > throttle_ratio * least usage.
  double throttle_ratio = 2.0;
  // Bounds of a chunk size relative to the Eq. (2) base size.
  double min_scale = 1.0 / 16;
  double max_scale = 16;

  // kInvalidArgument naming the offending field.
  Status Validate() const;

  // Eq. (2) cores after defaults are applied.
  uint64_t EffectiveCores() const;
  uint64_t EffectiveWavefront() const { return wavefront_width == 0 ? 64 : wavefront_width; }
};

// Reads beta, cores, gain, throttle_ratio, min_scale, max_scale from spec.params and the device
// from spec.device. kInvalidArgument for unknown keys or values out of range.
Result<SplitPolicyOptions> SplitPolicyOptionsFromSpec(const PolicySpec& spec);

// What the paper's GPGPU task monitor (Section 4.2) tracks for one tenant, read-only.
struct SplitTenantMonitor {
  size_t active_tenants = 0;     // N: tenants in the schedule now (same for every tenant)
  uint64_t total_items = 0;      // kernel work-items submitted since AddTenant (cumulative)
  uint64_t processed_items = 0;  // kernel work-items whose dispatch has completed (cumulative)
  uint64_t remaining_items = 0;  // total - processed: pending or in flight
  // Also useful to publish:
  bool in_schedule = false;      // has work pending or in flight
  double usage_s = 0;            // cumulative Eq. (1) usage
  uint64_t next_chunk_items = 0; // size of the tenant's next chunk if it were picked now (0: none)
  uint64_t rounds = 0;           // rounds in which it ran since it last joined
};

class SplitPolicy final : public Policy {
 public:
  // Precondition: options.Validate() is OK.
  explicit SplitPolicy(const SplitPolicyOptions& options);

  std::string_view name() const override { return "split"; }
  void AddTenant(const Tenant& tenant, TimePoint now) override;
  void SetWeight(TenantId tenant, double weight, TimePoint now) override;
  void RemoveTenant(TenantId tenant, TimePoint now) override;
  void Submit(const CommandBlock& block, TimePoint now) override;
  void Complete(const Completion& done, TimePoint now) override;
  void Tick(TimePoint) override {}
  std::optional<Dispatch> Pick(TimePoint now) override;
  size_t Pending(TenantId tenant) const override;

  // The monitor's view of one tenant; nullopt for an unknown tenant.
  std::optional<SplitTenantMonitor> Monitor(TenantId tenant) const;
  // N, the number of tenants in the schedule.
  size_t ActiveTenants() const { return active_count_; }
  // The current round number (rounds are counted from 1; 0 before the first).
  uint64_t round() const { return round_; }

 private:
  static constexpr uint32_t kNil = std::numeric_limits<uint32_t>::max();
  static constexpr uint64_t kNoRound = std::numeric_limits<uint64_t>::max();

  struct Block {
    BlockId id;
    BlockKind kind;
    uint64_t work_items;
    uint64_t granule;  // chunk sizes are multiples of this; 0: never split
  };
  // An Algorithm 2 / throttle decision taken at the close of round apply_round - 2.
  struct Plan {
    uint64_t apply_round;
    double scale;  // < 0: keep the current scale
    bool sit_out;
  };
  struct InFlight {
    BlockId block;
    uint64_t begin;
    uint64_t items;  // kernel work-items in the dispatch (0 for copies and markers)
    uint64_t round;  // kNoRound: dispatched while only one tenant was active
    uint32_t entry;  // index in that round's entries
  };
  struct TenantState {
    TenantId id = 0;
    uint32_t gen = 0;    // bumped when the slot is freed
    uint32_t epoch = 0;  // bumped each time the tenant joins the schedule
    std::deque<Block> queue;
    uint64_t next = 0;   // first undispatched work-item of queue.front()
    std::deque<InFlight> in_flight;
    bool in_schedule = false;
    uint32_t ring_prev = kNil;
    uint32_t ring_next = kNil;
    double usage_s = 0;
    double weight = 1.0;   // Tenant::weight; usage is compared per unit of weight
    bool charged = false;  // charged in at least one round since it joined
    double scale = 1.0;
    std::deque<Plan> plans;
    uint64_t sit_out_round = kNoRound;
    uint64_t last_dispatch_round = kNoRound;  // at most one dispatch per round
    uint64_t rounds = 0;
    uint64_t total_items = 0;
    uint64_t processed_items = 0;
  };
  // One dispatch of a round.
  struct Entry {
    uint32_t slot;
    uint32_t gen;
    uint32_t epoch;
    bool live;     // false once its tenant was removed
    bool regular;  // a chunk of a splittable kernel (Algorithm 2 learns only from these)
    uint64_t items;
    double scale;     // the scale that plans exactly `items` (the tenant's, for a full chunk)
    Duration runtime;
    double usage_s;   // its Eq. (1) charge, set when the round closes
  };
  struct Round {
    uint64_t number = 0;
    bool picking_done = false;
    uint32_t outstanding = 0;
    std::vector<Entry> entries;
  };

  uint32_t SlotOf(TenantId tenant) const;
  void Join(uint32_t slot);
  void Leave(uint32_t slot);
  void StartRound();
  void EndPicking();
  void TryCloseRounds();
  void CloseRound(Round& round);
  void ApplyPlans(TenantState& t);
  double BaseSize() const;  // Eq. (2) before rounding
  uint64_t ChunkSize(const TenantState& t, uint64_t granule) const;
  Dispatch DispatchHead(uint32_t slot, bool in_round);
  Round* FindRound(uint64_t number);

  SplitPolicyOptions options_;
  uint64_t cores_;
  uint64_t width_;

  std::vector<TenantState> slots_;
  std::vector<uint32_t> free_slots_;
  std::unordered_map<TenantId, uint32_t> slot_of_;

  // The ring of tenants in the schedule, in join order.
  uint32_t ring_head_ = kNil;
  uint32_t ring_tail_ = kNil;
  uint32_t cursor_ = kNil;  // next tenant to visit in the current round
  size_t active_count_ = 0;
  size_t ready_count_ = 0;  // tenants with a block pending

  uint64_t round_ = 0;
  bool round_open_ = false;
  std::deque<Round> rounds_;  // rounds not yet closed, oldest first
  std::vector<std::vector<Entry>> spare_entries_;
  double min_usage_s_ = 0;  // least usage per unit of weight among charged tenants in the
                            // schedule, at the last close
};

}  // namespace gmux::core
