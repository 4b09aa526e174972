// Split execution end to end: a gmuxd started here with `[scheduler] policy = "split"` (a small
// beta, so launches really split) and two TCP tenants with their own tokens. The second tenant is
// a child process (this binary again, running SplitE2eChild.KeepsTheDeviceBusy with its own
// GMUX_TOKEN) that keeps a backlog of its own kernels on the device from before the first
// launch of this process until after its last, so two tenants are active throughout (Kang & Yu
// split only when N >= 2). Through the real ICD loader this process checks that
//   - a plain kernel built from source runs in chunks (its tenant's dispatches exceed its
//     commands in `gmux status --json`) with results identical to PoCL run directly;
//   - the same kernel from clCreateProgramWithBinary runs whole (dispatches == commands);
//   - kernels using the five builtins a split changes run in chunks once their restoring
//     variant is built, with identical results;
//   - every launch is one event whose profiling times are ordered (SUBMIT <= START <= END).
// No assertion depends on wall-clock timing; deadlines only guard against hangs.
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/runtime_env.h"

namespace gmux::testing {
namespace {

using nlohmann::json;

const char* kAppToken = "split-e2e-app-3c1d";
const char* kBusyToken = "split-e2e-busy-9b7e";
const char* kAppTenant = "app";
const char* kBusyTenant = "busy";

// Plain kernels: get_global_id only, so a chunk computes exactly what the whole launch would.
const char* kPlainSource = R"(
__kernel void scramble(__global const uint* in, __global uint* out, uint k) {
  size_t i = get_global_id(0);
  uint x = in[i] ^ ((uint)i * 2654435761u);
  for (int j = 0; j < 4; ++j) x = x * 1664525u + k;
  out[i] = x;
}
__kernel void grid(__global uint* out, uint w) {
  size_t x = get_global_id(0), y = get_global_id(1);
  out[y * w + x] = (uint)(x * 100003u) ^ (uint)(y * 7919u);
}
)";
// Kernels a split would change (split_sched_test shows they compute something else in chunks).
const char* kGroupSource = R"(
__kernel void groups(__global const uint* in, __global uint* out) {
  size_t i = get_global_id(0);
  out[i] = in[i] * 3u + (uint)get_group_id(0);
}
)";
const char* kSizeSource = R"(
__kernel void gsize(__global const uint* in, __global uint* out) {
  size_t i = get_global_id(0);
  out[i] = in[i] + (uint)get_global_size(0) - (uint)i;
}
)";
const char* kNumGroupsSource = R"(
__kernel void ngroups(__global const uint* in, __global uint* out) {
  size_t i = get_global_id(0);
  out[i] = in[i] + (uint)get_num_groups(0) * 7u + (uint)get_group_id(0) * 131u;
}
)";
const char* kOffsetSource = R"(
__kernel void goffset(__global const uint* in, __global uint* out) {
  size_t i = get_global_id(0) - get_global_offset(0);
  out[i] = in[i] ^ (uint)get_global_offset(0) ^ ((uint)get_global_size(0) << 3);
}
)";
// OpenCL C 2.0 and later only (built with -cl-std=CL3.0).
const char* kLinearSource = R"(
__kernel void linear(__global uint* out, uint w) {
  size_t x = get_global_id(0) - get_global_offset(0), y = get_global_id(1) - get_global_offset(1);
  out[y * w + x] = (uint)get_global_linear_id() * 3u + (uint)get_group_id(1);
}
)";
// The busy tenant's kernel.
const char* kBusySource = R"(
__kernel void spin(__global uint* out, uint iters) {
  size_t i = get_global_id(0);
  uint x = (uint)i;
  for (uint j = 0; j < iters; ++j) x = x * 1103515245u + 12345u;
  out[i] = x;
}
)";
constexpr size_t kBusyItems = 1 << 14;
constexpr unsigned kBusyIters = 400;
constexpr int kBusyBacklog = 6;

constexpr size_t kN = 1 << 16;  // work-items of the 1-D launches

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

