#include "core/slot_allocator.h"

#include <algorithm>
#include <cassert>
#include <numeric>
#include <string>

namespace gmux::core {

std::string_view SlotPolicyName(SlotPolicy policy) {
  switch (policy) {
    case SlotPolicy::kBaseline: return "baseline";
    case SlotPolicy::kSize: return "size";
    case SlotPolicy::kUtilization: return "utilization";
  }
  return "?";
}

Result<SlotPolicy> ParseSlotPolicy(std::string_view name) {
  for (SlotPolicy p : {SlotPolicy::kBaseline, SlotPolicy::kSize, SlotPolicy::kUtilization}) {
    if (SlotPolicyName(p) == name) return p;
  }
  return InvalidArgument("unknown slot policy '" + std::string(name) +
                         "' (expected one of: baseline, size, utilization)");
}

Status SlotAllocatorOptions::Validate() const {
  if (slots < 1) return InvalidArgument("slots must be >= 1, got " + std::to_string(slots));
  if (monitor_period <= Duration::zero()) return InvalidArgument("monitor_period must be > 0");
  if (idle_threshold <= Duration::zero()) return InvalidArgument("idle_threshold must be > 0");
  if (utilization_window <= Duration::zero()) {
    return InvalidArgument("utilization_window must be > 0");
  }
  if (replacement_period < Duration::zero()) {
    return InvalidArgument("replacement_period must be >= 0 (0 disables re-placement)");
  }
  return Status::Ok();
}

namespace {

// Fig. 5 and Fig. 6 share their structure: walk `order`, packing tenants left to right from
// slot 0 while they fit without sharing (V_0..V_{K-1}); V_K is the first that does not fit.
// The policies differ in the order and in where V_K..V_{N-1} go.
size_t PackLeft(int32_t slots, const std::vector<SlotItem>& items, const std::vector<size_t>& order,
                std::vector<int32_t>& starts) {
  int32_t next_free = 0;
  for (size_t k = 0; k < order.size(); ++k) {
    const SlotItem& it = items[order[k]];
    assert(it.need >= 1 && it.need <= slots);
    if (next_free + it.need > slots) return k;
    starts[order[k]] = next_free;
    next_free += it.need;
  }
  return order.size();
}

}  // namespace

SlotLayout SizeBasedLayout(int32_t slots, const std::vector<SlotItem>& items) {
  std::vector<size_t> order(items.size());
  std::iota(order.begin(), order.end(), size_t{0});
  // Fig. 5: non-increasing S_i; equal sizes keep the lower id first (deterministic).
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (items[a].need != items[b].need) return items[a].need > items[b].need;
    return items[a].id < items[b].id;
  });
  SlotLayout out;
  out.starts.assign(items.size(), 0);
  size_t k = PackLeft(slots, items, order, out.starts);
  if (k == order.size()) return out;
  // V_K at the rightmost end. It cannot fit in the free tail, so it overlaps V_{K-1}: the shared
  // region L starts at P_K. Every later tenant is no larger than V_K (sorted), so P_K + S_j <= M.
  int32_t pk = slots - items[order[k]].need;
  out.shared_start = pk;
  for (size_t j = k; j < order.size(); ++j) out.starts[order[j]] = pk;
  return out;
}

SlotLayout UtilizationBasedLayout(int32_t slots, const std::vector<SlotItem>& items) {
  std::vector<size_t> order(items.size());
  std::iota(order.begin(), order.end(), size_t{0});
  // Fig. 6: non-increasing utilisation. Ties (e.g. before any sample) fall back to Fig. 5's
  // order, so with no history the packed part is the size-based one.
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (items[a].utilization != items[b].utilization) {
      return items[a].utilization > items[b].utilization;
    }
    if (items[a].need != items[b].need) return items[a].need > items[b].need;
    return items[a].id < items[b].id;
  });
  SlotLayout out;
  out.starts.assign(items.size(), 0);
  size_t k = PackLeft(slots, items, order, out.starts);
  if (k == order.size()) return out;
  // V_K..V_{N-1} each at the rightmost end (P_j = M - S_j).
  out.shared_start = slots - items[order[k]].need;
  for (size_t j = k; j < order.size(); ++j) out.starts[order[j]] = slots - items[order[j]].need;
  return out;
}

