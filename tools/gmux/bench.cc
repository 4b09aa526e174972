#include "bench.h"

#include <CL/cl.h>
#include <fcntl.h>
#include <signal.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "demo_common.h"

namespace gmux::cli {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t i = static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

double Median(std::vector<double> v) { return Percentile(std::move(v), 0.5); }

const char* kSource = R"(
__kernel void tiny(__global int* a) { if (get_global_id(0) == 0) a[0] += 1; }
__kernel void matmul(__global const float* A, __global const float* B, __global float* C, int n) {
  int row = get_global_id(1), col = get_global_id(0);
  float acc = 0.0f;
  for (int k = 0; k < n; ++k) acc += A[row * n + k] * B[k * n + col];
  C[row * n + col] = acc;
})";

// One platform's device, context, in-order queue and program, as a plain program sets them up.
struct Dev {
  std::string label;
  cl_platform_id platform = nullptr;
  cl_device_id device = nullptr;
  cl_context ctx = nullptr;
  cl_command_queue q = nullptr;
  cl_program prog = nullptr;
  ~Dev() {
    if (prog) clReleaseProgram(prog);
    if (q) clReleaseCommandQueue(q);
    if (ctx) clReleaseContext(ctx);
  }
};

std::string PlatformName(cl_platform_id p) {
  char buf[256] = {};
  clGetPlatformInfo(p, CL_PLATFORM_NAME, sizeof(buf) - 1, buf, nullptr);
  return buf;
}

// The loader's platforms: all of them, gmux's, and the native one (the first other whose name
// contains `native`, any other when it is empty); nullptr where there is none.
struct Platforms {
  std::vector<cl_platform_id> all;
  cl_platform_id gmux = nullptr;
  cl_platform_id native = nullptr;
};

Platforms FindPlatforms(const std::string& native) {
  Platforms out;
  cl_uint np = 0;
  clGetPlatformIDs(0, nullptr, &np);
  out.all.resize(np);
  if (np > 0) clGetPlatformIDs(np, out.all.data(), nullptr);
  for (auto p : out.all) {
    const std::string name = PlatformName(p);
    if (name == "gmux") {
      out.gmux = p;
    } else if (out.native == nullptr &&
               (native.empty() || name.find(native) != std::string::npos)) {
      out.native = p;
    }
  }
  return out;
}

// An error message, or "".
std::string Open(cl_platform_id p, const std::string& label, Dev& d) {
  d.label = label;
  d.platform = p;
  if (clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, 1, &d.device, nullptr) != CL_SUCCESS) {
    return label + ": no device";
  }
  cl_int err = CL_SUCCESS;
  d.ctx = clCreateContext(nullptr, 1, &d.device, nullptr, nullptr, &err);
  if (d.ctx == nullptr) return label + ": clCreateContext failed (" + std::to_string(err) + ")";
  d.q = clCreateCommandQueue(d.ctx, d.device, 0, &err);
  if (d.q == nullptr) return label + ": clCreateCommandQueue failed (" + std::to_string(err) + ")";
  d.prog = clCreateProgramWithSource(d.ctx, 1, &kSource, nullptr, &err);
  if (d.prog == nullptr || clBuildProgram(d.prog, 1, &d.device, "", nullptr, nullptr) != CL_SUCCESS) {
    return label + ": the benchmark's kernels did not build";
  }
  return "";
}

struct Failure {
  std::string what;
};

void Check(bool ok, const std::string& what) {
  if (!ok) throw Failure{what};
}

// How LaunchLatencies' loop waits for each launch: clFinish; or as timing code is written, a
// launch with an event on a profiling queue, clWaitForEvents (kTimedWait) or clFinish (kTimed
// Finish, as clpeak times its kernels), its start and end (two clGetEventProfilingInfo calls),
// clReleaseEvent.
enum class LaunchWait { kFinish, kTimedWait, kTimedFinish };

// Blocking launches of one work-item: per-launch microseconds. Through gmux a timed launch's
// times come with the wait's or the finish's answer (docs/policies.md, "Profiling times asked
// once per event").
std::vector<double> LaunchLatencies(Dev& d, int n, LaunchWait how = LaunchWait::kFinish) {
  cl_int err = CL_SUCCESS;
  cl_command_queue q = d.q;
  const bool timed = how != LaunchWait::kFinish;
  if (timed) {
    const cl_queue_properties props[] = {CL_QUEUE_PROPERTIES, CL_QUEUE_PROFILING_ENABLE, 0};
    q = clCreateCommandQueueWithProperties(d.ctx, d.device, props, &err);
    Check(q != nullptr, d.label + ": a profiling queue");
  }
  cl_mem m = clCreateBuffer(d.ctx, CL_MEM_READ_WRITE, sizeof(int), nullptr, &err);
  Check(m != nullptr, d.label + ": clCreateBuffer");
  int zero = 0;
  Check(clEnqueueWriteBuffer(q, m, CL_TRUE, 0, sizeof(int), &zero, 0, nullptr, nullptr) ==
            CL_SUCCESS, d.label + ": write");
  cl_kernel k = clCreateKernel(d.prog, "tiny", &err);
  clSetKernelArg(k, 0, sizeof(cl_mem), &m);
  size_t g = 1;
  std::vector<double> us;
  us.reserve(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    auto s = Clock::now();
    if (!timed) {
      Check(clEnqueueNDRangeKernel(q, k, 1, nullptr, &g, nullptr, 0, nullptr, nullptr) ==
                CL_SUCCESS && clFinish(q) == CL_SUCCESS, d.label + ": launch");
      us.push_back(Seconds(Clock::now() - s) * 1e6);
      continue;
    }
    cl_event ev = nullptr;
    cl_ulong start = 0, end = 0;
    Check(clEnqueueNDRangeKernel(q, k, 1, nullptr, &g, nullptr, 0, nullptr, &ev) ==
                  CL_SUCCESS &&
              (how == LaunchWait::kTimedWait ? clWaitForEvents(1, &ev) : clFinish(q)) ==
                  CL_SUCCESS &&
              clGetEventProfilingInfo(ev, CL_PROFILING_COMMAND_START, sizeof(start), &start,
                                      nullptr) == CL_SUCCESS &&
              clGetEventProfilingInfo(ev, CL_PROFILING_COMMAND_END, sizeof(end), &end,
                                      nullptr) == CL_SUCCESS,
          d.label + ": a timed launch");
    clReleaseEvent(ev);
    us.push_back(Seconds(Clock::now() - s) * 1e6);
    Check(end >= start && end > 0, d.label + ": a launch's end before its start");
  }
  int got = -1;
  clEnqueueReadBuffer(q, m, CL_TRUE, 0, sizeof(int), &got, 0, nullptr, nullptr);
  Check(got == n, d.label + ": the launches' result is " + std::to_string(got) + ", want " +
                      std::to_string(n));
  clReleaseKernel(k);
  clReleaseMemObject(m);
  if (timed) clReleaseCommandQueue(q);
  return us;
}

