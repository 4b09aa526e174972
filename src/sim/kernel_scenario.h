// Runner for scenario files of kind "kernel".
#pragma once

#include "sim/scenario.h"

namespace gmux::sim {

Result<ScenarioOutput> RunKernelScenario(const TomlDoc& doc);

}  // namespace gmux::sim
