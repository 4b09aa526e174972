#include "core/credit_policy.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <tuple>

#include "core/params.h"

namespace gmux::core {

Status CreditPolicyOptions::Validate() const {
  if (!(credits_per_interval > 0)) {
    return InvalidArgument("credit: credits_per_interval must be > 0");
  }
  if (time_g.count() < 0) return InvalidArgument("credit: time_g_ms must be >= 0");
  if (slice_max.count() <= 0) return InvalidArgument("credit: slice_max_ms must be > 0");
  if (slice_min.count() < 0 || slice_min > slice_max) {
    return InvalidArgument("credit: slice_min_ms must be in [0, slice_max_ms]");
  }
  if (blocks_per_round < 1) return InvalidArgument("credit: blocks_per_round must be >= 1");
  if (num_cap < 0) return InvalidArgument("credit: num_cap must be >= 0");
  if (!(carry_intervals >= 0)) return InvalidArgument("credit: carry_intervals must be >= 0");
  if (idle_grace.count() < 0) return InvalidArgument("credit: idle_grace_ms must be >= 0");
  if (chunk.count() < 0) return InvalidArgument("credit: chunk_ms must be >= 0");
  if (chunk_min.count() <= 0) return InvalidArgument("credit: chunk_min_ms must be > 0");
  if (think_grace_max.count() < 0) return InvalidArgument("credit: think_grace_max_ms must be >= 0");
  return Status::Ok();
}

namespace {

Duration Milliseconds(double ms) { return Duration(std::llround(ms * 1e6)); }

}  // namespace

Result<CreditPolicyOptions> CreditPolicyOptionsFromSpec(const PolicySpec& spec) {
  ParamReader params("policy credit", spec.params);
  CreditPolicyOptions o;
  constexpr double kMaxMs = 3.6e6;  // one hour
  GMUX_ASSIGN_OR_RETURN(o.credits_per_interval,
                        params.Number("credits_per_interval", o.credits_per_interval, 1e-3, 1e12));
  GMUX_ASSIGN_OR_RETURN(double time_g_ms, params.Number("time_g_ms", 0, 0, kMaxMs));
  GMUX_ASSIGN_OR_RETURN(double slice_max_ms, params.Number("slice_max_ms", 16, 1e-3, kMaxMs));
  GMUX_ASSIGN_OR_RETURN(double slice_min_ms, params.Number("slice_min_ms", 1, 0, kMaxMs));
  GMUX_ASSIGN_OR_RETURN(o.blocks_per_round,
                        params.Integer("blocks_per_round", o.blocks_per_round, 1, 1 << 20));
  GMUX_ASSIGN_OR_RETURN(o.num_cap, params.Integer("num_cap", o.num_cap, 0, 1 << 20));
  GMUX_ASSIGN_OR_RETURN(o.carry_intervals,
                        params.Number("carry_intervals", o.carry_intervals, 0, 1e6));
  GMUX_ASSIGN_OR_RETURN(double idle_grace_ms, params.Number("idle_grace_ms", 1, 0, kMaxMs));
  GMUX_ASSIGN_OR_RETURN(int64_t per_round, params.Integer("charge_per_round", 0, 0, 1));
  GMUX_ASSIGN_OR_RETURN(int64_t wall, params.Integer("time_g_wall", 0, 0, 1));
  GMUX_ASSIGN_OR_RETURN(int64_t owed, params.Integer("owed_first", 1, 0, 1));
  GMUX_ASSIGN_OR_RETURN(int64_t split, params.Integer("split_kernels", 1, 0, 1));
  GMUX_ASSIGN_OR_RETURN(double chunk_ms, params.Number("chunk_ms", 0, 0, kMaxMs));
  GMUX_ASSIGN_OR_RETURN(double chunk_min_ms, params.Number("chunk_min_ms", 0.5, 1e-3, kMaxMs));
  GMUX_ASSIGN_OR_RETURN(double think_max_ms, params.Number("think_grace_max_ms", 4, 0, kMaxMs));
  GMUX_RETURN_IF_ERROR(params.Finish());
  o.time_g = Milliseconds(time_g_ms);
  o.slice_max = Milliseconds(slice_max_ms);
  o.slice_min = Milliseconds(slice_min_ms);
  o.idle_grace = Milliseconds(idle_grace_ms);
  o.charge_per_round = per_round == 1;
  o.time_g_wall = wall == 1;
  o.owed_first = owed == 1;
  o.split_kernels = split == 1;
  o.chunk = Milliseconds(chunk_ms);
  o.chunk_min = Milliseconds(chunk_min_ms);
  o.think_grace_max = Milliseconds(think_max_ms);
  GMUX_RETURN_IF_ERROR(o.Validate());
  return o;
}

CreditPolicy::CreditPolicy(const CreditPolicyOptions& options, const DeviceInfo& device)
    : options_(options), device_(device) {
  assert(options_.Validate().ok());
  time_g_ns_ = options_.time_g.count() > 0 ? options_.time_g.count() : options_.slice_max.count();
}

Duration CreditPolicy::credit_value() const {
  return Duration(std::max<int64_t>(
      1, std::llround(static_cast<double>(time_g_ns_) / options_.credits_per_interval)));
}

void CreditPolicy::AddTenant(const Tenant& tenant, TimePoint now) {
  assert(tenants_.count(tenant.id) == 0);
  assert(tenant.weight > 0);
  AdvanceTo(now);
  TenantState& t = tenants_[tenant.id];
  t.info = tenant;
  t.join_seq = next_join_seq_++;
  t.slice_ns = options_.slice_max.count();
  t.rank = static_cast<uint32_t>(order_.size());
  order_.push_back(tenant.id);
}

void CreditPolicy::SetWeight(TenantId tenant, double weight, TimePoint now) {
  auto it = tenants_.find(tenant);
  if (it == tenants_.end() || !(weight > 0)) return;
  // Credits already handed out stand; the next replenishment (Eq. 2) shares by the new weight.
  AdvanceTo(now);
  it->second.info.weight = weight;
}

void CreditPolicy::RemoveTenant(TenantId tenant, TimePoint now) {
  auto it = tenants_.find(tenant);
  if (it != tenants_.end()) {
    TenantState& t = it->second;
    if (t.eligible) eligible_.erase(t.rank);
    if (t.claiming) --claiming_;
    total_pending_ -= t.channel.size();
    total_in_flight_ -= std::min(total_in_flight_, t.in_flight);
    order_[t.rank] = kNoTenant;
    if (turn_tenant_ == tenant) turn_open_ = false;
    tenants_.erase(it);
  }
  AdvanceTo(now);
}

void CreditPolicy::Submit(const CommandBlock& block, TimePoint now) {
  AdvanceTo(now);
  auto it = tenants_.find(block.tenant);
  assert(it != tenants_.end());
  TenantState& t = it->second;
  // Think time: the gap between going quiet and the next command (closed-loop tenants). A gap
  // far past the cap is a tenant that was really idle; it counts at twice the cap.
  if (t.quiet && t.ever_quiet) {
    const int64_t gap = std::min<int64_t>((now - t.quiet_since).count(),
                                          2 * std::max<int64_t>(options_.think_grace_max.count(),
                                                                options_.idle_grace.count()));
    t.think_ns += (std::max<int64_t>(0, gap) - t.think_ns) / 4;
  }
  t.quiet = false;
  // Only whole work-groups can be cut off a launch: a granule is one of its `work_groups`
  // equal parts (model.h), and a launch of one granule runs whole.
  uint64_t granule = 0;
  if (options_.split_kernels && block.kind == BlockKind::kKernel &&
      block.splittable == Splittable::kYes && block.work_groups > 1 &&
      block.work_items % block.work_groups == 0) {
    granule = block.work_items / block.work_groups;
  }
  t.channel.push_back({block.id, block.work_items, granule, 0, block.kind == BlockKind::kKernel});
  ++total_pending_;
  // req[i] += 1 (Section 4.2); the Eq. (2) inputs of the current interval.
  if (block.kind == BlockKind::kCopy) t.copy_bytes += block.bytes;
  t.active = true;
  t.peak_outstanding = std::max(t.peak_outstanding, t.channel.size() + t.in_flight);
  Refresh(t);
}

void CreditPolicy::Complete(const Completion& done, TimePoint now) {
  auto it = tenants_.find(done.tenant);
  if (it != tenants_.end()) {
    TenantState& t = it->second;
    if (t.in_flight > 0) {
      --t.in_flight;
      --total_in_flight_;
    }
    const int64_t d = std::max<int64_t>(0, done.device_time.count());
    if (done.range.size() > 0) {
      // Kernel cost per work-item, for chunk sizes (a chunk of k items costs about k · item_ns).
      const double per_item = static_cast<double>(d) / static_cast<double>(done.range.size());
      t.item_ns = t.item_ns <= 0 ? per_item : t.item_ns + (per_item - t.item_ns) / 4;
    }
    t.open_block_ns += d;
    if (done.last) {
      t.block_ns = t.block_ns == 0 ? t.open_block_ns : t.block_ns + (t.open_block_ns - t.block_ns) / 4;
      t.open_block_ns = 0;
    }
    auto unsplit = std::find(t.unsplit_in_flight.begin(), t.unsplit_in_flight.end(), done.block);
    if (unsplit != t.unsplit_in_flight.end()) {
      t.unsplit_kernel_ns += d;
      t.unsplit_in_flight.erase(unsplit);
    }
    if (!options_.charge_per_round) Charge(t, d);
    served_ns_ += d;
    t.est_block_ns += (d - t.est_block_ns) / 4;
    if (turn_open_ && turn_tenant_ == done.tenant) turn_used_ns_ += d;
    // A credit holder whose last block just finished is probably about to submit the next one
    // (closed loop); its capacity is not spare until idle_grace has passed.
    if (t.channel.empty() && t.in_flight == 0) {
      t.quiet = true;
      t.ever_quiet = true;
      t.quiet_since = now;
    }
    Refresh(t);
  }
  AdvanceTo(now);
}

void CreditPolicy::Tick(TimePoint now) { AdvanceTo(now); }

void CreditPolicy::ReportCpuTime(TenantId tenant, Duration cumulative_cpu, TimePoint now) {
  auto it = tenants_.find(tenant);
  if (it != tenants_.end()) {
    TenantState& t = it->second;
    t.cpu_cumulative_ns = cumulative_cpu.count();
    // A counter that went backwards (the tenant's process restarted) starts a new period.
    t.cpu_period_start_ns = std::min(t.cpu_period_start_ns, t.cpu_cumulative_ns);
  }
  AdvanceTo(now);
}

void CreditPolicy::ReportMemory(TenantId tenant, uint64_t bytes, TimePoint now) {
  auto it = tenants_.find(tenant);
  if (it != tenants_.end()) it->second.memory_bytes = bytes;
  AdvanceTo(now);
}

size_t CreditPolicy::Pending(TenantId tenant) const {
  auto it = tenants_.find(tenant);
  return it == tenants_.end() ? 0 : it->second.channel.size();
}

std::optional<TimePoint> CreditPolicy::NextTimer() const {
  if (!started_ || total_pending_ == 0) return std::nullopt;
  std::optional<TimePoint> next;
  if (options_.time_g_wall) next = interval_end_;
  std::optional<TimePoint> grace = HolderGraceEnd(last_now_);
  if (grace && (!next || *grace < *next)) next = grace;
  if (hold_until_ > last_now_ && (!next || hold_until_ < *next)) next = hold_until_;
  return next;
}

std::optional<Dispatch> CreditPolicy::Pick(TimePoint now) {
  AdvanceTo(now);
  if (options_.owed_first) {
    std::optional<TenantId> next = MostOwed();
    if (!next) {
      // Replenishment trigger (b), as below.
      if (total_pending_ == 0 || claiming_ > 0 || HolderGraceEnd(now)) return std::nullopt;
      Replenish(now, Trigger::kSpareCapacity);
      next = MostOwed();
      if (!next) return std::nullopt;
    }
    TenantState& t = tenants_.at(*next);
    // A closed-loop tenant between a completion and its next command, owed more than the
    // candidate: keep the device's queue to what is already running, so its next command starts
    // after that and not after another tenant's queued work too. The device never idles for it.
    if (total_in_flight_ > 0) {
      const double owed = Owed(t);
      std::optional<TimePoint> hold;
      for (const auto& [id, other] : tenants_) {
        if (id == *next || other.credit1_ns <= 0 || !Thinking(other, now) || !(Owed(other) > owed)) {
          continue;
        }
        const TimePoint end = other.quiet_since + Duration(GraceNs(other));
        if (!hold || end < *hold) hold = end;
      }
      if (hold) {
        hold_until_ = *hold;
        return std::nullopt;
      }
    }
    turn_tenant_ = *next;
    cursor_rank_ = t.rank;
    if (options_.charge_per_round) Charge(t, credit_value().count());
    return DispatchHead(*next, t, now);
  }
  if (turn_open_) {
    auto it = tenants_.find(turn_tenant_);
    if (it != tenants_.end() && CanContinueTurn(it->second)) {
      return DispatchHead(turn_tenant_, it->second, now);
    }
    turn_open_ = false;
  }
  std::optional<TenantId> next = NextEligible();
  if (!next) {
    // Nobody with status 1 has work. Replenishment trigger (b) needs a tenant with pending
    // blocks (all of them have credit1 = 0 here) and spare capacity: no credit holder has work
    // queued or executing, and none went quiet less than idle_grace ago.
    if (total_pending_ == 0 || claiming_ > 0 || HolderGraceEnd(now)) return std::nullopt;
    Replenish(now, Trigger::kSpareCapacity);
    next = NextEligible();
    assert(next.has_value());
    if (!next) return std::nullopt;
  }
  TenantState& t = tenants_.at(*next);
  turn_open_ = true;
  turn_tenant_ = *next;
  turn_blocks_ = 0;
  turn_used_ns_ = 0;
  cursor_rank_ = t.rank;
  // Paper-literal accounting (Algorithm 1 step 28): one credit per round, whatever it runs.
  if (options_.charge_per_round) Charge(t, credit_value().count());
  return DispatchHead(*next, t, now);
}

std::optional<Dispatch> CreditPolicy::PickTenant(TenantId tenant, TimePoint now) {
  AdvanceTo(now);
  auto it = tenants_.find(tenant);
  if (it == tenants_.end() || it->second.channel.empty()) return std::nullopt;
  TenantState& t = it->second;
  // Its turn, as Pick() would open it; the device time is charged at Complete() as for any
  // dispatch (credit1 to zero, the rest as debt repaid from later replenishments), so the
  // out-of-turn work comes out of the tenant's later share.
  if (!turn_open_ || turn_tenant_ != tenant) {
    turn_open_ = !options_.owed_first;
    turn_tenant_ = tenant;
    turn_blocks_ = 0;
    turn_used_ns_ = 0;
    cursor_rank_ = t.rank;
    if (options_.charge_per_round) Charge(t, credit_value().count());
  }
  return DispatchHead(tenant, t, now);
}

bool CreditPolicy::ExpressOk(TenantId tenant, TimePoint now) const {
  auto it = tenants_.find(tenant);
  if (it == tenants_.end()) return false;
  for (const auto& [id, t] : tenants_) {
    // (A tenant within its think grace counts as having work: it may be cut in chunks for.)
    if (id != tenant && WantsDevice(t, now)) return false;
  }
  return it->second.credit1_ns > 0 || !HolderGraceEnd(now, tenant);
}

void CreditPolicy::Express(const CommandBlock& block, TimePoint now) {
  Submit(block, now);
  TenantState& t = tenants_.at(block.tenant);
  // The block is the tenant's only pending one (the driver's precondition), so it is the head.
  assert(t.channel.size() == 1);
  // Out of credit: replenishment trigger (b), exactly when Pick() would fire it, so a lone
  // tenant's debt is repaid as on the ordinary path instead of piling up while it runs alone.
  if (t.credit1_ns <= 0 && claiming_ == 0 && !HolderGraceEnd(now)) {
    Replenish(now, Trigger::kSpareCapacity);
  }
  if (!turn_open_ || turn_tenant_ != block.tenant) {
    // The lone tenant's turn, as Pick() would open it (Algorithm 1, steps 27-28).
    turn_open_ = true;
    turn_tenant_ = block.tenant;
    turn_blocks_ = 0;
    turn_used_ns_ = 0;
    cursor_rank_ = t.rank;
    if (options_.charge_per_round) Charge(t, credit_value().count());
  }
  DispatchHead(block.tenant, t, now, /*may_split=*/false);  // the driver runs it whole
}

CreditTenantView CreditPolicy::View(TenantId tenant) const {
  const TenantState& t = tenants_.at(tenant);
  const double unit = static_cast<double>(credit_value().count());
  CreditTenantView v;
  v.credit1 = static_cast<double>(t.credit1_ns) / unit;
  v.credit2 = static_cast<double>(t.credit2_ns) / unit;
  v.debt = static_cast<double>(t.debt_ns) / unit;
  v.status = t.credit1_ns > 0 ? 1 : 0;
  v.slice = Duration(t.slice_ns);
  v.eq2_factor = t.eq2_factor;
  v.pending = t.channel.size();
  v.in_flight = t.in_flight;
  v.think = Duration(t.think_ns);
  v.grace = Duration(GraceNs(t));
  v.block_time = Duration(t.block_ns);
  v.chunks = t.chunks;
  v.unsplit_kernel_time = Duration(t.unsplit_kernel_ns);
  return v;
}

std::vector<TenantId> CreditPolicy::Order() const {
  std::vector<TenantId> out;
  for (TenantId id : order_) {
    if (id != kNoTenant) out.push_back(id);
  }
  return out;
}

void CreditPolicy::AdvanceTo(TimePoint now) {
  last_now_ = std::max(last_now_, now);
  if (!started_) {
    started_ = true;
    interval_start_ = now;
    interval_end_ = now + Duration(time_g_ns_);
    return;
  }
  // Replenishment trigger (a): the interval TIME_G has elapsed, counted in device time served
  // (default) or in wall time. After a long quiet spell only one replenishment happens.
  const bool elapsed = options_.time_g_wall ? now >= interval_end_ : served_ns_ >= time_g_ns_;
  if (elapsed) Replenish(now, Trigger::kInterval);
}

void CreditPolicy::Replenish(TimePoint now, Trigger trigger) {
  ComputeSlicesAndOrder();
  ComputeAllocations(now);

  // Trigger (b) exists to put a waiting tenant back to work, so it hands out as many
  // allocations as the least indebted waiting tenant needs to reach credit1 > 0.
  int64_t rounds = 1;
  if (trigger == Trigger::kSpareCapacity) {
    int64_t best = INT64_MAX;
    for (const auto& [id, t] : tenants_) {
      if (t.channel.empty() || t.credit2_ns <= 0) continue;
      best = std::min(best, t.debt_ns / t.credit2_ns + 1);
    }
    if (best != INT64_MAX) rounds = best;
  }
  for (auto& [id, t] : tenants_) {
    TopUp(t, rounds * t.credit2_ns, now);
    // The next interval's Eq. (2) inputs start from what is outstanding now.
    t.copy_bytes = 0;
    t.peak_outstanding = t.channel.size() + t.in_flight;
    t.active = t.peak_outstanding > 0;
  }
  interval_start_ = now;
  interval_end_ = now + Duration(time_g_ns_);
  served_ns_ = 0;
  RebuildSets();
  if (trigger == Trigger::kInterval) {
    ++interval_replenishments_;
  } else {
    ++spare_replenishments_;
  }
}

void CreditPolicy::ComputeSlicesAndOrder() {
  // Algorithm 1, steps 1-13: sort by the CPU time of the polling period (descending; ties by
  // join order), then t_i = cpu_i / cpu_max × slice_max, floored at slice_min.
  std::vector<std::tuple<int64_t, uint64_t, TenantId>> rows;
  rows.reserve(tenants_.size());
  int64_t cpu_max = 0;
  for (const auto& [id, t] : tenants_) {
    const int64_t delta = std::max<int64_t>(0, t.cpu_cumulative_ns - t.cpu_period_start_ns);
    cpu_max = std::max(cpu_max, delta);
    rows.emplace_back(delta, t.join_seq, id);
  }
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) {
    if (std::get<0>(a) != std::get<0>(b)) return std::get<0>(a) > std::get<0>(b);
    return std::get<1>(a) < std::get<1>(b);
  });
  const int64_t slice_max = options_.slice_max.count();
  const int64_t slice_min = options_.slice_min.count();
  order_.clear();
  for (const auto& [delta, seq, id] : rows) {
    TenantState& t = tenants_.at(id);
    if (cpu_max > 0) {
      const double ratio = static_cast<double>(delta) / static_cast<double>(cpu_max);
      t.slice_ns = std::max<int64_t>(slice_min, std::llround(ratio * static_cast<double>(slice_max)));
    } else {
      t.slice_ns = slice_max;  // no CPU reports this period: every slice is slice_max
    }
    t.cpu_period_start_ns = t.cpu_cumulative_ns;
    t.rank = static_cast<uint32_t>(order_.size());
    order_.push_back(id);
  }
  // Keep the round robin going from where it was, under the new ranks.
  auto turn = tenants_.find(turn_tenant_);
  cursor_rank_ = turn != tenants_.end() ? turn->second.rank
                                        : std::min<uint32_t>(cursor_rank_,
                                                             static_cast<uint32_t>(order_.size()));
}