// clCreateBuffer and clReleaseMemObject of a 1 MiB buffer, `n` times, as a program that
// allocates per step does: microseconds per pair. Through gmux each create is also reserved
// against the tenant's device memory in gmuxd's books (docs/operations.md, "Device memory").
std::vector<double> CreateReleaseUs(Dev& d, int n) {
  std::vector<double> us;
  us.reserve(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    auto s = Clock::now();
    cl_int err = CL_SUCCESS;
    cl_mem m = clCreateBuffer(d.ctx, CL_MEM_READ_WRITE, 1u << 20, nullptr, &err);
    Check(m != nullptr && err == CL_SUCCESS, d.label + ": clCreateBuffer");
    Check(clReleaseMemObject(m) == CL_SUCCESS, d.label + ": clReleaseMemObject");
    us.push_back(Seconds(Clock::now() - s) * 1e6);
  }
  return us;
}

// `n` launches enqueued back to back, then one clFinish: launches per second.
double PipelinedRate(Dev& d, int n) {
  cl_int err = CL_SUCCESS;
  cl_mem m = clCreateBuffer(d.ctx, CL_MEM_READ_WRITE, sizeof(int), nullptr, &err);
  int zero = 0;
  clEnqueueWriteBuffer(d.q, m, CL_TRUE, 0, sizeof(int), &zero, 0, nullptr, nullptr);
  cl_kernel k = clCreateKernel(d.prog, "tiny", &err);
  clSetKernelArg(k, 0, sizeof(cl_mem), &m);
  size_t g = 1;
  clFinish(d.q);
  auto s = Clock::now();
  for (int i = 0; i < n; ++i) {
    Check(clEnqueueNDRangeKernel(d.q, k, 1, nullptr, &g, nullptr, 0, nullptr, nullptr) ==
              CL_SUCCESS, d.label + ": launch");
  }
  Check(clFinish(d.q) == CL_SUCCESS, d.label + ": clFinish");
  const double rate = n / Seconds(Clock::now() - s);
  int got = -1;
  clEnqueueReadBuffer(d.q, m, CL_TRUE, 0, sizeof(int), &got, 0, nullptr, nullptr);
  Check(got == n, d.label + ": the pipelined launches' result is " + std::to_string(got));
  clReleaseKernel(k);
  clReleaseMemObject(m);
  return rate;
}

// How many times Transfer() writes, and then reads, `bytes` (about `total` bytes each way).
size_t TransferIters(size_t bytes, size_t total) { return std::max<size_t>(3, total / bytes); }

struct TransferRun {
  double write_gbps = 0, read_gbps = 0;
  std::vector<double> write_us, read_us;  // each call's time
};

// Blocking writes, then blocking reads, of `bytes` from and into a std::vector: GB/s each, and
// each call's time.
TransferRun Transfer(Dev& d, size_t bytes, size_t total) {
  TransferRun run;
  cl_int err = CL_SUCCESS;
  // The data first, then the buffer, then at once the writes: what a program that prepares its
  // input and uploads it does. (The other order would leave gmux's prefaulter the time of
  // filling the vectors to fault the new buffer in: common/prefault.h.)
  std::vector<unsigned char> out(bytes), in(bytes);
  for (size_t i = 0; i < bytes; ++i) out[i] = static_cast<unsigned char>(i * 7 + 3);
  cl_mem m = clCreateBuffer(d.ctx, CL_MEM_READ_WRITE, bytes, nullptr, &err);
  Check(m != nullptr, d.label + ": clCreateBuffer of " + std::to_string(bytes) + " bytes");
  const size_t iters = TransferIters(bytes, total);
  auto s = Clock::now();
  for (size_t i = 0; i < iters; ++i) {
    const auto c = Clock::now();
    Check(clEnqueueWriteBuffer(d.q, m, CL_TRUE, 0, bytes, out.data(), 0, nullptr, nullptr) ==
              CL_SUCCESS, d.label + ": write");
    run.write_us.push_back(Seconds(Clock::now() - c) * 1e6);
  }
  // A blocking write may return once the data is copied out (gmux's does): the writes are done
  // when the queue is, and the reads below must not pay for a backlog of them.
  Check(clFinish(d.q) == CL_SUCCESS, d.label + ": clFinish after the writes");
  run.write_gbps = static_cast<double>(bytes * iters) / Seconds(Clock::now() - s) / 1e9;
  s = Clock::now();
  for (size_t i = 0; i < iters; ++i) {
    const auto c = Clock::now();
    Check(clEnqueueReadBuffer(d.q, m, CL_TRUE, 0, bytes, in.data(), 0, nullptr, nullptr) ==
              CL_SUCCESS, d.label + ": read");
    run.read_us.push_back(Seconds(Clock::now() - c) * 1e6);
  }
  run.read_gbps = static_cast<double>(bytes * iters) / Seconds(Clock::now() - s) / 1e9;
  Check(in == out, d.label + ": the data read back differs from what was written");
  clReleaseMemObject(m);
  return run;
}

