// Standard OpenCL tools through gmux: clinfo lists the gmux platform and its device cleanly.
// (clpeak, group by group, is in clpeak_test.cc.)
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <string>

#include <nlohmann/json.hpp>

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

// `gmux bench` end to end with small sizes, against the test's daemon: every workload ran on
// both platforms with its results checked (the command fails otherwise), and the JSON has every
// figure.
TEST(ToolsTest, GmuxBenchRunsEndToEndWithSmallSizes) {
  std::string out;
  ASSERT_EQ(RunShell(std::string("timeout 300 ") + GMUX_CLI_PATH +
                         " bench --quick --json --repeat 1 --sizes 4K,64K 2>&1",
                     out),
            0)
      << out;
  auto j = nlohmann::json::parse(out.substr(out.find('{')), nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << out;
  EXPECT_GT(j["socket_round_trip_us"].get<double>(), 0);
  for (const char* p : {"native", "gmux"}) {
    EXPECT_GT(j["launch_us"][p]["p50"].get<double>(), 0) << p;
    EXPECT_GE(j["launch_us"][p]["p99"].get<double>(), j["launch_us"][p]["p50"].get<double>());
    EXPECT_GT(j["pipelined_per_s"][p].get<double>(), 0) << p;
    EXPECT_GE(j["idle_finish_us"][p]["p99"].get<double>(),
              j["idle_finish_us"][p]["p50"].get<double>()) << p;
    for (const char* key : {"timed_launch_us", "finish_timed_launch_us"}) {
      EXPECT_GT(j[key][p]["p50"].get<double>(), 0) << key << " " << p;
      EXPECT_GE(j[key][p]["p99"].get<double>(), j[key][p]["p50"].get<double>()) << key << " " << p;
    }
    EXPECT_GT(j["status_poll_us"][p]["p50"].get<double>(), 0) << p;
    EXPECT_GE(j["status_poll_us"][p]["p99"].get<double>(),
              j["status_poll_us"][p]["p50"].get<double>()) << p;
    EXPECT_GT(j["matmul_ms"][p].get<double>(), 0) << p;
    // The many-clients run: two processes at once on each platform.
    EXPECT_GT(j["clients"][p]["per_s"].get<double>(), 0) << p;
    EXPECT_GE(j["clients"][p]["p99_us"].get<double>(), j["clients"][p]["p50_us"].get<double>());
  }
  EXPECT_EQ(j["clients"]["count"], 2);
  EXPECT_GT(j["matmul_pair_ratio"].get<double>(), 0);
  ASSERT_EQ(j["transfers"].size(), 2u);
  EXPECT_EQ(j["transfers"][0]["bytes"], 4096);
  EXPECT_EQ(j["transfers"][1]["bytes"], 65536);
  for (const auto& t : j["transfers"]) {
    EXPECT_GT(t["write_gbps"]["gmux"].get<double>(), 0);
    EXPECT_GT(t["read_gbps"]["native"].get<double>(), 0);
  }
  // The daemon it measured is the test's own (named by $GMUX_SOCKET), not one it started.
  EXPECT_NE(j["daemon"].get<std::string>(), "started by gmux bench");
  // Bad input is a clear error and exit 2.
  EXPECT_EQ(RunShell(std::string(GMUX_CLI_PATH) + " bench --sizes 12Q 2>&1", out) != 0,
            true);
  EXPECT_NE(out.find("bad transfer size '12Q'"), std::string::npos) << out;
}

// `gmux demo fairness` with closed-loop tenants (launch + clFinish), end to end under credit:
// every tenant checks its kernel's results (a wrong result fails the command), the long launches
// ran in chunks beside the short tenant, and every figure of a normalised setup is there.
// (A 3-second window: on a host loaded by the rest of the suite, a tenant of 16x launches once
// got no device time at all within a 1-second window.)
TEST(ToolsTest, DemoFairnessClosedLoopsRunInChunksWithCorrectResults) {
  if (::getuid() != 0) GTEST_SKIP() << "needs root: each tenant runs as its own uid";
  std::string out;
  ASSERT_EQ(RunShell(std::string("timeout 300 ") + GMUX_CLI_PATH +
                         " demo fairness --json --setups closed-211 --policies credit"
                         " --window 3 --warmup 0.3 2>&1",
                     out),
            0)
      << out;
  auto j = nlohmann::json::parse(out.substr(out.find('{')), nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << out;
  ASSERT_EQ(j["runs"].size(), 1u) << out;
  const auto& r = j["runs"][0];
  ASSERT_FALSE(r.contains("error")) << out;
  ASSERT_EQ(r["tenants"].size(), 3u);
  double share_sum = 0;
  for (const auto& t : r["tenants"]) {
    EXPECT_GT(t["launches"].get<uint64_t>(), 0u) << t["name"];
    EXPECT_GT(t["alone_work_rate"].get<double>(), 0) << t["name"];
    EXPECT_GT(t["work_share"].get<double>(), 0) << t["name"];
    share_sum += t["share"].get<double>();
  }
  EXPECT_NEAR(share_sum, 1.0, 1e-9);
  const auto& x16 = r["tenants"][2];
  EXPECT_EQ(x16["name"], "x16");
  EXPECT_GT(x16["dispatches"].get<uint64_t>(), x16["commands"].get<uint64_t>())
      << "16x launches beside a 1x tenant run in chunks";
  EXPECT_GT(r["total_work"].get<double>(), 0);
  EXPECT_GE(r["jain"].get<double>(), 0);
}

// `gmux demo memory` on a small oversubscribed device: four tenants of 24 MiB on 64 MiB, every
// round's results checked against the CPU by the tenants themselves (a wrong one fails the
// run), and under every policy the runtime really moved data off the device and back.
TEST(ToolsTest, DemoMemoryMovesDataAndKeepsEveryResult) {
  if (::getuid() != 0) GTEST_SKIP() << "needs root: each tenant runs as its own uid";
  std::string out;
  // A run that does not finish in 40 s (2-3 s when quiet) reports the daemon's status and log.
  ASSERT_EQ(RunShell(std::string("timeout 280 ") + GMUX_CLI_PATH +
                         " demo memory --json --capacity 64MiB --slot 8MiB --mib 24 --rounds 3"
                         " --swap-batch 0,4 --timeout 40 2>&1",
                     out),
            0)
      << out;
  auto j = nlohmann::json::parse(out.substr(out.find('{')), nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << out;
  ASSERT_EQ(j["runs"].size(), 6u) << out;  // three policies, without and with swap batching
  EXPECT_GT(j["device_copy_gbps"].get<double>(), 0);
  for (const auto& r : j["runs"]) {
    ASSERT_FALSE(r.contains("error")) << r.dump();
    const auto& s = r["slots"];
    EXPECT_EQ(s["slots"].get<int>(), 8);
    EXPECT_GT(s["evictions"].get<int64_t>(), 0) << r["policy"];
    EXPECT_GT(s["restores"].get<int64_t>(), 0) << r["policy"];
    EXPECT_GT(s["slot_copies"].get<int64_t>(), 0) << r["policy"];
    EXPECT_GT(r["swap_gbps"].get<double>(), 0) << r["policy"];
    // A batch starts at every swap-in when batching is on, and never when it is off.
    EXPECT_EQ(s["swap_batch"].get<double>(), r["swap_batch"].get<double>());
    if (r["swap_batch"].get<double>() > 0) {
      EXPECT_GT(s["batches"].get<int64_t>(), 0) << r["policy"];
    } else {
      EXPECT_EQ(s["batches"].get<int64_t>(), 0) << r["policy"];
      EXPECT_EQ(s["batched_dispatches"].get<int64_t>(), 0) << r["policy"];
    }
    for (const auto& t : r["tenants"]) {
      EXPECT_EQ(t["rounds"].get<int>(), 3) << t["name"];
      EXPECT_EQ(t["rounds_wrong"].get<int>(), 0) << t["name"];
    }
  }
}

// `gmux demo pool` end to end on a small workload: every run of every tenant completed with
// right results (a wrong one fails the command), `static` holds one lease per tenant, `pool`
// takes one per run, and the simulator's figures for the same workload are beside them.
TEST(ToolsTest, DemoPoolRunsStaticAndPoolWithTheSimulatorsFigures) {
  if (::getuid() != 0) GTEST_SKIP() << "needs root: each tenant runs as its own uid";
  std::string out;
  ASSERT_EQ(RunShell(std::string("timeout 280 ") + GMUX_CLI_PATH +
                         " demo pool --json --devices 1,2 --sleeps 1 --tenants 2 --runs 2"
                         " --job 0.2 --timeout 60 2>&1",
                     out),
            0)
      << out;
  auto j = nlohmann::json::parse(out.substr(out.find('{')), nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << out;
  EXPECT_GT(j["job_s"].get<double>(), 0);
  ASSERT_EQ(j["configs"].size(), 2u) << out;
  for (const auto& c : j["configs"]) {
    for (const char* mode : {"static", "pool"}) {
      const auto& r = c[mode];
      ASSERT_FALSE(r.contains("error")) << r.dump();
      EXPECT_GT(r["normalized_time"].get<double>(), 0) << mode;
      ASSERT_EQ(r["runs"].size(), 2u) << mode;
      for (const auto& t : r["runs"]) EXPECT_EQ(t.size(), 2u) << mode;
      EXPECT_GT(c[std::string("sim_") + mode]["normalized_time"].get<double>(), 0) << mode;
    }
    EXPECT_EQ(c["static"]["grants"].get<int>(), 2) << c.dump();
    EXPECT_GE(c["pool"]["grants"].get<int>(), 4) << c.dump();
    EXPECT_TRUE(c.contains("gain_points"));
  }
}

}  // namespace
}  // namespace gmux::testing
