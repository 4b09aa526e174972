#include "core/split_policy.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

namespace gmux::core {
namespace {

constexpr TimePoint kT{};

CommandBlock Kernel(BlockId id, TenantId tenant, uint64_t items, uint64_t local = 64,
                    Splittable split = Splittable::kYes) {
  CommandBlock b;
  b.id = id;
  b.tenant = tenant;
  b.kind = BlockKind::kKernel;
  b.work_items = items;
  b.work_groups = items / local;
  b.splittable = split;
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

SplitPolicyOptions Options(uint64_t cores, double beta) {
  SplitPolicyOptions o;
  o.cores = cores;
  o.beta = beta;
  return o;
}

Completion Done(const Dispatch& d, Duration device_time) {
  return Completion{d.tenant, d.block, d.range, device_time, d.last};
}

struct Picked {
  Dispatch d;
  uint64_t round;
};

// Drives the policy like the simulator: one dispatch at a time, each completing before the next
// pick, with a device time from `cost`. Stops when nothing is pending or after `max` dispatches.
std::vector<Picked> Drive(SplitPolicy& p, const std::function<Duration(const Dispatch&)>& cost,
                          size_t max = 1'000'000) {
  std::vector<Picked> out;
  TimePoint now{};
  while (out.size() < max) {
    auto d = p.Pick(now);
    if (!d) break;
    out.push_back({*d, p.round()});
    Duration t = cost(*d);
    now += t;
    p.Complete(Done(*d, t), now);
  }
  return out;
}

// Device time proportional to work-items, per tenant.
std::function<Duration(const Dispatch&)> PerItemCost(std::map<TenantId, int64_t> ns_per_item) {
  return [ns_per_item](const Dispatch& d) {
    return Duration(std::max<int64_t>(1, static_cast<int64_t>(d.range.size()) *
                                             ns_per_item.at(d.tenant)));
  };
}

TEST(SplitPolicyTest, FirstChunkFollowsEquation2) {
  // 2048 cores (32 CUs x 64 lanes), beta 1024, 3 tenants: 2048 * 1024 / 3 = 699050.67,
  // rounded down to a multiple of 64 = 699008.
  SplitPolicyOptions o;
  o.compute_units = 32;
  o.wavefront_width = 64;
  o.beta = 1024;
  SplitPolicy p(o);
  for (TenantId t = 1; t <= 3; ++t) {
    p.AddTenant({t, "t", 1}, kT);
    p.Submit(Kernel(t, t, uint64_t{64} << 20), kT);
  }
  for (TenantId t = 1; t <= 3; ++t) {
    auto d = p.Pick(kT);
    ASSERT_TRUE(d);
    EXPECT_EQ(d->tenant, t);
    EXPECT_EQ(d->range, (WorkRange{0, 699008}));
    EXPECT_FALSE(d->last);
  }
}

// Rounds are not per pick: split takes no out-of-turn picks, so the daemon does not batch swaps
// for it (docs/policies.md, SlotAllocator decision 19).
TEST(SplitPolicyTest, TakesNoOutOfTurnPicks) {
  SplitPolicy p(SplitPolicyOptions{});
  p.AddTenant({1, "a", 1}, kT);
  p.AddTenant({2, "b", 1}, kT);
  p.Submit(Kernel(1, 1, 64 * 100), kT);
  p.Submit(Kernel(2, 2, 64 * 100), kT);
  EXPECT_FALSE(p.PicksOutOfTurn());
  EXPECT_FALSE(p.PickTenant(2, kT).has_value());
  EXPECT_EQ(p.Pending(2), 1u);
  EXPECT_TRUE(p.Pick(kT).has_value());
}

TEST(SplitPolicyTest, ChunkSizeIsNeverZero) {
  // 64 cores * beta 1 / 6 tenants = 10.7 work-items: rounds down to 0, so one wavefront is used.
  SplitPolicy p(Options(64, 1));
  for (TenantId t = 1; t <= 6; ++t) {
    p.AddTenant({t, "t", 1}, kT);
    p.Submit(Kernel(t, t, 64 * 100), kT);
  }
  auto d = p.Pick(kT);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->range, (WorkRange{0, 64}));
}

TEST(SplitPolicyTest, ChunksAreMultiplesOfWidthAndLocalSize) {
  // Local sizes 64, 96, 256, 100 with width 64: granules 64, 192, 256, 1600.
  const uint64_t locals[] = {64, 96, 256, 100};
  SplitPolicy p(Options(2048, 3.3));
  for (TenantId t = 1; t <= 4; ++t) {
    p.AddTenant({t, "t", 1}, kT);
    uint64_t local = locals[t - 1];
    p.Submit(Kernel(t, t, local * 1013, local), kT);
    p.Submit(Kernel(10 + t, t, local * 77, local), kT);
  }
  auto log = Drive(p, PerItemCost({{1, 1}, {2, 2}, {3, 5}, {4, 9}}));
  ASSERT_FALSE(log.empty());
  const uint64_t granules[] = {64, 192, 256, 1600};
  for (const auto& [d, round] : log) {
    uint64_t local = locals[d.tenant - 1];
    EXPECT_EQ(d.range.begin % local, 0u);
    EXPECT_EQ(d.range.end % local, 0u);
    EXPECT_GT(d.range.size(), 0u);
    if (!d.last) {
      EXPECT_EQ(d.range.size() % granules[d.tenant - 1], 0u) << "tenant " << d.tenant;
      EXPECT_EQ(d.range.size() % 64, 0u);
    }
  }
}

TEST(SplitPolicyTest, ChunksCoverEachBlockExactlyAndInOrder) {
  SplitPolicy p(Options(1024, 4));
  std::map<TenantId, std::vector<CommandBlock>> submitted;
  BlockId id = 1;
  for (TenantId t = 1; t <= 3; ++t) {
    p.AddTenant({t, "t", 1}, kT);
    for (int i = 0; i < 4; ++i) {
      CommandBlock b = Kernel(id++, t, 64 * (50 + 37 * i + 11 * t));
      submitted[t].push_back(b);
      p.Submit(b, kT);
    }
  }
  auto log = Drive(p, PerItemCost({{1, 1}, {2, 3}, {3, 7}}));
  std::map<TenantId, size_t> block_index;
  std::map<TenantId, uint64_t> next;
  for (const auto& [d, round] : log) {
    const auto& blocks = submitted[d.tenant];
    size_t& i = block_index[d.tenant];
    ASSERT_LT(i, blocks.size());
    EXPECT_EQ(d.block, blocks[i].id) << "per-tenant order";
    EXPECT_EQ(d.range.begin, next[d.tenant]) << "contiguous";
    next[d.tenant] = d.range.end;
    EXPECT_EQ(d.last, d.range.end == blocks[i].work_items);
    if (d.last) {
      ++i;
      next[d.tenant] = 0;
    }
  }
  for (TenantId t = 1; t <= 3; ++t) {
    EXPECT_EQ(block_index[t], submitted[t].size()) << "every block dispatched";
    EXPECT_EQ(p.Pending(t), 0u);
  }
}

TEST(SplitPolicyTest, OneDispatchPerTenantPerRoundInJoinOrder) {
  SplitPolicy p(Options(1024, 1));
  for (TenantId t = 1; t <= 3; ++t) {
    p.AddTenant({t, "t", 1}, kT);
    p.Submit(Kernel(t, t, 64 * 1000), kT);
  }
  auto log = Drive(p, PerItemCost({{1, 1}, {2, 1}, {3, 1}}), 12);
  ASSERT_EQ(log.size(), 12u);
  for (size_t i = 0; i < log.size(); ++i) {
    EXPECT_EQ(log[i].d.tenant, static_cast<TenantId>(i % 3 + 1));
    EXPECT_EQ(log[i].round, i / 3 + 1);
  }
}

TEST(SplitPolicyTest, SingleTenantBlocksRunWhole) {
  SplitPolicy p(Options(1024, 1));
  p.AddTenant({1, "a", 1}, kT);
  p.Submit(Kernel(1, 1, 64 * 1000), kT);
  auto d = p.Pick(kT);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->range, (WorkRange{0, 64 * 1000}));
  EXPECT_TRUE(d->last);
  EXPECT_EQ(p.round(), 0u) << "no scheduling round with one tenant";
  p.Complete(Done(*d, std::chrono::milliseconds(5)), kT);
  auto m = p.Monitor(1);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->usage_s, 0.0) << "no usage is recorded without a sharing target";
  EXPECT_FALSE(m->in_schedule);
}

