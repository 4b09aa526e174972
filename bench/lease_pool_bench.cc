// Decision cost of the LeasePool (BioCloud's device pool) at 10 .. 10,000 tenants.
//
//   BM_LeasePool_ReleaseGrantRequest  steady state with devices = tenants / 4 (at least 1), every
//       device leased and the other tenants waiting: one holder's program ends (implicit release),
//       the device goes to the longest waiter, and the releasing tenant asks again (queued last).
//       Plug-in/out take 0 s so every iteration completes the whole hand-over.
//   BM_LeasePool_CheckerRound  every tenant holds a device (devices = tenants), nothing is idle
//       long enough: one PoolChecker round, i.e. Advance() across one check period.
//   BM_LeasePool_NoteActivity  a usage report from a holder.
//   BM_PoolSim_BioCloud  one whole simulated run of the BioCloud experiment (5 x 18 s jobs, 36 s
//       sleeps, plug-in/out 1.3 s) with the given tenants on tenants / 4 devices.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "core/lease_pool.h"
#include "sim/pool_sim.h"

namespace {

using gmux::AtSeconds;
using gmux::TenantId;
using gmux::TimePoint;
using gmux::core::LeasePool;
using gmux::core::LeasePoolOptions;

LeasePool MakePool(const LeasePoolOptions& o) {
  auto pool = LeasePool::Create(o);
  if (!pool.ok()) std::abort();
  return std::move(pool).value();
}

void Must(const gmux::Status& s) {
  if (!s.ok()) std::abort();
}

void BM_LeasePool_ReleaseGrantRequest(benchmark::State& state) {
  const auto tenants = static_cast<TenantId>(state.range(0));
  LeasePoolOptions o;
  o.devices = std::max<uint32_t>(1, tenants / 4);
  o.attach_time = gmux::Duration::zero();
  o.detach_time = gmux::Duration::zero();
  o.idle_threshold = std::chrono::hours(24 * 365 * 100);
  LeasePool pool = MakePool(o);
  TimePoint now{};
  for (TenantId t = 0; t < tenants; ++t) {
    Must(pool.AddTenant(t, now));
    if (!pool.RequestImplicit(t, now).ok()) std::abort();
  }
  // Holders are served in request order, so the oldest holder is tenant `next` modulo tenants.
  TenantId next = 0;
  for (auto _ : state) {
    now += std::chrono::microseconds(1);
    Must(pool.ProgramEnd(next, now));
    auto v = pool.RequestImplicit(next, now);
    benchmark::DoNotOptimize(v);
    pool.TakeEvents();
    next = (next + 1) % tenants;
  }
  state.SetItemsProcessed(state.iterations());
  state.counters["devices"] = o.devices;
  state.counters["waiting"] = static_cast<double>(pool.waiting());
}
BENCHMARK(BM_LeasePool_ReleaseGrantRequest)->RangeMultiplier(10)->Range(10, 10000);

void BM_LeasePool_CheckerRound(benchmark::State& state) {
  const auto tenants = static_cast<TenantId>(state.range(0));
  LeasePoolOptions o;
  o.devices = tenants;
  o.idle_threshold = std::chrono::hours(24 * 365 * 100);  // scanned every round, never reclaimed
  LeasePool pool = MakePool(o);
  TimePoint now{};
  for (TenantId t = 0; t < tenants; ++t) {
    Must(pool.AddTenant(t, now));
    if (!pool.RequestImplicit(t, now).ok()) std::abort();
  }
  now = AtSeconds(2);
  Must(pool.Advance(now));  // all plugged in
  pool.TakeEvents();
  for (auto _ : state) {
    now += o.check_period;
    Must(pool.Advance(now));
  }
  state.SetItemsProcessed(state.iterations());
  state.counters["leases"] = static_cast<double>(pool.leased_devices());
}
BENCHMARK(BM_LeasePool_CheckerRound)->RangeMultiplier(10)->Range(10, 10000);

void BM_LeasePool_NoteActivity(benchmark::State& state) {
  const auto tenants = static_cast<TenantId>(state.range(0));
  LeasePoolOptions o;
  o.devices = tenants;
  LeasePool pool = MakePool(o);
  TimePoint now{};
  for (TenantId t = 0; t < tenants; ++t) {
    Must(pool.AddTenant(t, now));
    if (!pool.RequestImplicit(t, now).ok()) std::abort();
  }
  now = AtSeconds(2);
  Must(pool.Advance(now));
  TenantId next = 0;
  for (auto _ : state) {
    now += std::chrono::nanoseconds(100);  // stays between checker rounds for ~50 M iterations
    Must(pool.NoteActivity(next, now));
    next = (next + 1) % tenants;
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_LeasePool_NoteActivity)->RangeMultiplier(10)->Range(10, 10000);

void BM_PoolSim_BioCloud(benchmark::State& state) {
  gmux::sim::PoolSimConfig c;
  const auto tenants = static_cast<uint32_t>(state.range(0));
  c.pool.devices = std::max<uint32_t>(1, tenants / 4);
  for (uint32_t i = 0; i < tenants; ++i) {
    gmux::sim::PoolTenantSpec t;
    t.name = "vm" + std::to_string(i + 1);
    t.sleep_s = 36;
    c.tenants.push_back(t);
  }
  double events = 0;
  for (auto _ : state) {
    auto r = gmux::sim::SimulatePool(c);
    if (!r.ok()) std::abort();
    events = static_cast<double>(r->pool_events);
    benchmark::DoNotOptimize(r);
  }
  state.counters["pool_events"] = events;
  state.SetItemsProcessed(state.iterations() * static_cast<int64_t>(events));
}
BENCHMARK(BM_PoolSim_BioCloud)->RangeMultiplier(10)->Range(4, 4000)->Unit(benchmark::kMillisecond);

}  // namespace
