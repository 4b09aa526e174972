// clpeak (Debian's package, an unmodified OpenCL benchmark) completes through gmux: every one of
// its test groups, run through the loader with only the gmux ICD registered, so clpeak sees the
// gmux platform alone. One CTest test per group keeps each well inside its time limit and lets
// CTest run them in parallel. Figures are not checked here (timing belongs in benchmarks); the
// run must exit 0, reach the gmux platform, print the group's results and report no OpenCL error.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <ostream>
#include <string>

#include "runtime/runtime_env.h"

namespace gmux::testing {
namespace {

struct Group {
  const char* flag;     // clpeak option
  const char* heading;  // what clpeak prints when the group ran
};

// Names the group in test output instead of printing the struct's bytes.
void PrintTo(const Group& g, std::ostream* os) { *os << g.flag; }

class ClpeakTest : public ::testing::TestWithParam<Group> {};

// A vendors dir holding only the gmux ICD.
std::string GmuxOnlyVendors() {
  std::string dir = RuntimeEnv::dir + "/gmux-only-vendors";
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/gmux.icd") << GMUX_ICD_PATH << "\n";
  return dir;
}

TEST_P(ClpeakTest, GroupCompletesThroughGmux) {
  if (std::system("command -v clpeak >/dev/null 2>&1") != 0) GTEST_SKIP() << "clpeak not installed";
  const Group& g = GetParam();
  std::string out;
  std::string cmd = "OCL_ICD_VENDORS=" + GmuxOnlyVendors() + " timeout 500 clpeak --" + g.flag;
  ASSERT_EQ(RunShell(cmd, out), 0) << out;
  EXPECT_NE(out.find("Platform: gmux"), std::string::npos) << out;
  EXPECT_EQ(out.find("Platform: Portable"), std::string::npos) << "clpeak saw the backend: " << out;
  EXPECT_NE(out.find(g.heading), std::string::npos) << out;
  for (const char* bad : {"error", "Error", "failed", "CL_"}) {
    EXPECT_EQ(out.find(bad), std::string::npos) << "'" << bad << "' in: " << out;
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllGroups, ClpeakTest,
    ::testing::Values(Group{"global-bandwidth", "Global memory bandwidth (GBPS)"},
                      Group{"compute-sp", "Single-precision compute (GFLOPS)"},
                      Group{"compute-dp", "Double-precision compute (GFLOPS)"},
                      Group{"compute-integer", "Integer compute (GIOPS)"},
                      Group{"compute-intfast", "Integer compute Fast 24bit (GIOPS)"},
                      Group{"transfer-bandwidth", "Transfer bandwidth (GBPS)"},
                      Group{"kernel-latency", "Kernel launch latency"}),
    [](const ::testing::TestParamInfo<Group>& param_info) {
      std::string name = param_info.param.flag;
      std::erase(name, '-');
      return name;
    });

}  // namespace
}  // namespace gmux::testing
