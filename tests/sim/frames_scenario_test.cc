#include "sim/frames_scenario.h"

#include <cmath>
#include <string>

#include <gtest/gtest.h>

#include "sim/frames_sim.h"
#include "sim/scenario_test_util.h"

namespace gmux::sim {
namespace {

using nlohmann::json;

const char* kSmall = R"(kind = "frames"
seed = 3
duration_s = 20
agent_overhead_ms = 1.0
policies = ["none", "sa", "esa"]
criterion_fps = 30

[[tenants]]
name = "heavy"
cpu_ms = 7
gpu_ms = 13
gpu_jitter = 0.05
scenes = [{ at_s = 8, gpu_ms = 16 }, { at_s = 10, gpu_ms = 13 }]

[[tenants]]
name = "light"
cpu_ms = 3
gpu_ms = 7
gpu_jitter = 0.05
)";

const json& FindRun(const json& out, const std::string& label) {
  for (const json& r : out["runs"]) {
    if (r["label"] == label) return r;
  }
  ADD_FAILURE() << "no run " << label;
  static const json kEmpty;
  return kEmpty;
}

TEST(FramesScenarioTest, SameSeedSameOutput) {
  ExpectDeterministicInSeed(kSmall, "seed = 3", "seed = 4");
}

TEST(FramesScenarioTest, JsonHasTheCommonAndTheFrameFields) {
  auto out = RunText(kSmall);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  const json& j = out->json;
  EXPECT_EQ(j["kind"], "frames");
  EXPECT_EQ(j["scenario"], "t");
  ASSERT_EQ(j["runs"].size(), 3u);
  for (const json& r : j["runs"]) {
    for (const char* k : {"label", "policy", "params", "lambda", "jain", "gpu_usage", "tenants"}) {
      EXPECT_TRUE(r.contains(k)) << k;
    }
    EXPECT_EQ(r["params"], json({{"criterion_fps", 30.0}}));
    double share = 0;
    for (const json& t : r["tenants"]) {
      for (const char* k : {"name", "weight", "share", "commands", "completions_s", "mean_fps",
                            "gpu_usage", "frames_over_34ms", "frames_over_60ms"}) {
        EXPECT_TRUE(t.contains(k)) << k;
      }
      share += t["share"].get<double>();
      EXPECT_GT(t["commands"].get<int64_t>(), 0);
    }
    EXPECT_NEAR(share, 1.0, 1e-9);
  }
  EXPECT_EQ(FindRun(j, "sa")["policy"], "sa");
  // FPS over time for every tenant of every run, and the device's usage.
  int fps_series = 0, usage_series = 0;
  for (const Series& s : out->series) {
    if (s.metric == "fps") ++fps_series;
    if (s.metric == "gpu_usage") ++usage_series;
  }
  EXPECT_EQ(fps_series, 6);
  EXPECT_EQ(usage_series, 3);
  EXPECT_NE(out->table.find("mean FPS"), std::string::npos);
}

TEST(FramesScenarioTest, BrokenFilesNameFileLineAndKey) {
  struct Case {
    std::string text;
    std::string expect;
  };
  auto replace = [](std::string text, const std::string& from, const std::string& to) {
    text.replace(text.find(from), from.size(), to);
    return text;
  };
  const std::string base = kSmall;
  std::vector<Case> cases = {
      {base + "\nbogus = 1\n", "b.toml:21: key 'bogus'"},
      {replace(base, "\"sa\", \"esa\"", "\"lottery\""), "b.toml:5: key 'policies'"},
      {base + "\n[controller]\nkp = 0.1\nki = -0.05\n", "b.toml:23: key 'ki'"},
      {replace(base, "cpu_ms = 7", "cpu_ms = -7"), "b.toml:10: key 'cpu_ms'"},
      {replace(base, "at_s = 10", "at_s = 1"), "b.toml:13: key 'at_s'"},
      {"kind = \"frames\"\npolicies = [\"sa\"]\n", "key 'tenants'"},
      {"kind = \"frames\"\n", "key 'policies'"},
  };
  for (const Case& c : cases) {
    auto out = RunText(c.text, "b.toml");
    ASSERT_FALSE(out.ok()) << c.expect;
    EXPECT_NE(out.status().message().find(c.expect), std::string::npos)
        << out.status().message();
  }
}

TEST(FramesScenarioTest, UnstableSweepConfigurationIsAnError) {
  auto out = RunText(R"(kind = "frames"
[sweep]
configs = [{ kp = 0.1, ki = 0.05 },
           { kp = 0.1, ki = -0.5 }]
[sweep.workload]
name = "w"
cpu_ms = 1
gpu_ms = 2
)",
                     "s.toml");
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("s.toml:4: key 'ki'"), std::string::npos)
      << out.status().message();
  EXPECT_NE(out.status().message().find("Eq. (8)"), std::string::npos);
}

