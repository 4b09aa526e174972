#include "sim/slots_scenario.h"

namespace gmux::sim {

Result<ScenarioOutput> RunSlotsScenario(const ScenarioDoc& doc) {
  return Unimplemented(doc.path() + ": scenario kind 'slots' is not implemented yet");
}

}  // namespace gmux::sim
