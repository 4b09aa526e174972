// Test harness for isolation_test: a private gmuxd per test, hostile and well-behaved tenants as
// forked processes (each under a uid of its own when the test runs as root), raw protocol
// connections, and process-tree measurements from /proc.
//
// Nothing here touches OpenCL in the test process itself: every OpenCL call happens in a forked
// child, so a child never inherits a half-initialised loader, ICD connection or backend threads.
#pragma once

#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "proto/frame.h"

namespace gmux::testing::iso {

using namespace std::chrono_literals;

// Tenants are numbered per test; tenant N runs as uid kTenantUidBase + N when the test runs as
// root, else as the test's own uid (so every tenant is then the same tenant).
inline constexpr uid_t kTenantUidBase = 62000;
bool RunningAsRoot();
uid_t TenantUid(int tenant);
// The daemon's default tenant name for a local uid without a [[tenant]] table.
std::string UidTenantName(int tenant);

// A gmuxd of the test's own, in a fresh temp dir (mode 0755, so tenants under other uids reach
// its socket and the vendor dir) holding s.sock, g.toml, gmuxd.log and vendors/gmux.icd.
class PrivateDaemon {
 public:
  PrivateDaemon() = default;
  PrivateDaemon(const PrivateDaemon&) = delete;
  PrivateDaemon& operator=(const PrivateDaemon&) = delete;
  // Kills the daemon and every process under it if still running; removes the temp dir.
  ~PrivateDaemon();

  // Writes `config_toml` to g.toml and starts gmuxd --socket --config --exit-after 300 (and
  // --listen 127.0.0.1:0 --port-file when `tcp`); returns once the socket (and port) answer.
  // Fails the current test (fatally) when gmuxd exits or does not start within 30 s.
  void Start(const std::string& config_toml, bool tcp = false);

  bool started() const { return pid_ > 0; }
  // True while gmuxd has not exited (waitpid WNOHANG).
  bool Alive();
  // SIGTERM; true when gmuxd exited within `within` (false also when it had died before).
  bool Stop(std::chrono::milliseconds within = 5s);
  // The daemon's stderr so far.
  std::string Log() const;

  pid_t pid() const { return pid_; }
  const std::string& dir() const { return dir_; }
  const std::string& socket() const { return socket_; }
  std::string vendors() const { return dir_ + "/vendors"; }
  int tcp_port() const { return tcp_port_; }
  // SIGKILL to gmuxd and its workers (a crash, as far as they can tell).
  void KillTree();

 private:
  std::string dir_, socket_;
  pid_t pid_ = -1;
  bool exited_ = false;
  int tcp_port_ = 0;
};

// How a child process ended.
struct Outcome {
  enum class Kind { kExited, kSignaled, kTimedOut, kNotStarted };
  Kind kind = Kind::kNotStarted;
  int code = -1;    // exit code when kExited
  int signal = 0;   // the signal when kSignaled (SIGALRM: its own time limit ran out)
  bool ok() const { return kind == Kind::kExited && code == 0; }
  std::string Describe() const;
};

// The child's end of its channel to the test: values up, a "go" down.
class Channel {
 public:
  Channel(int up, int down) : up_(up), down_(down) {}
  void Send(int64_t value);
  // Blocks until the test calls Child::Go(); false when the test went away.
  bool WaitGo();

 private:
  int up_, down_;
};

struct ChildOptions {
  int tenant = 0;       // uid TenantUid(tenant)
  int limit_s = 60;     // alarm(): the child dies of SIGALRM after this
  // Extra environment (e.g. GMUX_SHM=0).
  std::vector<std::pair<std::string, std::string>> env;
};

// A forked child running `body` as its tenant, with the gmux ICD as its only OpenCL platform
// (OCL_ICD_VENDORS = the daemon's vendor dir) pointed at the daemon's socket. Its exit code is
// body's return value. Destroying a Child kills it (SIGKILL) and reaps it.
class Child {
 public:
  Child() = default;
  Child(Child&& other) noexcept;
  Child& operator=(Child&& other) noexcept;
  ~Child();

  static Child Spawn(const PrivateDaemon& daemon, const ChildOptions& options,
                     std::function<int(Channel&)> body);