namespace {

// Σ over each window [p, p + need) of the per-slot weight units (1 per occupied slot, or the
// occupant count), by a sliding window: O(M).
std::vector<int64_t> WindowUnits(const std::vector<int32_t>& occupancy, int32_t need,
                                 bool per_occupant) {
  auto unit = [&](size_t s) -> int64_t {
    return per_occupant ? occupancy[s] : (occupancy[s] > 0 ? 1 : 0);
  };
  size_t m = occupancy.size();
  size_t n = static_cast<size_t>(need);
  assert(need >= 1 && n <= m);
  std::vector<int64_t> out(m - n + 1);
  int64_t sum = 0;
  for (size_t s = 0; s < n; ++s) sum += unit(s);
  out[0] = sum;
  for (size_t p = 1; p + n <= m; ++p) {
    sum += unit(p + n - 1) - unit(p - 1);
    out[p] = sum;
  }
  return out;
}

}  // namespace

std::vector<double> GScaleScores(const std::vector<int32_t>& occupancy, int32_t need,
                                 bool weight_per_occupant) {
  std::vector<int64_t> units = WindowUnits(occupancy, need, weight_per_occupant);
  std::vector<double> out(units.size());
  for (size_t p = 0; p < units.size(); ++p) {
    out[p] = kGScaleOccupiedWeight * static_cast<double>(units[p]);
  }
  return out;
}

int32_t GScaleStart(const std::vector<int32_t>& occupancy, int32_t need, bool weight_per_occupant) {
  // Compare integer unit counts: exact, and the same argmin as W * units for any W > 0.
  std::vector<int64_t> units = WindowUnits(occupancy, need, weight_per_occupant);
  // min_element returns the first minimum: the leftmost start on ties.
  return static_cast<int32_t>(std::min_element(units.begin(), units.end()) - units.begin());
}

int32_t CountSharedSlots(int32_t slots, const std::vector<int32_t>& needs,
                         const std::vector<int32_t>& starts) {
  assert(needs.size() == starts.size());
  std::vector<int32_t> diff(static_cast<size_t>(slots) + 1, 0);
  for (size_t i = 0; i < needs.size(); ++i) {
    diff[static_cast<size_t>(starts[i])] += 1;
    diff[static_cast<size_t>(starts[i] + needs[i])] -= 1;
  }
  int32_t cover = 0, shared = 0;
  for (int32_t s = 0; s < slots; ++s) {
    cover += diff[static_cast<size_t>(s)];
    if (cover >= 2) ++shared;
  }
  return shared;
}

double WeightedSharedSlots(int32_t slots, const std::vector<SlotItem>& items,
                           const std::vector<int32_t>& starts) {
  assert(items.size() == starts.size());
  std::vector<int32_t> cover(static_cast<size_t>(slots), 0);
  for (size_t i = 0; i < items.size(); ++i) {
    for (int32_t s = starts[i]; s < starts[i] + items[i].need; ++s) ++cover[static_cast<size_t>(s)];
  }
  double cost = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    int32_t shared = 0;
    for (int32_t s = starts[i]; s < starts[i] + items[i].need; ++s) {
      if (cover[static_cast<size_t>(s)] >= 2) ++shared;
    }
    cost += items[i].utilization * shared;
  }
  return cost;
}

// ---------------------------------------------------------------------------------------------

Result<SlotAllocator> SlotAllocator::Create(const SlotAllocatorOptions& options) {
  GMUX_RETURN_IF_ERROR(options.Validate().WithPrefix("slot allocator"));
  return SlotAllocator(options);
}

SlotAllocator::SlotAllocator(const SlotAllocatorOptions& options)
    : options_(options),
      occupancy_(static_cast<size_t>(options.slots), 0),
      owner_(static_cast<size_t>(options.slots), kNoTenant) {}

void SlotAllocator::EnsureStarted(TimePoint now) {
  if (started_) return;
  started_ = true;
  last_sample_ = now;
  next_sample_ = now + options_.monitor_period;
  next_replacement_ = now + options_.replacement_period;
}

