// `gmux demo fairness`: the fairness experiment on the real runtime (issue 5). For each setup
// and each policy it starts a private gmuxd on a temp socket with that policy, runs every tenant
// as its own process (its own uid when run as root, so each is its own tenant) repeating matrix
// multiplies through the gmux ICD, and measures each tenant's device time, completed commands
// and work-items over a window in which every tenant is backlogged, from the daemon's own
// accounting (`gmux status`).
#pragma once

#include <string>
#include <vector>

namespace gmux::cli {

struct DemoFairnessOptions {
  bool json = false;
  double warmup_s = 1.5;   // before the measured window (programs built, queues full)
  double window_s = 6;     // the measured window
  int inflight = 2;        // [daemon] inflight_per_device of each gmuxd
  int depth = 2;           // launches each tenant keeps outstanding
  std::string policies = "fifo,credit,split";
  std::string setups = "kangyu,vmcg-equal,vmcg-weighted";
  // Policy parameters as "POLICY.KEY=VALUE" (e.g. "split.beta=256"), written to each gmuxd's
  // [scheduler.params] when it runs POLICY. They override kDefaultParams.
  std::vector<std::string> params;
};

// Parameters the demo passes unless --param overrides them: split.beta = 128. The policy's
// default beta (1024) is calibrated for the paper's GPU, whose launches are millions of
// work-items; with this demo's 16 k-65 k work-item launches on a 2-unit device it gives chunks
// larger than the small and medium launches, which then run whole and cannot be balanced
// (docs/policies.md, split, decision 2).
inline constexpr const char* kDefaultParams[] = {"split.beta=512"};

int RunDemoFairness(const DemoFairnessOptions& options);

}  // namespace gmux::cli