TEST(SplitPolicyTest, RemainderRunsWholeWhenTheOtherTenantLeaves) {
  SplitPolicy p(Options(1024, 1));
  p.AddTenant({1, "a", 1}, kT);
  p.AddTenant({2, "b", 1}, kT);
  p.Submit(Kernel(1, 1, 64 * 100), kT);
  p.Submit(Kernel(2, 2, 512), kT);  // fits in one chunk of 512
  auto a1 = p.Pick(kT);
  ASSERT_TRUE(a1);
  EXPECT_EQ(a1->range, (WorkRange{0, 512}));  // 1024 * 1 / 2 = 512
  p.Complete(Done(*a1, std::chrono::microseconds(10)), kT);
  auto b1 = p.Pick(kT);
  ASSERT_TRUE(b1);
  EXPECT_EQ(b1->tenant, 2u);
  EXPECT_TRUE(b1->last);
  p.Complete(Done(*b1, std::chrono::microseconds(10)), kT);
  EXPECT_EQ(p.ActiveTenants(), 1u) << "b's work is done: it left the schedule";
  auto a2 = p.Pick(kT);
  ASSERT_TRUE(a2);
  EXPECT_EQ(a2->range, (WorkRange{512, 64 * 100}));
  EXPECT_TRUE(a2->last);
}

