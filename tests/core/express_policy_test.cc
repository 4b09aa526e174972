// Express dispatch in the policies (docs/policies.md, "Express dispatch"): which policies let a
// lone tenant's blocks start without Pick(), and that accounting them with Express() leaves each
// policy as Submit() + Pick() would have.
#include <gtest/gtest.h>

#include <chrono>

#include "core/credit_policy.h"
#include "core/policy.h"

namespace gmux::core {
namespace {

using std::chrono::milliseconds;
using std::chrono::microseconds;

CommandBlock Kernel(BlockId id, TenantId tenant, uint64_t items = 64) {
  CommandBlock b;
  b.id = id;
  b.tenant = tenant;
  b.work_items = items;
  b.work_groups = 1;
  return b;
}

std::unique_ptr<Policy> Make(const std::string& name) {
  auto p = MakePolicy({name, {}, {}});
  EXPECT_TRUE(p.ok()) << p.status().message();
  return std::move(*p);
}

TEST(ExpressPolicyTest, OnlyPoliciesThatNeverHoldBackOrSplitALoneTenantAllowIt) {
  const TimePoint t0{};
  for (const char* name : {"fifo", "rr", "credit"}) {
    auto p = Make(name);
    p->AddTenant({1, "a", 1}, t0);
    EXPECT_TRUE(p->ExpressOk(1, t0)) << name;
  }
  // split may cut a lone tenant's launch into chunks; the SLA policy (built by the frame
  // controller, not by name) keeps the default too.
  auto split = Make("split");
  split->AddTenant({1, "a", 1}, t0);
  EXPECT_FALSE(split->ExpressOk(1, t0));
}

TEST(ExpressPolicyTest, ExpressedBlocksLeaveNothingPendingAndOthersStillGetPicked) {
  for (const char* name : {"fifo", "rr", "credit"}) {
    auto p = Make(name);
    TimePoint now{};
    p->AddTenant({1, "a", 1}, now);
    p->AddTenant({2, "b", 1}, now);
    for (BlockId id = 1; id <= 50; ++id) {
      p->Express(Kernel(id, 1), now);
      EXPECT_EQ(p->Pending(1), 0u) << name;
      EXPECT_FALSE(p->Pick(now).has_value()) << name << ": an expressed block was picked again";
      now += microseconds(100);
      p->Complete({1, id, {0, 64}, microseconds(100), true}, now);
    }
    // The other tenant's work goes through Pick() as usual afterwards (credit: once tenant 1's
    // idle_grace has passed, as on the ordinary path).
    now += milliseconds(10);
    p->Submit(Kernel(100, 2), now);
    auto d = p->Pick(now);
    ASSERT_TRUE(d.has_value()) << name;
    EXPECT_EQ(d->tenant, 2u);
    EXPECT_EQ(d->block, 100u);
  }
}

TEST(ExpressPolicyTest, CreditRefusesWhileAnotherTenantHasWork) {
  auto p = Make("credit");
  const TimePoint t0{};
  p->AddTenant({1, "a", 1}, t0);
  p->AddTenant({2, "b", 1}, t0);
  p->Submit(Kernel(1, 2), t0);
  EXPECT_FALSE(p->ExpressOk(1, t0));
  auto d = p->Pick(t0);
  ASSERT_TRUE(d.has_value());
  EXPECT_FALSE(p->ExpressOk(1, t0)) << "tenant 2's block is still in flight";
  p->Complete({2, 1, {0, 64}, milliseconds(1), true}, t0 + milliseconds(1));
  EXPECT_TRUE(p->ExpressOk(1, t0 + milliseconds(10)));
}

TEST(ExpressPolicyTest, CreditAccountsALoneTenantExactlyAsTheOrdinaryPath) {
  // A tenant alone for a long time, closed loop and bursts: after running by express its credit,
  // debt and slice are what running through Submit() + Pick() would have left, so the next
  // tenant to arrive meets the same state either way.
  auto run = [&](bool express, int burst) {
    CreditPolicy p(CreditPolicyOptions{}, DeviceInfo{});
    TimePoint now{};
    p.AddTenant({1, "a", 1}, now);
    p.AddTenant({2, "b", 2}, now);
    BlockId id = 1;
    for (int round = 0; round < 400; ++round) {
      std::vector<BlockId> ids;
      for (int i = 0; i < burst; ++i, ++id) {
        ids.push_back(id);
        if (express) {
          p.Express(Kernel(id, 1), now);
        } else {
          p.Submit(Kernel(id, 1), now);
          EXPECT_TRUE(p.Pick(now).has_value());
        }
      }
      for (BlockId done : ids) {
        now += microseconds(700);
        p.Complete({1, done, {0, 64}, microseconds(700), true}, now);
      }
      now += microseconds(round % 3 == 0 ? 2500 : 200);  // sometimes past idle_grace
    }
    return p.View(1);
  };
  for (int burst : {1, 4}) {
    const CreditTenantView ordinary = run(false, burst), express = run(true, burst);
    EXPECT_NEAR(express.credit1, ordinary.credit1, 1e-9) << "burst " << burst;
    EXPECT_NEAR(express.debt, ordinary.debt, 1e-9) << "burst " << burst;
    EXPECT_EQ(express.slice, ordinary.slice) << "burst " << burst;
    EXPECT_EQ(express.in_flight, 0u);
  }
}

}  // namespace
}  // namespace gmux::core
