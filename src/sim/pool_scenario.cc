#include "sim/pool_scenario.h"

namespace gmux::sim {

Result<ScenarioOutput> RunPoolScenario(const ScenarioDoc& doc) {
  return Unimplemented(doc.path() + ": scenario kind 'pool' is not implemented yet");
}

}  // namespace gmux::sim