Status SlotAllocator::AddTenant(TenantId id, int32_t slots, TimePoint now) {
  if (tenants_.count(id) != 0) {
    return AlreadyExists("slot allocator: tenant " + std::to_string(id) + " already exists");
  }
  if (slots < 1 || slots > options_.slots) {
    return InvalidArgument("slot allocator: tenant " + std::to_string(id) + " needs " +
                           std::to_string(slots) + " slots; must be in [1, " +
                           std::to_string(options_.slots) + "]");
  }
  EnsureStarted(now);
  State& s = tenants_[id];
  s.need = slots;
  s.last_use = now;
  PlaceNew(id, s);
  return Status::Ok();
}

Status SlotAllocator::RemoveTenant(TenantId id, TimePoint now) {
  auto it = tenants_.find(id);
  if (it == tenants_.end()) {
    return NotFound("slot allocator: unknown tenant " + std::to_string(id));
  }
  EnsureStarted(now);
  if (it->second.start >= 0 && Unplace(id, it->second) && dymgpu()) ReallocateAll();
  tenants_.erase(it);
  return Status::Ok();
}

Result<int64_t> SlotAllocator::SwitchTo(TenantId id, TimePoint now) {
  auto it = tenants_.find(id);
  if (it == tenants_.end()) {
    return NotFound("slot allocator: unknown tenant " + std::to_string(id));
  }
  EnsureStarted(now);
  State& s = it->second;
  s.last_use = std::max(s.last_use, now);
  if (s.start < 0) PlaceNew(id, s);  // an idle tenant comes back as a new one
  if (active_ == id) return int64_t{0};
  // Copy in every slot of the range whose physical entries belong to someone else (or nobody).
  int64_t copies = 0;
  for (int32_t slot = s.start; slot < s.start + s.need; ++slot) {
    TenantId& owner = owner_[static_cast<size_t>(slot)];
    if (owner != id) {
      owner = id;
      ++copies;
    }
  }
  active_ = id;
  ++s.switch_ins;
  s.copies += copies;
  ++counters_.switches;
  counters_.switch_copies += copies;
  return copies;
}

Status SlotAllocator::RecordUse(TenantId id, TimePoint start, TimePoint end) {
  auto it = tenants_.find(id);
  if (it == tenants_.end()) {
    return NotFound("slot allocator: unknown tenant " + std::to_string(id));
  }
  if (end < start) return InvalidArgument("slot allocator: use ends before it starts");
  EnsureStarted(start);
  State& s = it->second;
  s.busy_since_sample += end - start;
  s.last_use = std::max(s.last_use, end);
  if (s.start < 0) PlaceNew(id, s);
  return Status::Ok();
}

void SlotAllocator::Tick(TimePoint now) {
  EnsureStarted(now);
  if (now >= next_sample_) {
    // One sample covering everything since the previous one (several periods if called late).
    Duration length = now - last_sample_;
    for (auto& [id, s] : tenants_) {
      Duration busy = std::min(s.busy_since_sample, length);
      s.samples.push_back(Sample{now, length, busy});
      s.busy_since_sample = Duration::zero();
      while (!s.samples.empty() && s.samples.front().end <= now - options_.utilization_window) {
        s.samples.pop_front();
      }
    }
    last_sample_ = now;
    while (next_sample_ <= now) next_sample_ += options_.monitor_period;

    // Idle detection (Section III-A): unused for the threshold -> treated as terminated. All
    // idle tenants leave together so that at most one re-placement follows.
    if (dymgpu() && options_.idle_detection) {
      bool realloc = false;
      for (auto& [id, s] : tenants_) {
        if (s.start >= 0 && now - s.last_use >= options_.idle_threshold) {
          realloc = Unplace(id, s) || realloc;
          ++counters_.idle_evictions;
        }
      }
      if (realloc) ReallocateAll();
    }
  }
  if (options_.policy == SlotPolicy::kUtilization &&
      options_.replacement_period > Duration::zero() && now >= next_replacement_) {
    ReallocateAll(options_.replacement_only_if_better);
    while (next_replacement_ <= now) next_replacement_ += options_.replacement_period;
  }
}

Result<int32_t> SlotAllocator::StartOf(TenantId id) const {
  auto it = tenants_.find(id);
  if (it == tenants_.end()) {
    return NotFound("slot allocator: unknown tenant " + std::to_string(id));
  }
  if (it->second.start < 0) {
    return FailedPrecondition("slot allocator: tenant " + std::to_string(id) +
                              " is idle and holds no slots");
  }
  return it->second.start;
}

