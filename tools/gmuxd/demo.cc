// gmux-demo-tenants: starts a private gmuxd and runs the same OpenCL workload from several
// tenants through the gmux ICD, checking every result on the CPU and printing per-tenant
// results. Run as root, each tenant process switches to its own uid (60001, 60002, ...) and so is
// its own tenant; otherwise all share the caller's tenant (the demo says so).
//
// Usage: gmux-demo-tenants [--tenants N] [--rounds R]
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace {

const char* kSource = R"(
__kernel void vadd(__global const float* a, __global const float* b, __global float* c) {
  int i = get_global_id(0);
  c[i] = a[i] + b[i];
}
__kernel void matmul(__global const float* A, __global const float* B, __global float* C, int n) {
  int row = get_global_id(1), col = get_global_id(0);
  float acc = 0.0f;
  for (int k = 0; k < n; ++k) acc += A[row * n + k] * B[k * n + col];
  C[row * n + col] = acc;
})";

#define CHECK(expr)                                                              \
  do {                                                                           \
    cl_int e_ = (expr);                                                          \
    if (e_ != CL_SUCCESS) {                                                      \
      std::fprintf(stderr, "tenant %d: %s failed: %d\n", index, #expr, e_);      \
      return 1;                                                                  \
    }                                                                            \
  } while (0)

// One tenant's workload; returns the process exit status.
int Tenant(int index, int rounds) {
  cl_platform_id platform;
  cl_uint np = 0;
  if (clGetPlatformIDs(1, &platform, &np) != CL_SUCCESS || np == 0) {
    std::fprintf(stderr, "tenant %d: no gmux platform\n", index);
    return 1;
  }
  char pname[64] = {}, dname[256] = {};
  clGetPlatformInfo(platform, CL_PLATFORM_NAME, sizeof(pname), pname, nullptr);
  cl_device_id dev;
  CHECK(clGetDeviceIDs(platform, CL_DEVICE_TYPE_ALL, 1, &dev, nullptr));
  clGetDeviceInfo(dev, CL_DEVICE_NAME, sizeof(dname), dname, nullptr);
  cl_int err;
  cl_context ctx = clCreateContext(nullptr, 1, &dev, nullptr, nullptr, &err);
  CHECK(err);
  cl_command_queue q = clCreateCommandQueue(ctx, dev, CL_QUEUE_PROFILING_ENABLE, &err);
  CHECK(err);
  cl_program p = clCreateProgramWithSource(ctx, 1, &kSource, nullptr, &err);
  CHECK(clBuildProgram(p, 1, &dev, "", nullptr, nullptr));
  cl_kernel vadd = clCreateKernel(p, "vadd", &err);
  cl_kernel mm = clCreateKernel(p, "matmul", &err);

  const int n = 1 << 20, m = 128;
  std::vector<float> a(n), b(n), c(n), A(m * m), B(m * m), C(m * m);
  for (int i = 0; i < n; ++i) {
    a[i] = static_cast<float>(i % 1000) * 0.5f + static_cast<float>(index);
    b[i] = static_cast<float>(i % 77);
  }
  for (int i = 0; i < m * m; ++i) {
    A[i] = static_cast<float>((i * 7 + index) % 13) * 0.25f;
    B[i] = static_cast<float>((i * 3) % 11) * 0.5f;
  }
  cl_mem da = clCreateBuffer(ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, n * 4, a.data(), &err);
  cl_mem db = clCreateBuffer(ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, n * 4, b.data(), &err);
  cl_mem dc = clCreateBuffer(ctx, CL_MEM_WRITE_ONLY, n * 4, nullptr, &err);
  cl_mem dA = clCreateBuffer(ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, m * m * 4, A.data(), &err);
  cl_mem dB = clCreateBuffer(ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, m * m * 4, B.data(), &err);
  cl_mem dC = clCreateBuffer(ctx, CL_MEM_WRITE_ONLY, m * m * 4, nullptr, &err);
  CHECK(err);
  clSetKernelArg(vadd, 0, sizeof(cl_mem), &da);
  clSetKernelArg(vadd, 1, sizeof(cl_mem), &db);
  clSetKernelArg(vadd, 2, sizeof(cl_mem), &dc);
  clSetKernelArg(mm, 0, sizeof(cl_mem), &dA);
  clSetKernelArg(mm, 1, sizeof(cl_mem), &dB);
  clSetKernelArg(mm, 2, sizeof(cl_mem), &dC);
  clSetKernelArg(mm, 3, sizeof(int), &m);

  auto start = std::chrono::steady_clock::now();
  cl_ulong device_ns = 0;
  size_t gn = n, gm[2] = {static_cast<size_t>(m), static_cast<size_t>(m)};
  for (int r = 0; r < rounds; ++r) {
    cl_event e1, e2;
    CHECK(clEnqueueNDRangeKernel(q, vadd, 1, nullptr, &gn, nullptr, 0, nullptr, &e1));
    CHECK(clEnqueueNDRangeKernel(q, mm, 2, nullptr, gm, nullptr, 0, nullptr, &e2));
    CHECK(clWaitForEvents(1, &e2));
    for (cl_event e : {e1, e2}) {
      cl_ulong s = 0, t = 0;
      clGetEventProfilingInfo(e, CL_PROFILING_COMMAND_START, sizeof(s), &s, nullptr);
      clGetEventProfilingInfo(e, CL_PROFILING_COMMAND_END, sizeof(t), &t, nullptr);
      device_ns += t - s;
      clReleaseEvent(e);
    }
  }
  CHECK(clEnqueueReadBuffer(q, dc, CL_TRUE, 0, n * 4, c.data(), 0, nullptr, nullptr));
  CHECK(clEnqueueReadBuffer(q, dC, CL_TRUE, 0, m * m * 4, C.data(), 0, nullptr, nullptr));
  double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  int wrong = 0;
  for (int i = 0; i < n; ++i) wrong += c[i] != a[i] + b[i];
  for (int i = 0; i < m; i += 17) {
    for (int j = 0; j < m; j += 13) {
      double ref = 0;
      for (int k = 0; k < m; ++k) ref += static_cast<double>(A[i * m + k]) * B[k * m + j];
      wrong += std::fabs(ref - C[i * m + j]) > 1e-3 * std::fabs(ref) + 1e-3;
    }
  }
  std::printf("tenant %d (uid %d): %-5s on %s/%s  rounds %d  wall %.3f s  device %.3f s  %s\n",
              index, static_cast<int>(::getuid()), wrong == 0 ? "OK" : "WRONG", pname, dname,
              rounds, wall, static_cast<double>(device_ns) * 1e-9,
              wrong == 0 ? "(results match the CPU)" : "(results differ from the CPU)");
  std::fflush(stdout);
  for (cl_mem x : {da, db, dc, dA, dB, dC}) clReleaseMemObject(x);
  clReleaseKernel(vadd);
  clReleaseKernel(mm);
  clReleaseProgram(p);
  clReleaseCommandQueue(q);
  clReleaseContext(ctx);
  return wrong == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  int tenants = 3, rounds = 10;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--tenants") == 0) tenants = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--rounds") == 0) rounds = std::atoi(argv[i + 1]);
  }
  if (tenants < 1 || tenants > 64 || rounds < 1) {
    std::fprintf(stderr, "usage: gmux-demo-tenants [--tenants 1..64] [--rounds R]\n");
    return 2;
  }
  std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe");
  std::string gmuxd = (exe.parent_path() / "gmuxd").string();
  std::string icd = (exe.parent_path().parent_path() / "lib" / "libgmux-icd.so").string();

  char tmpl[] = "/tmp/gmux-demo-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) return 1;
  std::string dir = tmpl, socket = dir + "/gmuxd.sock", vendors = dir + "/vendors";
  ::chmod(tmpl, 0755);  // tenants running under other uids must reach the socket
  std::filesystem::create_directories(vendors);
  ::chmod(vendors.c_str(), 0755);
  std::ofstream(vendors + "/gmux.icd") << icd << "\n";
  ::chmod((vendors + "/gmux.icd").c_str(), 0644);

  pid_t daemon = ::fork();
  if (daemon == 0) {
    ::execl(gmuxd.c_str(), gmuxd.c_str(), "--socket", socket.c_str(), "--exit-after", "600",
            static_cast<char*>(nullptr));
    ::_exit(127);
  }
  for (int i = 0; i < 1000 && !std::filesystem::exists(socket); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  bool root = ::getuid() == 0;
  std::printf("gmux demo: %d tenants x %d rounds of vector add (1M floats) + matmul (128x128)\n",
              tenants, rounds);
  if (!root) std::printf("(not root: every tenant process runs as uid %d, so they share one tenant)\n",
                         static_cast<int>(::getuid()));
  std::fflush(stdout);
  std::vector<pid_t> kids;
  for (int t = 0; t < tenants; ++t) {
    pid_t pid = ::fork();
    if (pid == 0) {
      if (root) {
        uid_t uid = static_cast<uid_t>(60001 + t);
        if (::setgid(uid) != 0 || ::setuid(uid) != 0) ::_exit(3);
      }
      ::setenv("OCL_ICD_VENDORS", vendors.c_str(), 1);
      ::setenv("GMUX_SOCKET", socket.c_str(), 1);
      ::_exit(Tenant(t + 1, rounds));
    }
    kids.push_back(pid);
  }
  int failures = 0;
  for (pid_t k : kids) {
    int status = 0;
    ::waitpid(k, &status, 0);
    failures += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  ::kill(daemon, SIGTERM);
  int status;
  ::waitpid(daemon, &status, 0);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  std::printf("gmux demo: %d of %d tenants finished with correct results\n", tenants - failures,
              tenants);
  return failures == 0 ? 0 : 1;
}
