#include "demo_frames.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/frame_controller.h"
#include "demo_common.h"
#include "status.h"

extern "C" char** environ;

namespace gmux::cli {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

pid_t Spawn(const std::vector<std::string>& argv, const std::vector<std::string>& extra,
            const std::string& out) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string kv = *e;
    bool replaced = false;
    for (const auto& x : extra) {
      replaced = replaced || kv.substr(0, kv.find('=')) == x.substr(0, x.find('='));
    }
    if (!replaced) env.push_back(kv);
  }
  env.insert(env.end(), extra.begin(), extra.end());
  std::vector<char*> a, e;
  for (const auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
  a.push_back(nullptr);
  for (const auto& s : env) e.push_back(const_cast<char*>(s.c_str()));
  e.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  pid_t pid = -1;
  if (posix_spawnp(&pid, a[0], &fa, nullptr, a.data(), e.data()) != 0) pid = -1;
  posix_spawn_file_actions_destroy(&fa);
  return pid;
}

// SIGTERM, then SIGKILL after 5 s; reaps.
void Stop(pid_t pid) {
  if (pid <= 0) return;
  ::kill(pid, SIGTERM);
  for (int i = 0; i < 250; ++i) {
    if (::waitpid(pid, nullptr, WNOHANG) == pid) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Xvfb on a free display; its pid (or -1) and the display.
pid_t StartXvfb(const std::string& dir, std::string& display) {
  for (int n = 90 + static_cast<int>(::getpid() % 100); n < 400; ++n) {
    const std::string num = std::to_string(n);
    if (fs::exists("/tmp/.X" + num + "-lock") || fs::exists("/tmp/.X11-unix/X" + num)) continue;
    pid_t pid = Spawn({"Xvfb", ":" + num, "-screen", "0", "1280x1024x24", "-nolisten", "tcp",
                       "-noreset"},
                      {}, dir + "/xvfb.log");
    if (pid <= 0) return -1;
    for (int i = 0; i < 200 && !fs::exists("/tmp/.X11-unix/X" + num); ++i) {
      if (::waitpid(pid, nullptr, WNOHANG) == pid) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (fs::exists("/tmp/.X11-unix/X" + num) && ::kill(pid, 0) == 0) {
      display = ":" + num;
      return pid;
    }
    Stop(pid);
  }
  return -1;
}

struct LogFrame {
  double end_s, cpu_ms, sleep_ms, present_ms, reference;
};

std::vector<LogFrame> ReadLog(const std::string& path) {
  std::vector<LogFrame> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    LogFrame f{};
    if (std::sscanf(line.c_str(), "%lf %lf %lf %lf %lf", &f.end_s, &f.cpu_ms, &f.sleep_ms,
                    &f.present_ms, &f.reference) >= 4) {
      out.push_back(f);
    }
  }
  return out;
}

struct Program {
  std::string name;
  std::vector<std::string> argv;
};

struct ProgramResult {
  std::string name;
  double mean_fps = 0;
  double min_1s_fps = 0;
  double over34 = 0, over60 = 0;  // fractions of frames
  double usage = 0;               // mean device usage reported by gmuxd (share of the CPUs)
  uint64_t frames = 0;
  std::vector<double> series;     // FPS per second from the phase's start
};

// Per-program statistics from its frame log, skipping the first `settle_s` seconds.
ProgramResult Analyse(const std::string& name, const std::vector<LogFrame>& log, double t0,
                      double settle_s, double seconds) {
  ProgramResult r;
  r.name = name;
  for (int s = 0; s < static_cast<int>(seconds); ++s) r.series.push_back(0);
  for (const auto& f : log) {
    int bin = static_cast<int>(f.end_s - t0);
    if (bin >= 0 && bin < static_cast<int>(r.series.size())) {
      r.series[static_cast<size_t>(bin)] += 1;
    }
  }
  std::vector<double> ends;
  for (const auto& f : log) {
    if (f.end_s >= t0 + settle_s && f.end_s <= t0 + seconds) ends.push_back(f.end_s);
  }
  if (ends.size() >= 2) {
    r.frames = ends.size() - 1;
    r.mean_fps = static_cast<double>(ends.size() - 1) / (ends.back() - ends.front());
    size_t o34 = 0, o60 = 0;
    for (size_t i = 1; i < ends.size(); ++i) {
      const double dt = ends[i] - ends[i - 1];
      o34 += dt > 0.034 ? 1 : 0;
      o60 += dt > 0.060 ? 1 : 0;
    }
    r.over34 = static_cast<double>(o34) / static_cast<double>(ends.size() - 1);
    r.over60 = static_cast<double>(o60) / static_cast<double>(ends.size() - 1);
  }
  r.min_1s_fps = 1e9;
  // The last second is left out: the programs are stopped within it.
  for (size_t s = static_cast<size_t>(settle_s); s + 1 < r.series.size(); ++s) {
    r.min_1s_fps = std::min(r.min_1s_fps, r.series[s]);
  }
  if (r.min_1s_fps == 1e9) r.min_1s_fps = 0;
  return r;
}

std::optional<json> Frames(const std::string& socket, const FramesArgs& a) {
  auto s = ControlRequest(socket, "gmux demo frames", std::nullopt, a);
  if (!s.ok()) return std::nullopt;
  auto j = json::parse(*s, nullptr, false);
  if (j.is_discarded() || j.contains("error")) return std::nullopt;
  return j;
}

}  // namespace

int RunDemoFrames(const DemoFramesOptions& o) {
  DemoPaths paths;
  if (!paths.Find("gmux demo frames")) return 1;
  const fs::path exe = fs::read_symlink("/proc/self/exe");
  const std::string agent = (fs::path(paths.icd).parent_path() / "libgmux-frame.so").string();
  const std::string gl_frames = (exe.parent_path() / "gl_frames").string();
  for (const auto& need : {agent, gl_frames}) {
    if (!fs::exists(need)) {
      std::cerr << "gmux demo frames: needs " << need
                << " (build the gmux-frame and gl_frames targets)\n";
      return 1;
    }
  }
  if (::access("/usr/bin/Xvfb", X_OK) != 0) {
    std::cerr << "gmux demo frames: needs Xvfb (scripts/install-deps.sh installs it)\n";
    return 1;
  }
  std::vector<std::string> policies = SplitList(o.policies);
  for (const auto& p : policies) {
    if (p != "none" && p != "sa" && p != "fsa" && p != "esa") {
      std::cerr << "gmux demo frames: unknown policy '" << p << "' (none, sa, fsa, esa)\n";
      return 1;
    }
  }
  if (!(o.seconds > o.settle_s + 2)) {
    std::cerr << "gmux demo frames: --seconds must exceed --settle by more than 2\n";
    return 1;
  }
  DemoDaemon daemon;
  if (!daemon.Prepare("gmux-demo-frames", paths)) {
    std::cerr << "gmux demo frames: cannot create a temp dir\n";
    return 1;
  }
  const std::string dir = fs::path(daemon.socket()).parent_path().string();
  std::string display;
  pid_t xvfb = StartXvfb(dir, display);
  if (xvfb <= 0) {
    std::cerr << "gmux demo frames: Xvfb did not start: " << Slurp(dir + "/xvfb.log") << "\n";
    return 1;
  }
  struct XvfbGuard {
    pid_t pid;
    ~XvfbGuard() { Stop(pid); }
  } xvfb_guard{xvfb};
  char cfg[512];
  std::snprintf(cfg, sizeof(cfg),
                "[frames]\npolicy = \"none\"\ncriterion_fps = %g\ncontrol_period_s = 1.0\n"
                "target_usage = %g\n",
                o.criterion_fps, o.target_usage);
  const int budget = static_cast<int>((o.seconds + 10) * static_cast<double>(policies.size() + 2) +
                                      2 * o.overhead_pairs * o.overhead_s + 120);
  if (!daemon.Start(cfg, budget)) {
    std::cerr << "gmux demo frames: gmuxd did not start:\n" << daemon.LogTail() << "\n";
    return 1;
  }
  auto env = [&](const std::string& log, bool with_agent) {
    std::vector<std::string> e = {"DISPLAY=" + display, "GMUX_SOCKET=" + daemon.socket(),
                                  "vblank_mode=0"};
    if (with_agent) e.push_back("LD_PRELOAD=" + agent);
    if (with_agent && !log.empty()) e.push_back("GMUX_FRAME_LOG=" + log);
    return e;
  };
  // The trio (calibrated on 2 cores: about 0.4, 3.6 and 33 ms of CPU per frame; together,
  // free-running, the heavy one falls below 30 FPS; capped at 30, all fit).
  std::vector<Program> programs;
  if (::access("/usr/bin/glxgears", X_OK) == 0) {
    programs.push_back({"glxgears", {"glxgears", "-geometry", "300x300"}});
  } else {
    programs.push_back({"light", {gl_frames, "--seconds", "0", "--size", "300x300"}});
  }
  programs.push_back({"medium-egl",
                      {gl_frames, "--seconds", "0", "--api", "egl", "--size", "400x300", "--draw",
                       "4"}});
  programs.push_back({"heavy", {gl_frames, "--seconds", "0", "--size", "400x300", "--draw", "50"}});

  json out;
  out["criterion_fps"] = o.criterion_fps;
  out["seconds"] = o.seconds;
  out["settle_s"] = o.settle_s;
  out["target_usage"] = o.target_usage;
  out["display"] = display;
  out["policies"] = json::array();
  std::map<std::string, std::vector<ProgramResult>> by_policy;
  std::map<std::string, double> total_usage;
  for (const auto& policy : policies) {
    FramesArgs a;
    a.action = "policy";
    a.policy = policy;
    if (!Frames(daemon.socket(), a)) {
      std::cerr << "gmux demo frames: gmuxd refused policy " << policy << "\n"
                << daemon.LogTail() << "\n";
      return 1;
    }
    if (!o.json) std::fprintf(stderr, "policy %s: %.0f s...\n", policy.c_str(), o.seconds);
    std::vector<pid_t> pids;
    std::vector<std::string> logs;
    const double t0 = static_cast<double>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                              Clock::now().time_since_epoch())
                                              .count()) *
                      1e-9;
    for (const auto& p : programs) {
      logs.push_back(dir + "/" + policy + "-" + p.name + ".log");
      fs::remove(logs.back());
      pids.push_back(Spawn(p.argv, env(logs.back(), true), dir + "/" + policy + "-" + p.name +
                                                               ".out"));
    }
    // gmuxd's view each second: every agent's device usage (by pid).
    std::map<int, std::vector<double>> usage;
    const auto end = Clock::now() + std::chrono::milliseconds(static_cast<int>(o.seconds * 1e3));
    int tick = 0;
    while (Clock::now() < end) {
      std::this_thread::sleep_for(std::chrono::seconds(1));
      ++tick;
      if (tick <= static_cast<int>(o.settle_s)) continue;
      FramesArgs l;
      l.action = "list";
      if (auto j = Frames(daemon.socket(), l)) {
        for (const auto& g : (*j)["groups"]) {
          for (const auto& ag : g["agents"]) {
            usage[ag.value("pid", 0)].push_back(ag.value("usage", 0.0));
          }
        }
      }
    }
    for (pid_t pid : pids) Stop(pid);
    json pj = {{"policy", policy}, {"programs", json::array()}};
    double total = 0;
    for (size_t i = 0; i < programs.size(); ++i) {
      ProgramResult r = Analyse(programs[i].name, ReadLog(logs[i]), t0, o.settle_s, o.seconds);
      const auto& u = usage[pids[i]];
      for (double x : u) r.usage += x / static_cast<double>(u.size());
      total += r.usage;
      by_policy[policy].push_back(r);
      pj["programs"].push_back({{"name", r.name},
                                {"mean_fps", r.mean_fps},
                                {"min_1s_fps", r.min_1s_fps},
                                {"frames_over_34ms", r.over34},
                                {"frames_over_60ms", r.over60},
                                {"usage", r.usage},
                                {"frames", r.frames},
                                {"fps_series", r.series}});
    }
    total_usage[policy] = total;
    pj["total_usage"] = total;
    out["policies"].push_back(pj);
  }

  // The goals (docs/reproductions.md): computed from this run.
  json goals = json::object();
  const double c = o.criterion_fps;
  if (by_policy.count("sa") != 0) {
    double worst = 0;
    for (const auto& r : by_policy["sa"]) worst = std::max(worst, std::fabs(r.mean_fps / c - 1));
    goals["sa_max_deviation"] = worst;
    goals["sa_within_3pct"] = worst <= 0.03;
  }
  if (by_policy.count("none") != 0) {
    bool below = false;
    for (const auto& r : by_policy["none"]) below = below || r.mean_fps < c;
    goals["none_one_below_target"] = below;
  }
  if (by_policy.count("esa") != 0) {
    double lo = 1e9, hi = 0;
    for (const auto& r : by_policy["esa"]) {
      lo = std::min(lo, r.mean_fps);
      hi = std::max(hi, r.mean_fps);
    }
    goals["esa_spread"] = hi > 0 ? (hi - lo) / hi : 0.0;
    goals["esa_common_fps"] = lo;
    goals["esa_within_5pct_above_criterion"] = hi > 0 && (hi - lo) / hi <= 0.05 && lo >= c;
  }
  if (by_policy.count("fsa") != 0) {
    double lowest = 1e9;
    for (const auto& r : by_policy["fsa"]) lowest = std::min(lowest, r.mean_fps);
    goals["fsa_lowest_fps"] = lowest;
    goals["fsa_none_below_target"] = lowest >= c * 0.97;
    if (total_usage.count("sa") != 0) {
      goals["fsa_usage_over_sa"] = total_usage["fsa"] / std::max(1e-9, total_usage["sa"]);
      goals["fsa_more_usage_than_sa"] = total_usage["fsa"] > total_usage["sa"];
    }
  }

  // PI step response: the medium program alone under SA, its tenant's target moved from the
  // criterion to 1.5x mid-run; frames until the frame rate stays within 5 % of the new target,
  // against the same controller (core::FrameController, same gains) on a model of that program
  // (its measured CPU, Present and unmodelled time per frame).
  if (o.step) {
    FramesArgs a;
    a.action = "policy";
    a.policy = "sa";
    Frames(daemon.socket(), a);
    const std::string log = dir + "/step.log";
    fs::remove(log);
    pid_t pid = Spawn(programs[1].argv, env(log, true), dir + "/step.out");
    std::this_thread::sleep_for(std::chrono::seconds(5));
    std::string tenant;
    FramesArgs l;
    l.action = "list";
    if (auto j = Frames(daemon.socket(), l)) {
      for (const auto& g : (*j)["groups"]) {
        for (const auto& ag : g["agents"]) tenant = ag.value("tenant", std::string());
      }
    }
    const double target = 1.5 * c;
    FramesArgs t;
    t.action = "target";
    t.tenant = tenant;
    t.fps = target;
    Frames(daemon.socket(), t);
    std::this_thread::sleep_for(std::chrono::seconds(4));
    Stop(pid);
    t.fps = 0;
    Frames(daemon.socket(), t);
    auto frames = ReadLog(log);
    size_t first = frames.size();
    for (size_t i = 0; i < frames.size(); ++i) {
      if (std::fabs(frames[i].reference - target) < 1e-6) {
        first = i;
        break;
      }
    }
    json sj = {{"from_fps", c}, {"to_fps", target}};
    if (first + 20 < frames.size() && first > 10) {
      // Measured: frames after the new reference until the frame rate (over the last five
      // frames, as single frame times jitter by a few per cent on a shared CPU) is within 5 % of
      // it and stays there for the next ten frames.
      auto within = [&](size_t i) {
        const size_t from = i >= 5 ? i - 5 : 0;
        const double dt = (frames[i].end_s - frames[from].end_s) / static_cast<double>(i - from);
        return dt > 0 && std::fabs(1.0 / dt / target - 1) <= 0.05;
      };
      int settle = -1;
      for (size_t i = first; i + 10 < frames.size(); ++i) {
        bool ok = true;
        for (size_t k = i; k < i + 10 && ok; ++k) ok = within(k);
        if (ok) {
          settle = static_cast<int>(i - first);
          break;
        }
      }
      // The model: the mean CPU, Present and unmodelled time of the frames before the step; the
      // reference moves at frame 200, the first frame decided with it (as `first` is measured).
      double cpu = 0, present = 0, extra = 0;
      int n = 0;
      for (size_t i = first > 40 ? first - 40 : 1; i < first; ++i) {
        const double dt = frames[i].end_s - frames[i - 1].end_s;
        cpu += frames[i].cpu_ms * 1e-3;
        present += frames[i].present_ms * 1e-3;
        extra += dt - (frames[i].cpu_ms + frames[i].sleep_ms + frames[i].present_ms) * 1e-3;
        ++n;
      }
      cpu /= n;
      present /= n;
      extra /= n;
      core::FrameControllerOptions fo;  // gmuxd's defaults, as configured for this run
      auto ctl = core::FrameController::Create(fo).value();
      ctl.SetReference(c);
      double now = 0;
      int predicted = -1;
      std::vector<double> ends;
      for (int k = 0; k < 400; ++k) {
        if (k == 200) ctl.SetReference(target);
        core::FrameDecision d = ctl.Decide(FromSeconds(cpu));
        now += cpu + ToSeconds(d.sleep) + present + extra;
        ctl.Observe({AtSeconds(now), FromSeconds(present)});
        ends.push_back(now);
        if (k >= 200 && predicted < 0) {
          // The same criterion as for the program: the rate over the last five frames.
          const double dt = (ends[static_cast<size_t>(k)] - ends[static_cast<size_t>(k - 5)]) / 5;
          if (std::fabs(1.0 / dt / target - 1) <= 0.05) predicted = k - 200;
        }
      }
      sj["settle_frames"] = settle;
      sj["model_settle_frames"] = predicted;
      sj["pole"] = core::ClosedLoopPole(fo.kp, fo.ki);
      sj["within_50pct_of_model"] =
          settle >= 0 && predicted >= 0 &&
          std::abs(settle - predicted) <= std::max(1.0, 0.5 * predicted);
      double after = 0;
      int an = 0;
      for (size_t i = first + 30; i < frames.size(); ++i) {
        after += 1.0 / (frames[i].end_s - frames[i - 1].end_s);
        ++an;
      }
      sj["fps_after"] = an > 0 ? after / an : 0.0;
      // The step as a series (Fig. 8's view): per frame from 30 before the step to 60 after,
      // the frame's rate, the five-frame rate and the reference in force.
      json series = json::array();
      for (size_t i = first >= 30 ? first - 30 : 6; i < frames.size() && i < first + 60; ++i) {
        const double dt1 = frames[i].end_s - frames[i - 1].end_s;
        const double dt5 = (frames[i].end_s - frames[i - 5].end_s) / 5;
        series.push_back({{"frame", static_cast<int64_t>(i) - static_cast<int64_t>(first)},
                          {"fps", dt1 > 0 ? 1 / dt1 : 0.0},
                          {"fps5", dt5 > 0 ? 1 / dt5 : 0.0},
                          {"reference", frames[i].reference}});
      }
      sj["series"] = series;
    } else {
      sj["error"] = "the new target did not reach the agent in time";
    }
    out["step"] = sj;
  }

  // The agent's overhead on a free-running program: gl_frames alone, alternately without and
  // with the agent (gmuxd's policy none: the agent only measures and reports; no frame log);
  // FPS from the program's own output.
  if (o.overhead) {
    FramesArgs a;
    a.action = "policy";
    a.policy = "none";
    Frames(daemon.socket(), a);
    std::vector<double> with, without;
    for (int round = 0; round < 2 * o.overhead_pairs; ++round) {
      const bool agent_on = round % 2 == 1;
      const std::string outp = dir + "/overhead.out";
      pid_t pid = Spawn({gl_frames, "--seconds", std::to_string(o.overhead_s), "--size", "64x64",
                         "--json"},
                        env("", agent_on), outp);
      int status = 0;
      ::waitpid(pid, &status, 0);
      std::string text = Slurp(outp);
      auto j = json::parse(text.substr(text.rfind('{') == std::string::npos ? 0 : text.rfind('{')),
                           nullptr, false);
      if (!j.is_discarded()) (agent_on ? with : without).push_back(j.value("fps", 0.0));
    }
    // Medians: single runs vary by several per cent on a shared machine.
    auto median = [](std::vector<double> v) {
      if (v.empty()) return 0.0;
      std::sort(v.begin(), v.end());
      return v.size() % 2 == 1 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
    };
    const double w = median(with), wo = median(without);
    out["overhead"] = {{"fps_without_agent", wo}, {"fps_with_agent", w},
                       {"ratio", wo > 0 ? w / wo : 0.0}, {"runs", with.size() + without.size()},
                       {"fps_without_each", without}, {"fps_with_each", with}};
    goals["agent_overhead_within_2pct"] = wo > 0 && w / wo >= 0.98;
  }
  out["goals"] = goals;

  if (!o.plot_dir.empty()) {
    std::error_code ec;
    fs::create_directories(o.plot_dir, ec);
    if (out.contains("step") && out["step"].contains("series")) {
      const std::string base = o.plot_dir + "/frames-step";
      {
        std::ofstream csv(base + ".csv");
        csv << "frame,fps,fps5,reference\n";
        for (const auto& p : out["step"]["series"]) {
          csv << p["frame"].get<int64_t>() << "," << p["fps"].get<double>() << ","
              << p["fps5"].get<double>() << "," << p["reference"].get<double>() << "\n";
        }
      }
      std::ofstream gp(base + ".gp");
      gp << "set terminal png size 800,400\nset output '" << base << ".png'\n"
         << "set datafile separator ','\nset title 'PI step response: target moved mid-run'\n"
         << "set xlabel 'frame (0: first frame decided with the new reference)'\n"
         << "set ylabel 'FPS'\nset key outside\n"
         << "plot '" << base << ".csv' every ::1 using 1:2 with lines title 'frame rate', '"
         << base << ".csv' every ::1 using 1:3 with lines title 'five-frame rate', '" << base
         << ".csv' every ::1 using 1:4 with steps dt 2 title 'reference'\n";
      gp.close();
      if (::access("/usr/bin/gnuplot", X_OK) == 0) {
        pid_t pid = Spawn({"gnuplot", base + ".gp"}, {}, o.plot_dir + "/gnuplot.log");
        ::waitpid(pid, nullptr, 0);
      }
    }
    for (const auto& [policy, rs] : by_policy) {
      std::ofstream csv(o.plot_dir + "/frames-" + policy + ".csv");
      csv << "second";
      for (const auto& r : rs) csv << "," << r.name;
      csv << "\n";
      for (size_t s = 0; s < rs[0].series.size(); ++s) {
        csv << s;
        for (const auto& r : rs) csv << "," << r.series[s];
        csv << "\n";
      }
      csv.close();  // gnuplot reads it below
      std::ofstream gp(o.plot_dir + "/frames-" + policy + ".gp");
      gp << "set terminal png size 800,400\nset output '" << o.plot_dir << "/frames-" << policy
         << ".png'\nset datafile separator ','\nset title 'FPS per program, policy " << policy
         << "'\nset xlabel 'second'\nset ylabel 'FPS'\nset logscale y\nset yrange [5:*]\n"
         << "set key outside\n"
         << "plot " << c << " title 'criterion' dt 2";
      for (size_t i = 0; i < rs.size(); ++i) {
        gp << ", '" << o.plot_dir << "/frames-" << policy << ".csv' every ::1 using 1:" << i + 2
           << " with lines title '" << rs[i].name << "'";
      }
      gp << "\n";
      gp.close();
      if (::access("/usr/bin/gnuplot", X_OK) == 0) {
        pid_t pid = Spawn({"gnuplot", o.plot_dir + "/frames-" + policy + ".gp"}, {},
                          o.plot_dir + "/gnuplot.log");
        ::waitpid(pid, nullptr, 0);
      }
    }
  }

  if (o.json) {
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  std::printf("vGASA on real GL programs (Xvfb, llvmpipe), criterion %.0f FPS, %.0f s per policy "
              "(first %.0f s not counted)\n", c, o.seconds, o.settle_s);
  std::printf("%-6s %-12s %9s %9s %8s %8s %7s\n", "policy", "program", "mean_fps", "min_1s",
              ">34ms", ">60ms", "usage");
  for (const auto& p : out["policies"]) {
    for (const auto& r : p["programs"]) {
      std::printf("%-6s %-12s %9.1f %9.0f %7.1f%% %7.1f%% %7.3f\n",
                  p["policy"].get<std::string>().c_str(), r["name"].get<std::string>().c_str(),
                  r["mean_fps"].get<double>(), r["min_1s_fps"].get<double>(),
                  100 * r["frames_over_34ms"].get<double>(),
                  100 * r["frames_over_60ms"].get<double>(), r["usage"].get<double>());
    }
    std::printf("%-6s %-12s %57.3f\n", p["policy"].get<std::string>().c_str(), "total",
                p["total_usage"].get<double>());
  }
  if (out.contains("step")) std::printf("step response: %s\n", out["step"].dump().c_str());
  if (out.contains("overhead")) std::printf("agent overhead: %s\n", out["overhead"].dump().c_str());
  std::printf("goals: %s\n", goals.dump().c_str());
  return 0;
}

}  // namespace gmux::cli
