#include "core/slot_allocator.h"

#include <cstdint>
#include <map>
#include <vector>

#include <gtest/gtest.h>

namespace gmux::core {
namespace {

SlotAllocator Make(SlotPolicy policy, int32_t slots) {
  SlotAllocatorOptions o;
  o.policy = policy;
  o.slots = slots;
  auto a = SlotAllocator::Create(o);
  EXPECT_TRUE(a.ok()) << a.status().ToString();
  return std::move(a).value();
}

int32_t Start(const SlotAllocator& a, TenantId id) {
  auto s = a.StartOf(id);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return s.ok() ? *s : -1;
}

// Occupancy must equal the placed ranges; owners must cover their slots; ranges stay in [0, M).
void ExpectConsistent(const SlotAllocator& a) {
  const int32_t m = a.options().slots;
  std::vector<int32_t> cover(static_cast<size_t>(m), 0);
  std::map<TenantId, SlotTenantInfo> by_id;
  for (const SlotTenantInfo& t : a.Tenants()) {
    by_id[t.id] = t;
    if (!t.start) continue;
    ASSERT_GE(*t.start, 0);
    ASSERT_LE(*t.start + t.need, m);
    for (int32_t s = *t.start; s < *t.start + t.need; ++s) ++cover[static_cast<size_t>(s)];
  }
  ASSERT_EQ(cover, a.occupancy());
  for (int32_t s = 0; s < m; ++s) {
    TenantId owner = a.owners()[static_cast<size_t>(s)];
    if (owner == kNoTenant) continue;
    auto it = by_id.find(owner);
    ASSERT_TRUE(it != by_id.end() && it->second.start) << "slot " << s << " owned by " << owner;
    ASSERT_GE(s, *it->second.start);
    ASSERT_LT(s, *it->second.start + it->second.need) << "slot " << s << " owner not covering it";
  }
}

TEST(SlotPolicyTest, NamesRoundTripAndUnknownIsAnError) {
  for (SlotPolicy p : {SlotPolicy::kBaseline, SlotPolicy::kSize, SlotPolicy::kUtilization}) {
    auto parsed = ParseSlotPolicy(SlotPolicyName(p));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, p);
  }
  auto bad = ParseSlotPolicy("largest");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("baseline, size, utilization"), std::string::npos);
}

TEST(SlotAllocatorOptionsTest, ValidateRejectsNonsense) {
  SlotAllocatorOptions o;
  EXPECT_TRUE(o.Validate().ok());
  o.slots = 0;
  EXPECT_FALSE(o.Validate().ok());
  EXPECT_FALSE(SlotAllocator::Create(o).ok());
  o = {};
  o.monitor_period = Duration::zero();
  EXPECT_FALSE(o.Validate().ok());
  o = {};
  o.utilization_window = -std::chrono::seconds(1);
  EXPECT_FALSE(o.Validate().ok());
  o = {};
  o.replacement_period = Duration::zero();  // disables re-placement: allowed
  EXPECT_TRUE(o.Validate().ok());
  o.replacement_period = -std::chrono::seconds(1);
  EXPECT_FALSE(o.Validate().ok());
}

// --- gScale baseline (Section II-A) ----------------------------------------------------------

TEST(GScaleTest, PaperExampleTakesSlotsFourAndFive) {
  // "if there are 5 slots and slots 1, 2, 3, and 4 are occupied by one VM, then the vGPU of a
  // newly created VM that requires 2 slots is allocated to slots 4 and 5" (1-based).
  std::vector<int32_t> occupancy = {1, 1, 1, 1, 0};
  std::vector<double> scores = GScaleScores(occupancy, 2, false);
  ASSERT_EQ(scores.size(), 4u);
  EXPECT_DOUBLE_EQ(scores[0], 2 * kGScaleOccupiedWeight);
  EXPECT_DOUBLE_EQ(scores[3], 1 * kGScaleOccupiedWeight);
  EXPECT_EQ(GScaleStart(occupancy, 2, false), 3);

  SlotAllocator a = Make(SlotPolicy::kBaseline, 5);
  ASSERT_TRUE(a.AddTenant(1, 4, TimePoint{}).ok());
  ASSERT_TRUE(a.AddTenant(2, 2, TimePoint{}).ok());
  EXPECT_EQ(Start(a, 1), 0);
  EXPECT_EQ(Start(a, 2), 3);
}

