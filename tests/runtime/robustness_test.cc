// A real OpenCL client killed in the middle of large transfers and launches does not disturb
// the daemon: the next client's results are still right.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <vector>

#include "runtime/runtime_env.h"

namespace gmux::testing {
namespace {

const char* kInc = "__kernel void inc(__global int* a) { a[get_global_id(0)] += 1; }";

// Runs a small check through gmux; true when the result is right.
bool GmuxStillWorks() {
  ClDevice d;
  if (!OpenDevice(kGmux, d)) return false;
  cl_program p = BuildProgram(d, kInc);
  if (p == nullptr) return false;
  cl_int err;
  cl_kernel k = clCreateKernel(p, "inc", &err);
  std::vector<int> v(1024, 41);
  cl_mem m = clCreateBuffer(d.context, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, v.size() * 4, v.data(), &err);
  clSetKernelArg(k, 0, sizeof(cl_mem), &m);
  size_t g = v.size();
  clEnqueueNDRangeKernel(d.queue, k, 1, nullptr, &g, nullptr, 0, nullptr, nullptr);
  bool ok = clEnqueueReadBuffer(d.queue, m, CL_TRUE, 0, v.size() * 4, v.data(), 0, nullptr, nullptr) ==
            CL_SUCCESS;
  for (int x : v) ok = ok && x == 42;
  clReleaseMemObject(m);
  clReleaseKernel(k);
  clReleaseProgram(p);
  return ok;
}

TEST(RobustnessTest, ClientKilledMidTransferLeavesTheDaemonServing) {
  for (int round = 0; round < 3; ++round) {
    pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      // A fresh process: its own connection. Stream large writes, reads and launches forever.
      ClDevice d;
      if (!OpenDevice(kGmux, d)) ::_exit(1);
      cl_program p = BuildProgram(d, kInc);
      cl_int err;
      cl_kernel k = clCreateKernel(p, "inc", &err);
      std::vector<int> v((8u << 20) / 4, 1);
      cl_mem m = clCreateBuffer(d.context, CL_MEM_READ_WRITE, v.size() * 4, nullptr, &err);
      clSetKernelArg(k, 0, sizeof(cl_mem), &m);
      size_t g = v.size();
      for (;;) {
        clEnqueueWriteBuffer(d.queue, m, CL_FALSE, 0, v.size() * 4, v.data(), 0, nullptr, nullptr);
        clEnqueueNDRangeKernel(d.queue, k, 1, nullptr, &g, nullptr, 0, nullptr, nullptr);
        clEnqueueReadBuffer(d.queue, m, CL_TRUE, 0, v.size() * 4, v.data(), 0, nullptr, nullptr);
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(300 + 100 * round));
    ::kill(child, SIGKILL);
    int status = 0;
    ::waitpid(child, &status, 0);
    EXPECT_TRUE(WIFSIGNALED(status)) << "the client stopped on its own (round " << round << ")";
  }
  EXPECT_TRUE(GmuxStillWorks());
}

}  // namespace
}  // namespace gmux::testing