void CreditPolicy::ComputeAllocations(TimePoint now) {
  const double interval_s = std::max(1e-9, ToSeconds(now - interval_start_));
  double bytes_sum = 0, memory_sum = 0;
  for (const auto& [id, t] : tenants_) {
    bytes_sum += static_cast<double>(t.copy_bytes);
    memory_sum += static_cast<double>(t.memory_bytes);
  }
  // Eq. (2) numerators. b_i and m_i are normalised to [0, 1] (occupancy of the bus and share of
  // device memory, by the device's totals when known, else by the tenants' sum), so the exponent
  // is at most BW·MSIZE = 1 and e^{b_i m_i} stays in [1, e].
  double weighted_sum = 0;
  int64_t slice_sum = 0;
  for (auto& [id, t] : tenants_) {
    const bool active = t.active || !t.channel.empty() || t.in_flight > 0;
    if (!active) {
      t.eq2_factor = 0;
      continue;
    }
    double b = 0;
    if (device_.bus_bytes_per_s > 0) {
      b = std::min(1.0, static_cast<double>(t.copy_bytes) / (device_.bus_bytes_per_s * interval_s));
    } else if (bytes_sum > 0) {
      b = static_cast<double>(t.copy_bytes) / bytes_sum;
    }
    double m = 0;
    if (device_.memory_bytes > 0) {
      m = std::min(1.0, static_cast<double>(t.memory_bytes) /
                            static_cast<double>(device_.memory_bytes));
    } else if (memory_sum > 0) {
      m = static_cast<double>(t.memory_bytes) / memory_sum;
    }
    const double num = static_cast<double>(
        std::min<uint64_t>(t.peak_outstanding, static_cast<uint64_t>(options_.num_cap)));
    t.eq2_factor = std::exp(b * m) + num;  // e^{BW_i × MSIZE_i} + NUM_i
    weighted_sum += t.info.weight * t.eq2_factor;
    slice_sum += t.slice_ns;
  }
  // TIME_G: fixed when configured, else one polling period (each active tenant's slice once).
  time_g_ns_ = options_.time_g.count() > 0
                   ? options_.time_g.count()
                   : std::max<int64_t>(options_.slice_max.count(), slice_sum);
  // CREDIT_i = CREDIT · w_i f_i / Σ w_j f_j, held as device time: CREDIT credits are TIME_G.
  for (auto& [id, t] : tenants_) {
    if (t.eq2_factor <= 0 || weighted_sum <= 0) {
      t.credit2_ns = 0;
      continue;
    }
    const double share = t.info.weight * t.eq2_factor / weighted_sum;
    t.credit2_ns = std::max<int64_t>(1, std::llround(share * static_cast<double>(time_g_ns_)));
  }
}

