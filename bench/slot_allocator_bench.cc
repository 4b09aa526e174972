// Decision cost of the DymGPU slot allocator at 10..10,000 tenants.
//
// Memory scales with the tenant count as in the paper's setting: M = 54 slots per 15 tenants,
// tenant sizes cycling through 6, 11 and 16 slots (384/704/1024 MB). Every tenant is placed by
// the policy's own rules before timing starts, so the layout is the one the policy would build.
//   BM_Place       AddTenant of one more tenant (its removal is untimed)
//   BM_Terminate   RemoveTenant of that tenant (its addition is untimed)
//   BM_Switch      SwitchTo the next tenant, round robin over all of them
//   BM_Replace     one periodic re-placement (utilization policy; Tick at a 20 s boundary)
//   BM_SizeLayout / BM_UtilizationLayout / BM_GScaleStart: the pure placement functions
// Run: build/bin/slot_allocator_bench [--benchmark_filter=...]
#include <benchmark/benchmark.h>

#include <cstdint>
#include <vector>

#include "core/slot_allocator.h"

namespace gmux::core {
namespace {

constexpr int32_t kSizes[] = {6, 11, 16};

int32_t SlotsFor(int64_t tenants) {
  return static_cast<int32_t>(std::max<int64_t>(16, (tenants * 54 + 14) / 15));
}

SlotAllocator Filled(SlotPolicy policy, int64_t tenants) {
  SlotAllocatorOptions o;
  o.policy = policy;
  o.slots = SlotsFor(tenants);
  o.idle_detection = false;
  SlotAllocator a = std::move(SlotAllocator::Create(o)).value();
  for (int64_t i = 0; i < tenants; ++i) {
    a.AddTenant(static_cast<TenantId>(i), kSizes[i % 3], TimePoint{}).IgnoreError();
  }
  return a;
}

SlotPolicy PolicyArg(const benchmark::State& state) { return static_cast<SlotPolicy>(state.range(0)); }

void Label(benchmark::State& state) {
  state.SetLabel(std::string(SlotPolicyName(PolicyArg(state))) + " M=" +
                 std::to_string(SlotsFor(state.range(1))));
}

void BM_Place(benchmark::State& state) {
  SlotAllocator a = Filled(PolicyArg(state), state.range(1));
  const TenantId extra = static_cast<TenantId>(state.range(1));
  for (auto _ : state) {
    benchmark::DoNotOptimize(a.AddTenant(extra, 11, TimePoint{}).ok());
    state.PauseTiming();
    a.RemoveTenant(extra, TimePoint{}).IgnoreError();
    state.ResumeTiming();
  }
  Label(state);
}

void BM_Terminate(benchmark::State& state) {
  SlotAllocator a = Filled(PolicyArg(state), state.range(1));
  const TenantId extra = static_cast<TenantId>(state.range(1));
  for (auto _ : state) {
    state.PauseTiming();
    a.AddTenant(extra, 11, TimePoint{}).IgnoreError();
    state.ResumeTiming();
    benchmark::DoNotOptimize(a.RemoveTenant(extra, TimePoint{}).ok());
  }
  Label(state);
}

void BM_Switch(benchmark::State& state) {
  SlotAllocator a = Filled(PolicyArg(state), state.range(1));
  const int64_t n = state.range(1);
  int64_t i = 0;
  int64_t copies = 0;
  for (auto _ : state) {
    auto c = a.SwitchTo(static_cast<TenantId>(i), TimePoint{});
    copies += *c;
    if (++i == n) i = 0;
  }
  benchmark::DoNotOptimize(copies);
  Label(state);
}

void BM_Replace(benchmark::State& state) {
  const int64_t n = state.range(1);
  SlotAllocator a = Filled(SlotPolicy::kUtilization, n);
  // Utilisation that changes every period, so each re-placement has work to do.
  int64_t period = 0;
  for (auto _ : state) {
    state.PauseTiming();
    TimePoint start = AtSeconds(20.0 * static_cast<double>(period));
    for (int64_t i = 0; i < n; ++i) {
      int64_t ms = ((i * 7919 + period * 104729) % 1000);
      a.RecordUse(static_cast<TenantId>(i), start, start + std::chrono::milliseconds(ms))
          .IgnoreError();
    }
    ++period;
    state.ResumeTiming();
    a.Tick(AtSeconds(20.0 * static_cast<double>(period)));
  }
  state.counters["moves_per_replace"] =
      static_cast<double>(a.counters().moves) / static_cast<double>(period);
  state.SetLabel("utilization M=" + std::to_string(SlotsFor(n)));
}

std::vector<SlotItem> Items(int64_t n) {
  std::vector<SlotItem> items;
  for (int64_t i = 0; i < n; ++i) {
    items.push_back(SlotItem{static_cast<TenantId>(i), kSizes[i % 3],
                             static_cast<double>((i * 7919) % 1000) / 1000.0});
  }
  return items;
}

void BM_SizeLayout(benchmark::State& state) {
  std::vector<SlotItem> items = Items(state.range(0));
  const int32_t m = SlotsFor(state.range(0));
  for (auto _ : state) benchmark::DoNotOptimize(SizeBasedLayout(m, items));
}

void BM_UtilizationLayout(benchmark::State& state) {
  std::vector<SlotItem> items = Items(state.range(0));
  const int32_t m = SlotsFor(state.range(0));
  for (auto _ : state) benchmark::DoNotOptimize(UtilizationBasedLayout(m, items));
}

void BM_GScaleStart(benchmark::State& state) {
  SlotAllocator a = Filled(SlotPolicy::kBaseline, state.range(0));
  for (auto _ : state) benchmark::DoNotOptimize(GScaleStart(a.occupancy(), 11, false));
}

void PolicyArgs(benchmark::internal::Benchmark* b) {
  for (int64_t p : {0, 1, 2}) {
    for (int64_t n : {10, 100, 1000, 10000}) b->Args({p, n});
  }
}

BENCHMARK(BM_Place)->Apply(PolicyArgs);
BENCHMARK(BM_Terminate)->Apply(PolicyArgs);
BENCHMARK(BM_Switch)->Apply(PolicyArgs);
BENCHMARK(BM_Replace)->Args({2, 10})->Args({2, 100})->Args({2, 1000})->Args({2, 10000});
BENCHMARK(BM_SizeLayout)->Arg(10)->Arg(100)->Arg(1000)->Arg(10000);
BENCHMARK(BM_UtilizationLayout)->Arg(10)->Arg(100)->Arg(1000)->Arg(10000);
BENCHMARK(BM_GScaleStart)->Arg(10)->Arg(100)->Arg(1000)->Arg(10000);

}  // namespace
}  // namespace gmux::core
