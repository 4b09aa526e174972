// Simulator speed: discrete events processed per second of wall time on one core.
//
// Each iteration simulates `tenants` frame submitters (closed loop, jitter, bursts and cost
// noise on) sharing one device under a policy for 2 simulated seconds; the counter events_per_s
// is KernelSim's processed events (block completions, workload wake-ups, policy timers) divided
// by the wall time, which includes the policy's own decisions and the workload models.
// Goal (docs/performance.md): >= 5 M events/s with fifo.
#include <benchmark/benchmark.h>

#include <chrono>
#include <string>

#include "core/policy.h"
#include "sim/kernel_sim.h"
#include "sim/workloads.h"

namespace {

using gmux::sim::FrameLoopOptions;
using gmux::sim::KernelSim;
using gmux::sim::KernelSimOptions;

// Runs one simulation per iteration, with `spec`'s policy, `options` under a fresh seed each
// time, and the tenants `add_tenants(sim)` registers; reports processed events per second.
template <typename AddTenants>
void MeasureEvents(benchmark::State& state, const gmux::core::PolicySpec& spec,
                   KernelSimOptions options, AddTenants add_tenants) {
  uint64_t events = 0;
  uint64_t seed = 1;
  for (auto _ : state) {
    auto policy = gmux::core::MakePolicy(spec);
    if (!policy.ok()) {
      state.SkipWithError(policy.status().message().c_str());
      return;
    }
    options.seed = seed++;
    KernelSim sim(options, **policy);
    if (gmux::Status added = add_tenants(sim); !added.ok()) {
      state.SkipWithError(added.message().c_str());
      return;
    }
    auto r = sim.Run();
    if (!r.ok()) {
      state.SkipWithError(r.status().message().c_str());
      return;
    }
    events += r->events;
  }
  state.counters["events_per_s"] =
      benchmark::Counter(static_cast<double>(events), benchmark::Counter::kIsRate);
}

void RunFrames(benchmark::State& state, const char* policy_name) {
  const auto tenants = static_cast<int>(state.range(0));
  gmux::core::PolicySpec spec{policy_name, {}, gmux::core::DeviceInfo{32, 64, 8ULL << 30, 12e9}};
  KernelSimOptions o;
  o.duration = std::chrono::seconds(2);
  MeasureEvents(state, spec, o, [tenants](KernelSim& sim) {
    for (int t = 0; t < tenants; ++t) {
      FrameLoopOptions f;
      f.blocks_per_frame = 6;
      f.block_cost_s = 20e-6;  // short blocks: many events per simulated second
      f.cpu_per_frame_s = 50e-6;
      f.frames_in_flight = 3;
      f.interference.jitter_s = 20e-6;
      f.interference.burst_prob = 0.01;
      f.interference.burst_len = 50;
      f.interference.burst_depth = 2;
      f.interference.cost_cv = 0.3;
      GMUX_RETURN_IF_ERROR(
          sim.AddTenant("t" + std::to_string(t), 1, gmux::sim::MakeFrameLoop(f).value()));
    }
    return gmux::Status::Ok();
  });
}

void BM_SimFramesFifo(benchmark::State& s) { RunFrames(s, "fifo"); }
void BM_SimFramesRr(benchmark::State& s) { RunFrames(s, "rr"); }
void BM_SimFramesCredit(benchmark::State& s) { RunFrames(s, "credit"); }
BENCHMARK(BM_SimFramesFifo)->Arg(4)->Arg(64)->Arg(1024)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_SimFramesRr)->Arg(4)->Arg(64)->Arg(1024)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_SimFramesCredit)->Arg(4)->Arg(64)->Arg(1024)->Unit(benchmark::kMillisecond);

// Kang & Yu's workload under split: chunked matrix multiplications, 6 tenants, until done.
void BM_SimSplitMatmul(benchmark::State& state) {
  gmux::core::PolicySpec spec{"split", {{"beta", 16}},
                              gmux::core::DeviceInfo{32, 64, 8ULL << 30, 12e9}};
  MeasureEvents(state, spec, KernelSimOptions{}, [](KernelSim& sim) {
    for (int t = 0; t < 6; ++t) {
      auto k = gmux::sim::MatmulKernel(t < 3 ? 2048 : 3072);
      k.tasks = 1;
      k.interference.start_jitter_s = 1e-3;
      GMUX_RETURN_IF_ERROR(
          sim.AddTenant("t" + std::to_string(t), 1, gmux::sim::MakeKernelLoop(k).value()));
    }
    return gmux::Status::Ok();
  });
}
BENCHMARK(BM_SimSplitMatmul)->Unit(benchmark::kMillisecond);

}  // namespace
