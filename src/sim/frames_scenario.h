// Runner for scenario files of kind "frames".
#pragma once

#include "sim/scenario.h"

namespace gmux::sim {

Result<ScenarioOutput> RunFramesScenario(const TomlDoc& doc);

}  // namespace gmux::sim
