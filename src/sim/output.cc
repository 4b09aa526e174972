#include "sim/output.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

extern char** environ;  // POSIX; handed to gnuplot unchanged

namespace gmux::sim {
namespace {

namespace fs = std::filesystem;

struct RunSeries {
  std::string label;
  std::vector<const Series*> lines;
};

std::vector<RunSeries> GroupByRun(const std::vector<Series>& series) {
  std::vector<RunSeries> runs;
  std::map<std::string, size_t> index;
  for (const auto& s : series) {
    auto [it, inserted] = index.emplace(s.run_label, runs.size());
    if (inserted) runs.push_back(RunSeries{s.run_label, {}});
    runs[it->second].lines.push_back(&s);
  }
  return runs;
}

std::string Number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

// A CSV cell: quoted when it holds a separator or a quote.
std::string Cell(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

std::string ColumnName(const RunSeries& run, const Series& s) {
  bool several_metrics = false;
  for (const Series* o : run.lines) several_metrics |= o->metric != run.lines.front()->metric;
  return several_metrics ? s.tenant + " " + s.metric : s.tenant;
}

std::string Stem(size_t i, const std::string& label) {
  char prefix[16];
  std::snprintf(prefix, sizeof prefix, "%02zu-", i + 1);
  return prefix + FileStem(label);
}

Status WriteRunCsv(const fs::path& file, const RunSeries& run) {
  std::map<double, std::vector<std::string>> rows;  // t -> cells
  const size_t cols = run.lines.size();
  for (size_t c = 0; c < cols; ++c) {
    for (const auto& p : run.lines[c]->points) {
      auto& row = rows[p.t_s];
      row.resize(cols);
      row[c] = Number(p.value);
    }
  }
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  if (!out) return Unavailable("cannot write '" + file.string() + "': " + std::strerror(errno));
  out << "t_s";
  for (const Series* s : run.lines) out << "," << Cell(ColumnName(run, *s));
  out << "\n";
  for (auto& [t, cells] : rows) {
    cells.resize(cols);
    out << Number(t);
    for (const auto& cell : cells) out << "," << cell;
    out << "\n";
  }
  out.close();
  if (!out) return Unavailable("error writing '" + file.string() + "'");
  return Status::Ok();
}

Status MakeDir(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return Unavailable("cannot create directory '" + dir + "': " + ec.message());
  return Status::Ok();
}

// A gnuplot single-quoted string ('' stands for one quote).
std::string GpQuote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') out += '\'';
    if (c == '\n') continue;
    out += c;
  }
  return out + "'";
}

}  // namespace

std::string FileStem(const std::string& label) {
  std::string out;
  bool dash = false;
  for (char c : label) {
    const bool keep = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
                      (c >= 'A' && c <= 'Z');
    if (keep) {
      out += static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
      dash = false;
    } else if (!dash && !out.empty()) {
      out += '-';
      dash = true;
    }
  }
  while (!out.empty() && out.back() == '-') out.pop_back();
  return out.empty() ? "run" : out;
}

std::string FindGnuplot() {
  const char* path = std::getenv("PATH");
  std::string p = path != nullptr ? path : "/usr/bin:/bin";
  std::stringstream ss(p);
  std::string dir;
  while (std::getline(ss, dir, ':')) {
    if (dir.empty()) continue;
    fs::path candidate = fs::path(dir) / "gnuplot";
    if (::access(candidate.c_str(), X_OK) == 0) return candidate.string();
  }
  return "";
}

Result<std::vector<std::string>> WriteCsv(const std::string& dir, const std::vector<Series>& series) {
  if (series.empty()) return InvalidArgument("this scenario produced no time series to write");
  GMUX_RETURN_IF_ERROR(MakeDir(dir));
  std::vector<std::string> files;
  auto runs = GroupByRun(series);
  for (size_t i = 0; i < runs.size(); ++i) {
    fs::path file = fs::path(dir) / (Stem(i, runs[i].label) + ".csv");
    GMUX_RETURN_IF_ERROR(WriteRunCsv(file, runs[i]));
    files.push_back(file.string());
  }
  return files;
}

Result<std::vector<std::string>> WritePlots(const std::string& dir,
                                            const std::vector<Series>& series) {
  const std::string gnuplot = FindGnuplot();
  if (gnuplot.empty()) {
    return FailedPrecondition(
        "--plot needs gnuplot, which is not on PATH; install it (apt-get install gnuplot-nox, "
        "or run scripts/install-deps.sh) or use --csv");
  }
  GMUX_ASSIGN_OR_RETURN(std::vector<std::string> csvs, WriteCsv(dir, series));
  auto runs = GroupByRun(series);
  std::ostringstream gp;
  gp << "set terminal pngcairo size 900,480 noenhanced font 'sans,10'\n"
     << "set datafile separator ','\n"
     << "set key outside right top\n"
     << "set grid\n"
     << "set xlabel 'time (s)'\n";
  std::vector<std::string> pngs;
  for (size_t i = 0; i < runs.size(); ++i) {
    const RunSeries& run = runs[i];
    const std::string stem = Stem(i, run.label);
    const Series& first = *run.lines.front();
    gp << "set output " << GpQuote(stem + ".png") << "\n"
       << "set title " << GpQuote(run.label) << "\n"
       << "set ylabel " << GpQuote(first.metric + (first.unit.empty() ? "" : " (" + first.unit + ")"))
       << "\n"
       << "plot ";
    for (size_t c = 0; c < run.lines.size(); ++c) {
      if (c > 0) gp << ", ";
      gp << GpQuote(stem + ".csv") << " using 1:" << (c + 2) << " with linespoints pt 7 ps 0.5 title "
         << GpQuote(ColumnName(run, *run.lines[c]));
    }
    gp << "\n";
    pngs.push_back((fs::path(dir) / (stem + ".png")).string());
  }
  gp << "unset output\n";
  const fs::path script = fs::path(dir) / "plots.gp";
  {
    std::ofstream out(script, std::ios::binary | std::ios::trunc);
    out << gp.str();
    if (!out) return Unavailable("cannot write '" + script.string() + "'");
  }

  // gnuplot runs in `dir` so the script names files relative to it; no shell is involved.
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addchdir_np(&actions, dir.c_str());
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  std::string script_name = "plots.gp";
  char* argv[] = {const_cast<char*>(gnuplot.c_str()), script_name.data(), nullptr};
  pid_t pid = 0;
  int rc = posix_spawn(&pid, gnuplot.c_str(), &actions, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) return Internal("cannot start gnuplot: " + std::string(std::strerror(rc)));
  int wstatus = 0;
  while (waitpid(pid, &wstatus, 0) < 0) {
    if (errno != EINTR) return Internal("waiting for gnuplot: " + std::string(std::strerror(errno)));
  }
  if (!WIFEXITED(wstatus) || WEXITSTATUS(wstatus) != 0) {
    return Internal("gnuplot failed on '" + script.string() + "' (exit status " +
                    std::to_string(WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : -1) +
                    "); its messages are above");
  }
  for (const auto& png : pngs) {
    if (!fs::exists(png)) return Internal("gnuplot did not write '" + png + "'");
  }
  return pngs;
}

}  // namespace gmux::sim