TEST(GScaleTest, TiesGoToTheLeftmostLowestScore) {
  EXPECT_EQ(GScaleStart({0, 0, 0, 0}, 2, false), 0);
  // Zero-score windows at 1 and 4: the leftmost wins.
  EXPECT_EQ(GScaleStart({1, 0, 0, 1, 0, 0}, 2, false), 1);
  // Everything occupied: every window scores the same, so the leftmost.
  EXPECT_EQ(GScaleStart({2, 2, 1, 1, 1}, 2, false), 0);
}

TEST(GScaleTest, PerOccupantWeightPrefersLessSharedSlots) {
  std::vector<int32_t> occupancy = {2, 2, 1, 1, 1};
  EXPECT_EQ(GScaleStart(occupancy, 2, true), 2);
  std::vector<double> scores = GScaleScores(occupancy, 2, true);
  EXPECT_DOUBLE_EQ(scores[0], 4 * kGScaleOccupiedWeight);
  EXPECT_DOUBLE_EQ(scores[2], 2 * kGScaleOccupiedWeight);
}

TEST(GScaleTest, BaselineNeverMovesAndNeverEvicts) {
  SlotAllocator a = Make(SlotPolicy::kBaseline, 10);
  ASSERT_TRUE(a.AddTenant(1, 6, TimePoint{}).ok());
  ASSERT_TRUE(a.AddTenant(2, 6, TimePoint{}).ok());
  EXPECT_EQ(Start(a, 2), 4);  // window 4..9 holds the most free slots
  ASSERT_TRUE(a.RemoveTenant(1, AtSeconds(1)).ok());  // held exclusive slots; still no move
  EXPECT_EQ(Start(a, 2), 4);
  for (int t = 1; t <= 60; ++t) a.Tick(AtSeconds(t));
  EXPECT_EQ(Start(a, 2), 4);
  EXPECT_EQ(a.counters().idle_evictions, 0);
  EXPECT_EQ(a.counters().moves, 0);
  EXPECT_EQ(a.counters().reallocations, 0);
}

// --- size-based greedy (Fig. 5) --------------------------------------------------------------

TEST(SizeBasedTest, WorkedExampleStartsZeroOneOneOne) {
  // Section III-B: M = 5, S = 4, 4, 3, 2 -> P = 0, 1, 1, 1; L = 3 shared slots.
  std::vector<SlotItem> items = {{0, 4, 0}, {1, 4, 0}, {2, 3, 0}, {3, 2, 0}};
  SlotLayout layout = SizeBasedLayout(5, items);
  EXPECT_EQ(layout.starts, (std::vector<int32_t>{0, 1, 1, 1}));
  ASSERT_TRUE(layout.shared_start.has_value());
  EXPECT_EQ(*layout.shared_start, 1);
  EXPECT_EQ(CountSharedSlots(5, {4, 4, 3, 2}, layout.starts), 3);
}

TEST(SizeBasedTest, SortsBySizeWhateverTheInputOrder) {
  std::vector<SlotItem> items = {{7, 2, 0}, {8, 4, 0}, {9, 3, 0}, {10, 4, 0}};
  SlotLayout layout = SizeBasedLayout(5, items);
  // id 8 (4 slots, lower id) first at 0; id 10 at the right end; 9 and 7 on top of L.
  EXPECT_EQ(layout.starts, (std::vector<int32_t>{1, 0, 1, 1}));
}

TEST(SizeBasedTest, EverythingFitsMeansNoSharedRegion) {
  SlotLayout layout = SizeBasedLayout(10, {{0, 3, 0}, {1, 5, 0}, {2, 2, 0}});
  EXPECT_EQ(layout.starts, (std::vector<int32_t>{5, 0, 8}));
  EXPECT_FALSE(layout.shared_start.has_value());
}