// A plain TCP socket copy on loopback between another process and this one, in GB/s (0 where it
// could not run): a bound a transfer over TCP is read against. `bytes` cross `iters` times,
// timed from the receiver's go (the sender has its data ready by then).
// - `big`: from a std::vector of `bytes`, written first, into a new one of the same size on the
//   other side: what the bench's transfers move (each size's writes into a new buffer, reads
//   into a new vector), done with plain sockets.
// - else from one 4 MiB chunk again and again into another: both stay in the caches, so this is
//   the socket's peak, a bound no transfer of more than the caches hold reaches.
double TcpLoopbackRun(size_t bytes, size_t iters, bool big) {
  int ls = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (ls < 0 || ::bind(ls, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      ::listen(ls, 1) != 0 || ::getsockname(ls, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    if (ls >= 0) ::close(ls);
    return 0;
  }
  constexpr size_t kChunk = 4u << 20;  // gmux's own bulk chunk
  const size_t held = big ? bytes : std::min(kChunk, bytes);
  pid_t child = ::fork();
  if (child == 0) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) ::_exit(1);
    std::vector<unsigned char> buf(held);
    for (size_t i = 0; i < held; ++i) buf[i] = static_cast<unsigned char>(i * 7 + 3);
    char go = 0;
    // Ready (the data prepared), then go: the receiver times from its go.
    if (::send(fd, &go, 1, MSG_NOSIGNAL) != 1 || ::recv(fd, &go, 1, MSG_WAITALL) != 1) ::_exit(1);
    for (size_t i = 0; i < iters; ++i) {
      for (size_t sent = 0; sent < bytes;) {
        const size_t at = big ? sent : 0;
        ssize_t w = ::send(fd, buf.data() + at, std::min(kChunk, bytes - sent), MSG_NOSIGNAL);
        if (w <= 0) ::_exit(1);
        sent += static_cast<size_t>(w);
      }
    }
    ::_exit(0);
  }
  int fd = ::accept4(ls, nullptr, nullptr, SOCK_CLOEXEC);
  ::close(ls);
  double gbps = 0;
  if (fd >= 0) {
    std::vector<unsigned char> buf(held);  // zeroed: written, as the bench's read vector is
    char go = 0;
    if (::recv(fd, &go, 1, MSG_WAITALL) == 1) {
      const auto s = Clock::now();
      size_t got = 0;
      bool ok = ::send(fd, &go, 1, MSG_NOSIGNAL) == 1;
      for (size_t i = 0; ok && i < iters; ++i) {
        for (size_t at = 0; at < bytes;) {
          uint8_t* to = buf.data() + (big ? at : 0);
          ssize_t r = ::recv(fd, to, std::min(kChunk, bytes - at), 0);
          if (r <= 0) {
            ok = false;
            break;
          }
          at += static_cast<size_t>(r);
          got += static_cast<size_t>(r);
        }
      }
      if (ok) gbps = static_cast<double>(got) / Seconds(Clock::now() - s) / 1e9;
    }
    ::close(fd);
  }
  int st = 0;
  ::waitpid(child, &st, 0);
  return gbps;
}

// A matrix multiply as a program does it: upload A and B, launch, download C (milliseconds).
double MatmulMs(Dev& d, int n) {
  const size_t count = static_cast<size_t>(n) * static_cast<size_t>(n);
  std::vector<float> a(count), b(count), c(count);
  for (size_t i = 0; i < count; ++i) {
    a[i] = static_cast<float>(i % 13) * 0.5f;
    b[i] = static_cast<float>(i % 7) - 3.0f;
  }
  auto s = Clock::now();
  cl_int err = CL_SUCCESS;
  cl_mem ma = clCreateBuffer(d.ctx, CL_MEM_READ_ONLY, count * 4, nullptr, &err);
  cl_mem mb = clCreateBuffer(d.ctx, CL_MEM_READ_ONLY, count * 4, nullptr, &err);
  cl_mem mc = clCreateBuffer(d.ctx, CL_MEM_WRITE_ONLY, count * 4, nullptr, &err);
  clEnqueueWriteBuffer(d.q, ma, CL_TRUE, 0, count * 4, a.data(), 0, nullptr, nullptr);
  clEnqueueWriteBuffer(d.q, mb, CL_TRUE, 0, count * 4, b.data(), 0, nullptr, nullptr);
  cl_kernel k = clCreateKernel(d.prog, "matmul", &err);
  clSetKernelArg(k, 0, sizeof(cl_mem), &ma);
  clSetKernelArg(k, 1, sizeof(cl_mem), &mb);
  clSetKernelArg(k, 2, sizeof(cl_mem), &mc);
  clSetKernelArg(k, 3, sizeof(int), &n);
  size_t g[2] = {static_cast<size_t>(n), static_cast<size_t>(n)};
  Check(clEnqueueNDRangeKernel(d.q, k, 2, nullptr, g, nullptr, 0, nullptr, nullptr) == CL_SUCCESS,
        d.label + ": matmul launch");
  Check(clEnqueueReadBuffer(d.q, mc, CL_TRUE, 0, count * 4, c.data(), 0, nullptr, nullptr) ==
            CL_SUCCESS, d.label + ": matmul read");
  const double ms = Seconds(Clock::now() - s) * 1e3;
  for (int row : {0, n / 2, n - 1}) {
    for (int col : {0, n / 3, n - 1}) {
      float want = 0;
      for (int i = 0; i < n; ++i) want += a[row * n + i] * b[i * n + col];
      Check(std::fabs(c[row * n + col] - want) <= 1e-3f * std::max(1.0f, std::fabs(want)),
            d.label + ": matmul result differs from the host's");
    }
  }
  clReleaseKernel(k);
  clReleaseMemObject(ma);
  clReleaseMemObject(mb);
  clReleaseMemObject(mc);
  return ms;
}

