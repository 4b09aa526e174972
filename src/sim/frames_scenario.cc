#include "sim/frames_scenario.h"

namespace gmux::sim {

Result<ScenarioOutput> RunFramesScenario(const ScenarioDoc& doc) {
  return Unimplemented(doc.path() + ": scenario kind 'frames' is not implemented yet");
}

}  // namespace gmux::sim