TEST(SizeBasedTest, IncrementalArrivalsReproduceTheWorkedExample) {
  SlotAllocator a = Make(SlotPolicy::kSize, 5);
  ASSERT_TRUE(a.AddTenant(0, 4, TimePoint{}).ok());
  ASSERT_TRUE(a.AddTenant(1, 4, TimePoint{}).ok());
  ASSERT_TRUE(a.AddTenant(2, 3, TimePoint{}).ok());
  ASSERT_TRUE(a.AddTenant(3, 2, TimePoint{}).ok());
  EXPECT_EQ(Start(a, 0), 0);
  EXPECT_EQ(Start(a, 1), 1);
  EXPECT_EQ(Start(a, 2), 1);
  EXPECT_EQ(Start(a, 3), 1);
  EXPECT_EQ(a.SharedRegionStart(), std::optional<int32_t>(1));
  EXPECT_EQ(a.SharedRegionLength(), 3);
  EXPECT_EQ(a.SharedSlots(), 3);
  EXPECT_EQ(a.counters().moves, 0);
  ExpectConsistent(a);
}

TEST(SizeBasedTest, NewTenantNoLargerThanLGoesOnTopOfL) {
  SlotAllocator a = Make(SlotPolicy::kSize, 10);
  ASSERT_TRUE(a.AddTenant(1, 6, TimePoint{}).ok());
  ASSERT_TRUE(a.AddTenant(2, 6, TimePoint{}).ok());  // V_K at the right end: L = slots 4..5
  EXPECT_EQ(Start(a, 2), 4);
  ASSERT_EQ(a.SharedRegionLength(), 2);
  ASSERT_TRUE(a.AddTenant(3, 2, TimePoint{}).ok());
  EXPECT_EQ(Start(a, 3), 4);
  EXPECT_EQ(a.SharedSlots(), 2);  // nothing new is shared
  EXPECT_EQ(a.counters().reallocations, 0);
}

TEST(SizeBasedTest, NewTenantLargerThanLReallocatesWhenThatSharesFewerSlots) {
  // Four 2-slot tenants packed at 0..7 (free 8..9), then one of 5: on top of the would-be L at
  // 5..9 shares slots 5, 6, 7 (3); Fig. 5 over all five (5, 2, 2, 2 | 2 on top) shares 2.
  SlotAllocator a = Make(SlotPolicy::kSize, 10);
  for (TenantId id = 1; id <= 4; ++id) ASSERT_TRUE(a.AddTenant(id, 2, TimePoint{}).ok());
  ASSERT_TRUE(a.AddTenant(5, 5, TimePoint{}).ok());
  EXPECT_EQ(Start(a, 5), 0);
  EXPECT_EQ(Start(a, 1), 5);
  EXPECT_EQ(Start(a, 2), 7);
  EXPECT_EQ(Start(a, 3), 8);
  EXPECT_EQ(Start(a, 4), 8);
  EXPECT_EQ(a.SharedSlots(), 2);
  EXPECT_EQ(a.counters().reallocations, 1);
  // Every old tenant moved: 4 moves of 2 slots each; placing the newcomer is not a move.
  EXPECT_EQ(a.counters().moves, 4);
  EXPECT_EQ(a.counters().move_copies, 8);
  ExpectConsistent(a);
}

TEST(SizeBasedTest, NewTenantLargerThanLStaysIncrementalOnATie) {
  // 6 + 6 in 10 slots shares 2 either way: no reallocation, nobody moves.
  SlotAllocator a = Make(SlotPolicy::kSize, 10);
  ASSERT_TRUE(a.AddTenant(1, 6, TimePoint{}).ok());
  ASSERT_TRUE(a.AddTenant(2, 6, TimePoint{}).ok());
  ASSERT_TRUE(a.AddTenant(3, 3, TimePoint{}).ok());  // 3 > L = 2
  EXPECT_EQ(Start(a, 3), 4);
  EXPECT_EQ(a.SharedSlots(), 3);
  EXPECT_EQ(a.counters().reallocations, 0);
  EXPECT_EQ(a.counters().moves, 0);
}

