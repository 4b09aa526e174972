#include "core/credit_policy.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <vector>

#include "core/metrics.h"

namespace gmux::core {
namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;

CommandBlock Kernel(BlockId id, TenantId tenant, uint64_t items = 64) {
  CommandBlock b;
  b.id = id;
  b.tenant = tenant;
  b.work_items = items;
  b.work_groups = std::max<uint64_t>(1, items / 64);
  return b;
}

CommandBlock Copy(BlockId id, TenantId tenant, uint64_t bytes) {
  CommandBlock b;
  b.id = id;
  b.tenant = tenant;
  b.kind = BlockKind::kCopy;
  b.bytes = bytes;
  return b;
}

CreditPolicy Make(CreditPolicyOptions o = {}, DeviceInfo d = {}) {
  EXPECT_TRUE(o.Validate().ok());
  return CreditPolicy(o, d);
}

Completion Done(const Dispatch& d, Duration t) {
  return Completion{d.tenant, d.block, d.range, t, d.last};
}

// Seeded 64-bit LCG: the test's only randomness.
struct Lcg {
  uint64_t s;
  uint64_t Next() {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    return s >> 11;
  }
  double Uniform() { return static_cast<double>(Next()) / static_cast<double>(1ULL << 53); }
};

// One tenant of the closed-loop driver below.
struct Load {
  TenantId id;
  double weight;
  Duration block;       // device time of each block
  int depth;            // blocks kept outstanding (submitted and not completed)
  Duration jitter{0};   // CPU-side delay before each resubmission, uniform in [0, jitter]
  double noise = 0;     // per-block device-time noise, uniform in ±noise × block
};

struct RunResult {
  std::vector<double> device_s;  // per tenant, after warm-up
  double mean_lambda = 0;        // VMCG λ over 1 s windows, after warm-up
  std::vector<double> shares() const {
    double sum = 0;
    for (double v : device_s) sum += v;
    std::vector<double> out;
    for (double v : device_s) out.push_back(sum > 0 ? v / sum : 0);
    return out;
  }
};

// A serial device (one block at a time, no preemption) driven by closed-loop submitters. Every
// policy callback is invoked exactly as a simulator would: Submit on arrival, Pick whenever the
// device is free, Complete with the device time, Tick at NextTimer().
RunResult RunClosedLoop(Policy& p, const std::vector<Load>& loads, Duration run, Duration warmup,
                        uint64_t seed) {
  Lcg rng{seed};
  TimePoint now{};
  for (const Load& l : loads) p.AddTenant({l.id, "t" + std::to_string(l.id), l.weight}, now);
  std::map<TenantId, size_t> index;
  for (size_t i = 0; i < loads.size(); ++i) index[loads[i].id] = i;
  std::multimap<TimePoint, TenantId> arrivals;
  for (const Load& l : loads) {
    for (int k = 0; k < l.depth; ++k) arrivals.emplace(now, l.id);
  }
  BlockId next_id = 1;
  std::optional<Dispatch> running;
  TimePoint running_end{};
  Duration running_time{0};
  WindowedThroughput windows(loads.size(), std::chrono::seconds(1));
  std::vector<double> weights;
  for (const Load& l : loads) weights.push_back(l.weight);
  RunResult r;
  r.device_s.assign(loads.size(), 0);
  const TimePoint end = TimePoint{} + run;
  while (now < end) {
    while (!arrivals.empty() && arrivals.begin()->first <= now) {
      TenantId t = arrivals.begin()->second;
      arrivals.erase(arrivals.begin());
      p.Submit(Kernel(next_id++, t), now);
    }
    if (running && running_end <= now) {
      p.Complete(Done(*running, running_time), now);
      const Load& l = loads[index[running->tenant]];
      Duration delay(static_cast<int64_t>(rng.Uniform() * static_cast<double>(l.jitter.count())));
      arrivals.emplace(now + delay, l.id);
      running.reset();
      continue;  // the resubmission may be immediate
    }
    if (!running) {
      running = p.Pick(now);
      if (running) {
        const Load& l = loads[index[running->tenant]];
        double f = 1 + l.noise * (2 * rng.Uniform() - 1);
        running_time = Duration(static_cast<int64_t>(static_cast<double>(l.block.count()) * f));
        running_end = now + running_time;
        size_t i = index[running->tenant];
        if (now >= TimePoint{} + warmup) {
          r.device_s[i] += ToSeconds(running_time);
          windows.Add(i, now - warmup, running_end - warmup, ToSeconds(running_time));
        }
        continue;
      }
    }
    TimePoint next = end;
    if (running) next = std::min(next, running_end);
    if (!arrivals.empty()) next = std::min(next, arrivals.begin()->first);
    if (auto timer = p.NextTimer(); timer && *timer > now) next = std::min(next, *timer);
    now = next;
    p.Tick(now);
  }
  // Drop the last, partial window.
  size_t full = windows.windows() > 0 ? windows.windows() - 1 : 0;
  r.mean_lambda = windows.MeanLambda(weights, 0, full);
  return r;
}

TEST(CreditPolicyTest, OptionsValidateAndParamsAreRead) {
  EXPECT_TRUE(CreditPolicyOptions{}.Validate().ok());
  CreditPolicyOptions bad;
  bad.blocks_per_round = 0;
  EXPECT_FALSE(bad.Validate().ok());
  bad = {};
  bad.slice_min = milliseconds(20);
  EXPECT_FALSE(bad.Validate().ok());

  auto o = CreditPolicyOptionsFromSpec({"credit", {}, {}});
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->slice_max, milliseconds(16));
  EXPECT_EQ(o->blocks_per_round, 4);
  EXPECT_EQ(o->num_cap, 1);
  EXPECT_DOUBLE_EQ(o->credits_per_interval, 100);
  EXPECT_EQ(o->time_g, Duration(0));
  EXPECT_EQ(o->idle_grace, milliseconds(1));
  EXPECT_FALSE(o->time_g_wall);
  EXPECT_FALSE(o->charge_per_round);