TEST(SplitPolicyTest, UnsplittableKernelsCopiesAndMarkersRunWholeInTheirTurn) {
  SplitPolicyOptions o = Options(1024, 1);
  o.throttle_ratio = 1e9;  // tenant 2's whole kernel would otherwise make it sit out round 3
  SplitPolicy p(o);
  p.AddTenant({1, "a", 1}, kT);
  p.AddTenant({2, "b", 1}, kT);
  p.Submit(Kernel(1, 1, 64 * 100000), kT);
  p.Submit(Kernel(2, 2, 64 * 100, 64, Splittable::kNo), kT);
  p.Submit(Copy(3, 2, 4096), kT);
  CommandBlock marker;
  marker.id = 4;
  marker.tenant = 2;
  marker.kind = BlockKind::kMarker;
  p.Submit(marker, kT);
  // A kernel whose local size does not divide its global size is not split either.
  CommandBlock odd = Kernel(5, 2, 64 * 100 + 3, 64);
  odd.work_groups = 100;
  p.Submit(odd, kT);

  auto log = Drive(p, PerItemCost({{1, 1}, {2, 1}}), 8);
  ASSERT_EQ(log.size(), 8u);
  std::vector<TenantId> order;
  for (const auto& x : log) order.push_back(x.d.tenant);
  EXPECT_EQ(order, (std::vector<TenantId>{1, 2, 1, 2, 1, 2, 1, 2}));
  EXPECT_EQ(log[1].d.block, 2u);
  EXPECT_EQ(log[1].d.range, (WorkRange{0, 6400}));
  EXPECT_TRUE(log[1].d.last);
  EXPECT_EQ(log[3].d.block, 3u);
  EXPECT_EQ(log[3].d.range, (WorkRange{0, 0}));
  EXPECT_EQ(log[5].d.block, 4u);
  EXPECT_TRUE(log[5].d.last);
  EXPECT_EQ(log[7].d.block, 5u);
  EXPECT_EQ(log[7].d.range, (WorkRange{0, 6403}));
  EXPECT_TRUE(log[7].d.last);
  EXPECT_FALSE(log[0].d.last);
  EXPECT_EQ(log[0].d.range.size(), 512u);
}

TEST(SplitPolicyTest, UsageFollowsEquation1) {
  // cores 1024, beta 2, 2 tenants: chunks of 1024. Tenant 1's first block is 640 items.
  SplitPolicy p(Options(1024, 2));
  p.AddTenant({1, "a", 1}, kT);
  p.AddTenant({2, "b", 1}, kT);
  p.Submit(Kernel(1, 1, 640), kT);
  p.Submit(Kernel(2, 1, 64 * 1000), kT);
  p.Submit(Kernel(3, 2, 64 * 1000), kT);
  auto a = p.Pick(kT);
  auto b = p.Pick(kT);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->range.size(), 640u);
  EXPECT_EQ(b->range.size(), 1024u);
  p.Complete(Done(*a, std::chrono::milliseconds(2)), kT);
  p.Complete(Done(*b, std::chrono::milliseconds(4)), kT);
  ASSERT_TRUE(p.Pick(kT));  // starts round 2; round 1 is complete and is charged
  // usage = runtime * (1 + own items / round items), round items = 640 + 1024 = 1664.
  EXPECT_NEAR(p.Monitor(1)->usage_s, 0.002 * (1 + 640.0 / 1664), 1e-12);
  EXPECT_NEAR(p.Monitor(2)->usage_s, 0.004 * (1 + 1024.0 / 1664), 1e-12);
}

