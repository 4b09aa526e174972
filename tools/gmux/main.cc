// gmux: the command-line front end (simulator, and later status/lease/top/bench/demo).
#include <cstdio>
#include <iostream>
#include <string>

#include <CLI/CLI.hpp>

#include "sim/scenario.h"

namespace {

int RunSim(const std::string& file, bool json) {
  auto out = gmux::sim::RunScenarioFile(file);
  if (!out.ok()) {
    std::cerr << "gmux sim run: " << out.status().message() << "\n";
    return 2;
  }
  if (json) {
    std::cout << out->json.dump(2) << "\n";
  } else {
    std::cout << out->table;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"gmux: fair, measurable GPU sharing among tenants"};
  app.require_subcommand(1);

  CLI::App* sim = app.add_subcommand("sim", "Discrete-event simulator for gmux's policies");
  sim->require_subcommand(1);
  CLI::App* sim_run = sim->add_subcommand("run", "Run a scenario file and compare its policies");
  std::string file;
  bool json = false;
  sim_run->add_option("FILE", file, "Scenario file (TOML), e.g. scenarios/vmcg-fairness.toml")
      ->required();
  sim_run->add_flag("--json", json, "Print one JSON object instead of the table");

  CLI11_PARSE(app, argc, argv);
  if (sim_run->parsed()) return RunSim(file, json);
  return 0;
}