  auto set = CreditPolicyOptionsFromSpec(
      {"credit", {{"time_g_ms", 50}, {"blocks_per_round", 2}, {"slice_max_ms", 8}}, {}});
  ASSERT_TRUE(set.ok());
  EXPECT_EQ(set->time_g, milliseconds(50));
  EXPECT_EQ(set->blocks_per_round, 2);
  EXPECT_EQ(set->slice_max, milliseconds(8));
  EXPECT_TRUE(o->owed_first);
  EXPECT_TRUE(o->split_kernels);
  EXPECT_EQ(o->chunk, Duration(0));
  EXPECT_EQ(o->chunk_min, microseconds(500));
  EXPECT_EQ(o->think_grace_max, milliseconds(4));
  auto slices = CreditPolicyOptionsFromSpec(
      {"credit",
       {{"owed_first", 0}, {"split_kernels", 0}, {"chunk_ms", 2.5}, {"chunk_min_ms", 1},
        {"think_grace_max_ms", 10}},
       {}});
  ASSERT_TRUE(slices.ok());
  EXPECT_FALSE(slices->owed_first);
  EXPECT_FALSE(slices->split_kernels);
  EXPECT_EQ(slices->chunk, microseconds(2500));
  EXPECT_EQ(slices->chunk_min, milliseconds(1));
  EXPECT_EQ(slices->think_grace_max, milliseconds(10));
  EXPECT_FALSE(MakePolicy({"credit", {{"owed_first", 2}}, {}}).ok());
  EXPECT_FALSE(MakePolicy({"credit", {{"chunk_min_ms", 0}}, {}}).ok());

  auto typo = MakePolicy({"credit", {{"slice_ms", 4}}, {}});
  ASSERT_FALSE(typo.ok());
  EXPECT_NE(typo.status().message().find("slice_ms"), std::string::npos);
  auto range = MakePolicy({"credit", {{"blocks_per_round", 0}}, {}});
  ASSERT_FALSE(range.ok());
  EXPECT_NE(range.status().message().find("blocks_per_round"), std::string::npos);
  auto made = MakePolicy({"credit", {}, {}});
  ASSERT_TRUE(made.ok());
  EXPECT_EQ((*made)->name(), "credit");
}

TEST(CreditPolicyTest, Eq2SplitsCreditByWeightWhenDemandIsEqual) {
  CreditPolicy p = Make();
  TimePoint t{};
  p.AddTenant({1, "a", 4}, t);
  p.AddTenant({2, "b", 2}, t);
  p.AddTenant({3, "c", 1}, t);
  BlockId id = 1;
  for (TenantId tenant : {1u, 2u, 3u}) {
    for (int k = 0; k < 6; ++k) p.Submit(Kernel(id++, tenant), t);
  }
  auto d = p.Pick(t);  // nobody has credits yet: trigger (b) allocates
  ASSERT_TRUE(d);
  EXPECT_EQ(p.replenishments(CreditPolicy::Trigger::kSpareCapacity), 1u);
  // NUM_i = min(6, num_cap = 1) = 1, no bandwidth or memory: f_i = e^0 + 1 = 2 for everyone.
  EXPECT_DOUBLE_EQ(p.View(1).eq2_factor, 2.0);
  EXPECT_NEAR(p.View(1).credit2, 100.0 * 4 / 7, 1e-3);
  EXPECT_NEAR(p.View(2).credit2, 100.0 * 2 / 7, 1e-3);
  EXPECT_NEAR(p.View(3).credit2, 100.0 * 1 / 7, 1e-3);
  EXPECT_NEAR(p.View(1).credit2 + p.View(2).credit2 + p.View(3).credit2, 100.0, 1e-3);
  // TIME_G is one polling period: three 16 ms slices; one credit is TIME_G / CREDIT.
  EXPECT_EQ(p.time_g(), milliseconds(48));
  EXPECT_EQ(p.credit_value(), microseconds(480));
}

TEST(CreditPolicyTest, Eq2UsesNormalisedBandwidthMemoryAndCappedPendingCount) {
  DeviceInfo dev;
  dev.memory_bytes = 1000;
  CreditPolicyOptions o;
  o.num_cap = 4;  // the paper's demand-proportional NUM_i
  CreditPolicy p = Make(o, dev);
  TimePoint t{};
  p.AddTenant({1, "a", 1}, t);
  p.AddTenant({2, "b", 1}, t);
  p.ReportMemory(1, 500, t);  // m_1 = 0.5 of device memory
  p.ReportMemory(2, 100, t);  // m_2 = 0.1
  // No bus rate known: b_i is the tenant's share of copy bytes in the interval (3/4 and 1/4).
  p.Submit(Copy(1, 1, 300), t);
  p.Submit(Copy(2, 2, 100), t);
  for (BlockId id = 3; id < 10; ++id) p.Submit(Kernel(id, 2), t);  // tenant 2: 8 pending
  ASSERT_TRUE(p.Pick(t));
  const double f1 = std::exp(0.75 * 0.5) + 1;  // NUM_1 = 1
  const double f2 = std::exp(0.25 * 0.1) + 4;  // NUM_2 = min(8, 4)
  EXPECT_NEAR(p.View(1).eq2_factor, f1, 1e-12);
  EXPECT_NEAR(p.View(2).eq2_factor, f2, 1e-12);
  EXPECT_NEAR(p.View(1).credit2, 100 * f1 / (f1 + f2), 1e-3);
  EXPECT_NEAR(p.View(2).credit2, 100 * f2 / (f1 + f2), 1e-3);
}

