// `gmux demo pool`: BioCloud's sharing experiment (Jo et al., Section 4.3) on the real runtime.
// Tenants (separate processes, own uids as root) each run a job of fixed device work `runs`
// times with a sleep between runs, through the gmux ICD on a pool of 1, 2 and 4 exclusive PoCL
// devices. Two ways of using the pool: `static` (each tenant's program holds its device from its
// first run to its last, the sleeps included: one device per tenant for the whole run) and
// `pool` (each run is a program of its own: its context takes an implicit lease, its end gives
// it back). Completion time is normalised to BioCloud's theoretical time and shown beside the
// simulator's prediction for the same workload (sim::SimulatePool). A third way, `reclaim`, keeps
// each tenant's program up for all its runs and leaves it to the pool's checker to take the device
// back while it sleeps (its next run re-acquires one).
#pragma once

#include <string>

namespace gmux::cli {

struct DemoPoolOptions {
  bool json = false;
  std::string devices = "1,2,4";  // pool sizes
  std::string sleeps = "0.5,2";   // sleeps between runs, in jobs (paper: 9/18 and 36/18)
  std::string modes = "static,pool,reclaim";
  int tenants = 4;
  int runs = 3;
  double job_s = 1.0;             // device work of one run
  double timeout_s = 600;         // per configuration
};

int RunDemoPool(const DemoPoolOptions& options);

}  // namespace gmux::cli
