// Runner for scenario files of kind "pool".
#pragma once

#include "sim/scenario.h"

namespace gmux::sim {

Result<ScenarioOutput> RunPoolScenario(const TomlDoc& doc);

}  // namespace gmux::sim