TEST(CreditPolicyTest, CreditsNeverGoNegativeAndOverdraftBecomesDebt) {
  CreditPolicy p = Make();
  TimePoint t{};
  p.AddTenant({1, "a", 1}, t);
  for (BlockId id = 1; id <= 3; ++id) p.Submit(Kernel(id, 1), t);
  auto d = p.Pick(t);
  ASSERT_TRUE(d);
  // Alone, the tenant's CREDIT_1 is all 100 credits = TIME_G = 16 ms of device time.
  EXPECT_NEAR(p.View(1).credit1, 100, 1e-6);
  t += milliseconds(40);
  p.Complete(Done(*d, milliseconds(40)), t);  // 40 ms charged against 16 ms
  // 24 ms over (150 credits of 0.16 ms) became debt; the interval also elapsed during the
  // block (trigger a), and that allocation repaid 16 ms of it.
  CreditTenantView v = p.View(1);
  EXPECT_EQ(v.credit1, 0);
  EXPECT_EQ(v.status, 0);
  EXPECT_NEAR(v.debt, 50, 1e-6);
  EXPECT_EQ(p.replenishments(CreditPolicy::Trigger::kInterval), 1u);
  // Trigger (b) then adds as many allocations as needed for credit1 > 0: 8 ms of debt left,
  // so one more allocation gives 8 ms of credit.
  auto d2 = p.Pick(t);
  ASSERT_TRUE(d2);
  EXPECT_NEAR(p.View(1).credit1, 50, 1e-6);
  EXPECT_EQ(p.View(1).debt, 0);
}

TEST(CreditPolicyTest, CreditInvariantsHoldOnRandomWorkloads) {
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    Lcg rng{seed};
    CreditPolicyOptions o;
    o.time_g = milliseconds(static_cast<int64_t>(rng.Next() % 3) * 20);  // 0 = dynamic
    CreditPolicy p = Make(o);
    TimePoint t{};
    const int n = 2 + static_cast<int>(rng.Next() % 4);
    for (int i = 0; i < n; ++i) p.AddTenant({TenantId(i), "t", 1.0 + double(rng.Next() % 4)}, t);
    BlockId id = 1;
    std::optional<Dispatch> running;
    for (int step = 0; step < 3000; ++step) {
      if (rng.Next() % 3 == 0) p.Submit(Kernel(id++, TenantId(rng.Next() % n)), t);
      if (running) {
        Duration dt = microseconds(static_cast<int64_t>(rng.Next() % 30000));
        t += dt;
        p.Complete(Done(*running, dt), t);
        running.reset();
      } else {
        running = p.Pick(t);
        if (!running) {
          auto timer = p.NextTimer();
          t = timer ? std::max(t, *timer) : t + milliseconds(1);
          p.Tick(t);
        }
      }
      if (rng.Next() % 50 == 0) {
        TenantId who = TenantId(rng.Next() % n);
        p.ReportCpuTime(who, milliseconds(static_cast<int64_t>(step)), t);
      }
      for (int i = 0; i < n; ++i) {
        CreditTenantView v = p.View(TenantId(i));
        ASSERT_GE(v.credit1, 0);
        ASSERT_GE(v.debt, 0);
        ASSERT_FALSE(v.credit1 > 0 && v.debt > 0);
        ASSERT_EQ(v.status, v.credit1 > 0 ? 1 : 0);
      }
    }
  }
}

TEST(CreditPolicyTest, IntervalOfDeviceTimeReplenishesExhaustedTenants) {
  CreditPolicyOptions o;
  o.time_g = milliseconds(100);
  CreditPolicy p = Make(o);
  TimePoint t{};
  p.AddTenant({1, "a", 1}, t);
  p.AddTenant({2, "b", 1}, t);
  BlockId id = 1;
  for (int k = 0; k < 8; ++k) p.Submit(Kernel(id++, 1), t);
  for (int k = 0; k < 8; ++k) p.Submit(Kernel(id++, 2), t);
  auto d = p.Pick(t);  // trigger (b) at start: 50 ms each
  ASSERT_TRUE(d);
  ASSERT_EQ(d->tenant, 1u);
  t += milliseconds(60);
  p.Complete(Done(*d, milliseconds(60)), t);  // tenant 1 exhausted, 10 ms in debt
  EXPECT_EQ(p.View(1).status, 0);
  // Tenant 2 still has credits and work: no spare capacity, so no trigger (b); it runs until
  // TIME_G = 100 ms of device time has been served since the replenishment.
  for (int k = 0; k < 4; ++k) {
    EXPECT_EQ(p.replenishments(CreditPolicy::Trigger::kInterval), 0u);
    auto d2 = p.Pick(t);
    ASSERT_TRUE(d2);
    EXPECT_EQ(d2->tenant, 2u);
    t += milliseconds(10);
    p.Complete(Done(*d2, milliseconds(10)), t);
  }
  EXPECT_EQ(p.replenishments(CreditPolicy::Trigger::kInterval), 1u);
  EXPECT_EQ(p.replenishments(CreditPolicy::Trigger::kSpareCapacity), 1u);
  EXPECT_FALSE(p.NextTimer());  // a device-time interval needs no wall-clock timer
  // Tenant 1 had credit1 = 0: it gets credit2 minus its 10 ms debt (paper: credit1 := credit2).
  EXPECT_NEAR(p.View(1).credit1, 40, 1e-6);
  EXPECT_EQ(p.View(1).debt, 0);
  // Tenant 2 (still backlogged) keeps its 10 ms and gains 50.
  EXPECT_NEAR(p.View(2).credit1, 60, 1e-6);
}