// clGetKernelWorkGroupInfo(CL_KERNEL_WORK_GROUP_SIZE) as a program asks before each launch:
// microseconds per query, one sample per query.
std::vector<double> WorkGroupQueryUs(Dev& d, int n) {
  cl_int err = CL_SUCCESS;
  cl_kernel k = clCreateKernel(d.prog, "matmul", &err);
  Check(k != nullptr, d.label + ": clCreateKernel");
  std::vector<double> us;
  for (int i = 0; i < n; ++i) {
    size_t wg = 0;
    auto s = Clock::now();
    Check(clGetKernelWorkGroupInfo(k, d.device, CL_KERNEL_WORK_GROUP_SIZE, sizeof(wg), &wg,
                                   nullptr) == CL_SUCCESS && wg > 0,
          d.label + ": clGetKernelWorkGroupInfo");
    us.push_back(Seconds(Clock::now() - s) * 1e6);
  }
  clReleaseKernel(k);
  return us;
}

// clFinish on a queue with nothing in it, as a program calls it to be sure: microseconds per
// call, one sample per call. Natively next to nothing; through gmux too, since the ICD knows
// every command of the queue has completed (docs/policies.md, "An idle clFinish stays in the
// client").
std::vector<double> IdleFinishUs(Dev& d, int n) {
  Check(clFinish(d.q) == CL_SUCCESS, d.label + ": clFinish");
  std::vector<double> us;
  for (int i = 0; i < n; ++i) {
    auto s = Clock::now();
    Check(clFinish(d.q) == CL_SUCCESS, d.label + ": clFinish");
    us.push_back(Seconds(Clock::now() - s) * 1e6);
  }
  return us;
}

// The status of a command that has not run (a marker behind a user event), polled as a program
// polls an event: microseconds per clGetEventInfo. Natively next to nothing; through gmux one
// request and its answer with no device work behind it, so it is what the remoting itself adds
// to a blocking call.
std::vector<double> StatusPollUs(Dev& d, int n) {
  cl_int err = CL_SUCCESS;
  cl_event user = clCreateUserEvent(d.ctx, &err);
  Check(err == CL_SUCCESS, d.label + ": clCreateUserEvent");
  cl_event marker = nullptr;
  Check(clEnqueueMarkerWithWaitList(d.q, 1, &user, &marker) == CL_SUCCESS,
        d.label + ": clEnqueueMarkerWithWaitList");
  std::vector<double> us;
  for (int i = 0; i < n; ++i) {
    cl_int status = CL_COMPLETE;
    auto s = Clock::now();
    Check(clGetEventInfo(marker, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof(status), &status,
                         nullptr) == CL_SUCCESS,
          d.label + ": clGetEventInfo");
    us.push_back(Seconds(Clock::now() - s) * 1e6);
    Check(status > CL_COMPLETE, d.label + ": a marker behind an unset user event ran");
  }
  Check(clSetUserEventStatus(user, CL_COMPLETE) == CL_SUCCESS, d.label + ": clSetUserEventStatus");
  Check(clFinish(d.q) == CL_SUCCESS, d.label + ": clFinish");
  clReleaseEvent(marker);
  clReleaseEvent(user);
  return us;
}

// One 64-byte ping-pong with another process over a Unix socket pair: microseconds, p50.
double SocketRoundTripUs(int n) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return 0;
  pid_t child = ::fork();
  if (child == 0) {
    ::close(sv[0]);
    char buf[64];
    while (::read(sv[1], buf, sizeof(buf)) == static_cast<ssize_t>(sizeof(buf))) {
      if (::write(sv[1], buf, sizeof(buf)) != static_cast<ssize_t>(sizeof(buf))) break;
    }
    ::_exit(0);
  }
  ::close(sv[1]);
  std::vector<double> us;
  char buf[64] = {};
  for (int i = 0; i < n; ++i) {
    auto s = Clock::now();
    if (::write(sv[0], buf, sizeof(buf)) != static_cast<ssize_t>(sizeof(buf))) break;
    size_t got = 0;
    while (got < sizeof(buf)) {
      ssize_t r = ::read(sv[0], buf + got, sizeof(buf) - got);
      if (r <= 0) break;
      got += static_cast<size_t>(r);
    }
    us.push_back(Seconds(Clock::now() - s) * 1e6);
  }
  ::close(sv[0]);
  int st = 0;
  ::waitpid(child, &st, 0);
  return Median(us);
}

// Many clients at once, as many processes of one user run them: `n` processes, each with its
// own context, queue and 1-work-item kernel, in a closed loop of launch + clFinish for `secs`
// (after building the kernel and 20 warm-up launches), started together. `gmux`: the gmux
// platform, else the first other one whose name contains `native`. Forked, so it must run
// before this process makes any OpenCL call. A client process ends in ManyClient().
struct ManyRun {
  double per_s = 0;   // launches of all clients per second
  double p50_us = 0;  // the median of the clients' p50s
  double p99_us = 0;  // the median of the clients' p99s
};

struct ClientResult {
  uint64_t calls = 0;
  double p50 = 0, p99 = 0;
  int32_t ok = 0;
};