void CreditPolicy::TopUp(TenantState& t, int64_t amount_ns, TimePoint now) {
  if (amount_ns <= 0) return;
  const int64_t repaid = std::min(t.debt_ns, amount_ns);
  t.debt_ns -= repaid;
  amount_ns -= repaid;
  if (amount_ns <= 0) return;
  t.credit1_ns += amount_ns;
  // Banking is capped only for tenants with nothing pending: a backlogged tenant's credits grew
  // because the device was busy with someone else's (long) block, and they are owed.
  if (t.channel.empty() && t.in_flight == 0 && !Thinking(t, now)) {
    const auto cap = static_cast<int64_t>(
        std::llround((1.0 + options_.carry_intervals) * static_cast<double>(t.credit2_ns)));
    t.credit1_ns = std::min(t.credit1_ns, std::max<int64_t>(cap, 1));
  }
}

void CreditPolicy::Charge(TenantState& t, int64_t cost_ns) {
  // Section 4.2: check credit1 before decreasing it; it never goes below 0, the excess is debt.
  if (cost_ns <= t.credit1_ns) {
    t.credit1_ns -= cost_ns;
  } else {
    t.debt_ns += cost_ns - t.credit1_ns;
    t.credit1_ns = 0;
  }
}

void CreditPolicy::Refresh(TenantState& t) {
  const bool eligible = t.credit1_ns > 0 && !t.channel.empty();
  if (eligible != t.eligible) {
    if (eligible) {
      eligible_.insert(t.rank);
    } else {
      eligible_.erase(t.rank);
    }
    t.eligible = eligible;
  }
  const bool claiming = t.credit1_ns > 0 && (!t.channel.empty() || t.in_flight > 0);
  if (claiming != t.claiming) {
    if (claiming) {
      ++claiming_;
    } else {
      --claiming_;
    }
    t.claiming = claiming;
  }
}