TEST(SizeBasedTest, TerminationReallocatesOnlyWhenExclusiveSlotsAreFreed) {
  SlotAllocator a = Make(SlotPolicy::kSize, 5);
  ASSERT_TRUE(a.AddTenant(0, 4, TimePoint{}).ok());
  ASSERT_TRUE(a.AddTenant(1, 4, TimePoint{}).ok());
  ASSERT_TRUE(a.AddTenant(2, 3, TimePoint{}).ok());
  ASSERT_TRUE(a.AddTenant(3, 2, TimePoint{}).ok());
  // Tenant 3 (slots 1..2) shared every slot it had: just removed.
  ASSERT_TRUE(a.RemoveTenant(3, AtSeconds(1)).ok());
  EXPECT_EQ(a.counters().reallocations, 0);
  EXPECT_EQ(Start(a, 1), 1);
  EXPECT_EQ(Start(a, 2), 1);
  // Tenant 0 held slot 0 alone: everything is reallocated (4 at 0, 3 at the right end).
  ASSERT_TRUE(a.RemoveTenant(0, AtSeconds(2)).ok());
  EXPECT_EQ(a.counters().reallocations, 1);
  EXPECT_EQ(Start(a, 1), 0);
  EXPECT_EQ(Start(a, 2), 2);
  EXPECT_EQ(a.counters().moves, 2);
  EXPECT_EQ(a.counters().move_copies, 4 + 3);
  EXPECT_FALSE(a.Contains(0));
  ExpectConsistent(a);
}

// --- utilization-based greedy (Fig. 6) -------------------------------------------------------

TEST(UtilizationBasedTest, BusiestTenantsPackedLeftRestAtTheRightEnd) {
  std::vector<SlotItem> items = {{0, 4, 0.1}, {1, 4, 0.9}, {2, 3, 0.5}, {3, 2, 0.2}};
  SlotLayout layout = UtilizationBasedLayout(10, items);
  // Order 1, 2, 3, 0: 1 at 0..3, 2 at 4..6, 3 at 7..8, 0 does not fit -> 6..9.
  EXPECT_EQ(layout.starts, (std::vector<int32_t>{6, 0, 4, 7}));
  // Equal utilisation falls back to size order, then id.
  SlotLayout tie = UtilizationBasedLayout(5, {{0, 2, 0}, {1, 4, 0}, {2, 4, 0}});
  EXPECT_EQ(tie.starts, (std::vector<int32_t>{3, 0, 1}));
}

TEST(UtilizationBasedTest, PeriodicReplacementFollowsMeasuredUtilizationAndCountsMoves) {
  SlotAllocatorOptions o;
  o.policy = SlotPolicy::kUtilization;
  o.slots = 10;
  auto created = SlotAllocator::Create(o);
  ASSERT_TRUE(created.ok());
  SlotAllocator a = std::move(created).value();
  ASSERT_TRUE(a.AddTenant(1, 5, TimePoint{}).ok());
  ASSERT_TRUE(a.AddTenant(2, 5, TimePoint{}).ok());
  ASSERT_TRUE(a.AddTenant(3, 5, TimePoint{}).ok());
  EXPECT_EQ(Start(a, 1), 0);
  EXPECT_EQ(Start(a, 2), 5);
  EXPECT_EQ(Start(a, 3), 5);  // no free run: the right end
  // Per second: tenant 3 busy 100 %, tenant 1 50 %, tenant 2 1 %.
  for (int t = 0; t < 20; ++t) {
    TimePoint s = AtSeconds(t);
    ASSERT_TRUE(a.RecordUse(3, s, s + std::chrono::milliseconds(1000)).ok());
    ASSERT_TRUE(a.RecordUse(1, s, s + std::chrono::milliseconds(500)).ok());
    ASSERT_TRUE(a.RecordUse(2, s, s + std::chrono::milliseconds(10)).ok());
    a.Tick(AtSeconds(t + 1));
    if (t + 1 < 20) {
      EXPECT_EQ(Start(a, 3), 5) << "moved before the period at t=" << t + 1;
    }
  }
  EXPECT_NEAR(a.Utilization(3), 1.0, 1e-9);
  EXPECT_NEAR(a.Utilization(1), 0.5, 1e-9);
  EXPECT_NEAR(a.Utilization(2), 0.01, 1e-9);
  // At t = 20: order 3, 1, 2 -> 3 at 0, 1 at 5, 2 at the right end (5).
  EXPECT_EQ(Start(a, 3), 0);
  EXPECT_EQ(Start(a, 1), 5);
  EXPECT_EQ(Start(a, 2), 5);
  EXPECT_EQ(a.counters().moves, 2);
  EXPECT_EQ(a.counters().move_copies, 10);
  EXPECT_EQ(a.counters().reallocations, 1);
  // A moved tenant's entries were copied to its new place: switching to it copies nothing.
  auto copies = a.SwitchTo(3, AtSeconds(20));
  ASSERT_TRUE(copies.ok());
  EXPECT_EQ(*copies, 0);
  ExpectConsistent(a);
}