void ManyClient(bool gmux, const std::string& native, double secs, int ready, int go, int out) {
  ClientResult r;
  auto finish = [&] {
    (void)!::write(out, &r, sizeof(r));
    ::_exit(r.ok ? 0 : 1);
  };
  auto fail = [&] {
    char c = 0;
    (void)!::write(ready, &c, 1);
    finish();
  };
  const Platforms found = FindPlatforms(native);
  cl_platform_id p = gmux ? found.gmux : found.native;
  Dev d;
  if (p == nullptr || !Open(p, "client", d).empty()) fail();
  cl_int err = CL_SUCCESS;
  cl_mem m = clCreateBuffer(d.ctx, CL_MEM_READ_WRITE, sizeof(int), nullptr, &err);
  cl_kernel k = m != nullptr ? clCreateKernel(d.prog, "tiny", &err) : nullptr;
  if (k == nullptr || clSetKernelArg(k, 0, sizeof(cl_mem), &m) != CL_SUCCESS) fail();
  size_t g = 1;
  auto launch = [&] {
    return clEnqueueNDRangeKernel(d.q, k, 1, nullptr, &g, nullptr, 0, nullptr, nullptr) ==
               CL_SUCCESS && clFinish(d.q) == CL_SUCCESS;
  };
  for (int i = 0; i < 20; ++i) {
    if (!launch()) fail();
  }
  char c = 1;
  (void)!::write(ready, &c, 1);
  if (::read(go, &c, 1) != 1) finish();
  std::vector<double> us;
  us.reserve(1 << 16);
  const auto end = Clock::now() + std::chrono::duration<double>(secs);
  for (auto a = Clock::now(); a < end; a = Clock::now()) {
    if (!launch()) finish();
    us.push_back(Seconds(Clock::now() - a) * 1e6);
  }
  r.calls = us.size();
  r.p50 = Percentile(us, 0.5);
  r.p99 = Percentile(us, 0.99);
  r.ok = !us.empty();
  clReleaseKernel(k);
  clReleaseMemObject(m);
  finish();
}

ManyRun ManyClients(bool gmux, const std::string& native, int n, double secs) {
  const std::string label = gmux ? "gmux" : "native";
  int ready[2], go[2], out[2];
  Check(::pipe2(ready, O_CLOEXEC) == 0 && ::pipe2(go, O_CLOEXEC) == 0 &&
            ::pipe2(out, O_CLOEXEC) == 0, "pipe failed");
  std::vector<pid_t> kids;
  for (int i = 0; i < n; ++i) {
    pid_t pid = ::fork();
    if (pid == 0) {
      ::close(ready[0]);
      ::close(go[1]);
      ::close(out[0]);
      ManyClient(gmux, native, secs, ready[1], go[0], out[1]);  // exits
      ::_exit(1);
    }
    if (pid > 0) kids.push_back(pid);
  }
  ::close(ready[1]);
  ::close(go[0]);
  ::close(out[1]);
  // Each client says when it is ready (or failed); one that says nothing in a minute (it
  // crashed) does not hold the others.
  int up = 0;
  for (char c; up < static_cast<int>(kids.size()); ++up) {
    pollfd pf{ready[0], POLLIN, 0};
    if (::poll(&pf, 1, 60000) != 1 || ::read(ready[0], &c, 1) != 1) break;
  }
  const std::string go_all(kids.size(), '1');
  (void)!::write(go[1], go_all.data(), go_all.size());
  ::close(go[1]);
  std::vector<double> p50, p99;
  uint64_t calls = 0;
  bool all_ok = static_cast<int>(kids.size()) == n && up == n;
  for (size_t i = 0; all_ok && i < kids.size(); ++i) {
    ClientResult r;
    if (::read(out[0], &r, sizeof(r)) != static_cast<ssize_t>(sizeof(r)) || !r.ok) {
      all_ok = false;
      continue;
    }
    calls += r.calls;
    p50.push_back(r.p50);
    p99.push_back(r.p99);
  }
  ::close(ready[0]);
  ::close(out[0]);
  for (pid_t k : kids) {
    int st = 0;
    if (!all_ok) ::kill(k, SIGKILL);
    ::waitpid(k, &st, 0);
  }
  Check(all_ok, label + ": a client of the many-clients run failed");
  return {static_cast<double>(calls) / secs, Median(p50), Median(p99)};
}

std::optional<size_t> ParseSize(const std::string& s) {
  if (s.empty()) return std::nullopt;
  size_t pos = 0;
  unsigned long long v = 0;
  try {
    v = std::stoull(s, &pos);
  } catch (...) {
    return std::nullopt;
  }
  std::string unit = s.substr(pos);
  size_t mul = 1;
  if (unit == "K" || unit == "KiB") mul = 1u << 10;
  else if (unit == "M" || unit == "MiB") mul = 1u << 20;
  else if (unit == "G" || unit == "GiB") mul = 1u << 30;
  else if (!unit.empty()) return std::nullopt;
  if (v == 0 || v > (4ull << 30) / mul) return std::nullopt;
  return static_cast<size_t>(v * mul);
}

std::string SizeName(size_t b) {
  if (b >= (1u << 20) && b % (1u << 20) == 0) return std::to_string(b >> 20) + " MiB";
  if (b >= (1u << 10) && b % (1u << 10) == 0) return std::to_string(b >> 10) + " KiB";
  return std::to_string(b) + " B";
}

// The daemon this run uses: a running one, or one it starts (and stops).
struct Daemon {
  std::string socket;
  pid_t pid = -1;
  std::string dir;
  ~Daemon() {
    if (pid > 0) {
      ::kill(pid, SIGTERM);
      int st = 0;
      ::waitpid(pid, &st, 0);
    }
    if (!dir.empty()) std::filesystem::remove_all(dir);
  }
};

}  // namespace

