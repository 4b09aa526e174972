// Standard OpenCL tools through gmux: clinfo lists the gmux platform and its device cleanly.
// (clpeak, group by group, is in clpeak_test.cc.)
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "runtime/runtime_env.h"

namespace gmux::testing {
namespace {

TEST(ToolsTest, ClinfoShowsTheGmuxPlatformAndDevice) {
  if (std::system("command -v clinfo >/dev/null 2>&1") != 0) GTEST_SKIP() << "clinfo not installed";
  std::string out;
  ASSERT_EQ(RunShell("timeout 60 clinfo", out), 0) << out;
  EXPECT_NE(out.find("Platform Name                                   gmux"), std::string::npos) << out;
  EXPECT_NE(out.find("Platform Extensions function suffix             gmux"), std::string::npos);
  // The gmux device mirrors the backend's: its name appears twice (gmux and native).
  ClDevice native;
  ASSERT_TRUE(OpenDevice(kNative, native));
  char name[256] = {};
  clGetDeviceInfo(native.device, CL_DEVICE_NAME, sizeof(name), name, nullptr);
  size_t first = out.find(name);
  ASSERT_NE(first, std::string::npos);
  EXPECT_NE(out.find(name, first + 1), std::string::npos) << out;
  EXPECT_EQ(out.find("CL_INVALID"), std::string::npos) << out;
  EXPECT_EQ(out.find("CL_OUT_OF"), std::string::npos) << out;
}

}  // namespace
}  // namespace gmux::testing
