// Many ordinary clients at once: each a separate process running a closed loop the obvious way
// (one small launch, then clFinish; or a blocking write and read back), with every result
// checked, against one gmuxd with the default config. When the test runs as root each client
// takes a uid of its own (so each is a tenant of its own, as on a shared host). The daemon must
// stay up, answer every client, and keep its memory bounded.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "runtime/runtime_env.h"

namespace gmux::testing {
namespace {

const char* kAdd = "__kernel void add(__global int* a, int k) { a[get_global_id(0)] += k; }";

// Resident memory of a process in KiB (0 when unknown).
long RssKiB(int pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::atol(line.c_str() + 6);
  }
  return 0;
}

enum class Loop { kLaunches, kTransfers };

// One client process's body: exit code 0 when every result was right, 10+ for each kind of
// failure (so the parent can say which).
int ClientMain(int index, Loop loop, std::chrono::milliseconds run_for, int max_iterations) {
  if (::geteuid() == 0) {
    // A tenant of its own: uids above any real account's.
    uid_t uid = 61000 + static_cast<uid_t>(index);
    if (::setgid(uid) != 0 || ::setuid(uid) != 0) return 10;
  }
  ClDevice d;
  if (!OpenDevice(kGmux, d)) return 11;
  cl_program p = BuildProgram(d, kAdd);
  if (p == nullptr) return 12;
  cl_int err = CL_SUCCESS;
  cl_kernel k = clCreateKernel(p, "add", &err);
  if (k == nullptr) return 13;
  const size_t n = loop == Loop::kLaunches ? 4096 : (1u << 20) / 4;
  std::vector<int> v(n, index);
  cl_mem m = clCreateBuffer(d.context, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, n * sizeof(int),
                            v.data(), &err);
  if (m == nullptr) return 14;
  auto end = std::chrono::steady_clock::now() + run_for;
  int expect = index;
  for (int it = 0; it < max_iterations && std::chrono::steady_clock::now() < end; ++it) {
    if (loop == Loop::kLaunches) {
      int inc = 1 + (it % 3);
      clSetKernelArg(k, 0, sizeof(cl_mem), &m);
      clSetKernelArg(k, 1, sizeof(int), &inc);
      if (clEnqueueNDRangeKernel(d.queue, k, 1, nullptr, &n, nullptr, 0, nullptr, nullptr) !=
          CL_SUCCESS) {
        return 15;
      }
      if (clFinish(d.queue) != CL_SUCCESS) return 16;
      expect += inc;
    } else {
      for (size_t i = 0; i < n; i += 997) v[i] = index * 1000 + it + static_cast<int>(i);
      if (clEnqueueWriteBuffer(d.queue, m, CL_TRUE, 0, n * sizeof(int), v.data(), 0, nullptr,
                               nullptr) != CL_SUCCESS) {
        return 15;
      }
      std::vector<int> back(n, -1);
      if (clEnqueueReadBuffer(d.queue, m, CL_TRUE, 0, n * sizeof(int), back.data(), 0, nullptr,
                              nullptr) != CL_SUCCESS) {
        return 16;
      }
      if (back != v) return 17;
    }
  }
  if (loop == Loop::kLaunches) {
    std::vector<int> back(n, -1);
    if (clEnqueueReadBuffer(d.queue, m, CL_TRUE, 0, n * sizeof(int), back.data(), 0, nullptr,
                            nullptr) != CL_SUCCESS) {
      return 16;
    }
    for (int x : back) {
      if (x != expect) return 17;
    }
  }
  clReleaseMemObject(m);
  clReleaseKernel(k);
  clReleaseProgram(p);
  return 0;
}

// Runs `clients` client processes at once and checks every one succeeded and the daemon lived.
void RunLoad(int clients, Loop loop, std::chrono::milliseconds run_for, int max_iterations) {
  // One client first, so the baseline includes what the first compile and launch set up.
  pid_t warm = ::fork();
  ASSERT_GE(warm, 0);
  if (warm == 0) ::_exit(ClientMain(0, loop, std::chrono::milliseconds(0), 1));
  int warm_status = 0;
  ::waitpid(warm, &warm_status, 0);
  ASSERT_TRUE(WIFEXITED(warm_status) && WEXITSTATUS(warm_status) == 0);
  const long rss_before = RssKiB(RuntimeEnv::daemon_pid);
  std::vector<pid_t> pids;
  for (int i = 0; i < clients; ++i) {
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) ::_exit(ClientMain(i, loop, run_for, max_iterations));
    pids.push_back(pid);
  }
  int failed = 0;
  for (size_t i = 0; i < pids.size(); ++i) {
    int status = 0;
    ::waitpid(pids[i], &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      ++failed;
      ADD_FAILURE() << "client " << i << " failed: "
                    << (WIFEXITED(status) ? "exit " + std::to_string(WEXITSTATUS(status))
                                          : "signal " + std::to_string(WTERMSIG(status)));
    }
  }
  EXPECT_EQ(failed, 0);
  int status = 0;
  ASSERT_EQ(::waitpid(RuntimeEnv::daemon_pid, &status, WNOHANG), 0) << "gmuxd died under load";
  const long rss_after = RssKiB(RuntimeEnv::daemon_pid);
  // Bounded: the daemon holds nothing per finished client (generous, so a loaded machine and
  // allocator caching cannot fail it; a leak per command would exceed it by far).
  EXPECT_LT(rss_after, rss_before + 64 * 1024) << "gmuxd RSS " << rss_before << " -> " << rss_after
                                               << " KiB";
}

// Under sanitizers (FewIterations) a loop stops early: 50 launches, or 12 round trips of 1 MiB
// (50 of them took 68 s under TSan on 2 cores), per client.
int Iterations(Loop loop) {
  if (!FewIterations()) return 1 << 30;
  return loop == Loop::kLaunches ? 50 : 12;
}

TEST(LoadTest, EightClosedLoopsOfTinyLaunches) {
  RunLoad(8, Loop::kLaunches, std::chrono::seconds(3), Iterations(Loop::kLaunches));
}

TEST(LoadTest, EightClosedLoopsOfTransfers) {
  RunLoad(8, Loop::kTransfers, std::chrono::seconds(2), Iterations(Loop::kTransfers));
}

TEST(LoadTest, SixtyFourClosedLoopsOfTinyLaunches) {
  RunLoad(64, Loop::kLaunches, std::chrono::seconds(3), Iterations(Loop::kLaunches) / 4 + 20);
}

TEST(LoadTest, SixtyFourClosedLoopsOfTransfers) {
  RunLoad(64, Loop::kTransfers, std::chrono::seconds(2), Iterations(Loop::kTransfers) / 2 + 5);
}

}  // namespace
}  // namespace gmux::testing