void CreditPolicy::RebuildSets() {
  eligible_.clear();
  claiming_ = 0;
  for (auto& entry : tenants_) {
    TenantState& t = entry.second;
    t.eligible = false;
    t.claiming = false;
    Refresh(t);
  }
}

bool CreditPolicy::CanContinueTurn(const TenantState& t) const {
  if (t.channel.empty() || turn_blocks_ >= options_.blocks_per_round) return false;
  const int64_t in_flight_estimate = static_cast<int64_t>(t.in_flight) * t.est_block_ns;
  return turn_used_ns_ + in_flight_estimate < t.slice_ns;
}

Dispatch CreditPolicy::DispatchHead(TenantId id, TenantState& t, TimePoint now, bool may_split) {
  assert(!t.channel.empty());
  Entry& e = t.channel.front();
  const uint64_t begin = e.next;
  uint64_t end = e.work_items;
  // A bounded slice: a splittable kernel runs in chunks of about ChunkTarget() of device time
  // while another tenant wants the device, sized from this tenant's measured time per
  // work-item (one granule while nothing is measured yet). Alone, it runs whole.
  if (may_split && e.granule > 0 && OthersActive(id, now)) {
    uint64_t steps = 1;
    if (t.item_ns > 0) {
      const double per_step = t.item_ns * static_cast<double>(e.granule);
      steps = static_cast<uint64_t>(
          std::max(1.0, std::floor(static_cast<double>(ChunkTarget(now).count()) / per_step)));
    }
    const uint64_t remaining = e.work_items - begin;
    if (steps < remaining / e.granule) end = begin + steps * e.granule;
  }
  const bool last = end == e.work_items;
  if (!last || begin > 0) ++t.chunks;
  if (e.kernel && e.granule == 0) t.unsplit_in_flight.push_back(e.block);
  const Dispatch d{id, e.block, WorkRange{begin, end}, last};
  if (last) {
    t.channel.pop_front();  // req[i] -= 1
    --total_pending_;
  } else {
    e.next = end;
  }
  ++t.in_flight;
  ++total_in_flight_;
  ++turn_blocks_;
  Refresh(t);
  return d;
}