// The reproduction itself: direction of the paper's results on scenarios/vgasa-sla.toml.
TEST(FramesScenarioTest, VgasaSlaPoliciesGoThePapersWay) {
  auto out = RunScenarioFile(std::string(GMUX_SOURCE_DIR) + "/scenarios/vgasa-sla.toml");
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  const json& none = FindRun(out->json, "none");
  const json& sa = FindRun(out->json, "sa");
  const json& fsa = FindRun(out->json, "fsa");
  const json& esa = FindRun(out->json, "esa");
  // No control: the GPU-heavy game misses the SLA.
  EXPECT_LT(none["tenants"][0]["mean_fps"].get<double>(), 28);
  // SA: every game near the criterion, with less GPU busy than without control.
  for (const json& t : sa["tenants"]) {
    EXPECT_NEAR(t["mean_fps"].get<double>(), 30, 1.0) << t["name"];
  }
  EXPECT_LT(sa["gpu_usage"].get<double>(), none["gpu_usage"].get<double>() - 0.1);
  // FSA: nobody below the criterion on average, and more GPU used than SA.
  for (const json& t : fsa["tenants"]) {
    EXPECT_GT(t["mean_fps"].get<double>(), 29.5) << t["name"];
  }
  EXPECT_GT(fsa["gpu_usage"].get<double>(), sa["gpu_usage"].get<double>() + 0.05);
  // ESA: one common rate above the criterion, the device busier than under SA.
  double lo = 1e9, hi = 0;
  for (const json& t : esa["tenants"]) {
    lo = std::min(lo, t["mean_fps"].get<double>());
    hi = std::max(hi, t["mean_fps"].get<double>());
  }
  EXPECT_GT(lo, 32);
  EXPECT_LT(hi - lo, 0.15 * hi);
  EXPECT_GT(esa["fps_jain"].get<double>(), none["fps_jain"].get<double>());
  EXPECT_GT(esa["gpu_usage"].get<double>(), sa["gpu_usage"].get<double>() + 0.1);
}

TEST(FramesScenarioTest, ControlSweepReportsPolesErrorsAndConvergence) {
  auto out = RunScenarioFile(std::string(GMUX_SOURCE_DIR) + "/scenarios/vgasa-control-sweep.toml");
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  const json& runs = out->json["runs"];
  ASSERT_EQ(runs.size(), 6u);
  // k_i = 0: no pole, a steady-state error that shrinks as k_p grows.
  double last_error = 0;
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(runs[i]["pole"].is_null());
    EXPECT_EQ(runs[i]["ki"], 0.0);
    double err = std::abs(runs[i]["steady_state_error"].get<double>());
    EXPECT_GT(err, 1.0);
    EXPECT_GT(err, last_error);  // k_p = 0.5, 0.25, 0.1
    last_error = err;
  }
  // k_p = 0.1 with k_i = 0.5, 0.1, 0.05: the poles of Fig. 8c, no steady-state error, and the
  // slower the pole the more frames to converge.
  const double poles[] = {0.6875, 0.9167, 0.9565};
  int64_t last_frames = -1;
  for (int i = 3; i < 6; ++i) {
    EXPECT_NEAR(runs[i]["pole"].get<double>(), poles[i - 3], 5e-5);
    EXPECT_EQ(runs[i]["params"], json({{"kp", 0.1}, {"ki", runs[i]["ki"].get<double>()}}));
    EXPECT_LT(std::abs(runs[i]["steady_state_error"].get<double>()), 0.3);
    ASSERT_FALSE(runs[i]["frames_to_converge"].is_null());
    int64_t frames = runs[i]["frames_to_converge"].get<int64_t>();
    EXPECT_GT(frames, last_frames);
    last_frames = frames;
  }
}

TEST(FrameSimTest, FifoDeviceAndOptionsValidation) {
  FrameSimOptions o;
  EXPECT_FALSE(o.Validate().ok());  // no tenants
  o.tenants.push_back(FrameWorkload{"a", 1, 2, 4, 0, 0, {}});
  o.tenants.push_back(FrameWorkload{"b", 1, 2, 4, 0, 0, {}});
  o.duration_s = 5;
  o.sharing = DeviceSharing::kFifo;
  o.policy.kind = core::SlaKind::kNone;
  auto r = RunFrameSim(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  // Two tenants of 2 ms CPU + 4 ms GPU on one FIFO device: the GPU is the bottleneck, 8 ms a
  // round, so about 125 FPS each and the device busy nearly all the time.
  for (const auto& t : r->tenants) EXPECT_NEAR(t.mean_fps, 125, 3);
  EXPECT_GT(r->gpu_usage, 0.97);
  o.controller.ki = -1;  // unstable
  EXPECT_FALSE(RunFrameSim(o).ok());
}

}  // namespace
}  // namespace gmux::sim
