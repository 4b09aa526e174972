// Runner for scenario files of kind "slots".
#pragma once

#include "sim/scenario.h"

namespace gmux::sim {

Result<ScenarioOutput> RunSlotsScenario(const TomlDoc& doc);

}  // namespace gmux::sim