// Runs `cmd`, returns its stdout (empty on failure).
std::string Capture(const std::string& cmd) {
  std::string out;
  FILE* f = ::popen(cmd.c_str(), "r");
  if (f == nullptr) return out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), f)) > 0) out.append(buf.data(), n);
  ::pclose(f);
  return out;
}

bool CanConnect(const std::string& path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::strncpy(a.sun_path, path.c_str(), sizeof(a.sun_path) - 1);
  bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  ::close(fd);
  return ok;
}

std::vector<cl_uint> Input(size_t n, cl_uint seed) {
  std::vector<cl_uint> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<cl_uint>(i * 40503u + seed) ^ (seed << 7);
  return v;
}

// One launch's description, run the same way on gmux and on PoCL directly.
struct Launch {
  std::string source;  // built from source (or from its binary, see Run)
  std::string kernel;
  cl_uint dim = 1;
  std::array<size_t, 3> global{kN, 1, 1};
  const size_t* local = nullptr;  // nullptr: none given
  const size_t* offset = nullptr; // nullptr: none given
  std::string options;            // build options
  bool with_input = true;
  cl_uint scalar = 0;             // last argument, when the kernel has one
  bool has_scalar = false;
  size_t out_items() const { return global[0] * global[1] * global[2]; }
};

struct Ran {
  std::vector<cl_uint> out;
  cl_event event = nullptr;  // kept by the caller (released by it)
};

// Runs `l` on device `d` with program `p` (already built); the event is returned.
Ran RunOn(const ClDevice& d, cl_program p, const Launch& l) {
  Ran r;
  cl_int err = CL_SUCCESS;
  cl_kernel k = clCreateKernel(p, l.kernel.c_str(), &err);
  EXPECT_EQ(err, CL_SUCCESS) << l.kernel;
  if (k == nullptr) return r;
  std::vector<cl_uint> in = Input(l.out_items(), 17);
  cl_mem din = clCreateBuffer(d.context, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR,
                              in.size() * sizeof(cl_uint), in.data(), &err);
  EXPECT_EQ(err, CL_SUCCESS);
  cl_mem dout = clCreateBuffer(d.context, CL_MEM_READ_WRITE, l.out_items() * sizeof(cl_uint),
                               nullptr, &err);
  EXPECT_EQ(err, CL_SUCCESS);
  cl_uint arg = 0;
  if (l.with_input) {
    EXPECT_EQ(clSetKernelArg(k, arg++, sizeof(cl_mem), &din), CL_SUCCESS);
  }
  EXPECT_EQ(clSetKernelArg(k, arg++, sizeof(cl_mem), &dout), CL_SUCCESS);
  if (l.has_scalar) {
    EXPECT_EQ(clSetKernelArg(k, arg++, sizeof(cl_uint), &l.scalar), CL_SUCCESS);
  }
  EXPECT_EQ(clEnqueueNDRangeKernel(d.queue, k, l.dim, l.offset, l.global.data(), l.local, 0,
                                   nullptr, &r.event),
            CL_SUCCESS)
      << l.kernel;
  r.out.assign(l.out_items(), 0xdeadbeefu);
  EXPECT_EQ(clEnqueueReadBuffer(d.queue, dout, CL_TRUE, 0, r.out.size() * sizeof(cl_uint),
                                r.out.data(), 0, nullptr, nullptr),
            CL_SUCCESS);
  EXPECT_EQ(clFinish(d.queue), CL_SUCCESS);
  clReleaseMemObject(din);
  clReleaseMemObject(dout);
  clReleaseKernel(k);
  return r;
}

// A counter snapshot of one tenant from `gmux status --json`.
struct Counters {
  uint64_t commands = 0, completed = 0, dispatches = 0;
  bool found = false;
};

