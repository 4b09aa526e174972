// The frame agent (libgmux-frame.so) on real GL programs: gl_frames (GLX and EGL, direct calls
// and through GetProcAddress), glxgears and glmark2 (which opens libGL itself and looks the swap
// up with dlsym), on Mesa's llvmpipe under Xvfb started by the test; with no daemon and with a
// real gmuxd. The SLA check is about direction only (SA brings a free-running program down to
// its target; `none` lets it run free): no bound a loaded machine could break.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

extern "C" char** environ;

namespace {

namespace fs = std::filesystem;

pid_t Spawn(const std::vector<std::string>& argv, const std::vector<std::string>& env_extra,
            const std::string& out_path) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string kv = *e;
    bool replaced = false;
    for (const auto& x : env_extra) {
      replaced = replaced || kv.substr(0, kv.find('=')) == x.substr(0, x.find('='));
    }
    if (!replaced) env.push_back(kv);
  }
  env.insert(env.end(), env_extra.begin(), env_extra.end());
  std::vector<char*> a, e;
  for (const auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
  a.push_back(nullptr);
  for (const auto& s : env) e.push_back(const_cast<char*>(s.c_str()));
  e.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  if (!out_path.empty()) {
    posix_spawn_file_actions_addopen(&fa, 1, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
  }
  pid_t pid = -1;
  if (posix_spawnp(&pid, a[0], &fa, nullptr, a.data(), e.data()) != 0) pid = -1;
  posix_spawn_file_actions_destroy(&fa);
  return pid;
}

// Waits for `pid` up to `timeout`; kills it past that. Its exit status, or -1 when killed.
int Wait(pid_t pid, std::chrono::seconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  int status = 0;
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > end) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct Frame {
  double end_s, cpu_ms, sleep_ms, present_ms;
};

std::vector<Frame> ReadLog(const std::string& path) {
  std::vector<Frame> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    Frame f{};
    if (std::sscanf(line.c_str(), "%lf %lf %lf %lf", &f.end_s, &f.cpu_ms, &f.sleep_ms,
                    &f.present_ms) == 4) {
      out.push_back(f);
    }
  }
  return out;
}

// Frames per second over the log's last `window_s` seconds.
double TailFps(const std::vector<Frame>& frames, double window_s) {
  if (frames.size() < 2) return 0;
  const double end = frames.back().end_s;
  size_t n = 0;
  double first = end;
  for (auto it = frames.rbegin(); it != frames.rend() && it->end_s >= end - window_s; ++it) {
    ++n;
    first = it->end_s;
  }
  return n > 1 && end > first ? static_cast<double>(n - 1) / (end - first) : 0;
}

// The pid an X server wrote into its display's lock file (-1 when unreadable).
pid_t LockOwner(const std::string& lock) {
  std::ifstream in(lock);
  long pid = -1;
  if (!(in >> pid)) return -1;
  return static_cast<pid_t>(pid);
}

class FramesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::access("/usr/bin/Xvfb", X_OK) != 0) GTEST_SKIP() << "Xvfb is not installed";
    char tmpl[] = "/tmp/gmux-frames-e2e-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    // A free display: no lock file and no socket; Xvfb takes the lock itself, so a race with
    // another server makes it fail, and the next number is tried.
    for (int n = 90 + static_cast<int>(::getpid() % 100); n < 400 && xvfb_ < 0; ++n) {
      const std::string num = std::to_string(n);
      if (fs::exists("/tmp/.X" + num + "-lock") || fs::exists("/tmp/.X11-unix/X" + num)) continue;
      // -noreset: a server that resets when its last client leaves refuses connections for a
      // moment, and a program that closes its display and opens it again (dl_probe reload)
      // lands in that moment on a loaded host.
      pid_t pid = Spawn({"Xvfb", ":" + num, "-screen", "0", "1024x768x24", "-nolisten", "tcp",
                         "-noreset"},
                        {}, dir_ + "/xvfb.log");
      ASSERT_GT(pid, 0);
      for (int i = 0; i < 200 && !fs::exists("/tmp/.X11-unix/X" + num); ++i) {
        if (::waitpid(pid, nullptr, WNOHANG) == pid) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      // Ours only when the lock names our Xvfb: one that lost the race to another test's may
      // not have exited yet while the winner's socket is there (and that server goes away when
      // the other test ends).
      if (fs::exists("/tmp/.X11-unix/X" + num) && ::kill(pid, 0) == 0 &&
          LockOwner("/tmp/.X" + num + "-lock") == pid) {
        xvfb_ = pid;
        display_ = ":" + num;
      } else {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, nullptr, 0);
      }
    }
    ASSERT_GT(xvfb_, 0) << "Xvfb did not start: " << Slurp(dir_ + "/xvfb.log");
  }
  void TearDown() override {
    if (gmuxd_ > 0) {
      ::kill(gmuxd_, SIGTERM);
      if (Wait(gmuxd_, std::chrono::seconds(10)) == -1) ADD_FAILURE() << "gmuxd did not stop";
    }
    if (xvfb_ > 0) {
      ::kill(xvfb_, SIGTERM);
      Wait(xvfb_, std::chrono::seconds(10));
    }
    std::error_code ec;
    if (!dir_.empty() && std::getenv("GMUX_KEEP") == nullptr) fs::remove_all(dir_, ec);
  }

  void StartDaemon(const std::string& frames_toml) {
    std::ofstream(dir_ + "/gmux.toml") << "[daemon]\nsocket = \"" << socket() << "\"\n"
                                       << "spare_workers = 0\n" << frames_toml;
    gmuxd_ = Spawn({GMUXD_PATH, "--config", dir_ + "/gmux.toml"}, {}, dir_ + "/gmuxd.log");
    ASSERT_GT(gmuxd_, 0);
    for (int i = 0; i < 300 && !fs::exists(socket()); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ASSERT_TRUE(fs::exists(socket())) << Slurp(dir_ + "/gmuxd.log");
  }
  std::string socket() const { return dir_ + "/gmuxd.sock"; }
  std::vector<std::string> Env(const std::string& log) const {
    return {"DISPLAY=" + display_, "LD_PRELOAD=" + std::string(GMUX_FRAME_PATH),
            "GMUX_SOCKET=" + (gmuxd_ > 0 ? socket() : dir_ + "/no-daemon.sock"),
            "GMUX_FRAME_LOG=" + log, "LP_NUM_THREADS=1", "vblank_mode=0"};
  }
  nlohmann::json Cli(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {GMUX_CLI_PATH};
    argv.insert(argv.end(), args.begin(), args.end());
    argv.push_back("--socket");
    argv.push_back(socket());
    argv.push_back("--json");
    pid_t pid = Spawn(argv, {}, dir_ + "/cli.out");
    if (Wait(pid, std::chrono::seconds(30)) != 0) return {};
    return nlohmann::json::parse(Slurp(dir_ + "/cli.out"), nullptr, false);
  }

  std::string dir_;
  std::string display_;
  pid_t xvfb_ = -1;
  pid_t gmuxd_ = -1;
};