  // The next value the child sent, or nullopt when it sent none within `timeout` (or died).
  std::optional<int64_t> Receive(std::chrono::milliseconds timeout);
  // Lets the child's WaitGo() return.
  void Go();
  // Waits for the child to exit; after `timeout` it is killed and reported as kTimedOut.
  Outcome Wait(std::chrono::milliseconds timeout);
  // SIGKILL and reap (no-op when already reaped).
  void Kill();
  void Signal(int sig);
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  int up_ = -1, down_ = -1;  // the test's ends
};

// Child-side: blocks until killed.
[[noreturn]] void LingerUntilKilled();

// ---- OpenCL helpers for child bodies (never call them in the test process) ----

struct GmuxDevice {
  cl_platform_id platform = nullptr;
  cl_device_id device = nullptr;
  cl_context context = nullptr;
  cl_command_queue queue = nullptr;
  ~GmuxDevice();
};
// Opens device `index` of the "gmux" platform (a context and a queue on it); false when there
// is none or a step failed, with clCreateContext's error in `create_err` when given.
bool OpenGmux(GmuxDevice& out, cl_uint index = 0, cl_int* create_err = nullptr);
// Builds `source`; nullptr on failure, with the build log in `log` and the error in `err`.
cl_program Build(const GmuxDevice& d, const std::string& source, std::string* log = nullptr,
                 cl_int* err = nullptr);

// The isolation clients' common start: opens the gmux device, builds `source` and makes kernel
// `name` whose argument 0 is a new buffer of `bytes` (copied from `init` when it is not null).
// 0, or the clients' exit codes for a failed start: 50 no device, 51 the build failed, 52 the
// kernel, the buffer or the argument failed.
int KernelOnBuffer(GmuxDevice& d, const std::string& source, const char* name, size_t bytes,
                   const void* init, cl_kernel* kernel, cl_mem* buffer);

// A well-behaved tenant: `launches` rounds of one small launch and clFinish, then the buffer is
// read back and checked. 0 when every result was right; otherwise 10 + the step that failed.
int GoodTenant(int launches);

// A file's whole contents (empty when it cannot be read).
std::string ReadFile(const std::string& path);

// ---- raw protocol ----

// A connected socket to the daemon (blocking unless `nonblocking`); -1 on failure.
int ConnectUnix(const std::string& path, bool nonblocking = false);
int ConnectTcp(int port, bool nonblocking = false);

// One protocol connection written by hand (frames from the proto library).
class RawConn {
 public:
  explicit RawConn(int fd) : fd_(fd) {}
  ~RawConn();
  RawConn(const RawConn&) = delete;
  RawConn& operator=(const RawConn&) = delete;
  int fd() const { return fd_; }

  // hello{version 1} with seq 1; OK when the daemon answered CL_SUCCESS.
  Status Hello(const std::string& token = "");
  // Sends `request` with a fresh seq (and `pass_fd` as SCM_RIGHTS), then reads replies until the
  // one with that seq; its status. Unasked error reports (seq 0) on the way are remembered.
  Result<int32_t> Call(capnp::MallocMessageBuilder& request, int pass_fd = -1);
  // Sends `request` with seq 0 (no answer).
  Status Post(capnp::MallocMessageBuilder& request, int pass_fd = -1);
  int32_t async_error() const { return async_error_; }

 private:
  int fd_;
  uint64_t next_seq_ = 2;
  int32_t async_error_ = 0;
};

// ---- /proc ----

// `root` and every process below it.
std::vector<pid_t> ProcessTree(pid_t root);
// VmRSS in KiB (0 when unknown).
long RssKiB(pid_t pid);
// Sum of VmRSS over ProcessTree(root).
long TreeRssKiB(pid_t root);
// The real uid of a process (-1 when unknown).
long ProcessUid(pid_t pid);
// CPU seconds (user + system) per wall second spent by the process tree of `root` over
// `window`, counting only processes present at both ends plus those that appeared.
double TreeCpuLoad(pid_t root, std::chrono::milliseconds window);
// Processes under `root` (not root itself) whose real uid is in `uids`.
std::vector<pid_t> DescendantsOwnedBy(pid_t root, const std::set<uid_t>& uids);

// `gmux status --json --socket S` run as TenantUid(tenant) (as the test's own uid when
// tenant < 0); stdout, empty on failure. Bounded to 20 s.
std::string StatusJson(const PrivateDaemon& daemon, int tenant);
// `gmux status` as `tenant` (-1: as this process), as JSON or as its table.
std::string StatusOutput(const PrivateDaemon& daemon, int tenant, bool json);
// `gmux ARGS...` run as TenantUid(tenant) (as this process when tenant < 0): its stdout and
// stderr together (stdout only without `with_stderr`), and its exit code (-1 when it did not
// exit normally). Bounded to 20 s.
std::string RunGmux(int tenant, const std::vector<std::string>& args, int* exit_code = nullptr,
                    bool with_stderr = true);

}  // namespace gmux::testing::iso