TEST(CreditPolicyTest, WallClockIntervalIsATimer) {
  CreditPolicyOptions o;
  o.time_g = milliseconds(100);
  o.time_g_wall = true;
  CreditPolicy p = Make(o);
  TimePoint t{};
  p.AddTenant({1, "a", 1}, t);
  p.AddTenant({2, "b", 1}, t);
  BlockId id = 1;
  for (int k = 0; k < 8; ++k) p.Submit(Kernel(id++, 1), t);
  for (int k = 0; k < 8; ++k) p.Submit(Kernel(id++, 2), t);
  auto d = p.Pick(t);
  ASSERT_TRUE(d);
  t += milliseconds(60);
  p.Complete(Done(*d, milliseconds(60)), t);
  auto d2 = p.Pick(t);
  ASSERT_TRUE(d2);
  EXPECT_EQ(d2->tenant, 2u);
  t += milliseconds(10);
  p.Complete(Done(*d2, milliseconds(10)), t);
  // 100 ms of wall time after the first replenishment the interval ends, found by Tick.
  ASSERT_TRUE(p.NextTimer());
  EXPECT_EQ(*p.NextTimer(), TimePoint{} + milliseconds(100));
  EXPECT_EQ(p.replenishments(CreditPolicy::Trigger::kInterval), 0u);
  t = *p.NextTimer();
  p.Tick(t);
  EXPECT_EQ(p.replenishments(CreditPolicy::Trigger::kInterval), 1u);
  EXPECT_NEAR(p.View(1).credit1, 40, 1e-6);
  EXPECT_NEAR(p.View(2).credit1, 90, 1e-6);
}

TEST(CreditPolicyTest, SpareCapacityReplenishesOnlyWhenNoCreditHolderHasWork) {
  CreditPolicyOptions o;
  o.time_g = milliseconds(100);
  o.idle_grace = milliseconds(2);
  CreditPolicy p = Make(o);
  TimePoint t{};
  p.AddTenant({1, "a", 1}, t);
  p.AddTenant({2, "b", 1}, t);
  p.Submit(Kernel(1, 1), t);
  p.Submit(Kernel(2, 2), t);
  auto d = p.Pick(t);
  ASSERT_TRUE(d);
  ASSERT_EQ(d->tenant, 1u);
  t += milliseconds(70);
  p.Submit(Kernel(3, 1), t);                   // tenant 1 has new blocks...
  p.Complete(Done(*d, milliseconds(70)), t);   // ...and no credits left
  auto d2 = p.Pick(t);                         // tenant 2 holds credits and has work
  ASSERT_TRUE(d2);
  EXPECT_EQ(d2->tenant, 2u);
  t += milliseconds(5);
  p.Complete(Done(*d2, milliseconds(5)), t);
  // Tenant 2 (credits left) just went quiet: within idle_grace its capacity is not spare.
  EXPECT_FALSE(p.Pick(t));
  ASSERT_TRUE(p.NextTimer());
  EXPECT_EQ(*p.NextTimer(), t + milliseconds(2));
  EXPECT_EQ(p.replenishments(CreditPolicy::Trigger::kSpareCapacity), 1u);
  t = *p.NextTimer();
  p.Tick(t);
  auto d3 = p.Pick(t);  // trigger (b): exhausted tenant with new blocks, spare capacity
  ASSERT_TRUE(d3);
  EXPECT_EQ(d3->tenant, 1u);
  EXPECT_EQ(p.replenishments(CreditPolicy::Trigger::kSpareCapacity), 2u);
  EXPECT_EQ(p.replenishments(CreditPolicy::Trigger::kInterval), 0u);
}

TEST(CreditPolicyTest, ReturningCreditHolderWithinGraceKeepsItsTurn) {
  CreditPolicyOptions o;
  o.time_g = milliseconds(100);
  o.idle_grace = milliseconds(2);
  CreditPolicy p = Make(o);
  TimePoint t{};
  p.AddTenant({1, "a", 1}, t);
  p.AddTenant({2, "b", 1}, t);
  p.Submit(Kernel(1, 1), t);
  p.Submit(Kernel(2, 2), t);
  auto d = p.Pick(t);
  t += milliseconds(60);
  p.Submit(Kernel(3, 1), t);
  p.Complete(Done(*d, milliseconds(60)), t);  // tenant 1 exhausted
  auto d2 = p.Pick(t);
  ASSERT_EQ(d2->tenant, 2u);
  t += milliseconds(1);
  p.Complete(Done(*d2, milliseconds(1)), t);
  EXPECT_FALSE(p.Pick(t));  // tenant 2 is between submissions
  t += milliseconds(1);
  p.Submit(Kernel(4, 2), t);  // and comes back within the grace
  auto d3 = p.Pick(t);
  ASSERT_TRUE(d3);
  EXPECT_EQ(d3->tenant, 2u);
  EXPECT_EQ(p.replenishments(CreditPolicy::Trigger::kSpareCapacity), 1u);
}

// The paper's turns (Algorithm 1): owed_first = false.
CreditPolicyOptions PaperTurns() {
  CreditPolicyOptions o;
  o.owed_first = false;
  return o;
}

TEST(CreditPolicyTest, RoundsDispatchAtMostFourBlocksPerTenant) {
  CreditPolicy p = Make(PaperTurns());
  TimePoint t{};
  p.AddTenant({1, "a", 1}, t);
  p.AddTenant({2, "b", 1}, t);
  BlockId id = 1;
  for (int k = 0; k < 10; ++k) p.Submit(Kernel(id++, 1), t);
  for (int k = 0; k < 10; ++k) p.Submit(Kernel(id++, 2), t);
  std::string seq;
  for (int k = 0; k < 20; ++k) {
    auto d = p.Pick(t);
    ASSERT_TRUE(d);
    seq += d->tenant == 1 ? 'a' : 'b';
    t += microseconds(100);
    p.Complete(Done(*d, microseconds(100)), t);
  }
  EXPECT_EQ(seq, "aaaabbbbaaaabbbbaabb");
  EXPECT_FALSE(p.Pick(t));
}