TEST_F(FramesTest, WithoutADaemonTheProgramRunsAsIfTheAgentWereNotLoaded) {
  const std::vector<std::vector<std::string>> variants = {
      {"--api", "glx"}, {"--api", "glx", "--lookup"}, {"--api", "egl"},
      {"--api", "egl", "--lookup"}};
  for (const auto& v : variants) {
    std::string log = dir_ + "/nodaemon.log";
    fs::remove(log);
    std::vector<std::string> argv = {GL_FRAMES_PATH, "--frames", "40", "--size", "64x64", "--json"};
    argv.insert(argv.end(), v.begin(), v.end());
    pid_t pid = Spawn(argv, Env(log), dir_ + "/out.txt");
    ASSERT_EQ(Wait(pid, std::chrono::seconds(60)), 0) << v[1] << ": " << Slurp(dir_ + "/out.txt");
    auto out = Slurp(dir_ + "/out.txt");
    auto j = nlohmann::json::parse(out.substr(out.rfind('{')), nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << out;
    EXPECT_EQ(j["frames"], 40);
    // The agent saw every swap (interposition through this path works) and never slept.
    auto frames = ReadLog(log);
    EXPECT_EQ(frames.size(), 40u) << v[1] << (v.size() > 2 ? " --lookup" : "");
    for (const auto& f : frames) EXPECT_EQ(f.sleep_ms, 0);
  }
}

TEST_F(FramesTest, EverySwapPathIsControlledUnderSa) {
  StartDaemon("[frames]\npolicy = \"sa\"\ncriterion_fps = 40\ncontrol_period_s = 0.5\n");
  const std::vector<std::vector<std::string>> variants = {
      {GL_FRAMES_PATH, "--seconds", "2", "--size", "64x64", "--api", "glx"},
      {GL_FRAMES_PATH, "--seconds", "2", "--size", "64x64", "--api", "glx", "--lookup"},
      {GL_FRAMES_PATH, "--seconds", "2", "--size", "64x64", "--api", "egl"},
      {GL_FRAMES_PATH, "--seconds", "2", "--size", "64x64", "--api", "egl", "--lookup"},
      // glmark2 opens libGL itself and fetches glXSwapBuffers with dlsym.
      {"glmark2", "-b", "build:duration=2", "--size", "64x64"},
  };
  for (const auto& argv : variants) {
    if (argv[0] == "glmark2" && ::access("/usr/bin/glmark2", X_OK) != 0) continue;
    std::string log = dir_ + "/sa.log";
    fs::remove(log);
    pid_t pid = Spawn(argv, Env(log), dir_ + "/out.txt");
    ASSERT_EQ(Wait(pid, std::chrono::seconds(60)), 0)
        << argv[0] << ": " << Slurp(dir_ + "/out.txt");
    auto frames = ReadLog(log);
    // Free-running, these programs do hundreds of frames per second: under SA at 40, once the
    // agent is connected and controlled (the first frames may run free), frames sleep before
    // Present. Judged on the last second.
    ASSERT_GT(frames.size(), 10u) << argv[0];
    size_t last = 0, slept = 0;
    for (const auto& f : frames) {
      if (f.end_s < frames.back().end_s - 1.0) continue;
      ++last;
      slept += f.sleep_ms > 0 ? 1 : 0;
    }
    EXPECT_GT(slept, last / 2) << argv[0] << " " << argv.back() << ": " << slept << " of " << last;
  }
  EXPECT_NE(Slurp(dir_ + "/gmuxd.log").find("frame agent"), std::string::npos);
}

TEST_F(FramesTest, SaBringsAFreeRunningProgramToItsTargetAndNoneLetsItGo) {
  StartDaemon("[frames]\npolicy = \"none\"\ncontrol_period_s = 0.5\n");
  auto run_pair = [&](const std::string& tag, double* light_fps, double* heavy_fps) {
    std::string llog = dir_ + "/light-" + tag + ".log", hlog = dir_ + "/heavy-" + tag + ".log";
    pid_t light = Spawn({GL_FRAMES_PATH, "--seconds", "4", "--size", "96x96"}, Env(llog),
                        dir_ + "/light.out");
    pid_t heavy = Spawn({GL_FRAMES_PATH, "--seconds", "4", "--size", "256x256", "--draw", "8",
                         "--cpu-ms", "4"}, Env(hlog), dir_ + "/heavy.out");
    EXPECT_EQ(Wait(light, std::chrono::seconds(60)), 0) << Slurp(dir_ + "/light.out");
    EXPECT_EQ(Wait(heavy, std::chrono::seconds(60)), 0) << Slurp(dir_ + "/heavy.out");
    *light_fps = TailFps(ReadLog(llog), 2.0);
    *heavy_fps = TailFps(ReadLog(hlog), 2.0);
  };
  double light_none = 0, heavy_none = 0, light_sa = 0, heavy_sa = 0;
  run_pair("none", &light_none, &heavy_none);
  auto ans = Cli({"frames", "policy", "sa"});
  ASSERT_TRUE(ans.is_object() && ans.value("ok", false)) << ans;
  run_pair("sa", &light_sa, &heavy_sa);
  // The light program is capped near the criterion (30) under SA, and runs free without it.
  EXPECT_LT(light_sa, 45) << "none " << light_none << ", sa " << light_sa;
  EXPECT_GT(light_none, light_sa) << "none " << light_none << ", sa " << light_sa;
  EXPECT_GT(heavy_sa, 0);
  // gmux status listed them (the last run's agents are gone; the policy stays).
  auto st = Cli({"frames", "list"});
  ASSERT_TRUE(st.is_object()) << st;
  EXPECT_EQ(st.value("criterion_fps", 0.0), 30.0);
}

TEST_F(FramesTest, TheDynamicLinkerKeepsItsMeaningWithTheAgentLoaded) {
  // A program that opens libGL itself, swaps, closes it and opens it again (the agent keeps
  // nothing of a closed libGL, and pins none of it).
  std::vector<std::string> env = Env(dir_ + "/reload.log");
  pid_t pid = Spawn({DL_PROBE_PATH, "reload", "3"}, env, dir_ + "/reload.out");
  EXPECT_EQ(Wait(pid, std::chrono::seconds(60)), 0) << Slurp(dir_ + "/reload.out");
  EXPECT_EQ(ReadLog(dir_ + "/reload.log").size(), 30u);  // every swap of the three rounds seen
  // RTLD_NEXT from a plugin, and dlerror() for a missing symbol.
  pid = Spawn({DL_PROBE_PATH, "next", DL_PROBE_PLUGIN_PATH}, env, dir_ + "/next.out");
  EXPECT_EQ(Wait(pid, std::chrono::seconds(30)), 0) << Slurp(dir_ + "/next.out");
  // A naive malloc wrapper (dlsym(RTLD_NEXT) on first use) before and after the agent.
  for (const std::string& order :
       {std::string(DL_NAIVE_MALLOC_PATH) + ":" + GMUX_FRAME_PATH,
        std::string(GMUX_FRAME_PATH) + ":" + DL_NAIVE_MALLOC_PATH}) {
    pid = Spawn({"/bin/ls", "/"}, {"LD_PRELOAD=" + order}, dir_ + "/ls.out");
    EXPECT_EQ(Wait(pid, std::chrono::seconds(30)), 0) << order << ": " << Slurp(dir_ + "/ls.out");
  }
}

// `gmux demo frames` end to end, short: its JSON has every phase asked for and every program.
TEST(DemoFramesTest, RunsEndToEndWithJson) {
  if (::access("/usr/bin/Xvfb", X_OK) != 0) GTEST_SKIP() << "Xvfb is not installed";
  char tmpl[] = "/tmp/gmux-demo-frames-test-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  pid_t pid = Spawn({GMUX_CLI_PATH, "demo", "frames", "--seconds", "5", "--settle", "2",
                     "--policies", "none,sa", "--no-step", "--no-overhead", "--json", "--plot",
                     dir + "/plots"},
                    {}, dir + "/out.json");
  ASSERT_EQ(Wait(pid, std::chrono::seconds(150)), 0) << Slurp(dir + "/out.json");
  std::string text = Slurp(dir + "/out.json");
  auto j = nlohmann::json::parse(text.substr(text.find('{')), nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << text;
  ASSERT_EQ(j["policies"].size(), 2u);
  for (const auto& p : j["policies"]) {
    ASSERT_EQ(p["programs"].size(), 3u) << p;
    for (const auto& r : p["programs"]) EXPECT_GT(r["frames"].get<int>(), 0) << p["policy"] << r;
  }
  EXPECT_TRUE(j["goals"].contains("sa_within_3pct"));
  EXPECT_TRUE(j["goals"].contains("none_one_below_target"));
  EXPECT_TRUE(fs::exists(dir + "/plots/frames-sa.csv"));
  std::error_code ec;
  fs::remove_all(dir, ec);
}

}  // namespace