TEST(SplitPolicyTest, UsageIsChargedOnlyWhenTheWholeRoundHasCompleted) {
  SplitPolicy p(Options(1024, 2));
  p.AddTenant({1, "a", 1}, kT);
  p.AddTenant({2, "b", 1}, kT);
  p.Submit(Kernel(1, 1, 64 * 1000), kT);
  p.Submit(Kernel(2, 2, 64 * 1000), kT);
  auto a = p.Pick(kT);
  p.Complete(Done(*a, std::chrono::milliseconds(2)), kT);
  EXPECT_EQ(p.Monitor(1)->usage_s, 0.0);
  auto b = p.Pick(kT);
  p.Complete(Done(*b, std::chrono::milliseconds(2)), kT);
  ASSERT_TRUE(p.Pick(kT));
  EXPECT_NEAR(p.Monitor(1)->usage_s, 0.003, 1e-12);  // equal items: 2 ms * 1.5
}

// Reference for Algorithm 2 as documented: scale(r + 2) = scale(r) * (1 + gain * (fair/u - 1)).
TEST(SplitPolicyTest, Algorithm2SizesApplyTwoRoundsLater) {
  SplitPolicyOptions o = Options(2048, 1);  // 2 tenants: Eq. (2) size S = 1024
  o.throttle_ratio = 1e9;                   // isolate the resizing from the throttle
  SplitPolicy p(o);
  p.AddTenant({1, "cheap", 1}, kT);
  p.AddTenant({2, "dear", 1}, kT);
  p.Submit(Kernel(1, 1, 64 << 20), kT);
  p.Submit(Kernel(2, 2, 64 << 20), kT);
  auto log = Drive(p, PerItemCost({{1, 1000}, {2, 3000}}), 10);
  ASSERT_EQ(log.size(), 10u);
  auto size = [&](size_t round, TenantId t) {
    return log[(round - 1) * 2 + (t - 1)].d.range.size();
  };
  const double S = 1024;
  // Rounds 1 and 2: Eq. (2).
  EXPECT_EQ(size(1, 1), 1024u);
  EXPECT_EQ(size(1, 2), 1024u);
  EXPECT_EQ(size(2, 1), 1024u) << "round 1's decision must not apply in round 2";
  EXPECT_EQ(size(2, 2), 1024u);
  // Round 1: runtimes S*1us and S*3us, equal item shares 1/2: u1 = 1.5 S, u2 = 4.5 S, fair 3 S.
  double s1 = 1.0 * (1 + (3.0 / 1.5 - 1));  // 2
  double s2 = 1.0 * (1 + (3.0 / 4.5 - 1));  // 2/3
  auto chunk = [&](double scale) {
    return static_cast<uint64_t>(std::floor(scale * S / 64)) * 64;
  };
  EXPECT_EQ(size(3, 1), chunk(s1));
  EXPECT_EQ(size(3, 2), chunk(s2));
  EXPECT_EQ(size(4, 1), chunk(s1)) << "round 2 ran like round 1, so it decides the same";
  EXPECT_EQ(size(4, 2), chunk(s2));
  // Round 3 decides round 5 from the items round 3 actually ran.
  double i1 = static_cast<double>(size(3, 1)), i2 = static_cast<double>(size(3, 2));
  double u1 = i1 * 1e-6 * (1 + i1 / (i1 + i2));
  double u2 = i2 * 3e-6 * (1 + i2 / (i1 + i2));
  double fair = (u1 + u2) / 2;
  EXPECT_EQ(size(5, 1), chunk(s1 * (1 + (fair / u1 - 1))));
  EXPECT_EQ(size(5, 2), chunk(s2 * (1 + (fair / u2 - 1))));
}

