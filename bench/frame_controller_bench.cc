// Cost of vGASA's frame-rate control per frame and per control period, at 3 to 10,000 tenants.
//
//   BM_FrameControllerFrame/N   one frame of each of N agents: Decide (Eq. 1 + the PI of Eq. 3)
//                               at the sleep point and Observe when Present returns; items = frames
//   BM_SlaPolicyUpdate/K/N      one control period of the central controller over N tenants;
//                               K = 0 SA, 1 FSA, 2 ESA; items = tenants
//   BM_FramesSimulation/N       the whole simulator (frame loops, shared GPU, agents, ESA) for
//                               one simulated second with N tenants; items = frames simulated
//
// Run: build/bin/frame_controller_bench
#include <cstdint>
#include <vector>

#include <benchmark/benchmark.h>

#include "core/frame_controller.h"
#include "core/sla_policy.h"
#include "sim/frames_sim.h"
#include "sim/rng.h"

namespace gmux {
namespace {

void BM_FrameControllerFrame(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0));
  std::vector<core::FrameController> agents;
  agents.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    agents.push_back(std::move(core::FrameController::Create({})).value());
    agents.back().SetReference(30 + static_cast<double>(i % 30));
  }
  sim::Rng rng(1);
  std::vector<TimePoint> now(n);
  for (auto _ : state) {
    for (size_t i = 0; i < n; ++i) {
      Duration cpu = std::chrono::microseconds(4000 + static_cast<int64_t>(rng.NextU64() % 1000));
      core::FrameDecision d = agents[i].Decide(cpu);
      Duration gpu = std::chrono::microseconds(8000 + static_cast<int64_t>(rng.NextU64() % 2000));
      now[i] += cpu + d.sleep + gpu + std::chrono::microseconds(500);
      agents[i].Observe(core::FrameSample{now[i], gpu});
    }
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(n));
}
BENCHMARK(BM_FrameControllerFrame)->Arg(3)->Arg(10)->Arg(100)->Arg(1000)->Arg(10000);

void BM_SlaPolicyUpdate(benchmark::State& state) {
  const core::SlaKind kinds[] = {core::SlaKind::kSa, core::SlaKind::kFsa, core::SlaKind::kEsa};
  core::SlaPolicyOptions o;
  o.kind = kinds[state.range(0)];
  auto policy = core::SlaPolicy::Create(o);
  const size_t n = static_cast<size_t>(state.range(1));
  std::vector<core::SlaTenantState> tenants(n);
  sim::Rng rng(2);
  for (auto& t : tenants) {
    t.fps = rng.Uniform(10, 80);                          // about a third below the criterion
    t.gpu_usage = rng.Uniform(0.2, 1.0) / static_cast<double>(n);
  }
  for (auto _ : state) {
    policy->Update(tenants);
    benchmark::DoNotOptimize(tenants.data());
  }
  state.SetLabel(std::string(core::SlaKindName(o.kind)));
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(n));
}
BENCHMARK(BM_SlaPolicyUpdate)
    ->ArgsProduct({{0, 1, 2}, {3, 10, 100, 1000, 10000}});

void BM_FramesSimulation(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0));
  sim::FrameSimOptions o;
  for (size_t i = 0; i < n; ++i) {
    // Per-frame GPU time scaled so the device is about as loaded as in vgasa-sla.toml.
    double gpu_ms = 26.0 / static_cast<double>(n) * (0.5 + static_cast<double>(i % 3) * 0.5);
    o.tenants.push_back(sim::FrameWorkload{"t" + std::to_string(i), 1, 4, gpu_ms, 0.05, 0.05, {}});
  }
  o.duration_s = 1.0;
  o.agent_overhead_ms = 1.0;
  o.policy.kind = core::SlaKind::kEsa;
  uint64_t frames = 0;
  for (auto _ : state) {
    auto r = sim::RunFrameSim(o);
    for (const auto& t : r->tenants) frames += t.frames;
  }
  state.SetItemsProcessed(static_cast<int64_t>(frames));
}
BENCHMARK(BM_FramesSimulation)->Arg(3)->Arg(30)->Arg(300)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace gmux
