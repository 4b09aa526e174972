// runtime_bench: gmux's remoting overheads against native PoCL, measured in the same run.
//
// Starts its own gmuxd on a socket in a temp dir, points the ICD loader at the gmux ICD and the
// backend's ICD, and runs each workload on both platforms:
//   1. blocking tiny kernel launch + clFinish (median latency), beside one Unix-socket round
//      trip measured on this machine (a 64-byte ping-pong between two threads);
//   2. pipelined tiny launches with no wait between them (launches/s);
//   3. 256 MiB host->device and device->host transfers (GB/s, best of 3);
//   4. 512x512 matrix multiply end to end: upload, kernel, download (median of 5);
//   5. the memory of an idle connected session: gmuxd's resident growth, and its worker
//      process's proportional set size (PSS: shared library pages split among their users);
//   6. connect to first kernel result: a fresh process that opens the platform, builds (from the
//      compiler cache, warmed first), launches one kernel and reads its result (median of 5);
//   7. what a worker's death costs another session: this process's tiny-launch rate while other
//      processes one after another run a kernel that crashes their worker, against its rate
//      while the same processes run a harmless kernel (ratio 1.0 = nothing).
// Prints a table (and JSON with --json). Usage: runtime_bench [--quick] [--json]
// (`runtime_bench --child first|crash|churn PLATFORM` is the fresh process of 6 and 7.)
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

bool quick = false;

struct Dev {
  cl_platform_id platform = nullptr;
  cl_device_id device = nullptr;
  cl_context ctx = nullptr;
  cl_command_queue q = nullptr;
  cl_program prog = nullptr;
};

const char* kSource = R"(
__kernel void tiny(__global int* a) { if (get_global_id(0) == 0) a[0] += 1; }
__kernel void wild(__global int* a) { *(volatile __global int*)0x10 = 1; a[0] = 2; }
__kernel void matmul(__global const float* A, __global const float* B, __global float* C, int n) {
  int row = get_global_id(1), col = get_global_id(0);
  float acc = 0.0f;
  for (int k = 0; k < n; ++k) acc += A[row * n + k] * B[k * n + col];
  C[row * n + col] = acc;
})";

