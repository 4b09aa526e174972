#include "core/split_policy.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <numeric>
#include <string>

#include "core/params.h"

namespace gmux::core {

Status SplitPolicyOptions::Validate() const {
  if (!std::isfinite(beta) || beta <= 0) return InvalidArgument("split: beta must be > 0");
  if (cores == 0 && compute_units == 0) {
    return InvalidArgument("split: the device reports 0 compute units and no 'cores' is given");
  }
  if (!std::isfinite(gain) || gain < 0 || gain > 4) {
    return InvalidArgument("split: gain must be in [0, 4]");
  }
  if (!std::isfinite(throttle_ratio) || throttle_ratio < 1) {
    return InvalidArgument("split: throttle_ratio must be >= 1");
  }
  if (!std::isfinite(min_scale) || min_scale <= 0 || min_scale > 1) {
    return InvalidArgument("split: min_scale must be in (0, 1]");
  }
  if (!std::isfinite(max_scale) || max_scale < 1) {
    return InvalidArgument("split: max_scale must be >= 1");
  }
  return Status::Ok();
}

uint64_t SplitPolicyOptions::EffectiveCores() const {
  return cores != 0 ? cores : compute_units * EffectiveWavefront();
}

Result<SplitPolicyOptions> SplitPolicyOptionsFromSpec(const PolicySpec& spec) {
  SplitPolicyOptions o;
  o.compute_units = spec.device.compute_units;
  o.wavefront_width = spec.device.wavefront_width;
  ParamReader params("policy split", spec.params);
  GMUX_ASSIGN_OR_RETURN(o.beta, params.Number("beta", o.beta, 1e-6, 1e9));
  GMUX_ASSIGN_OR_RETURN(int64_t cores, params.Integer("cores", 0, 0, int64_t{1} << 40));
  o.cores = static_cast<uint64_t>(cores);
  GMUX_ASSIGN_OR_RETURN(o.gain, params.Number("gain", o.gain, 0, 4));
  GMUX_ASSIGN_OR_RETURN(o.throttle_ratio,
                        params.Number("throttle_ratio", o.throttle_ratio, 1, 1e12));
  GMUX_ASSIGN_OR_RETURN(o.min_scale, params.Number("min_scale", o.min_scale, 1e-6, 1));
  GMUX_ASSIGN_OR_RETURN(o.max_scale, params.Number("max_scale", o.max_scale, 1, 1e6));
  GMUX_RETURN_IF_ERROR(params.Finish());
  GMUX_RETURN_IF_ERROR(o.Validate());
  return o;
}

SplitPolicy::SplitPolicy(const SplitPolicyOptions& options)
    : options_(options), cores_(options.EffectiveCores()), width_(options.EffectiveWavefront()) {
  assert(options_.Validate().ok());
}

uint32_t SplitPolicy::SlotOf(TenantId tenant) const {
  auto it = slot_of_.find(tenant);
  return it == slot_of_.end() ? kNil : it->second;
}

void SplitPolicy::SetWeight(TenantId tenant, double weight, TimePoint) {
  const uint32_t slot = SlotOf(tenant);
  if (slot == kNil || !(weight > 0)) return;
  // Usage is compared per unit of weight: scaled with the weight, the tenant keeps its place
  // (no catch-up burst for what it used under the old weight, no penalty either).
  TenantState& t = slots_[slot];
  t.usage_s *= weight / t.weight;
  t.weight = weight;
}

void SplitPolicy::AddTenant(const Tenant& tenant, TimePoint) {
  assert(SlotOf(tenant.id) == kNil);
  uint32_t slot;
  if (!free_slots_.empty()) {
    slot = free_slots_.back();
    free_slots_.pop_back();
  } else {
    slot = static_cast<uint32_t>(slots_.size());
    slots_.emplace_back();
  }
  slots_[slot].id = tenant.id;
  slots_[slot].weight = tenant.weight;
  slot_of_[tenant.id] = slot;
}

void SplitPolicy::RemoveTenant(TenantId tenant, TimePoint) {
  uint32_t slot = SlotOf(tenant);
  if (slot == kNil) return;
  TenantState& t = slots_[slot];
  if (!t.queue.empty()) --ready_count_;
  // In-flight dispatches no longer hold their round open; their late Complete() is ignored.
  for (const InFlight& f : t.in_flight) {
    if (Round* r = FindRound(f.round)) {
      r->entries[f.entry].live = false;
      --r->outstanding;
    }
  }
  t.queue.clear();
  t.in_flight.clear();
  if (t.in_schedule) Leave(slot);
  uint32_t gen = t.gen + 1;
  t = TenantState{};
  t.gen = gen;
  free_slots_.push_back(slot);
  slot_of_.erase(tenant);
  TryCloseRounds();
}

void SplitPolicy::Submit(const CommandBlock& block, TimePoint) {
  uint32_t slot = SlotOf(block.tenant);
  assert(slot != kNil);
  TenantState& t = slots_[slot];
  Block b{block.id, block.kind, block.work_items, 0};
  if (block.kind == BlockKind::kKernel) {
    t.total_items += block.work_items;
    // Split only on whole work-groups: the local size must divide the global size exactly.
    if (block.splittable == Splittable::kYes && block.work_items > 0 && block.work_groups > 0 &&
        block.work_items % block.work_groups == 0) {
      b.granule = std::lcm(width_, block.local_size());
    }
  }
  t.queue.push_back(b);
  if (t.queue.size() == 1) ++ready_count_;
  if (!t.in_schedule) Join(slot);
}

void SplitPolicy::Join(uint32_t slot) {
  TenantState& t = slots_[slot];
  t.in_schedule = true;
  ++t.epoch;
  t.ring_prev = ring_tail_;
  t.ring_next = kNil;
  if (ring_tail_ != kNil) {
    slots_[ring_tail_].ring_next = slot;
  } else {
    ring_head_ = slot;
  }
  ring_tail_ = slot;
  ++active_count_;
  // A new task starts over at Eq. (2) (its first two rounds run at scale 1).
  t.scale = 1.0;
  t.plans.clear();
  t.sit_out_round = kNoRound;
  t.rounds = 0;
  t.charged = false;
  // Usage persists per tenant, but a tenant that was idle is brought up to the least usage of the
  // schedule so that the time it spent idle is not a credit that throttles everyone else.
  t.usage_s = std::max(t.usage_s, min_usage_s_ * t.weight);
}

void SplitPolicy::Leave(uint32_t slot) {
  TenantState& t = slots_[slot];
  assert(t.in_schedule);
  if (cursor_ == slot) cursor_ = t.ring_next;
  if (t.ring_prev != kNil) {
    slots_[t.ring_prev].ring_next = t.ring_next;
  } else {
    ring_head_ = t.ring_next;
  }
  if (t.ring_next != kNil) {
    slots_[t.ring_next].ring_prev = t.ring_prev;
  } else {
    ring_tail_ = t.ring_prev;
  }
  t.ring_prev = t.ring_next = kNil;
  t.in_schedule = false;
  t.plans.clear();
  --active_count_;
  // Scheduling acts only with two or more tenants: the round in progress ends here.
  if (active_count_ < 2 && round_open_) EndPicking();
}

SplitPolicy::Round* SplitPolicy::FindRound(uint64_t number) {
  if (number == kNoRound || rounds_.empty()) return nullptr;
  uint64_t first = rounds_.front().number;
  if (number < first || number - first >= rounds_.size()) return nullptr;
  return &rounds_[number - first];
}

void SplitPolicy::StartRound() {
  Round r;
  r.number = ++round_;
  if (!spare_entries_.empty()) {
    r.entries = std::move(spare_entries_.back());
    spare_entries_.pop_back();
  }
  rounds_.push_back(std::move(r));
  round_open_ = true;
  cursor_ = ring_head_;
}

void SplitPolicy::EndPicking() {
  assert(round_open_);
  rounds_.back().picking_done = true;
  round_open_ = false;
  cursor_ = kNil;
  TryCloseRounds();
}

void SplitPolicy::TryCloseRounds() {
  // Rounds close in order so that the decisions of round r are queued before those of r + 1.
  while (!rounds_.empty() && rounds_.front().picking_done && rounds_.front().outstanding == 0) {
    CloseRound(rounds_.front());
    rounds_.front().entries.clear();
    spare_entries_.push_back(std::move(rounds_.front().entries));
    rounds_.pop_front();
  }
}

void SplitPolicy::CloseRound(Round& round) {
  auto valid = [this](const Entry& e) { return e.live && slots_[e.slot].gen == e.gen; };

  // Eq. (1): every dispatch of the round is charged against the same denominator, the work-items
  // of all dispatches in the round, whatever its position in the round.
  uint64_t round_items = 0;
  for (const Entry& e : round.entries) {
    if (valid(e)) round_items += e.items;
  }
  double sum_usage = 0;
  size_t ran = 0;
  for (Entry& e : round.entries) {
    if (!valid(e)) continue;
    double share = round_items > 0 ? static_cast<double>(e.items) / round_items : 0.0;
    e.usage_s = ToSeconds(e.runtime) * (1.0 + share);  // Eq. (1)
    TenantState& t = slots_[e.slot];
    t.usage_s += e.usage_s;
    t.charged = true;
    sum_usage += e.usage_s;
    ++ran;
  }

  // Least usage in the schedule (Sched_Info->GPU_usage_minVM), among tenants charged since they
  // joined; a tenant that has not run yet has no measurement to compare. Usage is compared per
  // unit of weight (docs/policies.md, split, "Weights"): with equal weights this is the paper's
  // rule unchanged.
  double min_usage = std::numeric_limits<double>::infinity();
  size_t charged = 0;
  for (uint32_t s = ring_head_; s != kNil; s = slots_[s].ring_next) {
    if (!slots_[s].charged) continue;
    min_usage = std::min(min_usage, slots_[s].usage_s / slots_[s].weight);
    ++charged;
  }
  if (charged > 0) min_usage_s_ = min_usage;

  if (active_count_ < 2 || ran == 0) return;
  // The round's usage shared out by weight: a tenant's fair part is sum_usage * w / sum_w.
  double sum_weight = 0;
  for (const Entry& e : round.entries) {
    if (valid(e)) sum_weight += slots_[e.slot].weight;
  }
  for (const Entry& e : round.entries) {
    if (!valid(e)) continue;
    TenantState& t = slots_[e.slot];
    if (!t.in_schedule || t.epoch != e.epoch) continue;  // left (or left and came back) since
    Plan p{round.number + 2, -1.0, false};
    // Algorithm 2: size(r + 2) = size(r) + gain * (fair - u) * items / u, i.e. a relative change
    // of gain * (fair / u - 1). Learned from the chunks of splittable kernels, a short last chunk
    // at its own effective scale (DispatchHead).
    if (ran >= 2 && e.regular && e.usage_s > 0) {
      const double fair = sum_usage * t.weight / sum_weight;
      double scale = e.scale * (1.0 + options_.gain * (fair / e.usage_s - 1.0));
      p.scale = std::clamp(scale, options_.min_scale, options_.max_scale);
    }
    // Algorithm 1, lines 24-27.
    if (charged >= 2 && min_usage > 0 &&
        t.usage_s / t.weight > options_.throttle_ratio * min_usage) {
      p.sit_out = true;
    }
    t.plans.push_back(p);
  }
}

void SplitPolicy::ApplyPlans(TenantState& t) {
  while (!t.plans.empty() && t.plans.front().apply_round <= round_) {
    Plan p = t.plans.front();
    t.plans.pop_front();
    if (p.scale >= 0) t.scale = p.scale;
    // Exactly one round: a tenant that sat out the previous round runs in this one.
    if (p.sit_out && p.apply_round == round_ && t.sit_out_round + 1 != round_) {
      t.sit_out_round = round_;
    }
  }
}

double SplitPolicy::BaseSize() const {
  // Eq. (2) before rounding: cores * beta / N.
  return static_cast<double>(cores_) * options_.beta /
         static_cast<double>(std::max<size_t>(active_count_, 1));
}

uint64_t SplitPolicy::ChunkSize(const TenantState& t, uint64_t granule) const {
  // Eq. (2), rounded down to the wavefront width and to whole work-groups; never 0.
  double raw = t.scale * BaseSize();
  double g = static_cast<double>(granule);
  // The tolerance keeps a size that Algorithm 2 computed exactly (2.0 * S) from losing a granule
  // to floating-point error (1.9999999 * S).
  double granules = std::floor(raw / g * (1 + 1e-9));
  if (!(granules >= 1)) return granule;
  return static_cast<uint64_t>(granules) * granule;
}

Dispatch SplitPolicy::DispatchHead(uint32_t slot, bool in_round) {
  TenantState& t = slots_[slot];
  const Block b = t.queue.front();
  uint64_t remaining = b.work_items - t.next;
  uint64_t size = remaining;
  bool regular = false;
  double scale = t.scale;
  if (in_round && b.granule > 0) {
    uint64_t planned = ChunkSize(t, b.granule);
    if (planned <= remaining) {
      size = planned;
    } else {
      // The block's rest is shorter than the planned chunk: Algorithm 2 learns from it at the
      // scale that would have planned exactly this many work-items (its rate is what counts).
      // Without this, a tenant whose scale drifted above its launch size would run whole
      // launches, never learn again, and keep the larger share.
      scale = t.scale * static_cast<double>(remaining) / static_cast<double>(planned);
    }
    regular = true;
  }
  Dispatch d{t.id, b.id, WorkRange{t.next, t.next + size}, t.next + size == b.work_items};
  t.next += size;
  if (d.last) {
    t.queue.pop_front();
    t.next = 0;
    if (t.queue.empty()) --ready_count_;
  }
  uint64_t items = b.kind == BlockKind::kKernel ? size : 0;
  InFlight f{d.block, d.range.begin, items, kNoRound, 0};
  if (in_round) {
    Round& r = rounds_.back();
    f.round = r.number;
    f.entry = static_cast<uint32_t>(r.entries.size());
    r.entries.push_back(Entry{slot, t.gen, t.epoch, true, regular, items, scale, Duration{0}, 0});
    ++r.outstanding;
    t.last_dispatch_round = r.number;
    ++t.rounds;
  }
  t.in_flight.push_back(f);
  return d;
}

std::optional<Dispatch> SplitPolicy::Pick(TimePoint) {
  if (ready_count_ == 0) return std::nullopt;
  if (active_count_ < 2) {
    // One tenant in the schedule (the one with pending work): nothing to share, run it whole.
    assert(ring_head_ != kNil && !slots_[ring_head_].queue.empty());
    return DispatchHead(ring_head_, false);
  }
  if (!round_open_) StartRound();
  // Some ready tenant runs within three passes: a tenant sits out at most one round in a row.
  for (int wraps = 0; wraps <= 3;) {
    if (cursor_ == kNil) {
      ++wraps;
      EndPicking();
      StartRound();
      continue;
    }
    uint32_t slot = cursor_;
    TenantState& t = slots_[slot];
    cursor_ = t.ring_next;
    if (t.queue.empty() || t.last_dispatch_round == round_) continue;
    ApplyPlans(t);
    if (t.sit_out_round == round_) continue;
    return DispatchHead(slot, true);
  }
  assert(false && "split: no dispatch although work is pending");
  return std::nullopt;
}

void SplitPolicy::Complete(const Completion& done, TimePoint) {
  uint32_t slot = SlotOf(done.tenant);
  if (slot == kNil) return;  // removed; its rounds were already released
  TenantState& t = slots_[slot];
  auto it = std::find_if(t.in_flight.begin(), t.in_flight.end(), [&](const InFlight& f) {
    return f.block == done.block && f.begin == done.range.begin;
  });
  assert(it != t.in_flight.end() && "split: completion for a dispatch not in flight");
  if (it == t.in_flight.end()) return;
  InFlight f = *it;
  t.in_flight.erase(it);
  t.processed_items += f.items;
  if (Round* r = FindRound(f.round)) {
    r->entries[f.entry].runtime += done.device_time;
    --r->outstanding;
  }
  // The tenant's work is done: it leaves the schedule (Algorithm 2, lines 23-25).
  if (t.in_schedule && t.queue.empty() && t.in_flight.empty()) Leave(slot);
  TryCloseRounds();
}

size_t SplitPolicy::Pending(TenantId tenant) const {
  uint32_t slot = SlotOf(tenant);
  return slot == kNil ? 0 : slots_[slot].queue.size();
}

std::optional<SplitTenantMonitor> SplitPolicy::Monitor(TenantId tenant) const {
  uint32_t slot = SlotOf(tenant);
  if (slot == kNil) return std::nullopt;
  const TenantState& t = slots_[slot];
  SplitTenantMonitor m;
  m.active_tenants = active_count_;
  m.total_items = t.total_items;
  m.processed_items = t.processed_items;
  m.remaining_items = t.total_items - t.processed_items;
  m.in_schedule = t.in_schedule;
  m.usage_s = t.usage_s;
  m.rounds = t.rounds;
  if (!t.queue.empty()) {
    const Block& b = t.queue.front();
    uint64_t remaining = b.work_items - t.next;
    m.next_chunk_items = (active_count_ >= 2 && b.granule > 0)
                             ? std::min(ChunkSize(t, b.granule), remaining)
                             : remaining;
  }
  return m;
}

}  // namespace gmux::core
