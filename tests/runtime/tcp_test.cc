// The TCP transport: the ICD reaches gmuxd through GMUX_ADDRESS (127.0.0.1, the port the daemon
// bound for port 0) and identifies its tenant with GMUX_TOKEN. programs_tcp_test and
// transfers_tcp_test run the whole program and transfer suites the same way (bulk data inline).
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/runtime_env.h"

namespace gmux::testing {
namespace {

// Runs this test binary again with only `test` selected and GMUX_TOKEN set to `token` (unset
// when null); returns its exit status.
int RunChild(const std::string& test, const char* token) {
  pid_t pid = ::fork();
  if (pid == 0) {
    ::setenv("GMUX_TEST_CHILD", "1", 1);
    if (token != nullptr) {
      ::setenv("GMUX_TOKEN", token, 1);
    } else {
      ::unsetenv("GMUX_TOKEN");
    }
    std::string filter = "--gtest_filter=" + test;
    ::execl("/proc/self/exe", "tcp_test", filter.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(TcpTest, TheIcdReachesTheDaemonOverTcp) {
  ASSERT_GT(RuntimeEnv::tcp_port, 0);
  ASSERT_EQ(std::getenv("GMUX_SOCKET"), nullptr);  // TCP is the only way in
  ClDevice d;
  ASSERT_TRUE(OpenDevice(kGmux, d));
  cl_int err;
  std::vector<int> in(1000, 3), out(1000, 0);
  cl_mem m = clCreateBuffer(d.context, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, in.size() * 4,
                            in.data(), &err);
  ASSERT_EQ(err, CL_SUCCESS);
  cl_program p = BuildProgram(d, "__kernel void sq(__global int* a) { int i = get_global_id(0); a[i] *= a[i]; }");
  ASSERT_NE(p, nullptr);
  cl_kernel k = clCreateKernel(p, "sq", &err);
  ASSERT_EQ(clSetKernelArg(k, 0, sizeof(m), &m), CL_SUCCESS);
  size_t gs = in.size();
  ASSERT_EQ(clEnqueueNDRangeKernel(d.queue, k, 1, nullptr, &gs, nullptr, 0, nullptr, nullptr), CL_SUCCESS);
  ASSERT_EQ(clEnqueueReadBuffer(d.queue, m, CL_TRUE, 0, out.size() * 4, out.data(), 0, nullptr, nullptr),
            CL_SUCCESS);
  EXPECT_EQ(out, std::vector<int>(1000, 9));
  clReleaseKernel(k);
  clReleaseProgram(p);
  clReleaseMemObject(m);
}

// `gmux bench --address` over TCP, end to end with small sizes: gmux's transfers over TCP, and
// for each size the plain socket copy of the same bytes they are read against, and the
// socket's peak.
TEST(TcpTest, GmuxBenchMeasuresTransfersAgainstPlainSocketCopies) {
  ASSERT_GT(RuntimeEnv::tcp_port, 0);
  std::string out;
  const std::string address = "tcp://127.0.0.1:" + std::to_string(RuntimeEnv::tcp_port);
  ASSERT_EQ(RunShell(std::string("timeout 300 ") + GMUX_CLI_PATH +
                         " bench --quick --json --repeat 1 --sizes 64K,1M --address " + address +
                         " 2>&1",
                     out),
            0)
      << out;
  auto j = nlohmann::json::parse(out.substr(out.find('{')), nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << out;
  EXPECT_NE(j["daemon"].get<std::string>().find("tcp://"), std::string::npos);
  EXPECT_GT(j["tcp_loopback_gbps"].get<double>(), 0);
  ASSERT_EQ(j["transfers"].size(), 2u) << out;
  for (const auto& t : j["transfers"]) {
    EXPECT_GT(t["tcp_copy_gbps"].get<double>(), 0) << t["bytes"];
    EXPECT_GT(t["write_gbps"]["gmux"].get<double>(), 0) << t["bytes"];
    EXPECT_GT(t["read_gbps"]["gmux"].get<double>(), 0) << t["bytes"];
  }
}

// Run only as a child by the tests below: the gmux platform must list no devices, promptly.
TEST(TcpTest, ChildProcessSeesNoDevices) {
  if (std::getenv("GMUX_TEST_CHILD") == nullptr) GTEST_SKIP() << "run by WrongTokenIsRejected";
  cl_platform_id p = FindPlatform(kGmux);
  ASSERT_NE(p, nullptr);
  cl_uint n = 99;
  cl_device_id dev = nullptr;
  EXPECT_EQ(clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, 1, &dev, &n), CL_DEVICE_NOT_FOUND);
}

// The child with the right token sees the device (so the check above can fail).
TEST(TcpTest, ChildProcessSeesTheDevice) {
  if (std::getenv("GMUX_TEST_CHILD") == nullptr) GTEST_SKIP() << "run by WrongTokenIsRejected";
  ClDevice d;
  EXPECT_TRUE(OpenDevice(kGmux, d));
}

TEST(TcpTest, WrongOrMissingTokenIsRejected) {
  EXPECT_EQ(RunChild("TcpTest.ChildProcessSeesNoDevices", "not-the-token"), 0);
  EXPECT_EQ(RunChild("TcpTest.ChildProcessSeesNoDevices", nullptr), 0);
  EXPECT_EQ(RunChild("TcpTest.ChildProcessSeesTheDevice", kTcpToken), 0);
  // The rejected clients did not disturb this one.
  ClDevice d;
  EXPECT_TRUE(OpenDevice(kGmux, d));
}

}  // namespace
}  // namespace gmux::testing