int RunBench(const BenchOptions& o) {
  std::vector<size_t> sizes;
  for (const auto& s : o.sizes) {
    auto b = ParseSize(s);
    if (!b) {
      std::cerr << "gmux bench: bad transfer size '" << s << "' (a number with K, M or G)\n";
      return 2;
    }
    sizes.push_back(*b);
  }
  if (o.quick) {
    std::erase_if(sizes, [](size_t b) { return b > (1u << 20); });
    if (sizes.empty()) sizes = {4096, 1u << 20};
  }
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe");
  const std::string icd = IcdBeside(exe);

  Daemon daemon;
  daemon.socket = o.socket;
  if (daemon.socket.empty() && o.address.empty() && std::getenv("GMUX_SOCKET") != nullptr) {
    daemon.socket = std::getenv("GMUX_SOCKET");
  }
  if (!o.address.empty()) {
    // A daemon over TCP (TLS unless "tcp://"; GMUX_TOKEN and GMUX_TLS_* from the environment).
    ::unsetenv("GMUX_SOCKET");
    ::setenv("GMUX_ADDRESS", o.address.c_str(), 1);
  } else if (daemon.socket.empty()) {
    // None named: start this build's gmuxd on a socket of its own, with the default config.
    const std::string gmuxd = (exe.parent_path() / "gmuxd").string();
    if (!std::filesystem::exists(gmuxd)) {
      std::cerr << "gmux bench: no daemon named (--socket or $GMUX_SOCKET) and no gmuxd beside "
                << exe.string() << " to start\n";
      return 2;
    }
    char tmpl[] = "/tmp/gmux-bench-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) {
      std::cerr << "gmux bench: mkdtemp failed\n";
      return 1;
    }
    daemon.dir = tmpl;
    daemon.socket = daemon.dir + "/gmuxd.sock";
    daemon.pid = ::fork();
    if (daemon.pid == 0) {
      std::freopen((daemon.dir + "/gmuxd.log").c_str(), "w", stderr);
      std::freopen("/dev/null", "w", stdout);
      ::execl(gmuxd.c_str(), gmuxd.c_str(), "--socket", daemon.socket.c_str(), "--exit-after",
              "3600", static_cast<char*>(nullptr));
      ::_exit(127);
    }
    bool up = false;
    for (int i = 0; i < 3000 && !up; ++i) {
      up = std::filesystem::exists(daemon.socket);
      int st = 0;
      if (!up && ::waitpid(daemon.pid, &st, WNOHANG) == daemon.pid) {
        daemon.pid = -1;
        break;
      }
      if (!up) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (!up) {
      std::cerr << "gmux bench: the gmuxd it started did not come up (log: " << daemon.dir
                << "/gmuxd.log)\n";
      return 1;
    }
  }
  if (o.address.empty()) ::setenv("GMUX_SOCKET", daemon.socket.c_str(), 1);
  // The loader sees both platforms: the application's own vendor list when it has one (it must
  // then name gmux too), else the system's vendors beside this build's ICD.
  if (std::getenv("OCL_ICD_VENDORS") == nullptr) {
    if (daemon.dir.empty()) {
      char tmpl[] = "/tmp/gmux-bench-XXXXXX";
      if (::mkdtemp(tmpl) != nullptr) daemon.dir = tmpl;
    }
    const std::string vendors = daemon.dir + "/vendors";
    std::filesystem::create_directories(vendors);
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator("/etc/OpenCL/vendors", ec)) {
      std::ifstream in(e.path());
      std::string lib;
      std::getline(in, lib);
      if (lib.find("gmux") == std::string::npos) {
        std::ofstream(vendors + "/" + e.path().filename().string()) << lib << "\n";
      }
    }
    std::ofstream(vendors + "/gmux.icd") << icd << "\n";
    ::setenv("OCL_ICD_VENDORS", vendors.c_str(), 1);
  }

  // Measured before any OpenCL call: the echoing process is a fork of this one, which must not
  // hold the loader's state or the daemon connection.
  const double rtt = SocketRoundTripUs(o.quick ? 200 : 2000);
  // Many clients too: their processes are forked before this one opens OpenCL.
  const int clients = o.quick ? std::min(o.clients, 2) : o.clients;
  const double client_s = o.quick ? 0.3 : 2.0;
  std::vector<double> many_rate[2], many_p50[2], many_p99[2];
  try {
    for (int r = 0; clients > 0 && r < std::max(1, o.repeat); ++r) {
      for (int i = 0; i < 2; ++i) {
        const ManyRun m = ManyClients(i == 1, o.native, clients, client_s);
        many_rate[i].push_back(m.per_s);
        many_p50[i].push_back(m.p50_us);
        many_p99[i].push_back(m.p99_us);
      }
    }
  } catch (const Failure& f) {
    std::cerr << "gmux bench: " << f.what << "\n";
    return 1;
  }

  const Platforms found = FindPlatforms(o.native);
  cl_platform_id gp = found.gmux, npf = found.native;
  if (gp == nullptr || npf == nullptr) {
    std::cerr << "gmux bench: needs the gmux platform and a native one; the loader lists:";
    for (auto p : found.all) std::cerr << " '" << PlatformName(p) << "'";
    std::cerr << "\n";
    return 1;
  }
  Dev nat, gm;
  for (const std::string& e : {Open(npf, "native", nat), Open(gp, "gmux", gm)}) {
    if (!e.empty()) {
      std::cerr << "gmux bench: " << e << "\n";
      return 1;
    }
  }

  const int launches = o.quick ? 200 : 2000, pipelined = o.quick ? 2000 : 20000;
  const size_t total = o.quick ? (4u << 20) : (256u << 20);
  const int mm = o.quick ? 128 : 512, repeat = std::max(1, o.repeat);
  json out;
  out["native_platform"] = PlatformName(npf);
  out["daemon"] = !o.address.empty() ? o.address
                 : daemon.pid > 0    ? "started by gmux bench"
                                     : daemon.socket;
  out["repeat"] = repeat;
  out["socket_round_trip_us"] = rtt;
  try {
    // Each workload alternates the platforms `repeat` times; the median run is reported.
    std::vector<double> p50[2], p99[2], rate[2], mms[2], allocs[2], wgq[2], idle50[2],
        idle99[2], poll50[2], poll99[2], timed50[2], timed99[2], ftimed50[2], ftimed99[2];
    Dev* devs[2] = {&nat, &gm};
    // Runs `per_call(dev)` (per-call microseconds) `repeat` times on each platform, alternating
    // them, and keeps each run's p50 and p99.
    auto percentiles = [&](const auto& per_call, std::vector<double> (&p50s)[2],
                           std::vector<double> (&p99s)[2]) {
      for (int r = 0; r < repeat; ++r) {
        for (int i = 0; i < 2; ++i) {
          auto us = per_call(*devs[i]);
          p50s[i].push_back(Percentile(us, 0.5));
          p99s[i].push_back(Percentile(us, 0.99));
        }
      }
    };
    percentiles([&](Dev& d) { return LaunchLatencies(d, launches); }, p50, p99);
    percentiles([&](Dev& d) { return LaunchLatencies(d, launches, LaunchWait::kTimedWait); },
                timed50, timed99);
    percentiles([&](Dev& d) { return LaunchLatencies(d, launches, LaunchWait::kTimedFinish); },
                ftimed50, ftimed99);
    percentiles([&](Dev& d) { return IdleFinishUs(d, launches * 5); }, idle50, idle99);
    percentiles([&](Dev& d) { return StatusPollUs(d, launches * 5); }, poll50, poll99);
    for (int r = 0; r < repeat; ++r) {
      for (int i = 0; i < 2; ++i) rate[i].push_back(PipelinedRate(*devs[i], pipelined));
    }
    // One untimed multiply first: PoCL compiles a kernel for its work-group size at the first
    // launch, into a cache that a daemon started for this run (its own state dir) has empty,
    // while the native platform's is the user's, warm from earlier runs.
    for (int i = 0; i < 2; ++i) MatmulMs(*devs[i], mm);
    for (int r = 0; r < repeat; ++r) {
      for (int i = 0; i < 2; ++i) mms[i].push_back(MatmulMs(*devs[i], mm));
    }
    for (int r = 0; r < repeat; ++r) {
      for (int i = 0; i < 2; ++i) {
        allocs[i].push_back(Percentile(CreateReleaseUs(*devs[i], o.quick ? 100 : 1000), 0.5));
      }
    }
    for (int r = 0; r < repeat; ++r) {
      for (int i = 0; i < 2; ++i) {
        wgq[i].push_back(Percentile(WorkGroupQueryUs(*devs[i], o.quick ? 100 : 2000), 0.5));
      }
    }
    const char* names[2] = {"native", "gmux"};
    for (int i = 0; i < 2; ++i) {
      out["launch_us"][names[i]] = {{"p50", Median(p50[i])}, {"p99", Median(p99[i])}};
      out["timed_launch_us"][names[i]] = {{"p50", Median(timed50[i])},
                                          {"p99", Median(timed99[i])}};
      out["finish_timed_launch_us"][names[i]] = {{"p50", Median(ftimed50[i])},
                                                 {"p99", Median(ftimed99[i])}};
      out["idle_finish_us"][names[i]] = {{"p50", Median(idle50[i])}, {"p99", Median(idle99[i])}};
      out["status_poll_us"][names[i]] = {{"p50", Median(poll50[i])}, {"p99", Median(poll99[i])}};
      out["pipelined_per_s"][names[i]] = Median(rate[i]);
      out["matmul_ms"][names[i]] = Median(mms[i]);
      out["matmul_n"] = mm;
      out["create_release_us"][names[i]] = Median(allocs[i]);
      out["work_group_query_us"][names[i]] = Median(wgq[i]);
    }
    // Each repeat's two multiplies run back to back: their ratio, median over the repeats, is
    // less moved by the host's speed drifting between repeats than the medians' ratio.
    std::vector<double> pairs;
    for (size_t r = 0; r < mms[0].size() && r < mms[1].size(); ++r) {
      if (mms[0][r] > 0) pairs.push_back(mms[1][r] / mms[0][r]);
    }
    out["matmul_pair_ratio"] = pairs.empty() ? 0.0 : Median(pairs);
    if (clients > 0) {
      out["clients"] = {{"count", clients}, {"seconds", client_s}};
      for (int i = 0; i < 2; ++i) {
        out["clients"][names[i]] = {{"per_s", Median(many_rate[i])},
                                    {"p50_us", Median(many_p50[i])},
                                    {"p99_us", Median(many_p99[i])}};
      }
    }
    out["transfers"] = json::array();
    for (size_t b : sizes) {
      std::vector<double> w[2], rd[2], wp50[2], wp99[2], rp50[2], rp99[2], copy;
      for (int r = 0; r < repeat; ++r) {
        if (!o.address.empty()) copy.push_back(TcpLoopbackRun(b, TransferIters(b, total), true));
        for (int i = 0; i < 2; ++i) {
          TransferRun t = Transfer(*devs[i], b, total);
          w[i].push_back(t.write_gbps);
          rd[i].push_back(t.read_gbps);
          wp50[i].push_back(Percentile(t.write_us, 0.5));
          wp99[i].push_back(Percentile(t.write_us, 0.99));
          rp50[i].push_back(Percentile(t.read_us, 0.5));
          rp99[i].push_back(Percentile(t.read_us, 0.99));
        }
      }
      json t = {{"bytes", b},
                {"write_gbps", {{"native", Median(w[0])}, {"gmux", Median(w[1])}}},
                {"read_gbps", {{"native", Median(rd[0])}, {"gmux", Median(rd[1])}}}};
      for (int i = 0; i < 2; ++i) {
        t["write_us"][names[i]] = {{"p50", Median(wp50[i])}, {"p99", Median(wp99[i])}};
        t["read_us"][names[i]] = {{"p50", Median(rp50[i])}, {"p99", Median(rp99[i])}};
      }
      if (!copy.empty()) t["tcp_copy_gbps"] = Median(copy);
      out["transfers"].push_back(t);
    }
    if (!o.address.empty() && !sizes.empty()) {
      // Over TCP the bulk data is bounded by the socket's own speed: measured in the same run,
      // as a plain copy of what each transfer moves (above) and at the socket's peak.
      const size_t largest = *std::max_element(sizes.begin(), sizes.end());
      out["tcp_loopback_gbps"] = TcpLoopbackRun(std::max<size_t>(largest, 64u << 20), 1, false);
    }
  } catch (const Failure& f) {
    std::cerr << "gmux bench: " << f.what << "\n";
    return 1;
  }

  if (o.json) {
    std::cout << out.dump() << "\n";
    return 0;
  }
  auto row = [](const std::string& what, double n, double g, double ratio, const std::string& goal) {
    std::printf("%-36s %12.4g %12.4g %8.2f  %s\n", what.c_str(), n, g, ratio, goal.c_str());
  };
  std::printf("gmux bench: native platform '%s', daemon %s, median of %d runs\n",
              out["native_platform"].get<std::string>().c_str(),
              out["daemon"].get<std::string>().c_str(), repeat);
  std::printf("%-36s %12s %12s %8s  %s\n", "measure", "native", "gmux", "ratio", "goal");
  // What gmux adds to native's `n` microseconds, in microseconds and in socket round trips.
  auto added = [rtt](double n, double g) {
    return "added " + std::to_string(static_cast<int>(g - n)) + " us = " +
           std::to_string(rtt > 0 ? (g - n) / rtt : 0).substr(0, 4) + " round trips";
  };
  const double ln = out["launch_us"]["native"]["p50"], lg = out["launch_us"]["gmux"]["p50"];
  row("blocking launch + clFinish p50 (us)", ln, lg, lg / ln, added(ln, lg) + "; <= 1");
  const double qn = out["launch_us"]["native"]["p99"], qg = out["launch_us"]["gmux"]["p99"];
  row("blocking launch + clFinish p99 (us)", qn, qg, qg / qn, "");
  const double tn = out["timed_launch_us"]["native"]["p50"];
  const double tg = out["timed_launch_us"]["gmux"]["p50"];
  row("launch timed by its event p50 (us)", tn, tg, tg / tn, added(tn, tg));
  const double hn = out["finish_timed_launch_us"]["native"]["p50"];
  const double hg = out["finish_timed_launch_us"]["gmux"]["p50"];
  row("  the same with clFinish p50 (us)", hn, hg, hg / hn, added(hn, hg));
  const double fn = out["idle_finish_us"]["native"]["p50"];
  const double fg = out["idle_finish_us"]["gmux"]["p50"];
  row("clFinish of an idle queue p50 (us)", fn, fg, fn > 0 ? fg / fn : 0, "");
  const double sn = out["status_poll_us"]["native"]["p50"];
  const double sg = out["status_poll_us"]["gmux"]["p50"];
  row("status of a pending command p50 (us)", sn, sg, sn > 0 ? sg / sn : 0,
      "the call itself: " + std::to_string(rtt > 0 ? (sg - sn) / rtt : 0).substr(0, 4) +
          " round trips");
  const double rn = out["pipelined_per_s"]["native"], rg = out["pipelined_per_s"]["gmux"];
  row("pipelined launches (1/s)", rn, rg, rg / rn, ">= 0.5");
  if (out.contains("clients")) {
    const std::string n = std::to_string(out["clients"]["count"].get<int>());
    const double cn = out["clients"]["native"]["per_s"], cg = out["clients"]["gmux"]["per_s"];
    row(n + " clients' launch + clFinish (1/s)", cn, cg, cn > 0 ? cg / cn : 0, "");
    const double pn = out["clients"]["native"]["p50_us"], pg = out["clients"]["gmux"]["p50_us"];
    row("  per client p50 (us)", pn, pg, pn > 0 ? pg / pn : 0, "");
  }
  for (const auto& t : out["transfers"]) {
    const std::string size = SizeName(t["bytes"].get<size_t>());
    const double wn = t["write_gbps"]["native"], wg = t["write_gbps"]["gmux"];
    const double dn = t["read_gbps"]["native"], dg = t["read_gbps"]["gmux"];
    row("blocking write " + size + " (GB/s)", wn, wg, wg / wn, ">= 0.9");
    row("blocking read " + size + " (GB/s)", dn, dg, dg / dn, ">= 0.9");
    const double wpn = t["write_us"]["native"]["p99"], wpg = t["write_us"]["gmux"]["p99"];
    const double rpn = t["read_us"]["native"]["p99"], rpg = t["read_us"]["gmux"]["p99"];
    row("  write " + size + " p99 (us)", wpn, wpg, wpg / wpn, "");
    row("  read " + size + " p99 (us)", rpn, rpg, rpg / rpn, "");
    if (t.contains("tcp_copy_gbps")) {
      // The columns: the plain socket copy of the same bytes, gmux's write / read over TCP.
      const double c = t["tcp_copy_gbps"];
      row("  TCP: socket copy, write (GB/s)", c, wg, c > 0 ? wg / c : 0, "close to 1");
      row("  TCP: socket copy, read (GB/s)", c, dg, c > 0 ? dg / c : 0, "close to 1");
    }
  }
  const double mn = out["matmul_ms"]["native"], mg = out["matmul_ms"]["gmux"];
  char pairs[64];
  std::snprintf(pairs, sizeof(pairs), "<= 1.02; run by run %.3f",
                out["matmul_pair_ratio"].get<double>());
  row(std::to_string(mm) + "^2 matmul end to end (ms)", mn, mg, mg / mn, pairs);
  const double an = out["create_release_us"]["native"], ag = out["create_release_us"]["gmux"];
  row("1 MiB create + release p50 (us)", an, ag, ag / an, "");
  const double gn = out["work_group_query_us"]["native"], gg = out["work_group_query_us"]["gmux"];
  row("work-group size query p50 (us)", gn, gg, gn > 0 ? gg / gn : 0, "");
  std::printf("%-36s %12.1f\n", "Unix socket round trip p50 (us)", rtt);
  if (out.contains("tcp_loopback_gbps")) {
    std::printf("%-36s %12.4g  (the largest size from one cached 4 MiB chunk into another)\n",
                "TCP loopback socket peak (GB/s)", out["tcp_loopback_gbps"].get<double>());
  }
  return 0;
}

}  // namespace gmux::cli