TEST(CreditPolicyTest, BlocksPerRoundIsAParameter) {
  CreditPolicyOptions o = PaperTurns();
  o.blocks_per_round = 2;
  CreditPolicy p = Make(o);
  TimePoint t{};
  p.AddTenant({1, "a", 1}, t);
  p.AddTenant({2, "b", 1}, t);
  BlockId id = 1;
  for (int k = 0; k < 4; ++k) p.Submit(Kernel(id++, 1), t);
  for (int k = 0; k < 4; ++k) p.Submit(Kernel(id++, 2), t);
  std::string seq;
  while (auto d = p.Pick(t)) {
    seq += d->tenant == 1 ? 'a' : 'b';
    p.Complete(Done(*d, microseconds(10)), t);
  }
  EXPECT_EQ(seq, "aabbaabb");
}

TEST(CreditPolicyTest, TimeSliceEndsATurnBeforeFourBlocks) {
  CreditPolicy p = Make(PaperTurns());  // 16 ms slices
  TimePoint t{};
  p.AddTenant({1, "a", 1}, t);
  p.AddTenant({2, "b", 1}, t);
  BlockId id = 1;
  for (int k = 0; k < 6; ++k) p.Submit(Kernel(id++, 1), t);
  for (int k = 0; k < 6; ++k) p.Submit(Kernel(id++, 2), t);
  std::string seq;
  for (int k = 0; k < 6; ++k) {
    auto d = p.Pick(t);
    ASSERT_TRUE(d);
    seq += d->tenant == 1 ? 'a' : 'b';
    t += milliseconds(10);
    p.Complete(Done(*d, milliseconds(10)), t);
  }
  // 10 ms blocks: the second block takes the turn past 16 ms, so turns are two blocks long.
  EXPECT_EQ(seq, "aabbaa");
}

TEST(CreditPolicyTest, SlicesFollowCpuTimeAndOrderIsDescending) {
  CreditPolicyOptions o;
  o.time_g_wall = true;  // so that Tick() alone ends a polling period
  CreditPolicy p = Make(o);
  TimePoint t{};
  p.AddTenant({1, "a", 1}, t);
  p.AddTenant({2, "b", 1}, t);
  p.AddTenant({3, "c", 1}, t);
  p.Submit(Kernel(1, 1), t);
  ASSERT_TRUE(p.Pick(t));  // first replenishment, no CPU reports: every slice is 16 ms
  for (TenantId id : {1u, 2u, 3u}) EXPECT_EQ(p.View(id).slice, milliseconds(16));
  EXPECT_EQ(p.Order(), (std::vector<TenantId>{1, 2, 3}));
  p.ReportCpuTime(1, milliseconds(25), t);
  p.ReportCpuTime(2, milliseconds(100), t);
  p.ReportCpuTime(3, milliseconds(50), t);
  t += p.time_g();
  p.Tick(t);  // interval elapsed: a new polling period
  EXPECT_EQ(p.View(2).slice, milliseconds(16));  // cpu_max gets 16 ms
  EXPECT_EQ(p.View(3).slice, milliseconds(8));   // 50 / 100 × 16
  EXPECT_EQ(p.View(1).slice, milliseconds(4));   // 25 / 100 × 16
  EXPECT_EQ(p.Order(), (std::vector<TenantId>{2, 3, 1}));  // DomID_Num: descending CPU time
  // The next period uses CPU time consumed since this one started (the array is cleared).
  p.ReportCpuTime(1, milliseconds(25 + 40), t);
  p.ReportCpuTime(2, milliseconds(100 + 10), t);
  t += p.time_g();
  p.Tick(t);
  EXPECT_EQ(p.View(1).slice, milliseconds(16));
  EXPECT_EQ(p.View(2).slice, milliseconds(4));
  EXPECT_EQ(p.View(3).slice, milliseconds(1));  // no CPU this period: slice_min
  EXPECT_EQ(p.Order(), (std::vector<TenantId>{1, 2, 3}));
}

TEST(CreditPolicyTest, PerTenantOrderIsKept) {
  CreditPolicy p = Make();
  TimePoint t{};
  p.AddTenant({1, "a", 1}, t);
  p.AddTenant({2, "b", 3}, t);
  BlockId id = 1;
  std::map<TenantId, std::vector<BlockId>> submitted, dispatched;
  Lcg rng{7};
  for (int k = 0; k < 200; ++k) {
    TenantId tenant = 1 + TenantId(rng.Next() % 2);
    submitted[tenant].push_back(id);
    p.Submit(Kernel(id++, tenant), t);
  }
  for (int guard = 0; guard < 10000 && p.Pending(1) + p.Pending(2) > 0; ++guard) {
    auto d = p.Pick(t);
    if (!d) {  // holding back: wait for the policy's timer
      ASSERT_TRUE(p.NextTimer());
      t = *p.NextTimer();
      p.Tick(t);
      continue;
    }
    dispatched[d->tenant].push_back(d->block);
    EXPECT_EQ(d->range, (WorkRange{0, 64}));
    EXPECT_TRUE(d->last);
    Duration dt = microseconds(100 + static_cast<int64_t>(rng.Next() % 5000));
    t += dt;
    p.Complete(Done(*d, dt), t);
  }
  EXPECT_EQ(dispatched, submitted);
}

