// Closed-loop tenants on a non-preemptible device (docs/policies.md, credit, "Slices and closed
// loops"): tenants that submit one launch, wait for it, think briefly and submit the next, with
// launches of 1x to 16x the work. Deterministic: the simulator with fixed seeds.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/credit_policy.h"
#include "core/metrics.h"
#include "core/policy.h"
#include "sim/kernel_sim.h"
#include "sim/workloads.h"

namespace gmux::sim {
namespace {

struct TenantDef {
  std::string name;
  double weight;
  double cost_ms;       // device time of one launch
  bool splittable = true;
  uint32_t depth = 1;   // launches per task: 1 is launch + clFinish
};

struct Outcome {
  std::vector<TenantResult> tenants;
  double busy = 0;  // device busy fraction
  std::vector<double> shares() const {
    std::vector<double> s;
    for (const auto& t : tenants) s.push_back(t.share);
    return s;
  }
};

// 1 ms of device time is 4096 work-items in 64 work-groups, on a device that takes up to two
// dispatches at once (the daemon's default inflight_per_device) and pays 50 us per dispatch.
Outcome Simulate(const std::string& policy, const std::vector<TenantDef>& defs,
             std::map<std::string, double> params = {}, double seconds = 20) {
  core::PolicySpec spec{policy, std::move(params), {}};
  spec.device.compute_units = 2;
  spec.device.wavefront_width = 1;
  auto made = core::MakePolicy(spec);
  EXPECT_TRUE(made.ok()) << made.status().message();
  KernelSimOptions o;
  o.duration = FromSeconds(seconds);
  o.inflight = 2;
  o.dispatch_overhead = std::chrono::microseconds(50);
  o.device = spec.device;
  o.seed = 11;
  KernelSim sim(o, **made);
  for (const TenantDef& d : defs) {
    KernelLoopOptions k;
    k.label = d.name;
    k.work_items = static_cast<uint64_t>(4096 * d.cost_ms);
    k.local_size = 64;
    k.kernel_cost_s = d.cost_ms * 1e-3;
    k.splittable = d.splittable;
    k.kernels_per_task = d.depth;
    k.interference.think_s = 0.3e-3;  // reply, return from clFinish, next enqueue
    auto w = MakeKernelLoop(k);
    EXPECT_TRUE(w.ok());
    EXPECT_TRUE(sim.AddTenant(d.name, d.weight, std::move(*w)).ok());
  }
  auto r = sim.Run();
  EXPECT_TRUE(r.ok()) << r.status().message();
  Outcome out;
  out.tenants = r->tenants;
  out.busy = r->busy_s / r->end_s;
  return out;
}

std::vector<double> WeightShares(const std::vector<TenantDef>& defs) {
  double sum = 0;
  for (const auto& d : defs) sum += d.weight;
  std::vector<double> s;
  for (const auto& d : defs) s.push_back(d.weight / sum);
  return s;
}

double WorstError(const std::vector<double>& got, const std::vector<double>& want) {
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::fabs(got[i] - want[i]));
  return worst;
}

double Jain(const std::vector<TenantDef>& defs, const std::vector<double>& shares) {
  std::vector<double> w;
  for (const auto& d : defs) w.push_back(d.weight);
  return core::JainIndex(w, shares);
}

TEST(ClosedLoopTest, WeightsHoldForClosedLoopsOfShortAndLongLaunches) {
  // The mix users reported: 1x, 4x and 16x launches, each tenant a closed loop, weights 2:1:1.
  const std::vector<TenantDef> defs = {{"x1", 2, 1}, {"x4", 1, 4}, {"x16", 1, 16}};
  const auto want = WeightShares(defs);
  const Outcome fifo = Simulate("fifo", defs);
  const Outcome credit = Simulate("credit", defs);
  EXPECT_GT(WorstError(fifo.shares(), want), 0.3) << "fifo follows launch size";
  EXPECT_LT(WorstError(credit.shares(), want), 0.03);
  EXPECT_GE(Jain(defs, credit.shares()), 0.98);
  EXPECT_GE(credit.busy, 0.95 * fifo.busy);
}

TEST(ClosedLoopTest, EqualWeightsAndEightTenantsWithOpenLoops) {
  const std::vector<TenantDef> equal = {{"x1", 1, 1}, {"x4", 1, 4}, {"x16", 1, 16}};
  const Outcome e = Simulate("credit", equal);
  EXPECT_LT(WorstError(e.shares(), WeightShares(equal)), 0.03);
  // Eight tenants: weights 2 and 1, 1x to 64x launches, two open loops (4 launches in flight).
  const std::vector<TenantDef> eight = {{"x1-a", 2, 1},  {"x1-b", 1, 1},   {"x4-a", 2, 4},
                                        {"x4-b", 1, 4},  {"x16-a", 1, 16}, {"x16-b", 1, 16},
                                        {"x64", 1, 64},  {"open", 1, 16, true, 4}};
  const Outcome fifo = Simulate("fifo", eight);
  const Outcome credit = Simulate("credit", eight);
  EXPECT_LT(WorstError(credit.shares(), WeightShares(eight)), 0.05);
  EXPECT_GE(Jain(eight, credit.shares()), 0.98);
  EXPECT_GE(credit.busy, 0.95 * fifo.busy);
}

TEST(ClosedLoopTest, ShortTenantAmongLongOnesWaitsAboutOneOfItsOwnLaunches) {
  const std::vector<TenantDef> defs = {{"x1", 1, 1}, {"x16-a", 1, 16}, {"x16-b", 1, 16}};
  const double alone = Simulate("credit", {defs[0]}).tenants[0].completion.mean;
  const double fifo = Simulate("fifo", defs).tenants[0].completion.mean;
  const Outcome credit = Simulate("credit", defs);
  ASSERT_GT(alone, 0);
  EXPECT_GT(fifo, 10 * alone) << "behind whole 16x launches";
  EXPECT_LE(credit.tenants[0].completion.mean, 3 * alone);
  // The long tenants were cut into chunks: more dispatches than launches.
  EXPECT_GT(credit.tenants[1].dispatches, 4 * credit.tenants[1].commands);
}

TEST(ClosedLoopTest, UnsplittableLaunchesStayWholeAndTheOthersStillGetTheirShare) {
  const std::vector<TenantDef> defs = {{"x1", 1, 1}, {"x4-whole", 1, 4, false}, {"x16", 1, 16}};
  const Outcome credit = Simulate("credit", defs);
  // (+1: a launch still running when the run stops is dispatched but not completed.)
  EXPECT_LE(credit.tenants[1].dispatches, credit.tenants[1].commands + 1);
  EXPECT_LT(WorstError(credit.shares(), WeightShares(defs)), 0.05);
}

TEST(ClosedLoopTest, ALoneTenantIsNeverSplitOrHeld) {
  const Outcome alone = Simulate("credit", {{"x16", 1, 16}}, {}, 2);
  EXPECT_LE(alone.tenants[0].dispatches, alone.tenants[0].commands + 1);
  const Outcome fifo = Simulate("fifo", {{"x16", 1, 16}}, {}, 2);
  EXPECT_EQ(alone.tenants[0].commands, fifo.tenants[0].commands);
}

}  // namespace
}  // namespace gmux::sim
