#include "core/fifo_policy.h"

#include <gtest/gtest.h>

namespace gmux::core {
namespace {

CommandBlock Kernel(BlockId id, TenantId tenant, uint64_t items) {
  CommandBlock b;
  b.id = id;
  b.tenant = tenant;
  b.work_items = items;
  b.work_groups = items / 64;
  return b;
}

TEST(FifoPolicyTest, DispatchesInArrivalOrderAcrossTenants) {
  FifoPolicy p;
  TimePoint t{};
  p.AddTenant({1, "a", 1}, t);
  p.AddTenant({2, "b", 1}, t);
  p.Submit(Kernel(10, 2, 128), t);
  p.Submit(Kernel(11, 1, 64), t);
  p.Submit(Kernel(12, 2, 64), t);
  EXPECT_EQ(p.Pending(2), 2u);
  auto d1 = p.Pick(t);
  auto d2 = p.Pick(t);
  auto d3 = p.Pick(t);
  ASSERT_TRUE(d1 && d2 && d3);
  EXPECT_EQ(d1->block, 10u);
  EXPECT_EQ(d1->range, (WorkRange{0, 128}));
  EXPECT_EQ(d2->block, 11u);
  EXPECT_EQ(d3->block, 12u);
  EXPECT_FALSE(p.Pick(t));
  EXPECT_EQ(p.Pending(2), 0u);
}

TEST(FifoPolicyTest, RemovedTenantsBlocksAreDropped) {
  FifoPolicy p;
  TimePoint t{};
  p.AddTenant({1, "a", 1}, t);
  p.AddTenant({2, "b", 1}, t);
  p.Submit(Kernel(1, 1, 64), t);
  p.Submit(Kernel(2, 2, 64), t);
  p.RemoveTenant(1, t);
  auto d = p.Pick(t);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->tenant, 2u);
  EXPECT_FALSE(p.Pick(t));
}

TEST(FifoPolicyTest, OutOfTurnPickTakesTheTenantsOldestBlockAheadOfOthers) {
  FifoPolicy p;
  TimePoint t{};
  p.AddTenant({1, "a", 1}, t);
  p.AddTenant({2, "b", 1}, t);
  p.Submit(Kernel(1, 1, 64), t);
  p.Submit(Kernel(2, 2, 64), t);
  p.Submit(Kernel(3, 2, 64), t);
  EXPECT_TRUE(p.PicksOutOfTurn());
  auto d = p.PickTenant(2, t);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->block, 2u);
  EXPECT_EQ(p.Pending(2), 1u);
  EXPECT_EQ(p.Pick(t)->block, 1u);  // the others keep their order
  EXPECT_EQ(p.Pick(t)->block, 3u);
  EXPECT_FALSE(p.PickTenant(2, t));
  EXPECT_FALSE(p.PickTenant(7, t));
}

TEST(MakePolicyTest, RejectsUnknownNamesAndParameters) {
  EXPECT_TRUE(MakePolicy({"fifo", {}, {}}).ok());
  auto bad = MakePolicy({"lottery", {}, {}});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("lottery"), std::string::npos);
  auto typo = MakePolicy({"fifo", {{"wieght", 1}}, {}});
  ASSERT_FALSE(typo.ok());
  EXPECT_NE(typo.status().message().find("wieght"), std::string::npos);
}

}  // namespace
}  // namespace gmux::core