TEST(SplitPolicyTest, ResizingEqualisesUsagePerRound) {
  SplitPolicyOptions o = Options(2048, 8);
  SplitPolicy p(o);
  for (TenantId t = 1; t <= 6; ++t) {
    p.AddTenant({t, "t", 1}, kT);
    p.Submit(Kernel(t, t, 64ull << 24), kT);
  }
  // Three cheap and three expensive tenants, per-item cost 1 : 2.4.
  auto cost = PerItemCost({{1, 10}, {2, 10}, {3, 10}, {4, 24}, {5, 24}, {6, 24}});
  Drive(p, cost, 6 * 40);
  std::map<TenantId, double> before;
  for (TenantId t = 1; t <= 6; ++t) before[t] = p.Monitor(t)->usage_s;
  auto log = Drive(p, cost, 6 * 20);
  std::map<TenantId, double> per_tenant;
  for (TenantId t = 1; t <= 6; ++t) per_tenant[t] = p.Monitor(t)->usage_s - before[t];
  double lo = 1e300, hi = 0;
  for (auto& [t, u] : per_tenant) {
    lo = std::min(lo, u);
    hi = std::max(hi, u);
  }
  EXPECT_LT(hi / lo, 1.15) << "usage over 20 rounds after convergence";
  // Cheap tenants run bigger chunks than expensive ones.
  EXPECT_GT(p.Monitor(1)->next_chunk_items, p.Monitor(4)->next_chunk_items);
}

TEST(SplitPolicyTest, WeightsScaleTheFairUsage) {
  // Weights 4:2:1 with the same per-item cost: after convergence each tenant's Eq. (1) usage per
  // round, and so its device time, follows its weight.
  SplitPolicy p(Options(2048, 8));
  const std::map<TenantId, double> weight = {{1, 4}, {2, 2}, {3, 1}};
  for (auto [t, w] : weight) {
    p.AddTenant({t, "t", w}, kT);
    p.Submit(Kernel(t, t, 64ull << 24), kT);
  }
  auto cost = PerItemCost({{1, 10}, {2, 10}, {3, 10}});
  Drive(p, cost, 3 * 60);
  std::map<TenantId, double> before;
  for (auto [t, w] : weight) before[t] = p.Monitor(t)->usage_s;
  Drive(p, cost, 3 * 30);
  double lo = 1e300, hi = 0;
  for (auto [t, w] : weight) {
    double per_weight = (p.Monitor(t)->usage_s - before[t]) / w;
    lo = std::min(lo, per_weight);
    hi = std::max(hi, per_weight);
  }
  EXPECT_LT(hi / lo, 1.2) << "usage per unit of weight over 30 rounds after convergence";
  EXPECT_GT(p.Monitor(1)->next_chunk_items, 2 * p.Monitor(3)->next_chunk_items);
}

TEST(SplitPolicyTest, HeavyTenantSitsOutExactlyOneRound) {
  // Round 1: u1 = 1.5 S, u2 = 4.5 S > 2 * u1, so tenant 2 sits out round 3. After round 2 it is
  // still above twice the least, but it never sits out two rounds in a row.
  SplitPolicyOptions o = Options(2048, 1);
  o.gain = 0;  // sizes stay at Eq. (2): only the throttle acts
  SplitPolicy p(o);
  p.AddTenant({1, "light", 1}, kT);
  p.AddTenant({2, "heavy", 1}, kT);
  p.AddTenant({3, "light2", 1}, kT);
  for (TenantId t = 1; t <= 3; ++t) p.Submit(Kernel(t, t, 64 << 20), kT);
  auto log = Drive(p, PerItemCost({{1, 1000}, {2, 3000}, {3, 1000}}), 40);
  std::map<uint64_t, std::vector<TenantId>> rounds;
  for (const auto& x : log) rounds[x.round].push_back(x.d.tenant);
  EXPECT_EQ(rounds[1], (std::vector<TenantId>{1, 2, 3}));
  EXPECT_EQ(rounds[2], (std::vector<TenantId>{1, 2, 3}));
  EXPECT_EQ(rounds[3], (std::vector<TenantId>{1, 3})) << "heavy sits out round 3";
  EXPECT_EQ(rounds[4], (std::vector<TenantId>{1, 2, 3})) << "and only round 3";
  bool sat_out_before = false;
  int sit_outs = 0;
  for (auto& [r, ts] : rounds) {
    if (r == rounds.rbegin()->first) break;  // the last round may be cut short
    bool sat_out = std::find(ts.begin(), ts.end(), 2u) == ts.end();
    EXPECT_FALSE(sat_out && sat_out_before) << "two rounds in a row at round " << r;
    sit_outs += sat_out;
    sat_out_before = sat_out;
    EXPECT_NE(std::find(ts.begin(), ts.end(), 1u), ts.end()) << "light tenants never sit out";
  }
  EXPECT_GE(sit_outs, 3);
}