TEST(CreditPolicyTest, WeightsAreHonouredInDeviceTimeWhenBlockSizesDiffer) {
  // Weights 4:2:1, every tenant backlogged, block sizes 1, 7 and 3 ms (so equal block counts
  // would give shares 1:7:3).
  std::vector<Load> loads = {{1, 4, milliseconds(1), 8},
                             {2, 2, milliseconds(7), 8},
                             {3, 1, milliseconds(3), 8}};
  for (Load& l : loads) l.noise = 0.3;
  CreditPolicy p = Make();
  RunResult r = RunClosedLoop(p, loads, std::chrono::seconds(30), std::chrono::seconds(2), 11);
  std::vector<double> s = r.shares();
  EXPECT_NEAR(s[0], 4.0 / 7, 0.01);
  EXPECT_NEAR(s[1], 2.0 / 7, 0.01);
  EXPECT_NEAR(s[2], 1.0 / 7, 0.01);
  EXPECT_LT(r.mean_lambda, 0.02);
}

TEST(CreditPolicyTest, EqualWeightsGetEqualDeviceTimeUnlikeFifo) {
  // Closed-loop submitters with one block outstanding and CPU jitter between blocks: a heavy
  // tenant (20 ms blocks) and two light ones (1 and 3 ms).
  std::vector<Load> loads = {{1, 1, milliseconds(20), 1, microseconds(300), 0.2},
                             {2, 1, milliseconds(1), 1, microseconds(300), 0.2},
                             {3, 1, milliseconds(3), 1, microseconds(300), 0.2}};
  CreditPolicy credit = Make();
  RunResult rc = RunClosedLoop(credit, loads, std::chrono::seconds(30), std::chrono::seconds(2), 5);
  auto fifo = MakePolicy({"fifo", {}, {}});
  ASSERT_TRUE(fifo.ok());
  RunResult rf = RunClosedLoop(**fifo, loads, std::chrono::seconds(30), std::chrono::seconds(2), 5);
  for (double s : rc.shares()) EXPECT_NEAR(s, 1.0 / 3, 0.02);
  EXPECT_GT(rf.mean_lambda, 0.5);  // fifo: the heavy tenant takes most of the device
  EXPECT_LT(rc.mean_lambda, 0.05);
  EXPECT_LT(rc.mean_lambda, 0.1 * rf.mean_lambda);
}

TEST(CreditPolicyTest, LiteralOneCreditPerRoundFollowsBlockSizeNotWeight) {
  // Why credits are charged in device time: with the paper's 1 credit per round, equal weights
  // and backlogged tenants get equal rounds, hence device time in proportion to block size.
  std::vector<Load> loads = {{1, 1, milliseconds(8), 8}, {2, 1, milliseconds(1), 8}};
  CreditPolicyOptions literal = PaperTurns();
  literal.charge_per_round = true;
  CreditPolicy p = Make(literal);
  RunResult r = RunClosedLoop(p, loads, std::chrono::seconds(10), std::chrono::seconds(1), 3);
  std::vector<double> s = r.shares();
  // Turns: 2 × 8 ms (slice) against 4 × 1 ms: shares 0.8 and 0.2.
  EXPECT_NEAR(s[0], 0.8, 0.02);
  CreditPolicy q = Make();
  RunResult rq = RunClosedLoop(q, loads, std::chrono::seconds(10), std::chrono::seconds(1), 3);
  EXPECT_NEAR(rq.shares()[0], 0.5, 0.01);
}

TEST(CreditPolicyTest, LowWeightTenantIsNotStarved) {
  std::vector<Load> loads = {{1, 100, milliseconds(30), 4},
                             {2, 100, milliseconds(30), 4},
                             {3, 0.5, milliseconds(2), 1}};
  CreditPolicy p = Make();
  RunResult r = RunClosedLoop(p, loads, std::chrono::seconds(20), std::chrono::seconds(1), 9);
  // Its weighted share is 0.5 / 200.5 ≈ 0.25 %; it must get about that, not 0.
  EXPECT_GT(r.shares()[2], 0.0015);
  EXPECT_LT(r.shares()[2], 0.004);
}

TEST(CreditPolicyTest, RemoveTenantDropsItsBlocksAndKeepsOthersGoing) {
  CreditPolicy p = Make();
  TimePoint t{};
  p.AddTenant({1, "a", 1}, t);
  p.AddTenant({2, "b", 1}, t);
  BlockId id = 1;
  for (int k = 0; k < 6; ++k) p.Submit(Kernel(id++, 1), t);
  for (int k = 0; k < 3; ++k) p.Submit(Kernel(id++, 2), t);
  auto d = p.Pick(t);
  ASSERT_TRUE(d);
  ASSERT_EQ(d->tenant, 1u);
  p.RemoveTenant(1, t);  // during its own turn, with a block in flight
  EXPECT_EQ(p.Pending(1), 0u);
  p.Complete(Done(*d, milliseconds(1)), t);  // a late completion is ignored
  std::vector<BlockId> rest;
  while (auto next = p.Pick(t)) {
    EXPECT_EQ(next->tenant, 2u);
    rest.push_back(next->block);
    p.Complete(Done(*next, milliseconds(1)), t);
  }
  EXPECT_EQ(rest, (std::vector<BlockId>{7, 8, 9}));
  EXPECT_FALSE(p.NextTimer());  // nothing pending, nothing to wake up for
  // A tenant that joins later is served too (once tenant 2's idle grace has passed).
  t += milliseconds(2);
  p.AddTenant({3, "c", 1}, t);
  p.Submit(Kernel(id++, 3), t);
  auto late = p.Pick(t);
  ASSERT_TRUE(late);
  EXPECT_EQ(late->tenant, 3u);
}

}  // namespace
}  // namespace gmux::core

