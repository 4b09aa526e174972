#include "core/rr_policy.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

namespace gmux::core {
namespace {

CommandBlock Kernel(BlockId id, TenantId tenant, uint64_t items = 64) {
  CommandBlock b;
  b.id = id;
  b.tenant = tenant;
  b.work_items = items;
  b.work_groups = items / 64;
  return b;
}

std::string Sequence(RrPolicy& p, TimePoint t, size_t max = 100) {
  std::string seq;
  while (seq.size() < max) {
    auto d = p.Pick(t);
    if (!d) break;
    seq += static_cast<char>('a' + d->tenant - 1);
    p.Complete({d->tenant, d->block, d->range, std::chrono::milliseconds(1), d->last}, t);
  }
  return seq;
}

TEST(RrPolicyTest, OneBlockPerTenantPerTurn) {
  RrPolicy p;
  TimePoint t{};
  p.AddTenant({1, "a", 1}, t);
  p.AddTenant({2, "b", 1}, t);
  p.AddTenant({3, "c", 1}, t);
  BlockId id = 1;
  for (int k = 0; k < 4; ++k) p.Submit(Kernel(id++, 1), t);  // a submits all first...
  for (int k = 0; k < 2; ++k) p.Submit(Kernel(id++, 2), t);
  p.Submit(Kernel(id++, 3), t);
  EXPECT_EQ(p.Pending(1), 4u);
  // ...but turns alternate, and a tenant whose channel empties leaves the ring.
  EXPECT_EQ(Sequence(p, t), "abcabaa");
  EXPECT_EQ(p.Pending(1), 0u);
  EXPECT_FALSE(p.Pick(t));
}

TEST(RrPolicyTest, OutOfTurnPicksKeepTheRingAndDropEmptiedTenants) {
  RrPolicy p;
  TimePoint t{};
  p.AddTenant({1, "a", 1}, t);
  p.AddTenant({2, "b", 1}, t);
  p.Submit(Kernel(1, 1), t);
  p.Submit(Kernel(2, 1), t);
  p.Submit(Kernel(3, 2), t);
  p.Submit(Kernel(4, 2), t);
  auto d = p.PickTenant(2, t);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->block, 3u);
  EXPECT_EQ(Sequence(p, t), "aba");
  p.Submit(Kernel(5, 2), t);
  EXPECT_EQ(p.PickTenant(2, t)->block, 5u);  // its channel empties: it leaves the ring
  EXPECT_FALSE(p.Pick(t));
  EXPECT_FALSE(p.PickTenant(1, t));
}

TEST(RrPolicyTest, IgnoresWeightsAndBlockSizes) {
  RrPolicy p;
  TimePoint t{};
  p.AddTenant({1, "a", 10}, t);
  p.AddTenant({2, "b", 1}, t);
  BlockId id = 1;
  for (int k = 0; k < 3; ++k) p.Submit(Kernel(id++, 1, 64), t);
  for (int k = 0; k < 3; ++k) p.Submit(Kernel(id++, 2, 1 << 20), t);
  EXPECT_EQ(Sequence(p, t), "ababab");
}

TEST(RrPolicyTest, TenantThatBecomesBackloggedJoinsTheBackOfTheRing) {
  RrPolicy p;
  TimePoint t{};
  p.AddTenant({1, "a", 1}, t);
  p.AddTenant({2, "b", 1}, t);
  p.AddTenant({3, "c", 1}, t);
  p.Submit(Kernel(1, 1), t);
  p.Submit(Kernel(2, 1), t);
  p.Submit(Kernel(3, 2), t);
  auto d = p.Pick(t);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->tenant, 1u);
  p.Submit(Kernel(4, 3), t);  // c arrives after a was moved behind b
  EXPECT_EQ(Sequence(p, t), "bac");
}

TEST(RrPolicyTest, PerTenantOrderAndWholeBlocks) {
  RrPolicy p;
  TimePoint t{};
  std::map<TenantId, std::vector<BlockId>> submitted, dispatched;
  for (TenantId id = 1; id <= 4; ++id) p.AddTenant({id, "t", 1}, t);
  uint64_t s = 12345;
  for (BlockId id = 1; id <= 400; ++id) {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    TenantId tenant = 1 + static_cast<TenantId>((s >> 33) % 4);
    submitted[tenant].push_back(id);
    p.Submit(Kernel(id, tenant, 64 * (1 + (s >> 40) % 8)), t);
    if (id % 3 == 0) {
      auto d = p.Pick(t);
      ASSERT_TRUE(d);
      EXPECT_TRUE(d->last);
      EXPECT_EQ(d->range.begin, 0u);
      dispatched[d->tenant].push_back(d->block);
    }
  }
  while (auto d = p.Pick(t)) dispatched[d->tenant].push_back(d->block);
  EXPECT_EQ(dispatched, submitted);
}

TEST(RrPolicyTest, NoStarvationUnderAFlood) {
  RrPolicy p;
  TimePoint t{};
  p.AddTenant({1, "flood", 1}, t);
  p.AddTenant({2, "quiet", 1}, t);
  BlockId id = 1;
  for (int k = 0; k < 1000; ++k) p.Submit(Kernel(id++, 1), t);
  p.Submit(Kernel(id++, 2), t);
  // The quiet tenant is served within one round (two dispatches), not after the flood.
  auto first = p.Pick(t);
  auto second = p.Pick(t);
  ASSERT_TRUE(first && second);
  EXPECT_TRUE(first->tenant == 2 || second->tenant == 2);
}

TEST(RrPolicyTest, RemoveTenantDropsItsBlocks) {
  RrPolicy p;
  TimePoint t{};
  p.AddTenant({1, "a", 1}, t);
  p.AddTenant({2, "b", 1}, t);
  p.Submit(Kernel(1, 1), t);
  p.Submit(Kernel(2, 1), t);
  p.Submit(Kernel(3, 2), t);
  auto d = p.Pick(t);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->tenant, 1u);
  p.RemoveTenant(1, t);
  EXPECT_EQ(p.Pending(1), 0u);
  p.Complete({1, d->block, d->range, std::chrono::milliseconds(1), true}, t);  // late, ignored
  EXPECT_EQ(Sequence(p, t), "b");
}

TEST(RrPolicyTest, MadeByName) {
  auto p = MakePolicy({"rr", {}, {}});
  ASSERT_TRUE(p.ok());
  EXPECT_EQ((*p)->name(), "rr");
  auto bad = MakePolicy({"rr", {{"quantum", 2}}, {}});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("quantum"), std::string::npos);
  EXPECT_NE(std::string(KnownPolicyNames()).find("rr"), std::string::npos);
  EXPECT_NE(std::string(KnownPolicyNames()).find("credit"), std::string::npos);
}

}  // namespace
}  // namespace gmux::core