// Three tenants that all fit: Fig. 6 would reorder them by utilisation, which moves tenants
// without removing any sharing. By default that re-placement is skipped; the paper's
// unconditional behaviour is an option.
TEST(UtilizationBasedTest, ReplacementThatSharesNothingLessIsSkippedUnlessConfigured) {
  for (bool only_if_better : {true, false}) {
    SlotAllocatorOptions o;
    o.policy = SlotPolicy::kUtilization;
    o.slots = 12;
    o.replacement_only_if_better = only_if_better;
    auto created = SlotAllocator::Create(o);
    ASSERT_TRUE(created.ok());
    SlotAllocator a = std::move(created).value();
    for (TenantId id = 1; id <= 3; ++id) ASSERT_TRUE(a.AddTenant(id, 4, TimePoint{}).ok());
    ASSERT_EQ(Start(a, 3), 8);
    for (int t = 0; t < 20; ++t) {
      ASSERT_TRUE(a.RecordUse(3, AtSeconds(t), AtSeconds(t + 0.9)).ok());
      ASSERT_TRUE(a.RecordUse(1, AtSeconds(t), AtSeconds(t + 0.1)).ok());
      ASSERT_TRUE(a.RecordUse(2, AtSeconds(t), AtSeconds(t + 0.1)).ok());
      a.Tick(AtSeconds(t + 1));
    }
    if (only_if_better) {
      EXPECT_EQ(Start(a, 3), 8);
      EXPECT_EQ(a.counters().moves, 0);
      EXPECT_EQ(a.counters().skipped_replacements, 1);
    } else {
      EXPECT_EQ(Start(a, 3), 0);  // busiest first
      EXPECT_GT(a.counters().moves, 0);
      EXPECT_EQ(a.counters().skipped_replacements, 0);
    }
    EXPECT_EQ(a.SharedSlots(), 0);
  }
}

TEST(UtilizationBasedTest, WeightedSharedSlotsCountsUtilizationTimesSharedSlots) {
  // 0..3 (u = 0.5) and 2..5 (u = 0.25) share slots 2, 3; 6..7 (u = 1) is alone.
  std::vector<SlotItem> items = {{0, 4, 0.5}, {1, 4, 0.25}, {2, 2, 1.0}};
  EXPECT_DOUBLE_EQ(WeightedSharedSlots(8, items, {0, 2, 6}), 0.5 * 2 + 0.25 * 2);
}

TEST(UtilizationBasedTest, UtilizationIsAveragedOverTheWindowOnly) {
  SlotAllocatorOptions o;
  o.policy = SlotPolicy::kUtilization;
  o.slots = 4;
  o.replacement_period = Duration::zero();
  o.idle_detection = false;
  auto created = SlotAllocator::Create(o);
  ASSERT_TRUE(created.ok());
  SlotAllocator a = std::move(created).value();
  ASSERT_TRUE(a.AddTenant(1, 2, TimePoint{}).ok());
  // Fully busy for 20 s, then idle for 10 s: the 20 s window holds 10 busy and 10 idle seconds.
  for (int t = 0; t < 30; ++t) {
    if (t < 20) {
      ASSERT_TRUE(a.RecordUse(1, AtSeconds(t), AtSeconds(t + 1)).ok());
    }
    a.Tick(AtSeconds(t + 1));
  }
  EXPECT_NEAR(a.Utilization(1), 0.5, 1e-9);
}

