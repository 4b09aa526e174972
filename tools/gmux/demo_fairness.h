// `gmux demo fairness`: the fairness experiment on the real runtime (issue 5). For each setup
// and each policy it starts a private gmuxd on a temp socket with that policy, runs every tenant
// as its own process (its own uid when run as root, so each is its own tenant) repeating matrix
// multiplies through the gmux ICD, and measures each tenant's device time, completed commands
// and work-items over a window in which every tenant is backlogged, from the daemon's own
// accounting (`gmux status`).
#pragma once

#include <string>

namespace gmux::cli {

struct DemoFairnessOptions {
  bool json = false;
  double warmup_s = 1.5;   // before the measured window (programs built, queues full)
  double window_s = 6;     // the measured window
  int inflight = 2;        // [daemon] inflight_per_device of each gmuxd
  int depth = 2;           // launches each tenant keeps outstanding
  std::string policies = "fifo,credit,split";
  std::string setups = "kangyu,vmcg-equal,vmcg-weighted";
};

int RunDemoFairness(const DemoFairnessOptions& options);

}  // namespace gmux::cli
