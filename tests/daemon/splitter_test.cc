// The splitter's pure arithmetic: the chunk geometry of a launch, without a backend. Plans must
// cost the same for any launch size (a huge prime global size once made planning spin).
#include "daemon/splitter.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>

namespace gmux::daemon {
namespace {

constexpr size_t kPrime61 = (size_t{1} << 61) - 1;  // a Mersenne prime

// The quantisation as first written, by linear search; a reference for small slab counts.
uint64_t ReferenceGranules(uint64_t slabs) {
  uint64_t per = 1;
  while (per < slabs && (slabs % per != 0 || slabs / per > kMaxGranules)) ++per;
  return slabs / per;
}

TEST(PlanSplitGeometryTest, GranulesMatchTheLinearSearchForOrdinarySizes) {
  for (size_t slabs = 1; slabs <= 5000; ++slabs) {
    const uint64_t want = ReferenceGranules(slabs);
    auto plan = PlanSplitGeometry(1, {slabs * 64, 1, 1}, {64, 1, 1});
    if (want < 2) {
      EXPECT_FALSE(plan.has_value()) << "slabs " << slabs;
      continue;
    }
    ASSERT_TRUE(plan.has_value()) << "slabs " << slabs;
    EXPECT_EQ(plan->granules, want) << "slabs " << slabs;
    EXPECT_EQ(slabs % plan->granules, 0u) << "slabs " << slabs;
  }
}

TEST(PlanSplitGeometryTest, HugePrimeGlobalSizeIsNotSplit) {
  // 2^61 - 1 slabs of one work-item: no divisor in 2..kMaxGranules, so the launch runs whole.
  EXPECT_FALSE(PlanSplitGeometry(1, {kPrime61, 1, 1}, {1, 1, 1}).has_value());
  EXPECT_FALSE(PlanSplitGeometry(2, {4, kPrime61, 1}, {4, 1, 1}).has_value());
  EXPECT_FALSE(PlanSplitGeometry(3, {2, 2, kPrime61}, {1, 1, 1}).has_value());
}

TEST(PlanSplitGeometryTest, HugeSizesWithSmallFactorsSplitIntoAtMostMaxGranules) {
  auto pow2 = PlanSplitGeometry(1, {size_t{1} << 61, 1, 1}, {1, 1, 1});
  ASSERT_TRUE(pow2.has_value());
  EXPECT_EQ(pow2->granules, kMaxGranules);
  EXPECT_EQ(pow2->row_items, 1u);

  // 3 * (2^61 - 1): the only small divisor is 3.
  auto three = PlanSplitGeometry(1, {3 * kPrime61, 1, 1}, {1, 1, 1});
  ASSERT_TRUE(three.has_value());
  EXPECT_EQ(three->granules, 3u);

  // 30 * 2^58: 32 divides it.
  auto mixed = PlanSplitGeometry(1, {size_t{30} << 58, 1, 1}, {1, 1, 1});
  ASSERT_TRUE(mixed.has_value());
  EXPECT_EQ(mixed->granules, 32u);

  // 2^64 - 1 = 3 * 5 * 17 * 257 * 641 * 65537 * 6700417: 17 is its largest divisor up to 32.
  const size_t max = std::numeric_limits<size_t>::max();
  auto full = PlanSplitGeometry(1, {max, 1, 1}, {1, 1, 1});
  ASSERT_TRUE(full.has_value());
  EXPECT_EQ(full->granules, 17u);
}

TEST(PlanSplitGeometryTest, RowItemsAreTheWorkItemsOfOneIndexOfTheLastDimension) {
  auto plan = PlanSplitGeometry(3, {8, 6, 64}, {4, 2, 2});
  ASSERT_TRUE(plan.has_value());
  EXPECT_EQ(plan->dim, 3u);
  EXPECT_EQ(plan->row_items, 48u);
  EXPECT_EQ(plan->granules, 32u);  // 64 / 2 slabs
  EXPECT_EQ(plan->local, (std::array<size_t, 3>{4, 2, 2}));
}

TEST(PlanSplitGeometryTest, WorkItemsOverflowingUint64AreNotSplit) {
  const size_t big = size_t{1} << 40;
  EXPECT_FALSE(PlanSplitGeometry(2, {big, big, 1}, {1, 1, 1}).has_value());
  EXPECT_FALSE(PlanSplitGeometry(3, {big, 1, big}, {1, 1, 1}).has_value());
  EXPECT_FALSE(PlanSplitGeometry(3, {big, big, 2}, {1, 1, 1}).has_value());
  // 2^32 * 2^31 fits.
  auto fits = PlanSplitGeometry(2, {size_t{1} << 32, size_t{1} << 31, 1}, {1, 1, 1});
  ASSERT_TRUE(fits.has_value());
  EXPECT_EQ(fits->row_items, uint64_t{1} << 32);
}

TEST(PlanSplitGeometryTest, RejectsBadShapes) {
  EXPECT_FALSE(PlanSplitGeometry(0, {64, 1, 1}, {1, 1, 1}).has_value());
  EXPECT_FALSE(PlanSplitGeometry(4, {64, 1, 1}, {1, 1, 1}).has_value());
  EXPECT_FALSE(PlanSplitGeometry(1, {64, 1, 1}, {0, 1, 1}).has_value());
  EXPECT_FALSE(PlanSplitGeometry(1, {64, 1, 1}, {48, 1, 1}).has_value());  // does not divide
  EXPECT_FALSE(PlanSplitGeometry(2, {64, 64, 1}, {8, 0, 1}).has_value());
  EXPECT_FALSE(PlanSplitGeometry(1, {64, 1, 1}, {64, 1, 1}).has_value());  // one slab
  EXPECT_FALSE(PlanSplitGeometry(1, {0, 1, 1}, {1, 1, 1}).has_value());
  // Entries past dim are ignored (the app passes only dim of them).
  EXPECT_TRUE(PlanSplitGeometry(1, {64, 1, 1}, {8, 0, 0}).has_value());
}

TEST(ChooseSplitLocalSizeTest, LargestDivisorUpToTheKernelLimit) {
  EXPECT_EQ(ChooseSplitLocalSize(4096, 256), 256u);
  EXPECT_EQ(ChooseSplitLocalSize(4096, 4096), kMaxChosenLocal);
  EXPECT_EQ(ChooseSplitLocalSize(3000, 1024), 1000u);
  EXPECT_EQ(ChooseSplitLocalSize(10, 1024), 10u);
  EXPECT_EQ(ChooseSplitLocalSize(size_t{1} << 60, std::numeric_limits<size_t>::max()),
            kMaxChosenLocal);
}

TEST(ChooseSplitLocalSizeTest, RefusesTinyGroupsAndUnknownLimits) {
  EXPECT_FALSE(ChooseSplitLocalSize(4096, 0).has_value());
  EXPECT_FALSE(ChooseSplitLocalSize(kPrime61, 1024).has_value());  // only 1 divides
  EXPECT_FALSE(ChooseSplitLocalSize(2 * 1031, 1024).has_value());  // 2 < 16
  EXPECT_FALSE(ChooseSplitLocalSize(4096, 8).has_value());
}

TEST(ChunkGeometryTest, ChunksCoverWholeRowsOfTheLastDimension) {
  auto plan = PlanSplitGeometry(2, {48, 64, 1}, {16, 2, 1});
  ASSERT_TRUE(plan.has_value());
  const uint64_t g = 48 * 64 / plan->granules;
  std::array<size_t, 3> off{}, gs{};
  ChunkGeometry(*plan, {5, 7, 0}, {48, 64, 1}, core::WorkRange{g, 3 * g}, off, gs);
  EXPECT_EQ(off, (std::array<size_t, 3>{5, 7 + g / 48, 0}));
  EXPECT_EQ(gs, (std::array<size_t, 3>{48, 2 * g / 48, 1}));
}

}  // namespace
}  // namespace gmux::daemon