TEST(SplitPolicyTest, NewTenantDoesNotThrottleTheOthers) {
  SplitPolicy p(Options(2048, 1));
  p.AddTenant({1, "a", 1}, kT);
  p.AddTenant({2, "b", 1}, kT);
  p.Submit(Kernel(1, 1, 64 << 20), kT);
  p.Submit(Kernel(2, 2, 64 << 20), kT);
  auto cost = PerItemCost({{1, 1000}, {2, 1000}, {3, 1000}});
  Drive(p, cost, 20);
  p.AddTenant({3, "c", 1}, kT);
  p.Submit(Kernel(3, 3, 64 << 20), kT);
  auto log = Drive(p, cost, 30);
  std::map<uint64_t, std::vector<TenantId>> rounds;
  for (const auto& x : log) rounds[x.round].push_back(x.d.tenant);
  for (auto& [r, ts] : rounds) {
    if (r == rounds.rbegin()->first) break;
    EXPECT_EQ(ts.size(), 3u) << "round " << r;
  }
  EXPECT_GE(p.Monitor(3)->usage_s, p.Monitor(1)->usage_s * 0.5)
      << "the newcomer starts at the least usage of the schedule, not at 0";
}

TEST(SplitPolicyTest, TenantLeavesWhenItsWorkIsDoneAndOthersGrow) {
  SplitPolicy p(Options(3072, 1));
  for (TenantId t = 1; t <= 3; ++t) p.AddTenant({t, "t", 1}, kT);
  p.Submit(Kernel(1, 1, 1024), kT);  // exactly one chunk at N = 3
  p.Submit(Kernel(2, 2, 64 * 1000), kT);
  p.Submit(Kernel(3, 3, 64 * 1000), kT);
  EXPECT_EQ(p.ActiveTenants(), 3u);
  EXPECT_EQ(p.Monitor(2)->next_chunk_items, 1024u);
  auto d = p.Pick(kT);
  ASSERT_TRUE(d && d->last);
  EXPECT_EQ(p.ActiveTenants(), 3u) << "in flight is still running work";
  p.Complete(Done(*d, std::chrono::microseconds(5)), kT);
  EXPECT_EQ(p.ActiveTenants(), 2u);
  EXPECT_FALSE(p.Monitor(1)->in_schedule);
  EXPECT_EQ(p.Monitor(2)->next_chunk_items, 1536u) << "3072 / 2";
  // It comes back with new work: it joins again, at the tail of the ring.
  p.Submit(Kernel(4, 1, 64 * 1000), kT);
  EXPECT_EQ(p.ActiveTenants(), 3u);
  EXPECT_TRUE(p.Monitor(1)->in_schedule);
}

TEST(SplitPolicyTest, MonitorTracksTheFourQuantities) {
  SplitPolicy p(Options(1024, 1));
  p.AddTenant({1, "a", 1}, kT);
  p.AddTenant({2, "b", 1}, kT);
  p.Submit(Kernel(1, 1, 6400), kT);
  p.Submit(Copy(2, 1, 100), kT);
  p.Submit(Kernel(3, 2, 6400), kT);
  auto m = p.Monitor(1);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->active_tenants, 2u);
  EXPECT_EQ(m->total_items, 6400u);
  EXPECT_EQ(m->processed_items, 0u);
  EXPECT_EQ(m->remaining_items, 6400u);
  auto d = p.Pick(kT);
  ASSERT_TRUE(d);
  EXPECT_EQ(p.Monitor(1)->remaining_items, 6400u) << "in flight is not processed yet";
  p.Complete(Done(*d, std::chrono::microseconds(3)), kT);
  m = p.Monitor(1);
  EXPECT_EQ(m->processed_items, 512u);
  EXPECT_EQ(m->remaining_items, 6400u - 512u);
  EXPECT_FALSE(p.Monitor(99));
}

TEST(SplitPolicyTest, RemovedTenantDoesNotStallRounds) {
  SplitPolicy p(Options(1024, 1));
  for (TenantId t = 1; t <= 3; ++t) {
    p.AddTenant({t, "t", 1}, kT);
    p.Submit(Kernel(t, t, 64 * 100), kT);
  }
  auto d1 = p.Pick(kT);
  ASSERT_TRUE(d1);
  EXPECT_EQ(d1->tenant, 1u);
  p.RemoveTenant(1, kT);  // in flight when removed
  p.Complete(Done(*d1, std::chrono::microseconds(3)), kT);  // late completion: ignored
  EXPECT_EQ(p.Pending(1), 0u);
  auto log = Drive(p, PerItemCost({{2, 1}, {3, 1}}));
  uint64_t items2 = 0, items3 = 0;
  for (const auto& x : log) {
    ASSERT_NE(x.d.tenant, 1u);
    (x.d.tenant == 2 ? items2 : items3) += x.d.range.size();
  }
  EXPECT_EQ(items2, 6400u);
  EXPECT_EQ(items3, 6400u);
  EXPECT_GT(p.round(), 3u);
}