std::optional<TenantId> CreditPolicy::NextEligible() const {
  if (eligible_.empty()) return std::nullopt;
  auto it = cursor_rank_ == UINT32_MAX ? eligible_.end() : eligible_.upper_bound(cursor_rank_);
  if (it == eligible_.end()) it = eligible_.begin();
  return order_[*it];
}

double CreditPolicy::Owed(const TenantState& t) {
  return static_cast<double>(t.credit1_ns) / static_cast<double>(std::max<int64_t>(1, t.credit2_ns));
}

std::optional<TenantId> CreditPolicy::MostOwed() const {
  // The eligible tenant with the largest part of its allocation left; ties go round robin from
  // the last tenant served (DomID_Num order).
  if (eligible_.empty()) return std::nullopt;
  auto start = cursor_rank_ == UINT32_MAX ? eligible_.end() : eligible_.upper_bound(cursor_rank_);
  if (start == eligible_.end()) start = eligible_.begin();
  std::optional<TenantId> best;
  double best_owed = 0;
  auto it = start;
  do {
    const TenantId id = order_[*it];
    const double owed = Owed(tenants_.at(id));
    if (!best || owed > best_owed) {
      best = id;
      best_owed = owed;
    }
    if (++it == eligible_.end()) it = eligible_.begin();
  } while (it != start);
  return best;
}