namespace gmux::core {
namespace {

CommandBlock Splittable(BlockId id, TenantId tenant, uint64_t items, uint64_t groups) {
  CommandBlock b = Kernel(id, tenant, items);
  b.work_groups = groups;
  b.splittable = Splittable::kYes;
  return b;
}

TEST(CreditSlicesTest, ChunksFollowTheMeasuredTimePerWorkItem) {
  CreditPolicyOptions o;
  o.chunk = milliseconds(2);
  CreditPolicy p = Make(o);
  TimePoint t{};
  p.AddTenant({1, "long", 1}, t);
  p.AddTenant({2, "short", 1}, t);
  p.Submit(Splittable(1, 1, 32 * 1024, 32), t);  // 32 granules of 1024 work-items
  p.Submit(Kernel(2, 2), t);
  // Nothing measured yet: one granule.
  auto d1 = p.Pick(t);
  ASSERT_TRUE(d1);
  EXPECT_EQ(d1->tenant, 1u);
  EXPECT_EQ(d1->range, (WorkRange{0, 1024}));
  EXPECT_FALSE(d1->last);
  auto d2 = p.Pick(t);
  ASSERT_TRUE(d2);
  EXPECT_EQ(d2->tenant, 2u);
  t += microseconds(500);
  p.Complete(Done(*d1, microseconds(500)), t);  // 1024 items in 0.5 ms
  p.Complete(Done(*d2, microseconds(100)), t);
  p.Submit(Kernel(3, 2), t);
  // 2 ms at 0.5 ms per granule: four granules, from where the first chunk ended.
  auto d3 = p.Pick(t);
  ASSERT_TRUE(d3);
  if (d3->tenant == 2u) d3 = p.Pick(t);
  ASSERT_TRUE(d3);
  EXPECT_EQ(d3->tenant, 1u);
  EXPECT_EQ(d3->range, (WorkRange{1024, 5 * 1024}));
  EXPECT_EQ(p.Pending(1), 1u) << "the block stays pending until its last chunk";
  EXPECT_GE(p.View(1).chunks, 2u);
}

TEST(CreditSlicesTest, ALoneTenantAndUnsplittableKernelsRunWhole) {
  CreditPolicy p = Make();
  TimePoint t{};
  p.AddTenant({1, "a", 1}, t);
  p.AddTenant({2, "b", 1}, t);
  p.Submit(Splittable(1, 1, 32 * 1024, 32), t);
  auto d = p.Pick(t);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->range, (WorkRange{0, 32 * 1024})) << "nobody else wants the device";
  EXPECT_TRUE(d->last);
  p.Complete(Done(*d, milliseconds(8)), t + milliseconds(8));
  t += milliseconds(20);
  // With another tenant backlogged, a kernel that is not splittable still runs whole, and its
  // device time is reported as such.
  p.Submit(Kernel(2, 1, 32 * 1024), t);
  p.Submit(Kernel(3, 2), t);
  auto e = p.Pick(t);
  ASSERT_TRUE(e);
  if (e->tenant == 2u) e = p.Pick(t);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->range, (WorkRange{0, 32 * 1024}));
  p.Complete(Done(*e, milliseconds(8)), t + milliseconds(8));
  EXPECT_EQ(p.View(1).unsplit_kernel_time, milliseconds(8));
}

TEST(CreditSlicesTest, AdaptiveTargetIsTheShortestLaunchOfTheTenantsThatWantTheDevice) {
  CreditPolicy p = Make();
  TimePoint t{};
  p.AddTenant({1, "a", 1}, t);
  p.AddTenant({2, "b", 1}, t);
  EXPECT_EQ(p.ChunkTarget(t), milliseconds(16)) << "nothing measured: the slice";
  p.Submit(Kernel(1, 2), t);
  auto d = p.Pick(t);
  ASSERT_TRUE(d);
  t += milliseconds(2);
  p.Complete(Done(*d, milliseconds(2)), t);
  EXPECT_EQ(p.ChunkTarget(t), milliseconds(2)) << "tenant 2 is within its think grace";
  t += milliseconds(50);
  EXPECT_EQ(p.ChunkTarget(t), milliseconds(16)) << "tenant 2 went idle";
  CreditPolicyOptions floor;
  floor.chunk_min = milliseconds(3);
  CreditPolicy q = Make(floor);
  q.AddTenant({1, "a", 1}, TimePoint{});
  q.Submit(Kernel(1, 1), TimePoint{});
  auto e = q.Pick(TimePoint{});
  ASSERT_TRUE(e);
  q.Complete(Done(*e, microseconds(100)), TimePoint{} + microseconds(100));
  EXPECT_EQ(q.ChunkTarget(TimePoint{} + microseconds(100)), milliseconds(3));
}

