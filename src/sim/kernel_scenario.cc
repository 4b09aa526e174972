#include "sim/kernel_scenario.h"

namespace gmux::sim {

Result<ScenarioOutput> RunKernelScenario(const ScenarioDoc& doc) {
  return Unimplemented(doc.path() + ": scenario kind 'kernel' is not implemented yet");
}

}  // namespace gmux::sim