class SplitE2eTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ASSERT_FALSE(RuntimeEnv::dir.empty());
    dir_ = RuntimeEnv::dir;
    socket_ = dir_ + "/split-gmuxd.sock";
    std::string config = dir_ + "/split-gmuxd.toml";
    std::string port_file = dir_ + "/split-port";
    // inflight 2: the policy, not PoCL's queue, decides the order; beta 8: chunks of a few
    // granules (Eq. (2)), so a 64 Ki-item launch runs in several.
    std::ofstream(config) << "[daemon]\ninflight_per_device = 2\n\n"
                          << "[scheduler]\npolicy = \"split\"\n\n[scheduler.params]\nbeta = 8\n\n"
                          << "[[tenant]]\nname = \"" << kAppTenant << "\"\ntokens = [\""
                          << kAppToken << "\"]\n\n"
                          << "[[tenant]]\nname = \"" << kBusyTenant << "\"\ntokens = [\""
                          << kBusyToken << "\"]\n";
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      std::string log = dir_ + "/split-gmuxd.log";
      FILE* f = std::freopen(log.c_str(), "w", stderr);
      if (f != nullptr) ::dup2(::fileno(stderr), 1);
      ::execl(GMUXD_PATH, GMUXD_PATH, "--config", config.c_str(), "--socket", socket_.c_str(),
              "--listen", "127.0.0.1:0", "--plain-tcp", "--port-file", port_file.c_str(),
              "--exit-after", "120", static_cast<char*>(nullptr));
      ::_exit(127);
    }
    daemon_pid_ = pid;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!CanConnect(socket_) || !std::filesystem::exists(port_file)) {
      int status = 0;
      ASSERT_EQ(::waitpid(pid, &status, WNOHANG), 0)
          << "gmuxd exited during start-up:\n" << Capture("cat " + dir_ + "/split-gmuxd.log");
      ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "gmuxd did not start";
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    int port = 0;
    std::ifstream(port_file) >> port;
    ASSERT_GT(port, 0);
    // Both tenants reach the daemon over TCP, each with its own token (GMUX_SOCKET would win).
    std::string address = "tcp://127.0.0.1:" + std::to_string(port);
    ::unsetenv("GMUX_SOCKET");
    ::setenv("GMUX_ADDRESS", address.c_str(), 1);

    // The busy tenant first, and wait until the daemon counts it active.
    stop_file_ = dir_ + "/split-stop";
    pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      ::setenv("GMUX_TEST_CHILD", "1", 1);
      ::setenv("GMUX_TOKEN", kBusyToken, 1);
      ::setenv("GMUX_E2E_STOP_FILE", stop_file_.c_str(), 1);
      std::string log = dir_ + "/split-child.log";
      FILE* f = std::freopen(log.c_str(), "w", stdout);
      if (f != nullptr) ::dup2(::fileno(stdout), 2);
      ::execl("/proc/self/exe", "split_e2e_test", "--gtest_filter=SplitE2eChild.KeepsTheDeviceBusy",
              static_cast<char*>(nullptr));
      ::_exit(127);
    }
    child_pid_ = child;
    ::setenv("GMUX_TOKEN", kAppToken, 1);
    deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    for (;;) {
      Counters busy = Tenant(kBusyTenant);
      if (busy.found && busy.commands > busy.completed && busy.completed > 0) break;
      int status = 0;
      ASSERT_EQ(::waitpid(child, &status, WNOHANG), 0)
          << "the busy tenant exited early:\n" << Capture("cat " + dir_ + "/split-child.log");
      ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "the busy tenant never got busy";
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  static void TearDownTestSuite() {
    if (child_pid_ > 0) {
      // Ask the busy tenant to stop; it must have stayed busy and exit cleanly.
      std::ofstream(stop_file_) << "stop\n";
      int status = 0;
      bool exited = false;
      for (int i = 0; i < 1500 && !exited; ++i) {
        exited = ::waitpid(child_pid_, &status, WNOHANG) == child_pid_;
        if (!exited) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      if (!exited) {
        ::kill(child_pid_, SIGKILL);
        ::waitpid(child_pid_, &status, 0);
      }
      EXPECT_TRUE(exited && WIFEXITED(status) && WEXITSTATUS(status) == 0)
          << "busy tenant:\n" << Capture("cat " + dir_ + "/split-child.log");
      child_pid_ = -1;
    }
    if (daemon_pid_ > 0) {
      ::kill(daemon_pid_, SIGTERM);
      int status = 0;
      bool exited = false;
      for (int i = 0; i < 500 && !exited; ++i) {
        exited = ::waitpid(daemon_pid_, &status, WNOHANG) == daemon_pid_;
        if (!exited) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      if (!exited) {
        ::kill(daemon_pid_, SIGKILL);
        ::waitpid(daemon_pid_, &status, 0);
      }
      daemon_pid_ = -1;
    }
  }

  void SetUp() override {
    ASSERT_GT(daemon_pid_, 0);
    ASSERT_TRUE(OpenDevice(kGmux, gmux_, CL_QUEUE_PROFILING_ENABLE));
    ASSERT_TRUE(OpenDevice(kNative, native_));
  }

  void TearDown() override {
    for (cl_event e : events_) clReleaseEvent(e);
  }

  static json Status() {
    std::string out =
        Capture(std::string("timeout 20 ") + GMUX_CLI_PATH + " status --json --socket " + socket_);
    json j = json::parse(out, nullptr, false);
    return j.is_discarded() ? json{} : j;
  }

  static Counters Tenant(const std::string& name) {
    Counters c;
    json j = Status();
    if (!j.contains("tenants")) return c;
    for (const auto& t : j["tenants"]) {
      if (t.value("name", std::string()) == name) {
        c.commands = t.value("commands", uint64_t{0});
        c.completed = t.value("completed_commands", uint64_t{0});
        c.dispatches = t.value("dispatches", uint64_t{0});
        c.found = true;
      }
    }
    return c;
  }

  // The busy tenant still has work queued or in flight.
  static void ExpectBusyActive() {
    Counters busy = Tenant(kBusyTenant);
    ASSERT_TRUE(busy.found);
    EXPECT_GT(busy.commands, busy.completed) << "the busy tenant went idle";
  }

  cl_program Build(const ClDevice& d, const std::string& src, const std::string& options = "") {
    std::string log;
    cl_program p = BuildProgram(d, src, &log, options.c_str());
    EXPECT_NE(p, nullptr) << log;
    return p;
  }

  // Runs `l` on PoCL directly from source and expects the gmux run `g` to have computed the
  // same, with a well-formed event (kept until the end of the test).
  void CompareWithNative(const Ran& g, const Launch& l) {
    cl_program np = Build(native_, l.source, l.options);
    if (np == nullptr) return;
    Ran n = RunOn(native_, np, l);
    clReleaseProgram(np);
    if (n.event != nullptr) clReleaseEvent(n.event);
    EXPECT_EQ(g.out.size(), n.out.size());
    size_t diffs = 0, first = 0;
    for (size_t i = 0; i < g.out.size() && i < n.out.size(); ++i) {
      if (g.out[i] != n.out[i] && diffs++ == 0) first = i;
    }
    EXPECT_EQ(diffs, 0u) << l.kernel << ": first difference at " << first << ": gmux "
                         << g.out[first] << ", PoCL " << n.out[first];
    EXPECT_NE(g.event, nullptr);
    if (g.event != nullptr) {
      ExpectProfilingOrdered(g.event, l.kernel);
      events_.push_back(g.event);
    }
  }

  // (d) One event per launch, complete, with QUEUED <= SUBMIT <= START <= END.
  static void ExpectProfilingOrdered(cl_event e, const std::string& what) {
    cl_int st = CL_QUEUED;
    ASSERT_EQ(clGetEventInfo(e, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof(st), &st, nullptr),
              CL_SUCCESS);
    EXPECT_EQ(st, CL_COMPLETE) << what;
    cl_command_type type = 0;
    ASSERT_EQ(clGetEventInfo(e, CL_EVENT_COMMAND_TYPE, sizeof(type), &type, nullptr), CL_SUCCESS);
    EXPECT_EQ(type, static_cast<cl_command_type>(CL_COMMAND_NDRANGE_KERNEL)) << what;
    cl_ulong queued = 0, submit = 0, start = 0, end = 0;
    ASSERT_EQ(clGetEventProfilingInfo(e, CL_PROFILING_COMMAND_QUEUED, 8, &queued, nullptr),
              CL_SUCCESS);
    ASSERT_EQ(clGetEventProfilingInfo(e, CL_PROFILING_COMMAND_SUBMIT, 8, &submit, nullptr),
              CL_SUCCESS);
    ASSERT_EQ(clGetEventProfilingInfo(e, CL_PROFILING_COMMAND_START, 8, &start, nullptr),
              CL_SUCCESS);
    ASSERT_EQ(clGetEventProfilingInfo(e, CL_PROFILING_COMMAND_END, 8, &end, nullptr), CL_SUCCESS);
    EXPECT_GT(start, 0u) << what;
    EXPECT_LE(queued, submit) << what;
    EXPECT_LE(submit, start) << what;
    EXPECT_LE(start, end) << what;
  }

  // The app tenant's commands and dispatches during one launch through gmux.
  struct Delta {
    std::string kernel;
    uint64_t commands = 0, dispatches = 0;
  };

  // Runs every launch through gmux (program from `make_program`) and natively, comparing
  // results and events; returns the app tenant's counter deltas of each gmux run (the launch and
  // its blocking read).
  template <typename MakeProgram>
  std::vector<Delta> RunAndCount(const std::vector<Launch>& launches, MakeProgram make_program) {
    std::vector<Delta> out;
    for (const Launch& l : launches) {
      cl_program p = make_program(l);
      if (p == nullptr) return out;
      Counters before = Tenant(kAppTenant);
      Ran g = RunOn(gmux_, p, l);
      Counters after = Tenant(kAppTenant);
      clReleaseProgram(p);
      EXPECT_TRUE(before.found && after.found);
      // Everything this tenant enqueued has finished (blocking read, clFinish).
      EXPECT_EQ(after.commands, after.completed);
      Counters busy = Tenant(kBusyTenant);
      Delta d{l.kernel, after.commands - before.commands, after.dispatches - before.dispatches};
      std::printf("%s: app tenant %llu commands, %llu dispatches; busy tenant %llu commands, "
                  "%llu completed, %llu dispatches so far\n",
                  l.kernel.c_str(), static_cast<unsigned long long>(d.commands),
                  static_cast<unsigned long long>(d.dispatches),
                  static_cast<unsigned long long>(busy.commands),
                  static_cast<unsigned long long>(busy.completed),
                  static_cast<unsigned long long>(busy.dispatches));
      out.push_back(d);
      CompareWithNative(g, l);
    }
    return out;
  }

  static inline std::string dir_, socket_, stop_file_;
  static inline pid_t daemon_pid_ = -1, child_pid_ = -1;
  ClDevice gmux_, native_;
  std::vector<cl_event> events_;
};

std::vector<Launch> PlainLaunches() {
  static const size_t kLocal64[3] = {64, 1, 1};
  std::vector<Launch> out;
  for (cl_uint k : {3u, 11u}) {
    Launch l;
    l.source = kPlainSource;
    l.kernel = "scramble";
    l.scalar = k;
    l.has_scalar = true;
    if (k == 11u) l.local = kLocal64;  // the app's local size, and one gmux chooses
    out.push_back(l);
  }
  Launch g;  // 2-D: chunks of whole rows
  g.source = kPlainSource;
  g.kernel = "grid";
  g.dim = 2;
  g.global = {128, 512, 1};
  g.with_input = false;
  g.scalar = 128;
  g.has_scalar = true;
  out.push_back(g);
  return out;
}

// (a) A plain kernel built from source is split and computes what PoCL computes.
TEST_F(SplitE2eTest, PlainKernelFromSourceIsSplitWithIdenticalResults) {
  ExpectBusyActive();
  auto deltas = RunAndCount(PlainLaunches(), [this](const Launch& l) {
    return Build(gmux_, l.source);
  });
  ASSERT_EQ(deltas.size(), PlainLaunches().size());
  for (const Delta& d : deltas) {
    // The launch and its read are two commands; the launch's chunks are dispatches.
    EXPECT_EQ(d.commands, 2u) << d.kernel;
    EXPECT_GT(d.dispatches, d.commands) << d.kernel << " did not run in chunks";
  }
  ExpectBusyActive();
}

// (b) The same kernel from a binary (obtained from PoCL through gmux) runs whole.
TEST_F(SplitE2eTest, KernelFromBinaryIsNotSplitWithIdenticalResults) {
  ExpectBusyActive();
  cl_program from_source = Build(gmux_, kPlainSource);
  ASSERT_NE(from_source, nullptr);
  size_t size = 0;
  ASSERT_EQ(clGetProgramInfo(from_source, CL_PROGRAM_BINARY_SIZES, sizeof(size), &size, nullptr),
            CL_SUCCESS);
  ASSERT_GT(size, 0u);
  std::vector<unsigned char> binary(size);
  unsigned char* ptr = binary.data();
  ASSERT_EQ(clGetProgramInfo(from_source, CL_PROGRAM_BINARIES, sizeof(ptr), &ptr, nullptr),
            CL_SUCCESS);
  clReleaseProgram(from_source);
  auto from_binary = [&](const Launch&) -> cl_program {
    const unsigned char* cptr = binary.data();
    cl_int status = CL_SUCCESS, err = CL_SUCCESS;
    cl_program p = clCreateProgramWithBinary(gmux_.context, 1, &gmux_.device, &size, &cptr,
                                             &status, &err);
    EXPECT_EQ(err, CL_SUCCESS);
    EXPECT_EQ(status, CL_SUCCESS);
    if (p == nullptr) return nullptr;
    EXPECT_EQ(clBuildProgram(p, 1, &gmux_.device, "", nullptr, nullptr), CL_SUCCESS)
        << BuildLog(p, gmux_.device);
    return p;
  };
  auto deltas = RunAndCount(PlainLaunches(), from_binary);
  ASSERT_EQ(deltas.size(), PlainLaunches().size());
  for (const Delta& d : deltas) {
    EXPECT_EQ(d.commands, 2u) << d.kernel;
    EXPECT_EQ(d.dispatches, d.commands) << d.kernel << " from a binary ran in chunks";
  }
  ExpectBusyActive();
}

// (c) Kernels that use get_group_id, get_num_groups, get_global_size, get_global_offset or
// get_global_linear_id run whole at first; once their program's restoring variant for the
// launch's shape is built (in the background, restore.h), launches of that shape run in chunks,
// and every run computes what PoCL computes directly.
TEST_F(SplitE2eTest, KernelsUsingTheFiveBuiltinsSplitOnceRestoredWithIdenticalResults) {
  ExpectBusyActive();
  static const size_t kLocal64[3] = {64, 1, 1};
  static const size_t kOffset[3] = {1000, 0, 0};
  static const size_t kOffset2[3] = {3, 5, 0};
  static const size_t kLocal2[3] = {16, 4, 1};
  std::vector<Launch> launches;
  Launch g;
  g.source = kGroupSource;
  g.kernel = "groups";
  g.local = kLocal64;
  launches.push_back(g);
  Launch n;
  n.source = kNumGroupsSource;
  n.kernel = "ngroups";
  n.local = kLocal64;
  launches.push_back(n);
  Launch s;  // no local size: it uses no group ids, so gmux may choose one
  s.source = kSizeSource;
  s.kernel = "gsize";
  launches.push_back(s);
  Launch o;
  o.source = kOffsetSource;
  o.kernel = "goffset";
  o.offset = kOffset;
  launches.push_back(o);
  Launch l;  // 2-D with offsets: chunks of whole rows
  l.source = kLinearSource;
  l.kernel = "linear";
  l.dim = 2;
  l.global = {128, 512, 1};
  l.offset = kOffset2;
  l.local = kLocal2;
  l.options = "-cl-std=CL3.0";
  l.with_input = false;
  l.scalar = 128;
  l.has_scalar = true;
  launches.push_back(l);
  for (const Launch& launch : launches) {
    cl_program p = Build(gmux_, launch.source, launch.options);
    ASSERT_NE(p, nullptr) << launch.kernel;
    bool split = false;
    int runs = 0;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!split && std::chrono::steady_clock::now() < deadline) {
      Counters before = Tenant(kAppTenant);
      Ran r = RunOn(gmux_, p, launch);
      Counters after = Tenant(kAppTenant);
      ++runs;
      EXPECT_EQ(after.commands - before.commands, 2u) << launch.kernel;
      split = after.dispatches - before.dispatches > after.commands - before.commands;
      CompareWithNative(r, launch);
      if (HasFailure()) break;
      if (!split) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    clReleaseProgram(p);
    std::printf("%s: split after %d runs\n", launch.kernel.c_str(), runs);
    EXPECT_TRUE(split) << launch.kernel << " never ran in chunks (" << runs << " runs)";
    ExpectBusyActive();
  }
}

// (c') A kernel that uses group ids, launched without a local size, always runs whole: the
// work-groups the backend would choose are not known, so a restored run could differ.
TEST_F(SplitE2eTest, GroupIdKernelWithoutLocalSizeRunsWhole) {
  ExpectBusyActive();
  Launch g;
  g.source = kGroupSource;
  g.kernel = "groups";
  cl_program p = Build(gmux_, g.source);
  ASSERT_NE(p, nullptr);
  for (int i = 0; i < 5; ++i) {
    Counters before = Tenant(kAppTenant);
    Ran r = RunOn(gmux_, p, g);
    Counters after = Tenant(kAppTenant);
    EXPECT_EQ(after.dispatches - before.dispatches, after.commands - before.commands)
        << "run " << i << " ran in chunks";
    CompareWithNative(r, g);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  clReleaseProgram(p);
}

// (d) is checked on every gmux launch above (CompareWithNative); here also for back-to-back split launches
// whose events are only read after all of them completed.
TEST_F(SplitE2eTest, EverySplitLaunchIsOneEventWithOrderedProfiling) {
  ExpectBusyActive();
  cl_program p = Build(gmux_, kPlainSource);
  ASSERT_NE(p, nullptr);
  cl_int err = CL_SUCCESS;
  cl_kernel k = clCreateKernel(p, "scramble", &err);
  ASSERT_EQ(err, CL_SUCCESS);
  std::vector<cl_uint> in = Input(kN, 5);
  cl_mem din = clCreateBuffer(gmux_.context, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR,
                              kN * sizeof(cl_uint), in.data(), &err);
  cl_mem dout = clCreateBuffer(gmux_.context, CL_MEM_READ_WRITE, kN * sizeof(cl_uint), nullptr, &err);
  Counters before = Tenant(kAppTenant);
  const int launches = 4;
  for (int i = 0; i < launches; ++i) {
    cl_uint kk = static_cast<cl_uint>(i);
    ASSERT_EQ(clSetKernelArg(k, 0, sizeof(cl_mem), &din), CL_SUCCESS);
    ASSERT_EQ(clSetKernelArg(k, 1, sizeof(cl_mem), &dout), CL_SUCCESS);
    ASSERT_EQ(clSetKernelArg(k, 2, sizeof(cl_uint), &kk), CL_SUCCESS);
    size_t gs = kN;
    cl_event e = nullptr;
    ASSERT_EQ(clEnqueueNDRangeKernel(gmux_.queue, k, 1, nullptr, &gs, nullptr, 0, nullptr, &e),
              CL_SUCCESS);
    events_.push_back(e);
  }
  ASSERT_EQ(clFinish(gmux_.queue), CL_SUCCESS);
  Counters after = Tenant(kAppTenant);
  EXPECT_EQ(after.commands - before.commands, static_cast<uint64_t>(launches));
  EXPECT_GT(after.dispatches - before.dispatches, static_cast<uint64_t>(launches));
  ASSERT_EQ(events_.size(), static_cast<size_t>(launches));
  cl_ulong prev_end = 0;
  for (cl_event e : events_) {
    ExpectProfilingOrdered(e, "scramble");
    // In-order queue: a launch starts after the previous one ended.
    cl_ulong start = 0, end = 0;
    clGetEventProfilingInfo(e, CL_PROFILING_COMMAND_START, 8, &start, nullptr);
    clGetEventProfilingInfo(e, CL_PROFILING_COMMAND_END, 8, &end, nullptr);
    EXPECT_LE(prev_end, start);
    prev_end = end;
  }
  clReleaseMemObject(din);
  clReleaseMemObject(dout);
  clReleaseKernel(k);
  clReleaseProgram(p);
  ExpectBusyActive();
}

// The busy tenant, run only as the child of SplitE2eTest: keeps kBusyBacklog launches queued
// until the stop file appears (or 90 s pass), then checks its own last result.
TEST(SplitE2eChild, KeepsTheDeviceBusy) {
  if (Env("GMUX_TEST_CHILD").empty()) GTEST_SKIP() << "run by SplitE2eTest as the second tenant";
  const std::string stop = Env("GMUX_E2E_STOP_FILE");
  ASSERT_FALSE(stop.empty());
  ClDevice d;
  ASSERT_TRUE(OpenDevice(kGmux, d));
  std::string log;
  cl_program p = BuildProgram(d, kBusySource, &log);
  ASSERT_NE(p, nullptr) << log;
  cl_int err = CL_SUCCESS;
  cl_kernel k = clCreateKernel(p, "spin", &err);
  ASSERT_EQ(err, CL_SUCCESS);
  cl_mem out = clCreateBuffer(d.context, CL_MEM_READ_WRITE, kBusyItems * sizeof(cl_uint), nullptr,
                              &err);
  ASSERT_EQ(err, CL_SUCCESS);
  cl_uint iters = kBusyIters;
  ASSERT_EQ(clSetKernelArg(k, 0, sizeof(cl_mem), &out), CL_SUCCESS);
  ASSERT_EQ(clSetKernelArg(k, 1, sizeof(cl_uint), &iters), CL_SUCCESS);
  std::vector<cl_event> backlog;
  auto enqueue = [&] {
    size_t gs = kBusyItems;
    cl_event e = nullptr;
    ASSERT_EQ(clEnqueueNDRangeKernel(d.queue, k, 1, nullptr, &gs, nullptr, 0, nullptr, &e),
              CL_SUCCESS);
    ASSERT_EQ(clFlush(d.queue), CL_SUCCESS);
    backlog.push_back(e);
  };
  for (int i = 0; i < kBusyBacklog; ++i) enqueue();
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(90);
  while (!std::filesystem::exists(stop) && std::chrono::steady_clock::now() < deadline) {
    // Top up before waiting, so the backlog never drains while the oldest completes.
    enqueue();
    ASSERT_EQ(clWaitForEvents(1, &backlog.front()), CL_SUCCESS);
    clReleaseEvent(backlog.front());
    backlog.erase(backlog.begin());
  }
  ASSERT_EQ(clFinish(d.queue), CL_SUCCESS);
  for (cl_event e : backlog) clReleaseEvent(e);
  std::vector<cl_uint> got(kBusyItems);
  ASSERT_EQ(clEnqueueReadBuffer(d.queue, out, CL_TRUE, 0, got.size() * sizeof(cl_uint), got.data(),
                                0, nullptr, nullptr),
            CL_SUCCESS);
  for (size_t i = 0; i < kBusyItems; i += 97) {
    cl_uint x = static_cast<cl_uint>(i);
    for (cl_uint j = 0; j < kBusyIters; ++j) x = x * 1103515245u + 12345u;
    ASSERT_EQ(got[i], x) << i;
  }
  clReleaseMemObject(out);
  clReleaseKernel(k);
  clReleaseProgram(p);
}

}  // namespace
}  // namespace gmux::testing
