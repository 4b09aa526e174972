// PoolSim: the discrete-event model of BioCloud's sharing experiment (Jo et al., Section 4.3)
// driving a core::LeasePool.
//
// Model
//   - Each tenant (a VM) runs its workload: `runs` executions of a GPU job of `job_s` seconds
//     (barraCUDA, 18 s in the paper) with a sleep of `sleep_s` between consecutive runs (the user
//     reading results). A run asks for a device when it starts and computes for job_s once the
//     device is usable; the sleep starts when the run ends. Hot plug-out happens on the pool's side
//     while the tenant already sleeps.
//   - How a tenant's program talks to the pool is the client mode:
//       kPool         the paper's WrapCUDA path: implicit request at the run's first API call,
//                     implicit release when the program ends (and disconnect after the last run).
//       kIdleReclaim  a program that stays up between runs (an interactive session) and never
//                     releases: only the PoolChecker's idle reclaim returns the device.
//       kExplicit     the RequestSender path: a pinned lease taken before the first run and
//                     released by the user after the last one.
//   - The simulator calls LeasePool::Advance at NextTimer() and reacts to the pool's events: a
//     waiting run starts computing when its attach finishes.
//   - Theoretical time (Fig. 7's baseline): the workloads run one after another on devices held
//     exclusively, without plug-in/out, spread over the N devices:
//         T_theory = max(Σ_i W_i / N, max_i W_i),   W_i = Σ_r job_{i,r} + (runs_i − 1) · sleep_i.
//     normalized_time = makespan / T_theory (see docs/policies.md for why Σ/N).
//   - Waiting time of a run (Fig. 8): from the moment it wants a device to the moment it can
//     compute (plug-in included); 0 when the tenant still holds its device.
//
// Determinism: events are ordered by (time, insertion sequence) and job-length jitter comes from
// sim::Rng streams forked per tenant from the seed. Single-threaded.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "core/lease_pool.h"
#include "sim/scenario.h"

namespace gmux::sim {

enum class PoolClientMode { kPool, kIdleReclaim, kExplicit };
std::string_view PoolClientModeName(PoolClientMode mode);  // "pool", "idle-reclaim", "explicit"

struct PoolTenantSpec {
  std::string name;
  double weight = 1.0;    // > 0; only used for λ and Jain
  double start_s = 0;     // >= 0: when the first run starts
  int runs = 5;           // >= 1
  double job_s = 18;      // > 0: device time of one run
  double sleep_s = 9;     // >= 0: between consecutive runs
};

struct PoolSimConfig {
  core::LeasePoolOptions pool;        // origin must be zero
  std::vector<PoolTenantSpec> tenants;
  PoolClientMode mode = PoolClientMode::kPool;
  double job_jitter_s = 0;            // >= 0: each run lasts job_s + Uniform(-j, +j), at least 1 ms
  uint64_t seed = 1;

  Status Validate() const;
};

struct PoolTenantResult {
  std::string name;
  double weight = 1;
  std::vector<double> completions_s;  // end time of each run
  std::vector<double> waits_s;        // waiting time of each run
  double mean_wait_s = 0;
  double leased_s = 0;                // device-time held with a ready lease
  double in_use_s = 0;                // device-time computing
  uint64_t reclaimed = 0;             // leases taken back by the PoolChecker
};

struct PoolSimResult {
  std::vector<PoolTenantResult> tenants;
  double makespan_s = 0;         // the last run's end (all workloads done)
  double theoretical_s = 0;      // T_theory above
  double normalized_time = 0;    // makespan_s / theoretical_s
  double mean_wait_s = 0;        // over all runs of all tenants
  double leased_fraction = 0;    // of device-time over [0, makespan]
  double in_use_fraction = 0;
  double plug_fraction = 0;
  uint64_t pool_events = 0;      // PoolEvents the simulator carried out
  // Step series sampled at each change (plus the old value 1 ms before it):
  std::vector<SeriesPoint> devices_leased;   // devices attaching or leased
  std::vector<SeriesPoint> waiting_tenants;  // requests in the queue
};

// Runs the experiment once. Errors: kInvalidArgument when the config does not validate, kInternal
// if the pool rejects a request the model considers legal (a bug).
Result<PoolSimResult> SimulatePool(const PoolSimConfig& config);

}  // namespace gmux::sim