double SlotAllocator::Utilization(TenantId id) const {
  auto it = tenants_.find(id);
  return it == tenants_.end() ? 0.0 : AverageUtilization(it->second);
}

double SlotAllocator::AverageUtilization(const State& s) const {
  Duration busy{0}, length{0};
  for (const Sample& x : s.samples) {
    busy += x.busy;
    length += x.length;
  }
  if (length <= Duration::zero()) return 0;
  return static_cast<double>(busy.count()) / static_cast<double>(length.count());
}

int32_t SlotAllocator::SharedSlots() const {
  return static_cast<int32_t>(
      std::count_if(occupancy_.begin(), occupancy_.end(), [](int32_t c) { return c >= 2; }));
}

int32_t SlotAllocator::SharedRegionLength() const {
  return anchor_ ? SharedRunFrom(*anchor_) : 0;
}

std::vector<SlotTenantInfo> SlotAllocator::Tenants() const {
  std::vector<SlotTenantInfo> out;
  out.reserve(tenants_.size());
  for (const auto& [id, s] : tenants_) {
    SlotTenantInfo info;
    info.id = id;
    info.need = s.need;
    if (s.start >= 0) info.start = s.start;
    info.utilization = AverageUtilization(s);
    info.switch_ins = s.switch_ins;
    info.copies = s.copies;
    info.moves = s.moves;
    out.push_back(info);
  }
  return out;
}

// --- layout maintenance -----------------------------------------------------------------------

void SlotAllocator::Cover(int32_t start, int32_t need, int32_t delta) {
  for (int32_t slot = start; slot < start + need; ++slot) {
    occupancy_[static_cast<size_t>(slot)] += delta;
  }
}

std::optional<int32_t> SlotAllocator::FirstFreeRun(int32_t need) const {
  int32_t run = 0;
  for (int32_t slot = 0; slot < options_.slots; ++slot) {
    run = occupancy_[static_cast<size_t>(slot)] == 0 ? run + 1 : 0;
    if (run == need) return slot - need + 1;
  }
  return std::nullopt;
}

int32_t SlotAllocator::SharedRunFrom(int32_t start) const {
  int32_t slot = start;
  while (slot < options_.slots && occupancy_[static_cast<size_t>(slot)] >= 2) ++slot;
  return slot - start;
}

int32_t SlotAllocator::SharedSlotsWith(int32_t start, int32_t need) const {
  int32_t shared = 0;
  for (int32_t slot = 0; slot < options_.slots; ++slot) {
    int32_t c = occupancy_[static_cast<size_t>(slot)] + (slot >= start && slot < start + need);
    if (c >= 2) ++shared;
  }
  return shared;
}

std::vector<SlotItem> SlotAllocator::PlacedItems(std::optional<TenantId> extra) const {
  std::vector<SlotItem> items;
  items.reserve(tenants_.size());
  for (const auto& [id, s] : tenants_) {
    if (s.start >= 0 || (extra && *extra == id)) {
      items.push_back(SlotItem{id, s.need, AverageUtilization(s)});
    }
  }
  return items;
}

void SlotAllocator::PlaceNew(TenantId id, State& s) {
  assert(s.start < 0);
  const int32_t m = options_.slots;
  int32_t start = 0;
  switch (options_.policy) {
    case SlotPolicy::kBaseline:
      start = GScaleStart(occupancy_, s.need, options_.baseline_weight_per_occupant);
      break;
    case SlotPolicy::kSize: {
      if (auto free = FirstFreeRun(s.need)) {
        start = *free;  // no sharing at all: what Fig. 5 would do for V_0..V_{K-1}
        break;
      }
      if (anchor_ && s.need <= SharedRunFrom(*anchor_)) {
        start = *anchor_;  // on top of L: adds no shared slot
        break;
      }
      // Either on top of L (shifted left if it would run past M), or V_K of a fresh Fig. 5
      // layout when none exists; versus reallocating everything. Fewer shared slots wins; a tie
      // keeps the incremental choice, which moves nobody.
      int32_t candidate = anchor_ ? std::min(*anchor_, m - s.need) : m - s.need;
      int32_t incremental = SharedSlotsWith(candidate, s.need);
      std::vector<SlotItem> items = PlacedItems(id);
      SlotLayout layout = SizeBasedLayout(m, items);
      std::vector<int32_t> needs;
      needs.reserve(items.size());
      for (const SlotItem& it : items) needs.push_back(it.need);
      if (CountSharedSlots(m, needs, layout.starts) < incremental) {
        std::vector<TenantId> ids;
        ids.reserve(items.size());
        for (const SlotItem& it : items) ids.push_back(it.id);
        ApplyLayout(ids, layout);
        anchor_ = layout.shared_start;
        ++counters_.reallocations;
        return;
      }
      start = candidate;
      if (!anchor_) anchor_ = candidate;
      break;
    }
    case SlotPolicy::kUtilization:
      // Fig. 6 for one newcomer with no history (utilisation 0, so last in the order): packed
      // if a free run fits it, otherwise at the rightmost end. The next periodic re-placement
      // moves it by its measured utilisation.
      if (auto free = FirstFreeRun(s.need)) {
        start = *free;
      } else {
        start = m - s.need;
      }
      break;
  }
  s.start = start;
  Cover(start, s.need, +1);
}