int64_t CreditPolicy::GraceNs(const TenantState& t) const {
  // Four measured think times, at least idle_grace, at most think_grace_max.
  const int64_t floor = options_.idle_grace.count();
  const int64_t cap = std::max(floor, options_.think_grace_max.count());
  return std::clamp<int64_t>(4 * t.think_ns, floor, cap);
}

bool CreditPolicy::Thinking(const TenantState& t, TimePoint now) const {
  return t.quiet && t.ever_quiet && now < t.quiet_since + Duration(GraceNs(t));
}

std::optional<TimePoint> CreditPolicy::HolderGraceEnd(TimePoint now, TenantId except) const {
  // A credit holder that went quiet less than its grace ago is probably about to submit again
  // (closed loop): its capacity is not spare yet.
  std::optional<TimePoint> end;
  for (const auto& [id, t] : tenants_) {
    if (id == except || t.credit1_ns <= 0 || !Thinking(t, now)) continue;
    const TimePoint at = t.quiet_since + Duration(GraceNs(t));
    if (!end || at < *end) end = at;
  }
  return end;
}

bool CreditPolicy::WantsDevice(const TenantState& t, TimePoint now) const {
  return !t.channel.empty() || t.in_flight > 0 || Thinking(t, now);
}

bool CreditPolicy::OthersActive(TenantId id, TimePoint now) const {
  for (const auto& [other, t] : tenants_) {
    if (other != id && WantsDevice(t, now)) return true;
  }
  return false;
}

Duration CreditPolicy::ChunkTarget(TimePoint now) const {
  if (options_.chunk.count() > 0) return options_.chunk;
  // Adaptive: the shortest whole-block time among the tenants that want the device, so a
  // tenant with short launches waits about one of its own launches, not one of the others'.
  int64_t shortest = options_.slice_max.count();
  for (const auto& [id, t] : tenants_) {
    if (WantsDevice(t, now) && t.block_ns > 0) shortest = std::min(shortest, t.block_ns);
  }
  return Duration(std::clamp<int64_t>(shortest, options_.chunk_min.count(),
                                      std::max(options_.chunk_min.count(), options_.slice_max.count())));
}

}  // namespace gmux::core
