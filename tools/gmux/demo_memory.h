// `gmux demo memory`: DymGPU's slot sharing on the real runtime. For each placement policy it
// starts a private gmuxd whose managed device memory is smaller than the tenants' working sets
// together (memory_slots), runs every tenant as its own process (its own uid when run as root)
// looping over its buffer and checking every result against the CPU, and reports what moved:
// DymGPU's slot copies, and the evictions, restores, bytes and time the runtime really spent,
// with the swap bandwidth against the device's own copy bandwidth measured in the same run.
#pragma once

#include <string>

namespace gmux::cli {

struct DemoMemoryOptions {
  bool json = false;
  std::string policies = "baseline,size,utilization";
  std::string swap_batch = "0,2";  // [daemon] swap_batch values: every policy runs with each
  std::string capacity = "1GiB";  // [daemon] memory_bytes
  std::string slot = "64MiB";     // [daemon] slot_bytes (DymGPU's 64 MB)
  int tenants = 4;
  int mib = 400;                  // each tenant's buffer
  int rounds = 6;                 // per tenant: launches, clFinish, read back, check
  double timeout_s = 1800;        // per run: tenants still running then are killed (an error)
};

int RunDemoMemory(const DemoMemoryOptions& options);

}  // namespace gmux::cli