TEST(CreditSlicesTest, AnOwedTenantThinkingKeepsTheQueueToWhatRuns) {
  CreditPolicy p = Make();
  TimePoint t{};
  p.AddTenant({1, "closed", 2}, t);
  p.AddTenant({2, "busy", 1}, t);
  BlockId id = 1;
  p.Submit(Kernel(id++, 1), t);
  for (int k = 0; k < 8; ++k) p.Submit(Kernel(id++, 2), t);
  auto d1 = p.Pick(t);
  auto d2 = p.Pick(t);
  ASSERT_TRUE(d1 && d2);
  EXPECT_EQ(d1->tenant, 1u);
  EXPECT_EQ(d2->tenant, 2u);
  // Both used 1 ms; tenant 1 (weight 2) has the larger part of its allocation left.
  t += milliseconds(1);
  p.Complete(Done(*d1, milliseconds(1)), t);
  p.Complete(Done(*d2, milliseconds(1)), t);
  EXPECT_GT(p.View(1).credit1 / p.View(1).credit2, p.View(2).credit1 / p.View(2).credit2);
  // Tenant 1 is thinking. With nothing running, tenant 2 runs: the device never idles for it.
  auto d3 = p.Pick(t);
  ASSERT_TRUE(d3);
  EXPECT_EQ(d3->tenant, 2u);
  // With tenant 2's launch running, its next one waits rather than queue in front of tenant 1's
  // next launch, until tenant 1's grace ends.
  EXPECT_FALSE(p.Pick(t));
  const auto timer = p.NextTimer();
  ASSERT_TRUE(timer);
  EXPECT_EQ(*timer, t + p.View(1).grace);
  // Tenant 1 comes back within the grace and goes first.
  t += microseconds(200);
  p.Submit(Kernel(id++, 1), t);
  auto back = p.Pick(t);
  ASSERT_TRUE(back);
  EXPECT_EQ(back->tenant, 1u);
  // Past the grace of a tenant that stays away, the others use the device again.
  p.Complete(Done(*d3, microseconds(200)), t);
  t += milliseconds(1);
  p.Complete(Done(*back, milliseconds(1)), t);
  auto d4 = p.Pick(t);
  ASSERT_TRUE(d4);
  EXPECT_EQ(d4->tenant, 2u);
  t += p.View(1).grace;
  auto d5 = p.Pick(t);
  ASSERT_TRUE(d5);
  EXPECT_EQ(d5->tenant, 2u);
  // The grace follows the measured think time (200 us), within [idle_grace, think_grace_max].
  EXPECT_GT(p.View(1).think, Duration(0));
  EXPECT_GE(p.View(1).grace, milliseconds(1));
  EXPECT_LE(p.View(1).grace, milliseconds(4));
}

TEST(CreditSlicesTest, NoExpressWhileAnotherTenantThinks) {
  CreditPolicy p = Make();
  TimePoint t{};
  p.AddTenant({1, "a", 1}, t);
  p.AddTenant({2, "b", 1}, t);
  p.Submit(Kernel(1, 2), t);
  auto d = p.Pick(t);
  ASSERT_TRUE(d);
  t += milliseconds(1);
  p.Complete(Done(*d, milliseconds(1)), t);
  // Tenant 2 is between two launches of a closed loop: tenant 1 is not alone.
  EXPECT_FALSE(p.ExpressOk(1, t));
  EXPECT_TRUE(p.ExpressOk(1, t + p.View(2).grace));
  // An express block is accounted whole even if a thinking tenant would make Pick() split it.
  const TimePoint later = t + p.View(2).grace;
  CommandBlock big = Splittable(2, 1, 32 * 1024, 32);
  p.Express(big, later);
  EXPECT_EQ(p.Pending(1), 0u);
  EXPECT_EQ(p.View(1).in_flight, 1u);
}

}  // namespace
}  // namespace gmux::core

namespace gmux::core {
namespace {

// Swap batching: out-of-turn picks for one tenant are paid for out of its later turns, so the
// weights still hold over time (docs/policies.md, "Device memory").
TEST(CreditPolicyTest, OutOfTurnPicksArePaidBackAndWeightsHold) {
  CreditPolicy p = Make();
  TimePoint now{};
  p.AddTenant({1, "a", 1}, now);
  p.AddTenant({2, "b", 1}, now);
  BlockId next = 1;
  for (int k = 0; k < 2; ++k) {
    p.Submit(Kernel(next++, 1), now);
    p.Submit(Kernel(next++, 2), now);
  }
  EXPECT_FALSE(p.PickTenant(3, now).has_value());  // unknown tenant
  std::map<TenantId, double> device_s;
  const Duration block = milliseconds(2);
  const TimePoint end = now + std::chrono::seconds(20);
  int out_of_turn = 0;
  while (now < end) {
    // Tenant 1 runs out of turn in the first 40 ms of every 200 ms (a "slice" after a swap).
    const auto phase = (now - TimePoint{}) % milliseconds(200);
    std::optional<Dispatch> d;
    if (phase < milliseconds(40)) {
      d = p.PickTenant(1, now);
      if (d) ++out_of_turn;
    }
    if (!d) d = p.Pick(now);
    if (!d) {
      now += microseconds(100);
      p.Tick(now);
      continue;
    }
    EXPECT_EQ(d->range.begin, 0u);
    now += block;
    p.Complete(Done(*d, block), now);
    device_s[d->tenant] += ToSeconds(block);
    if (d->last) p.Submit(Kernel(next++, d->tenant), now);  // closed loop, always backlogged
  }
  EXPECT_GT(out_of_turn, 1000);
  const double total = device_s[1] + device_s[2];
  EXPECT_NEAR(device_s[1] / total, 0.5, 0.03);
  // Nothing is lost: every dispatch was a block of one of the two.
  EXPECT_NEAR(total, 20.0, 0.1);
}

TEST(CreditPolicyTest, OutOfTurnPickOfATenantWithNothingPendingIsNothing) {
  CreditPolicy p = Make();
  TimePoint now{};
  p.AddTenant({1, "a", 1}, now);
  p.AddTenant({2, "b", 1}, now);
  p.Submit(Kernel(1, 2), now);
  EXPECT_FALSE(p.PickTenant(1, now).has_value());
  auto d = p.PickTenant(2, now);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->tenant, 2u);
  EXPECT_EQ(d->block, 1u);
  EXPECT_EQ(p.Pending(2), 0u);
  EXPECT_FALSE(p.Pick(now).has_value());
}

}  // namespace
}  // namespace gmux::core
