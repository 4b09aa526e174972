// Scenario: load a scenario file and run every experiment it describes.
//
// A scenario file names its `kind`, which selects the runner:
//   kernel  closed-loop kernel/frame submitters on shared devices (VMCG, Kang & Yu)   kernel_scenario.h
//   pool    BioCloud's exclusive device pool                                       pool_scenario.h
//   slots   DymGPU's slot-based memory sharing                                     slots_scenario.h
//   frames  vGASA's frame-rate SLA control                                         frames_scenario.h
// Every runner returns a ScenarioOutput: one JSON object (the machine-readable result), a
// human-readable table, and time series for --csv/--plot.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "common/toml_doc.h"

namespace gmux::sim {

struct SeriesPoint {
  double t_s = 0;   // simulated time, seconds
  double value = 0;
};

// One line of a chart: e.g. run "fifo n=3", tenant "vm1", metric "throughput" in "blocks/s".
struct Series {
  std::string run_label;
  std::string tenant;
  std::string metric;
  std::string unit;
  std::vector<SeriesPoint> points;
};

struct ScenarioOutput {
  // {"scenario": str, "kind": str, "runs": [{"label", "policy", "params", ...}]}
  nlohmann::json json;
  std::string table;            // what `gmux sim run FILE` prints
  std::vector<Series> series;   // what --csv writes and --plot draws
};

// Runs the scenario in `doc`. Errors name the file, line and key.
Result<ScenarioOutput> RunScenario(const TomlDoc& doc);

// Loads and runs a scenario file.
Result<ScenarioOutput> RunScenarioFile(const std::string& path);

// Parses `text` as if it were the file `path` and runs it (tests, embedded scenarios).
Result<ScenarioOutput> RunScenarioText(std::string_view text, const std::string& path);

}  // namespace gmux::sim