bool Open(const char* name, Dev& d) {
  cl_uint n = 0;
  clGetPlatformIDs(0, nullptr, &n);
  std::vector<cl_platform_id> ps(n);
  clGetPlatformIDs(n, ps.data(), nullptr);
  for (auto p : ps) {
    char buf[256] = {};
    clGetPlatformInfo(p, CL_PLATFORM_NAME, sizeof(buf), buf, nullptr);
    if (std::string(buf).find(name) != std::string::npos) d.platform = p;
  }
  if (d.platform == nullptr) return false;
  if (clGetDeviceIDs(d.platform, CL_DEVICE_TYPE_ALL, 1, &d.device, nullptr) != CL_SUCCESS) return false;
  cl_int err;
  d.ctx = clCreateContext(nullptr, 1, &d.device, nullptr, nullptr, &err);
  d.q = clCreateCommandQueue(d.ctx, d.device, 0, &err);
  d.prog = clCreateProgramWithSource(d.ctx, 1, &kSource, nullptr, &err);
  return clBuildProgram(d.prog, 1, &d.device, "", nullptr, nullptr) == CL_SUCCESS;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double TinyLatencyUs(Dev& d) {
  cl_int err;
  cl_mem m = clCreateBuffer(d.ctx, CL_MEM_READ_WRITE, 64, nullptr, &err);
  cl_kernel k = clCreateKernel(d.prog, "tiny", &err);
  clSetKernelArg(k, 0, sizeof(cl_mem), &m);
  size_t g = 1;
  std::vector<double> t;
  int iters = quick ? 200 : 2000;
  for (int i = 0; i < iters; ++i) {
    auto s = Clock::now();
    clEnqueueNDRangeKernel(d.q, k, 1, nullptr, &g, nullptr, 0, nullptr, nullptr);
    clFinish(d.q);
    t.push_back(Seconds(Clock::now() - s) * 1e6);
  }
  clReleaseKernel(k);
  clReleaseMemObject(m);
  return Median(t);
}

double PipelinedRate(Dev& d) {
  cl_int err;
  cl_mem m = clCreateBuffer(d.ctx, CL_MEM_READ_WRITE, 64, nullptr, &err);
  cl_kernel k = clCreateKernel(d.prog, "tiny", &err);
  clSetKernelArg(k, 0, sizeof(cl_mem), &m);
  size_t g = 1;
  int n = quick ? 2000 : 20000;
  clFinish(d.q);
  auto s = Clock::now();
  for (int i = 0; i < n; ++i) clEnqueueNDRangeKernel(d.q, k, 1, nullptr, &g, nullptr, 0, nullptr, nullptr);
  clFinish(d.q);
  double rate = n / Seconds(Clock::now() - s);
  clReleaseKernel(k);
  clReleaseMemObject(m);
  return rate;
}

void TransferGBps(Dev& d, double& h2d, double& d2h) {
  size_t bytes = (quick ? 64u : 256u) << 20;
  cl_int err;
  cl_mem m = clCreateBuffer(d.ctx, CL_MEM_READ_WRITE, bytes, nullptr, &err);
  std::vector<char> host(bytes, 1);
  h2d = d2h = 0;
  for (int r = 0; r < 3; ++r) {
    auto s = Clock::now();
    clEnqueueWriteBuffer(d.q, m, CL_TRUE, 0, bytes, host.data(), 0, nullptr, nullptr);
    clFinish(d.q);
    h2d = std::max(h2d, bytes / Seconds(Clock::now() - s) / 1e9);
    s = Clock::now();
    clEnqueueReadBuffer(d.q, m, CL_TRUE, 0, bytes, host.data(), 0, nullptr, nullptr);
    d2h = std::max(d2h, bytes / Seconds(Clock::now() - s) / 1e9);
  }
  clReleaseMemObject(m);
}

double MatmulMs(Dev& d) {
  const int n = 512;
  std::vector<float> a(n * n, 1.5f), b(n * n, 0.5f), c(n * n);
  cl_int err;
  cl_kernel k = clCreateKernel(d.prog, "matmul", &err);
  std::vector<double> t;
  for (int r = 0; r < (quick ? 2 : 5); ++r) {
    auto s = Clock::now();
    cl_mem A = clCreateBuffer(d.ctx, CL_MEM_READ_ONLY, a.size() * 4, nullptr, &err);
    cl_mem B = clCreateBuffer(d.ctx, CL_MEM_READ_ONLY, b.size() * 4, nullptr, &err);
    cl_mem C = clCreateBuffer(d.ctx, CL_MEM_WRITE_ONLY, c.size() * 4, nullptr, &err);
    clEnqueueWriteBuffer(d.q, A, CL_FALSE, 0, a.size() * 4, a.data(), 0, nullptr, nullptr);
    clEnqueueWriteBuffer(d.q, B, CL_FALSE, 0, b.size() * 4, b.data(), 0, nullptr, nullptr);
    clSetKernelArg(k, 0, sizeof(cl_mem), &A);
    clSetKernelArg(k, 1, sizeof(cl_mem), &B);
    clSetKernelArg(k, 2, sizeof(cl_mem), &C);
    clSetKernelArg(k, 3, sizeof(int), &n);
    size_t gs[2] = {n, n}, ls[2] = {16, 16};
    clEnqueueNDRangeKernel(d.q, k, 2, nullptr, gs, ls, 0, nullptr, nullptr);
    clEnqueueReadBuffer(d.q, C, CL_TRUE, 0, c.size() * 4, c.data(), 0, nullptr, nullptr);
    t.push_back(Seconds(Clock::now() - s) * 1e3);
    clReleaseMemObject(A);
    clReleaseMemObject(B);
    clReleaseMemObject(C);
  }
  clReleaseKernel(k);
  if (c[0] != 1.5f * 0.5f * n) std::fprintf(stderr, "matmul: wrong result %f\n", c[0]);
  return Median(t);
}

double SocketRoundTripUs() {
  int sv[2];
  ::socketpair(AF_UNIX, SOCK_STREAM, 0, sv);
  int iters = quick ? 2000 : 20000;
  std::thread echo([&] {
    char b[64];
    for (int i = 0; i < iters; ++i) {
      if (::read(sv[1], b, sizeof(b)) <= 0) return;
      (void)!::write(sv[1], b, sizeof(b));
    }
  });
  char b[64] = {};
  std::vector<double> t;
  for (int i = 0; i < iters; ++i) {
    auto s = Clock::now();
    (void)!::write(sv[0], b, sizeof(b));
    size_t got = 0;
    while (got < sizeof(b)) got += static_cast<size_t>(::read(sv[0], b + got, sizeof(b) - got));
    t.push_back(Seconds(Clock::now() - s) * 1e6);
  }
  echo.join();
  ::close(sv[0]);
  ::close(sv[1]);
  return Median(t);
}

long RssKb(int pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/statm");
  long pages = 0, resident = 0;
  f >> pages >> resident;
  return resident * (::sysconf(_SC_PAGESIZE) / 1024);
}

// Proportional set size of a process in KiB (0 when unreadable).
long PssKb(int pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/smaps_rollup");
  std::string key;
  long value = 0;
  while (f >> key) {
    if (key == "Pss:") {
      f >> value;
      return value;
    }
    f.ignore(1 << 12, '\n');
  }
  return 0;
}

// A process's children, whichever of its threads forked them.
std::vector<int> Children(int pid) {
  std::vector<int> out;
  std::error_code ec;
  for (const auto& t : std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/task", ec)) {
    std::ifstream f(t.path() / "children");
    int c = 0;
    while (f >> c) out.push_back(c);
  }
  return out;
}

struct IdleMemory {
  double daemon_kib = 0;  // gmuxd's RSS growth per session
  double worker_kib = 0;  // PSS of one session's worker (idle workers: spares excluded)
};

// Opens `n` idle sessions (handshake only, through a raw protocol hello) and measures them.
IdleMemory IdleSessionKb(int daemon_pid, const std::string& socket, int n);

}  // namespace