bool SlotAllocator::Unplace(TenantId id, State& s) {
  assert(s.start >= 0);
  bool had_exclusive = false;
  for (int32_t slot = s.start; slot < s.start + s.need; ++slot) {
    size_t i = static_cast<size_t>(slot);
    if (occupancy_[i] == 1) had_exclusive = true;
    occupancy_[i] -= 1;
    if (owner_[i] == id) owner_[i] = kNoTenant;
  }
  s.start = -1;
  if (active_ == id) active_ = kNoTenant;
  if (std::all_of(tenants_.begin(), tenants_.end(),
                  [](const auto& kv) { return kv.second.start < 0; })) {
    anchor_.reset();
  }
  return had_exclusive;
}

void SlotAllocator::ReallocateAll(bool only_if_better) {
  std::vector<SlotItem> items = PlacedItems(std::nullopt);
  if (items.empty()) {
    anchor_.reset();
    return;
  }
  SlotLayout layout = options_.policy == SlotPolicy::kUtilization
                          ? UtilizationBasedLayout(options_.slots, items)
                          : SizeBasedLayout(options_.slots, items);
  std::vector<TenantId> ids;
  ids.reserve(items.size());
  for (const SlotItem& it : items) ids.push_back(it.id);
  if (only_if_better) {
    std::vector<int32_t> current;
    current.reserve(items.size());
    for (const SlotItem& it : items) current.push_back(tenants_.at(it.id).start);
    if (WeightedSharedSlots(options_.slots, items, layout.starts) >=
        WeightedSharedSlots(options_.slots, items, current)) {
      ++counters_.skipped_replacements;
      return;
    }
  }
  ApplyLayout(ids, layout);
  anchor_ = options_.policy == SlotPolicy::kSize ? layout.shared_start : std::nullopt;
  ++counters_.reallocations;
}

void SlotAllocator::ApplyLayout(const std::vector<TenantId>& ids, const SlotLayout& layout) {
  assert(ids.size() == layout.starts.size());
  std::vector<size_t> moved;
  for (size_t i = 0; i < ids.size(); ++i) {
    State& s = tenants_.at(ids[i]);
    if (s.start >= 0 && s.start != layout.starts[i]) {
      moved.push_back(i);
      // The old position is invalidated (Section III-B).
      for (int32_t slot = s.start; slot < s.start + s.need; ++slot) {
        if (owner_[static_cast<size_t>(slot)] == ids[i]) owner_[static_cast<size_t>(slot)] = kNoTenant;
      }
    }
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    State& s = tenants_.at(ids[i]);
    if (s.start >= 0) Cover(s.start, s.need, -1);
    s.start = layout.starts[i];
    Cover(s.start, s.need, +1);
  }
  // A moved tenant's entries are copied to its new position, which it then owns.
  for (size_t i : moved) {
    State& s = tenants_.at(ids[i]);
    for (int32_t slot = s.start; slot < s.start + s.need; ++slot) {
      owner_[static_cast<size_t>(slot)] = ids[i];
    }
    ++s.moves;
    ++counters_.moves;
    counters_.move_copies += s.need;
  }
}

}  // namespace gmux::core
