// Output of a scenario's time series: CSV files and PNG charts (gnuplot).
//
// Generic over every scenario kind: a runner fills ScenarioOutput.series and gets files for free.
// Series are grouped by run label, in order of first appearance; each run becomes
//   DIR/NN-<label>.csv   columns: t_s, then one column per (tenant[, metric]) series
//   DIR/NN-<label>.png   (WritePlots) one line per column, titled by the run label
// NN is the run's position (01, 02, ...), so names are unique even when labels sanitise alike.
// Points of different series are aligned on the union of their times; a series without a point
// at some time leaves that cell empty.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "sim/scenario.h"

namespace gmux::sim {

// Writes one CSV per run into `dir` (created if missing). Returns the files written.
// Errors: kInvalidArgument for no series, kUnavailable when a file cannot be written.
Result<std::vector<std::string>> WriteCsv(const std::string& dir, const std::vector<Series>& series);

// Writes the CSVs (as WriteCsv) and renders one PNG chart per run with gnuplot, run as a
// subprocess on a generated script (DIR/plots.gp). Returns the PNG files written.
// Errors: kFailedPrecondition when gnuplot is not on PATH, kInternal when it fails, plus
// WriteCsv's.
Result<std::vector<std::string>> WritePlots(const std::string& dir,
                                            const std::vector<Series>& series);

// Lower-case file-name stem of a label: [a-z0-9._-] kept, every other run of characters → '-'.
std::string FileStem(const std::string& label);

// The gnuplot executable found on PATH, or "" when there is none.
std::string FindGnuplot();

}  // namespace gmux::sim