// --- idle detection (Section III-A) ----------------------------------------------------------

TEST(IdleDetectionTest, UnusedFor20SecondsIsTreatedAsTerminated) {
  SlotAllocator a = Make(SlotPolicy::kSize, 10);
  ASSERT_TRUE(a.AddTenant(1, 6, TimePoint{}).ok());
  ASSERT_TRUE(a.AddTenant(2, 6, TimePoint{}).ok());
  ASSERT_EQ(Start(a, 2), 4);
  for (int t = 1; t <= 19; ++t) {
    ASSERT_TRUE(a.RecordUse(1, AtSeconds(t - 1), AtSeconds(t - 0.5)).ok());
    a.Tick(AtSeconds(t));
  }
  EXPECT_TRUE(a.StartOf(2).ok()) << "evicted before the threshold";
  ASSERT_TRUE(a.RecordUse(1, AtSeconds(19), AtSeconds(19.5)).ok());
  a.Tick(AtSeconds(20));
  auto gone = a.StartOf(2);
  ASSERT_FALSE(gone.ok());
  EXPECT_EQ(gone.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(a.counters().idle_evictions, 1);
  EXPECT_EQ(a.SharedSlots(), 0);
  // Tenant 2 held slots 6..9 alone, so the rest was reallocated (tenant 1 stays at 0).
  EXPECT_EQ(a.counters().reallocations, 1);
  EXPECT_EQ(Start(a, 1), 0);
  // It comes back as a new tenant on its next switch-in and copies its whole range.
  auto copies = a.SwitchTo(2, AtSeconds(21));
  ASSERT_TRUE(copies.ok());
  EXPECT_EQ(*copies, 6);
  EXPECT_EQ(Start(a, 2), 4);
  ExpectConsistent(a);
}

TEST(IdleDetectionTest, DisabledByOption) {
  SlotAllocatorOptions o;
  o.slots = 10;
  o.idle_detection = false;
  auto created = SlotAllocator::Create(o);
  ASSERT_TRUE(created.ok());
  SlotAllocator a = std::move(created).value();
  ASSERT_TRUE(a.AddTenant(1, 6, TimePoint{}).ok());
  for (int t = 1; t <= 60; ++t) a.Tick(AtSeconds(t));
  EXPECT_TRUE(a.StartOf(1).ok());
  EXPECT_EQ(a.counters().idle_evictions, 0);
}

// --- switch cost -----------------------------------------------------------------------------

TEST(SwitchCostTest, CopiesOnlySlotsHoldingSomeoneElsesEntries) {
  SlotAllocator a = Make(SlotPolicy::kSize, 5);
  ASSERT_TRUE(a.AddTenant(0, 4, TimePoint{}).ok());  // 0..3
  ASSERT_TRUE(a.AddTenant(1, 4, TimePoint{}).ok());  // 1..4
  auto c = a.SwitchTo(0, AtSeconds(1));
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(*c, 4);  // first load
  c = a.SwitchTo(0, AtSeconds(2));
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(*c, 0);  // already active: no switch at all
  EXPECT_EQ(a.counters().switches, 1);
  c = a.SwitchTo(1, AtSeconds(3));
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(*c, 4);  // slots 1..3 held tenant 0's entries, slot 4 nothing
  c = a.SwitchTo(0, AtSeconds(4));
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(*c, 3);  // only the shared slots 1..3; slot 0 still holds tenant 0's entries
  EXPECT_EQ(a.counters().switches, 3);
  EXPECT_EQ(a.counters().switch_copies, 11);
  EXPECT_EQ(a.Tenants()[0].copies, 7);
  EXPECT_EQ(a.Tenants()[1].copies, 4);
}

TEST(SwitchCostTest, ExclusiveTenantsCopyOnlyOnce) {
  SlotAllocator a = Make(SlotPolicy::kSize, 10);
  ASSERT_TRUE(a.AddTenant(1, 5, TimePoint{}).ok());
  ASSERT_TRUE(a.AddTenant(2, 5, TimePoint{}).ok());
  int64_t total = 0;
  for (int i = 0; i < 10; ++i) {
    auto c = a.SwitchTo(i % 2 == 0 ? 1 : 2, AtSeconds(i));
    ASSERT_TRUE(c.ok());
    total += *c;
  }
  EXPECT_EQ(total, 10);
  EXPECT_EQ(a.counters().switches, 10);
}

// --- errors ----------------------------------------------------------------------------------

TEST(SlotAllocatorTest, BadRequestsAreErrorsNotCrashes) {
  SlotAllocator a = Make(SlotPolicy::kSize, 5);
  Status big = a.AddTenant(1, 6, TimePoint{});
  EXPECT_EQ(big.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(big.message().find("[1, 5]"), std::string::npos) << big.message();
  EXPECT_EQ(a.AddTenant(1, 0, TimePoint{}).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(a.AddTenant(1, 2, TimePoint{}).ok());
  EXPECT_EQ(a.AddTenant(1, 2, TimePoint{}).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(a.RemoveTenant(9, TimePoint{}).code(), StatusCode::kNotFound);
  EXPECT_EQ(a.SwitchTo(9, TimePoint{}).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(a.RecordUse(9, TimePoint{}, TimePoint{}).code(), StatusCode::kNotFound);
  EXPECT_EQ(a.RecordUse(1, AtSeconds(2), AtSeconds(1)).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(a.StartOf(9).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(a.size(), 1u);
  ExpectConsistent(a);
}

// --- invariants under a seeded random sequence of operations ---------------------------------

class SlotAllocatorRandomTest : public ::testing::TestWithParam<SlotPolicy> {};

TEST_P(SlotAllocatorRandomTest, LayoutStaysConsistent) {
  const uint64_t seed = 20240611;
  uint64_t x = seed;
  auto next = [&x](uint64_t n) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    return (x >> 33) % n;
  };
  SlotAllocator a = Make(GetParam(), 30);
  std::vector<TenantId> live;
  TenantId next_id = 0;
  for (int step = 0; step < 3000; ++step) {
    TimePoint now = AtSeconds(step * 0.1);
    uint64_t op = next(10);
    if (op < 2 || live.empty()) {
      ASSERT_TRUE(a.AddTenant(next_id, static_cast<int32_t>(1 + next(12)), now).ok());
      live.push_back(next_id++);
    } else if (op == 2 && live.size() > 2) {
      size_t i = next(live.size());
      ASSERT_TRUE(a.RemoveTenant(live[i], now).ok());
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
    } else if (op < 8) {
      // Only the first half of the tenants is ever used, so the rest goes idle.
      TenantId id = live[next((live.size() + 1) / 2)];
      ASSERT_TRUE(a.SwitchTo(id, now).ok());
      ASSERT_TRUE(a.RecordUse(id, now, now + std::chrono::milliseconds(50)).ok());
    } else {
      a.Tick(now);
    }
    ASSERT_NO_FATAL_FAILURE(ExpectConsistent(a)) << "seed " << seed << " step " << step;
  }
  EXPECT_GT(a.counters().switch_copies, 0);
  if (GetParam() != SlotPolicy::kBaseline) {
    EXPECT_GT(a.counters().idle_evictions, 0);
    EXPECT_GT(a.counters().reallocations, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(AllPolicies, SlotAllocatorRandomTest,
                         ::testing::Values(SlotPolicy::kBaseline, SlotPolicy::kSize,
                                           SlotPolicy::kUtilization),
                         [](const ::testing::TestParamInfo<SlotPolicy>& p) {
                           return std::string(SlotPolicyName(p.param));
                         });

}  // namespace
}  // namespace gmux::core
