// runtime_bench: gmux's remoting overheads against native PoCL, measured in the same run.
//
// Starts its own gmuxd on a socket in a temp dir, points the ICD loader at the gmux ICD and the
// backend's ICD, and runs each workload on both platforms:
//   1. blocking tiny kernel launch + clFinish (median latency), beside one Unix-socket round
//      trip measured on this machine (a 64-byte ping-pong between two threads);
//   2. pipelined tiny launches with no wait between them (launches/s);
//   3. 256 MiB host->device and device->host transfers (GB/s, best of 3);
//   4. 512x512 matrix multiply end to end: upload, kernel, download (median of 5);
//   5. gmuxd's resident memory per idle connected session.
// Prints a table (and JSON with --json). Usage: runtime_bench [--quick] [--json]
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
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

// Opens `n` idle sessions (handshake only, through a raw protocol hello) and returns gmuxd's
// resident memory growth per session in KiB.
double IdleSessionKb(int daemon_pid, const std::string& socket, int n);

}  // namespace

#include "proto/frame.h"

namespace {

double IdleSessionKb(int daemon_pid, const std::string& socket, int n) {
  long before = RssKb(daemon_pid);
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
    if (!gmux::proto::ReadFrame(fd, gmux::proto::FrameKind::kReply).ok()) break;
    fds.push_back(fd);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  long after = RssKb(daemon_pid);
  for (int fd : fds) ::close(fd);
  return fds.empty() ? 0 : static_cast<double>(after - before) / static_cast<double>(fds.size());
}

}  // namespace

int main(int argc, char** argv) {
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
  double idle_kb = IdleSessionKb(pid, socket, 50);

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
  std::printf("%-44s %12.0f\n", "gmuxd RSS per idle session (KiB)", idle_kb);
  std::printf("%-44s %12.1f\n", "Unix socket round trip, median (us)", rtt);
  if (json) {
    std::printf("{\"socket_rtt_us\":%.2f,\"tiny_latency_us\":{\"gmux\":%.2f,\"native\":%.2f},"
                "\"pipelined_per_s\":{\"gmux\":%.0f,\"native\":%.0f},"
                "\"h2d_gbps\":{\"gmux\":%.3f,\"native\":%.3f},\"d2h_gbps\":{\"gmux\":%.3f,\"native\":%.3f},"
                "\"matmul512_ms\":{\"gmux\":%.2f,\"native\":%.2f},\"idle_session_kib\":%.0f}\n",
                rtt, lat_g, lat_n, rate_g, rate_n, h2d_g, h2d_n, d2h_g, d2h_n, mm_g, mm_n, idle_kb);
  }
  ::kill(pid, SIGTERM);
  int status;
  ::waitpid(pid, &status, 0);
  std::filesystem::remove_all(dir, ec);
  return 0;
}