// Seeded random workloads: arrivals interleaved with dispatches; every block is dispatched exactly
// once, per-tenant order holds, and Pick() never refuses while work is pending.
TEST(SplitPolicyTest, RandomWorkloadsKeepTheContract) {
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    auto below = [&](uint64_t n) { return rng() % n; };
    SplitPolicyOptions o = Options(64 * (1 + below(64)), 1 + static_cast<double>(below(50)));
    o.wavefront_width = below(2) ? 64 : 32;
    SplitPolicy p(o);
    const TenantId tenants = 2 + static_cast<TenantId>(below(6));
    for (TenantId t = 1; t <= tenants; ++t) p.AddTenant({t, "t", 1}, kT);
    std::map<TenantId, std::vector<CommandBlock>> submitted;
    std::map<TenantId, size_t> done_blocks;
    std::map<TenantId, uint64_t> next;
    BlockId id = 1;
    size_t pending = 0;
    TimePoint now{};
    for (int step = 0; step < 3000; ++step) {
      if (below(3) == 0) {
        TenantId t = 1 + static_cast<TenantId>(below(tenants));
        CommandBlock b;
        switch (below(5)) {
          case 0: b = Copy(id, t, 1000); break;
          case 1: b = Kernel(id, t, 64 * (1 + below(100)), 64, Splittable::kNo); break;
          default: {
            uint64_t local = uint64_t{1} << below(9);
            b = Kernel(id, t, local * (1 + below(400)), local);
          }
        }
        ++id;
        submitted[t].push_back(b);
        p.Submit(b, now);
        ++pending;
        continue;
      }
      auto d = p.Pick(now);
      size_t truly_pending = 0;
      for (TenantId t = 1; t <= tenants; ++t) truly_pending += p.Pending(t);
      if (!d) {
        ASSERT_EQ(truly_pending, 0u) << "work-conserving";
        continue;
      }
      const auto& blocks = submitted[d->tenant];
      size_t& i = done_blocks[d->tenant];
      ASSERT_LT(i, blocks.size());
      ASSERT_EQ(d->block, blocks[i].id);
      ASSERT_EQ(d->range.begin, next[d->tenant]);
      next[d->tenant] = d->range.end;
      ASSERT_EQ(d->last, d->range.end == blocks[i].work_items);
      if (!d->last) {
        ASSERT_GT(d->range.size(), 0u);
        ASSERT_EQ(d->range.size() % o.wavefront_width, 0u);
        ASSERT_EQ(d->range.size() % blocks[i].local_size(), 0u);
      } else {
        ++i;
        next[d->tenant] = 0;
        --pending;
      }
      Duration t = Duration(1 + static_cast<int64_t>(d->range.size() * (1 + below(5))));
      now += t;
      p.Complete(Done(*d, t), now);
    }
    // Drain.
    while (auto d = p.Pick(now)) {
      if (d->last) --pending;
      p.Complete(Done(*d, Duration(10)), now);
    }
    EXPECT_EQ(pending, 0u);
    EXPECT_EQ(p.ActiveTenants(), 0u);
  }
}

TEST(SplitPolicyTest, MakePolicyBuildsSplitAndChecksParameters) {
  PolicySpec spec{"split", {{"beta", 16}, {"gain", 0.5}}, {}};
  spec.device.compute_units = 32;
  auto p = MakePolicy(spec);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ((*p)->name(), "split");
  auto typo = MakePolicy({"split", {{"betta", 16}}, {}});
  ASSERT_FALSE(typo.ok());
  EXPECT_NE(typo.status().message().find("betta"), std::string::npos);
  auto bad = MakePolicy({"split", {{"min_scale", 2}}, {}});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("min_scale"), std::string::npos);
  EXPECT_NE(std::string(KnownPolicyNames()).find("split"), std::string::npos);
}

}  // namespace
}  // namespace gmux::core