#include "proto/frame.h"

namespace {

IdleMemory IdleSessionKb(int daemon_pid, const std::string& socket, int n) {
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  long before = RssKb(daemon_pid);
  long workers_before = 0;
  for (int c : Children(daemon_pid)) workers_before += PssKb(c);
  const size_t children_before = Children(daemon_pid).size();
  std::vector<int> fds;
  for (int i = 0; i < n; ++i) {
    int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strncpy(a.sun_path, socket.c_str(), sizeof(a.sun_path) - 1);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) break;
    capnp::MallocMessageBuilder b;
    auto r = b.initRoot<gmux::proto::wire::Request>();
    r.setSeq(1);
    r.initHello().setProtocolVersion(gmux::proto::kProtocolVersion);
    if (!gmux::proto::WriteFrame(fd, gmux::proto::FrameKind::kRequest, b).ok()) break;
    auto reply = gmux::proto::ReadFrame(fd, gmux::proto::FrameKind::kReply);
    if (!reply.ok()) {
      std::fprintf(stderr, "runtime_bench: idle session %d: %s\n", i,
                   reply.status().ToString().c_str());
      ::close(fd);
      break;
    }
    fds.push_back(fd);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  long after = RssKb(daemon_pid);
  long workers_after = 0;
  std::vector<int> children = Children(daemon_pid);
  for (int c : children) workers_after += PssKb(c);
  for (int fd : fds) ::close(fd);
  IdleMemory m;
  if (fds.empty()) return m;
  const double k = static_cast<double>(fds.size());
  m.daemon_kib = static_cast<double>(after - before) / k;
  // Spares started meanwhile count like sessions' workers: per worker added.
  const double added = static_cast<double>(children.size() - std::min(children.size(), children_before));
  m.worker_kib = added > 0 ? static_cast<double>(workers_after - workers_before) / added : 0;
  return m;
}

// --child MODE PLATFORM: one fresh application process.
int ChildMain(const std::string& mode, const std::string& platform) {
  Dev d;
  if (!Open(platform.c_str(), d)) return 10;
  cl_int err;
  cl_mem m = clCreateBuffer(d.ctx, CL_MEM_READ_WRITE, 64, nullptr, &err);
  int zero = 0;
  clEnqueueWriteBuffer(d.q, m, CL_TRUE, 0, sizeof(zero), &zero, 0, nullptr, nullptr);
  cl_kernel k = clCreateKernel(d.prog, mode == "crash" ? "wild" : "tiny", &err);
  clSetKernelArg(k, 0, sizeof(cl_mem), &m);
  size_t g = 1;
  clEnqueueNDRangeKernel(d.q, k, 1, nullptr, &g, nullptr, 0, nullptr, nullptr);
  int result = -1;
  err = clEnqueueReadBuffer(d.q, m, CL_TRUE, 0, sizeof(result), &result, 0, nullptr, nullptr);
  if (mode == "crash") return err != CL_SUCCESS ? 0 : 11;  // its worker died: the call fails
  return err == CL_SUCCESS && result == 1 ? 0 : 12;
}

// Runs `runtime_bench --child MODE PLATFORM` and waits; its wall time in ms (negative: failed).
double RunChild(const char* mode, const char* platform) {
  auto s = Clock::now();
  pid_t pid = ::fork();
  if (pid == 0) {
    int fd = ::open("/dev/null", O_WRONLY);
    ::dup2(fd, 2);
    ::execl("/proc/self/exe", "runtime_bench", "--child", mode, platform,
            static_cast<char*>(nullptr));
    ::_exit(127);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  const double ms = Seconds(Clock::now() - s) * 1e3;
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? ms : -ms;
}

// Connect to first kernel result on `platform`, median of `n` after one warm-up.
double FirstResultMs(const char* platform, int n) {
  RunChild("first", platform);
  std::vector<double> t;
  for (int i = 0; i < n; ++i) {
    double ms = RunChild("first", platform);
    if (ms < 0) std::fprintf(stderr, "runtime_bench: first-result child failed on %s\n", platform);
    t.push_back(std::abs(ms));
  }
  return Median(t);
}

// Tiny launches per second of `d` during `seconds` while child processes of `mode` run one after
// another; `children` receives how many ran (and did what their mode expects).
double RateWhileChildren(Dev& d, const char* mode, double seconds, int& children) {
  std::atomic<bool> stop{false};
  std::atomic<int> ok{0}, ran{0};
  std::thread churn([&] {
    while (!stop) {
      ++ran;
      if (RunChild(mode, "gmux") >= 0) ++ok;
    }
  });
  cl_int err;
  cl_mem m = clCreateBuffer(d.ctx, CL_MEM_READ_WRITE, 64, nullptr, &err);
  cl_kernel k = clCreateKernel(d.prog, "tiny", &err);
  clSetKernelArg(k, 0, sizeof(cl_mem), &m);
  size_t g = 1;
  long launches = 0;
  bool failed = false;
  auto s = Clock::now();
  while (Seconds(Clock::now() - s) < seconds) {
    clEnqueueNDRangeKernel(d.q, k, 1, nullptr, &g, nullptr, 0, nullptr, nullptr);
    failed = failed || clFinish(d.q) != CL_SUCCESS;
    ++launches;
  }
  const double rate = static_cast<double>(launches) / Seconds(Clock::now() - s);
  stop = true;
  churn.join();
  clReleaseKernel(k);
  clReleaseMemObject(m);
  if (failed) std::fprintf(stderr, "runtime_bench: a launch failed while %s children ran\n", mode);
  children = ok.load();
  if (ok.load() != ran.load()) {
    std::fprintf(stderr, "runtime_bench: %d of %d %s children did not behave as expected\n",
                 ran.load() - ok.load(), ran.load(), mode);
  }
  return failed ? 0 : rate;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 4 && std::strcmp(argv[1], "--child") == 0) return ChildMain(argv[2], argv[3]);
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) quick = true;
    if (std::strcmp(argv[i], "--json") == 0) json = true;
  }
  char tmpl[] = "/tmp/gmux-bench-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) return 1;
  std::string dir = tmpl, socket = dir + "/gmuxd.sock", vendors = dir + "/vendors";
  std::filesystem::create_directories(vendors);
  std::ofstream(vendors + "/gmux.icd") << GMUX_ICD_PATH << "\n";
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/etc/OpenCL/vendors", ec)) {
    if (e.path().extension() == ".icd") {
      std::filesystem::copy_file(e.path(), vendors + "/" + e.path().filename().string(), ec);
    }
  }
  ::setenv("OCL_ICD_VENDORS", vendors.c_str(), 1);
  ::setenv("GMUX_SOCKET", socket.c_str(), 1);
  pid_t pid = ::fork();
  if (pid == 0) {
    int fd = ::open("/dev/null", O_WRONLY);
    ::dup2(fd, 2);
    ::execl(GMUXD_PATH, GMUXD_PATH, "--socket", socket.c_str(), "--exit-after", "900",
            static_cast<char*>(nullptr));
    ::_exit(127);
  }
  for (int i = 0; i < 1000 && !std::filesystem::exists(socket); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));

  Dev g, n;
  if (!Open("gmux", g) || !Open("Portable", n)) {
    std::fprintf(stderr, "runtime_bench: cannot open the gmux and native platforms\n");
    ::kill(pid, SIGTERM);
    return 1;
  }
  double rtt = SocketRoundTripUs();
  double lat_g = TinyLatencyUs(g), lat_n = TinyLatencyUs(n);
  double rate_g = PipelinedRate(g), rate_n = PipelinedRate(n);
  double h2d_g, d2h_g, h2d_n, d2h_n;
  TransferGBps(g, h2d_g, d2h_g);
  TransferGBps(n, h2d_n, d2h_n);
  double mm_g = MatmulMs(g), mm_n = MatmulMs(n);
  IdleMemory idle = IdleSessionKb(pid, socket, quick ? 8 : 20);
  const int first_runs = quick ? 3 : 5;
  double first_g = FirstResultMs("gmux", first_runs), first_n = FirstResultMs("Portable", first_runs);
  const double window = quick ? 2 : 5;
  int harmless = 0, crashed = 0;
  double rate_harmless = RateWhileChildren(g, "churn", window, harmless);
  double rate_crash = RateWhileChildren(g, "crash", window, crashed);

  std::printf("%-44s %12s %12s %10s  %s\n", "measure", "gmux", "native", "ratio", "goal");
  std::printf("%-44s %12.1f %12.1f %10.2f  added <= %.1f us (1 socket RTT)\n",
              "tiny launch + clFinish, median (us)", lat_g, lat_n, lat_g / lat_n, rtt);
  std::printf("%-44s %12.0f %12.0f %10.2f  >= 0.5\n", "pipelined tiny launches (1/s)", rate_g, rate_n,
              rate_g / rate_n);
  std::printf("%-44s %12.2f %12.2f %10.2f  >= 0.9\n", "host->device transfer (GB/s)", h2d_g, h2d_n,
              h2d_g / h2d_n);
  std::printf("%-44s %12.2f %12.2f %10.2f  >= 0.9\n", "device->host transfer (GB/s)", d2h_g, d2h_n,
              d2h_g / d2h_n);
  std::printf("%-44s %12.1f %12.1f %10.2f  <= 1.02\n", "512x512 matmul end to end (ms)", mm_g, mm_n,
              mm_g / mm_n);
  std::printf("%-44s %12.1f %12.1f %10.2f  low\n", "connect to first kernel result (ms)", first_g,
              first_n, first_g / first_n);
  std::printf("%-44s %12.0f %12.0f %10.2f  1.0 (nothing)\n",
              "tiny launches/s beside crashing | harmless", rate_crash, rate_harmless,
              rate_crash / rate_harmless);
  std::printf("%-44s %12d %12d\n", "  other processes: crashed | harmless", crashed, harmless);
  std::printf("%-44s %12.0f\n", "gmuxd RSS per idle session (KiB)", idle.daemon_kib);
  std::printf("%-44s %12.0f\n", "worker PSS per idle session (KiB)", idle.worker_kib);
  std::printf("%-44s %12.1f\n", "Unix socket round trip, median (us)", rtt);
  if (json) {
    std::printf("{\"socket_rtt_us\":%.2f,\"tiny_latency_us\":{\"gmux\":%.2f,\"native\":%.2f},"
                "\"pipelined_per_s\":{\"gmux\":%.0f,\"native\":%.0f},"
                "\"h2d_gbps\":{\"gmux\":%.3f,\"native\":%.3f},\"d2h_gbps\":{\"gmux\":%.3f,\"native\":%.3f},"
                "\"matmul512_ms\":{\"gmux\":%.2f,\"native\":%.2f},\"idle_session_kib\":%.0f,"
                "\"idle_worker_pss_kib\":%.0f,\"first_result_ms\":{\"gmux\":%.1f,\"native\":%.1f},"
                "\"launches_per_s_beside\":{\"crashing\":%.0f,\"harmless\":%.0f,"
                "\"crashed\":%d,\"harmless_runs\":%d}}\n",
                rtt, lat_g, lat_n, rate_g, rate_n, h2d_g, h2d_n, d2h_g, d2h_n, mm_g, mm_n,
                idle.daemon_kib, idle.worker_kib, first_g, first_n, rate_crash, rate_harmless,
                crashed, harmless);
  }
  ::kill(pid, SIGTERM);
  int status;
  ::waitpid(pid, &status, 0);
  std::filesystem::remove_all(dir, ec);
  return 0;
}
