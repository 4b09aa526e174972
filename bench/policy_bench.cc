// Decision cost of each scheduling policy at 10 to 10,000 tenants.
//
// Every tenant is kept backlogged (at least two kernel blocks queued; a finished block is
// replaced), and the device runs one dispatch at a time, as in the simulator. Device time is
// proportional to the dispatch's work-items with a per-tenant factor of 1, 2 or 3, so policies
// that react to usage (credit, split) have work to do.
//
//   BM_Cycle/<policy>/<tenants>: one Pick + Complete (+ Submit of the replacement block when a
//     block finishes); time per iteration is the cost of one scheduling decision, all included.
//   BM_PickOnly/<policy>/<tenants>: 256 Picks in a row are timed; their Completes and Submits run
//     with the timer paused. The counter per_pick is the time of one Pick. Work that a policy
//     defers to Complete (split closes its rounds there) is not in this figure.
//
// Goal (issue 2): <= 1 us per decision at 1,000 tenants. A policy name that MakePolicy does not
// know is reported as an error row, so this builds before every policy exists.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/policy.h"

namespace gmux::core {
namespace {

constexpr int kBacklog = 2;
constexpr uint64_t kItems = uint64_t{1} << 20;  // work-items per kernel block
constexpr size_t kBatch = 256;

class Harness {
 public:
  // False (and the benchmark skipped) when the policy is unknown.
  bool Init(benchmark::State& state, const std::string& name, int tenants, int backlog) {
    PolicySpec spec;
    spec.name = name;
    spec.device.compute_units = 32;
    spec.device.wavefront_width = 64;
    spec.device.memory_bytes = uint64_t{8} << 30;
    spec.device.bus_bytes_per_s = 12e9;
    auto made = MakePolicy(spec);
    if (!made.ok()) {
      state.SkipWithError(made.status().message().c_str());
      return false;
    }
    policy_ = std::move(made).value();
    for (int i = 0; i < tenants; ++i) {
      TenantId t = static_cast<TenantId>(i + 1);
      policy_->AddTenant(Tenant{t, "t" + std::to_string(t), 1.0}, now_);
      for (int k = 0; k < backlog; ++k) policy_->Submit(Block(t), now_);
    }
    // Reach a steady state: every tenant has been served a few times.
    for (int i = 0; i < 4 * tenants; ++i) {
      auto d = PickOrWait();
      if (!d) {
        state.SkipWithError("policy returned nothing while every tenant is backlogged");
        return false;
      }
      Finish(*d);
    }
    return true;
  }

  // Pick, or advance to the policy's timer and Tick when it holds work back.
  std::optional<Dispatch> PickOrWait() {
    for (int tries = 0; tries < 8; ++tries) {
      if (auto d = policy_->Pick(now_)) return d;
      auto timer = policy_->NextTimer();
      if (!timer) return std::nullopt;
      now_ = std::max(now_, *timer);
      policy_->Tick(now_);
    }
    return std::nullopt;
  }

  // The device ran `d`: complete it and keep its tenant backlogged.
  void Finish(const Dispatch& d) {
    Duration dt(static_cast<int64_t>(std::max<uint64_t>(d.range.size(), 1000) * (1 + d.tenant % 3)));
    now_ += dt;
    policy_->Complete(Completion{d.tenant, d.block, d.range, dt, d.last}, now_);
    if (d.last) policy_->Submit(Block(d.tenant), now_);
  }

  Policy& policy() { return *policy_; }
  TimePoint now() const { return now_; }

 private:
  CommandBlock Block(TenantId t) {
    CommandBlock b;
    b.id = next_id_++;
    b.tenant = t;
    b.kind = BlockKind::kKernel;
    b.work_items = kItems;
    b.work_groups = kItems / 64;
    b.arrival = now_;
    b.splittable = Splittable::kYes;
    return b;
  }

  std::unique_ptr<Policy> policy_;
  TimePoint now_{};
  BlockId next_id_ = 1;
};

void BM_Cycle(benchmark::State& state, const char* name) {
  Harness h;
  if (!h.Init(state, name, static_cast<int>(state.range(0)), kBacklog)) return;
  for (auto _ : state) {
    auto d = h.PickOrWait();
    if (!d) {
      state.SkipWithError("policy returned nothing while every tenant is backlogged");
      break;
    }
    h.Finish(*d);
  }
  state.counters["tenants"] = static_cast<double>(state.range(0));
}

void BM_PickOnly(benchmark::State& state, const char* name) {
  // Enough blocks queued that a policy that never splits can fill a batch.
  const int tenants = static_cast<int>(state.range(0));
  Harness h;
  if (!h.Init(state, name, tenants, std::max(kBacklog, static_cast<int>(kBatch) / tenants + 1))) {
    return;
  }
  std::vector<Dispatch> batch;
  batch.reserve(kBatch);
  int64_t picks = 0;
  for (auto _ : state) {
    batch.clear();
    for (size_t i = 0; i < kBatch; ++i) {
      auto d = h.policy().Pick(h.now());
      if (!d) break;
      batch.push_back(*d);
    }
    state.PauseTiming();
    picks += static_cast<int64_t>(batch.size());
    for (const Dispatch& d : batch) h.Finish(d);
    if (batch.empty()) {
      auto d = h.PickOrWait();  // held back: let its timer fire, untimed
      if (!d) {
        state.SkipWithError("policy returned nothing while every tenant is backlogged");
        state.ResumeTiming();
        break;
      }
      h.Finish(*d);
    }
    state.ResumeTiming();
  }
  state.counters["per_pick"] =
      benchmark::Counter(static_cast<double>(picks), benchmark::Counter::kIsRate |
                                                         benchmark::Counter::kInvert);
  state.counters["tenants"] = static_cast<double>(state.range(0));
}

#define GMUX_POLICY_BENCH(policy)                                                        \
  BENCHMARK_CAPTURE(BM_Cycle, policy, #policy)->RangeMultiplier(10)->Range(10, 10000);   \
  BENCHMARK_CAPTURE(BM_PickOnly, policy, #policy)->RangeMultiplier(10)->Range(10, 10000)

GMUX_POLICY_BENCH(fifo);
GMUX_POLICY_BENCH(rr);
GMUX_POLICY_BENCH(credit);
GMUX_POLICY_BENCH(split);

}  // namespace
}  // namespace gmux::core
