#include "sim/scenario.h"

#include "sim/frames_scenario.h"
#include "sim/kernel_scenario.h"
#include "sim/pool_scenario.h"
#include "sim/slots_scenario.h"

namespace gmux::sim {

Result<ScenarioOutput> RunScenario(const TomlDoc& doc) {
  auto kind = doc.Choice(doc.root(), "kind", std::nullopt, {"kernel", "pool", "slots", "frames"});
  if (!kind.ok()) return kind.status();
  if (*kind == "kernel") return RunKernelScenario(doc);
  if (*kind == "pool") return RunPoolScenario(doc);
  if (*kind == "slots") return RunSlotsScenario(doc);
  return RunFramesScenario(doc);
}

Result<ScenarioOutput> RunScenarioFile(const std::string& path) {
  auto doc = TomlDoc::Load(path);
  if (!doc.ok()) return doc.status();
  return RunScenario(*doc);
}

Result<ScenarioOutput> RunScenarioText(std::string_view text, const std::string& path) {
  auto doc = TomlDoc::Parse(text, path);
  if (!doc.ok()) return doc.status();
  return RunScenario(*doc);
}

}  // namespace gmux::sim
