// `gmux top` against a real gmuxd with real tenants (OpenCL programs through the gmux ICD on
// PoCL, forked under uids of their own when the test runs as root): `--once` as text and JSON,
// and the live view in a detached tmux of the test's own (its own server socket), driven with
// send-keys and read with capture-pane. Every wait polls with a generous deadline; nothing
// depends on how fast a loaded machine is.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/isolation_harness.h"
#include "runtime/runtime_env.h"

namespace gmux::testing {
namespace {

using namespace iso;
using nlohmann::json;

constexpr const char* kSpin = R"(
__kernel void spin(__global uint* a, uint rounds) {
  uint x = a[get_global_id(0)];
  for (uint i = 0; i < rounds; ++i) x = x * 1664525u + 1013904223u;
  a[get_global_id(0)] = x;
}
)";

// A tenant that keeps using the device (launch, clFinish, a short pause, again) until it is
// killed; it reports once its first launch has completed. Exit codes: KernelOnBuffer's, or
// 60/61 when setting the argument or a launch failed.
int BusyTenant(Channel& ch) {
  const size_t n = 4096;
  std::vector<cl_uint> init(n, 1);
  GmuxDevice d;
  cl_kernel k = nullptr;
  cl_mem m = nullptr;
  if (int rc = KernelOnBuffer(d, kSpin, "spin", n * sizeof(cl_uint), init.data(), &k, &m);
      rc != 0) {
    return rc;
  }
  const cl_uint rounds = 2000;
  if (clSetKernelArg(k, 1, sizeof(rounds), &rounds) != CL_SUCCESS) return 60;
  for (bool first = true;; first = false) {
    if (clEnqueueNDRangeKernel(d.queue, k, 1, nullptr, &n, nullptr, 0, nullptr, nullptr) !=
            CL_SUCCESS ||
        clFinish(d.queue) != CL_SUCCESS) {
      return 61;
    }
    if (first) ch.Send(1);
    std::this_thread::sleep_for(10ms);  // a busy tenant, not a CPU-bound test
  }
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

bool Has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// The index of the first line starting with `prefix`, or -1.
int LineStarting(const std::string& text, const std::string& prefix) {
  const auto lines = Lines(text);
  for (size_t i = 0; i < lines.size(); ++i) {
    if (lines[i].rfind(prefix, 0) == 0) return static_cast<int>(i);
  }
  return -1;
}

bool HaveTmux() { return std::system("command -v tmux >/dev/null 2>&1") == 0; }

// A tmux server of the test's own (-S: a socket of its own, in the test's temp dir, so nothing
// is left in /tmp/tmux-UID; -f /dev/null: no config file), killed with every session in it
// when the object goes.
class Tmux {
 public:
  explicit Tmux(std::string socket) : socket_(std::move(socket)) {}
  ~Tmux() {
    Run("kill-server");
    ::unlink(socket_.c_str());
  }
  Tmux(const Tmux&) = delete;
  Tmux& operator=(const Tmux&) = delete;

  // `tmux ARGS`: its exit status, with its output in `out` when given.
  int Run(const std::string& args, std::string* out = nullptr) {
    std::string text;
    const int rc = RunShell("tmux -S " + socket_ + " -f /dev/null " + args, text);
    if (out != nullptr) *out = text;
    return rc;
  }
  // The pane's visible text now.
  std::string Screen(const std::string& target) {
    std::string out;
    return Run("capture-pane -p -t " + target, &out) == 0 ? out : "";
  }
  // Polls the screen until `pred` holds, for up to `within`; the last screen seen.
  std::string WaitFor(const std::string& target,
                      const std::function<bool(const std::string&)>& pred,
                      std::chrono::seconds within = 60s) {
    const auto end = std::chrono::steady_clock::now() + within;
    std::string s;
    while (std::chrono::steady_clock::now() < end) {
      s = Screen(target);
      if (pred(s)) return s;
      std::this_thread::sleep_for(50ms);
    }
    return s;
  }
  std::string WaitFor(const std::string& target, const std::string& part) {
    return WaitFor(target, [&](const std::string& s) { return Has(s, part); });
  }

 private:
  std::string socket_;
};

class GmuxTopTest : public ::testing::Test {
 protected:
  // gmuxd under `credit` with tenant alpha (weight 2) and, when tenants have uids of their own
  // (as root), beta (weight 3); with `load`, each runs BusyTenant and has used the device.
  void StartDaemon(bool load) {
    std::ostringstream c;
    c << "[scheduler]\npolicy = \"credit\"\n\n[[tenant]]\nname = \"alpha\"\nweight = 2\nuids = ["
      << TenantUid(0) << "]\n";
    if (two_tenants_) c << "\n[[tenant]]\nname = \"beta\"\nweight = 3\nuids = [" << TenantUid(1)
                        << "]\n";
    daemon_.Start(c.str());
    if (!load) return;
    for (int t = 0; t < (two_tenants_ ? 2 : 1); ++t) {
      ChildOptions o;
      o.tenant = t;
      o.limit_s = 280;
      tenants_.push_back(Child::Spawn(daemon_, o, BusyTenant));
    }
    for (auto& t : tenants_) {
      // Each compiles its kernel first: a minute is plenty even on a loaded 2-core machine.
      ASSERT_EQ(t.Receive(120s), 1) << "a tenant did not start: " << t.Wait(1s).Describe()
                                    << "\n" << daemon_.Log();
    }
  }

  // A script for a tmux pane: `command`, then the exit status on the shell's (normal) screen,
  // then a pause so the pane stays to be read. The shell traps SIGINT so that Ctrl-C, which
  // the terminal sends to the shell too, ends only the command.
  std::string PaneScript(const std::string& command) {
    const std::string path = daemon_.dir() + "/pane-" + std::to_string(panes_++) + ".sh";
    std::ofstream(path) << "trap : INT\n"
                        << command << "\necho \"top-exited-$?\"\nexec sleep 600\n";
    return path;
  }

  std::string TopCommand() const {
    return std::string(GMUX_CLI_PATH) + " top --interval 0.3 --socket " + daemon_.socket();
  }

  PrivateDaemon daemon_;
  std::vector<Child> tenants_;
  const bool two_tenants_ = RunningAsRoot();
  int panes_ = 0;
};

TEST_F(GmuxTopTest, OncePrintsDevicesAndTenantsWithWeightsAndShares) {
  StartDaemon(true);
  int code = -1;
  const std::string out = RunGmux(
      -1, {"top", "--once", "--interval", "0.5", "--socket", daemon_.socket()}, &code);
  ASSERT_EQ(code, 0) << out;
  EXPECT_EQ(LineStarting(out, "gmux top: gmuxd at " + daemon_.socket()), 0) << out;
  const int dev = LineStarting(out, "DEV POLICY");
  ASSERT_GE(dev, 0) << out;
  EXPECT_TRUE(Has(Lines(out)[static_cast<size_t>(dev)], "BUSY")) << out;
  EXPECT_EQ(LineStarting(out, "  0 credit"), dev + 1) << out;
  const int header = LineStarting(out, "TENANT");
  ASSERT_GT(header, dev) << out;
  for (const char* col : {"WEIGHT", "W.SHARE", "SHARE", "WINDOW", "QUEUED", "MEM_MiB"}) {
    EXPECT_TRUE(Has(Lines(out)[static_cast<size_t>(header)], col)) << col << "\n" << out;
  }
  const int alpha = LineStarting(out, "alpha ");
  ASSERT_GT(alpha, header) << out;
  EXPECT_TRUE(Has(Lines(out)[static_cast<size_t>(alpha)], " 2.00 ")) << out;
  if (two_tenants_) {
    const int beta = LineStarting(out, "beta ");
    ASSERT_GT(beta, header) << out;
    EXPECT_TRUE(Has(Lines(out)[static_cast<size_t>(beta)], " 3.00 ")) << out;
  }

  const std::string js = RunGmux(-1,
                                 {"top", "--once", "--json", "--sort", "name", "--interval",
                                  "0.5", "--socket", daemon_.socket()},
                                 &code, false);
  ASSERT_EQ(code, 0) << js;
  const json j = json::parse(js, nullptr, false);
  ASSERT_TRUE(j.is_object()) << js;
  EXPECT_GT(j["interval_s"].get<double>(), 0);
  ASSERT_EQ(j["devices"].size(), 1u) << js;
  EXPECT_EQ(j["devices"][0]["policy"], "credit");
  ASSERT_EQ(j["tenants"].size(), two_tenants_ ? 2u : 1u) << js;
  const json& a = j["tenants"][0];
  EXPECT_EQ(a["name"], "alpha");  // sorted by name
  EXPECT_EQ(a["weight"].get<double>(), 2.0);
  EXPECT_GT(a["device_time_s"].get<double>(), 0) << js;
  EXPECT_GE(a["memory_bytes"].get<uint64_t>(), 4096u * sizeof(cl_uint)) << js;
  EXPECT_GE(a["sessions"].get<uint64_t>(), 1u) << js;
  // Shares are parts of one whole; which tenant got how much is the scheduler's business.
  double sum = 0;
  bool any = false;
  for (const auto& t : j["tenants"]) {
    for (const char* k : {"share_now", "share_window"}) {
      if (t[k].is_null()) continue;
      EXPECT_GE(t[k].get<double>(), 0) << js;
      EXPECT_LE(t[k].get<double>(), 1) << js;
    }
    if (t["share_now"].is_number()) {
      sum += t["share_now"].get<double>();
      any = true;
    }
  }
  if (any) {
    EXPECT_NEAR(sum, 1.0, 1e-9) << js;
  }
  // Both busy (they may be idle at the instant of a poll): alpha's weight is 2 of 2 + 3.
  if (two_tenants_ && a["weight_share"].is_number() &&
      j["tenants"][1]["weight_share"].is_number()) {
    EXPECT_NEAR(a["weight_share"].get<double>(), 0.4, 1e-9) << js;
  }
}

TEST_F(GmuxTopTest, LiveViewInTmuxSortsPausesHelpsResizesAndQuitsOnQ) {
  if (!HaveTmux()) GTEST_SKIP() << "tmux is not installed (scripts/install-deps.sh installs it)";
  StartDaemon(true);
  Tmux tmux(daemon_.dir() + "/tmux.sock");
  ASSERT_EQ(tmux.Run("new-session -d -s top -x 160 -y 40 'sh " + PaneScript(TopCommand()) + "'"),
            0);
  std::string s = tmux.WaitFor("top", [](const std::string& x) {
    return LineStarting(x, "alpha ") >= 0 && LineStarting(x, "  0 credit") >= 0 &&
           Has(x, "shares of device time");
  });
  ASSERT_GE(LineStarting(s, "alpha "), 0) << s;
  EXPECT_EQ(LineStarting(s, "gmux top: gmuxd at " + daemon_.socket()), 0) << s;
  EXPECT_GE(LineStarting(s, "DEV POLICY"), 0) << s;
  EXPECT_GE(LineStarting(s, "TENANT"), 0) << s;
  EXPECT_TRUE(Has(s, "sort: share")) << s;
  EXPECT_TRUE(Has(s, "q quit")) << s;

  // s: the next sort column, weight: beta (3) above alpha (2).
  ASSERT_EQ(tmux.Run("send-keys -t top s"), 0);
  s = tmux.WaitFor("top", "sort: weight");
  ASSERT_TRUE(Has(s, "sort: weight")) << s;
  if (two_tenants_) {
    EXPECT_LT(LineStarting(s, "beta "), LineStarting(s, "alpha ")) << s;
  }
  // S twice: back past share to name: alpha above beta.
  ASSERT_EQ(tmux.Run("send-keys -t top S S"), 0);
  s = tmux.WaitFor("top", "sort: name");
  ASSERT_TRUE(Has(s, "sort: name")) << s;
  if (two_tenants_) {
    EXPECT_LT(LineStarting(s, "alpha "), LineStarting(s, "beta ")) << s;
  }

  // p pauses and resumes.
  ASSERT_EQ(tmux.Run("send-keys -t top p"), 0);
  s = tmux.WaitFor("top", "PAUSED");
  EXPECT_TRUE(Has(s, "PAUSED")) << s;
  ASSERT_EQ(tmux.Run("send-keys -t top p"), 0);
  s = tmux.WaitFor("top", [](const std::string& x) {
    return !Has(x, "PAUSED") && Has(x, "shares of device time");
  });
  EXPECT_FALSE(Has(s, "PAUSED")) << s;

  // h shows the help; any key goes back.
  ASSERT_EQ(tmux.Run("send-keys -t top h"), 0);
  s = tmux.WaitFor("top", "gmux top: keys");
  EXPECT_TRUE(Has(s, "gmux top: keys")) << s;
  ASSERT_EQ(tmux.Run("send-keys -t top x"), 0);
  s = tmux.WaitFor("top", [](const std::string& x) {
    return !Has(x, "gmux top: keys") && LineStarting(x, "alpha ") >= 0;
  });
  EXPECT_GE(LineStarting(s, "alpha "), 0) << s;

  // A smaller terminal: the frame is drawn again within it, the keys on its last row.
  ASSERT_EQ(tmux.Run("resize-window -t top -x 90 -y 20"), 0);
  s = tmux.WaitFor("top", [](const std::string& x) {
    const auto lines = Lines(x);
    return lines.size() == 20 && Has(lines.back(), "q quit") && LineStarting(x, "alpha ") >= 0;
  });
  EXPECT_EQ(Lines(s).size(), 20u) << s;
  for (const auto& l : Lines(s)) EXPECT_LE(l.size(), 90u) << l;
  EXPECT_GE(LineStarting(s, "alpha "), 0) << s;

  // q quits: the shell's screen is back (the frame is gone) and shows the exit status.
  ASSERT_EQ(tmux.Run("send-keys -t top q"), 0);
  s = tmux.WaitFor("top", "top-exited-");
  EXPECT_TRUE(Has(s, "top-exited-0")) << s;
  EXPECT_LT(LineStarting(s, "TENANT"), 0) << s;
}

TEST_F(GmuxTopTest, LiveViewRetriesWhileGmuxdIsGoneAndRestoresTheTerminalOnSignals) {
  if (!HaveTmux()) GTEST_SKIP() << "tmux is not installed (scripts/install-deps.sh installs it)";
  StartDaemon(false);
  Tmux tmux(daemon_.dir() + "/tmux.sock");
  const std::string pid_file = daemon_.dir() + "/top.pid";
  const std::string script =
      PaneScript("sh -c 'echo $$ > " + pid_file + "; exec " + TopCommand() + "'");
  ASSERT_EQ(tmux.Run("new-session -d -s term -x 160 -y 40 'sh " + script + "'"), 0);
  std::string s = tmux.WaitFor("term", "(no tenants yet");
  ASSERT_TRUE(Has(s, "(no tenants yet")) << s;
  EXPECT_GE(LineStarting(s, "  0 credit"), 0) << s;
  pid_t pid = 0;
  std::ifstream(pid_file) >> pid;
  ASSERT_GT(pid, 0);

  ASSERT_TRUE(daemon_.Stop(30s)) << daemon_.Log();
  s = tmux.WaitFor("term", "gmuxd not reachable: cannot connect to gmuxd at " + daemon_.socket());
  ASSERT_TRUE(Has(s, "gmuxd not reachable: cannot connect")) << s;
  EXPECT_TRUE(Has(s, "retrying every 0.3 s")) << s;
  EXPECT_FALSE(Has(s, "top-exited")) << s;
  EXPECT_EQ(::kill(pid, 0), 0) << "gmux top exited when gmuxd went away";

  // SIGTERM: the terminal is restored, then the signal ends the process (status 128 + 15).
  ASSERT_EQ(::kill(pid, SIGTERM), 0);
  s = tmux.WaitFor("term", "top-exited-");
  EXPECT_TRUE(Has(s, "top-exited-143")) << s;
  EXPECT_FALSE(Has(s, "gmuxd not reachable")) << s;

  // Ctrl-C in the terminal: the same with SIGINT (128 + 2).
  ASSERT_EQ(tmux.Run("new-session -d -s int -x 100 -y 30 'sh " + PaneScript(TopCommand()) +
                     "'"),
            0);
  s = tmux.WaitFor("int", "gmuxd not reachable");
  ASSERT_TRUE(Has(s, "gmuxd not reachable")) << s;
  ASSERT_EQ(tmux.Run("send-keys -t int C-c"), 0);
  s = tmux.WaitFor("int", "top-exited-");
  EXPECT_TRUE(Has(s, "top-exited-130")) << s;
  EXPECT_FALSE(Has(s, "gmuxd not reachable")) << s;
}

}  // namespace
}  // namespace gmux::testing
