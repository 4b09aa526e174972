#include "sim/kernel_scenario.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>

#include "sim/scenario.h"
#include "sim/scenario_test_util.h"

namespace gmux::sim {
namespace {

using nlohmann::json;

constexpr const char* kSmall = R"(kind = "kernel"
name = "small"
seed = 5
policies = ["fifo", "rr"]
duration_s = 2

[workload.frames]
type = "frames"
blocks_per_frame = 3
jitter_s = 2e-4
burst_prob = 0.01
burst_len = 50
burst_depth = 2
cost_cv = 0.2

[workload.mm]
type = "matmul"
n = 512

[[experiment]]
name = "sweep"
tenants = [2, 3]
[[experiment.mix]]
name = "same"
workloads = ["frames"]
[[experiment.mix]]
name = "mixed"
workloads = ["frames", "mm"]

[[experiment]]
name = "explicit"
[[experiment.tenant]]
name = "big"
weight = 2
workload = "frames"
[[experiment.tenant]]
name = "small"
workload = "mm"
)";

std::string ErrorOf(const std::string& text) {
  auto out = RunText(text, "bad.toml");
  if (out.ok()) return "(no error)";
  return out.status().message();
}

TEST(KernelScenarioTest, SameSeedGivesIdenticalJson) {
  ExpectDeterministicInSeed(kSmall, "seed = 5", "seed = 6");
}

TEST(KernelScenarioTest, SweepsExpandAndParamsExcludeThePolicy) {
  auto out = RunText(kSmall);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  const json& j = out->json;
  EXPECT_EQ(j["scenario"], "small");
  EXPECT_EQ(j["kind"], "kernel");
  // 2 tenant counts x 2 mixes + 1 explicit set, each under 2 policies.
  ASSERT_EQ(j["runs"].size(), 10u);
  std::map<std::string, std::set<std::string>> policies_by_params;
  for (const auto& r : j["runs"]) {
    for (auto key : {"label", "policy", "params", "lambda", "jain", "tenants"}) {
      EXPECT_TRUE(r.contains(key)) << key;
    }
    EXPECT_FALSE(r["params"].contains("policy"));
    policies_by_params[r["params"].dump()].insert(r["policy"].get<std::string>());
    EXPECT_EQ(r["tenants"].size(), r["params"]["tenants"].get<size_t>());
    double share = 0;
    for (const auto& t : r["tenants"]) {
      for (auto key : {"name", "weight", "share", "commands", "completions_s"}) {
        EXPECT_TRUE(t.contains(key)) << key;
      }
      share += t["share"].get<double>();
    }
    EXPECT_NEAR(share, 1.0, 1e-9);
  }
  ASSERT_EQ(policies_by_params.size(), 5u);
  for (const auto& [params, policies] : policies_by_params) {
    EXPECT_EQ(policies, (std::set<std::string>{"fifo", "rr"})) << params;
  }
  const json& last = j["runs"][9];
  EXPECT_EQ(last["tenants"][0]["name"], "big");
  EXPECT_EQ(last["tenants"][0]["weight"], 2.0);
  EXPECT_EQ(last["params"]["weights"], "2:1");
  // Series: one per tenant per run, one point per 1 s window.
  size_t tenants = 0;
  for (const auto& r : j["runs"]) tenants += r["tenants"].size();
  ASSERT_EQ(out->series.size(), tenants);
  for (const auto& s : out->series) EXPECT_EQ(s.points.size(), 2u) << s.run_label;
  EXPECT_NE(out->table.find("sweep"), std::string::npos);
}

TEST(KernelScenarioTest, RepetitionsCollectCompletionTimes) {
  constexpr const char* kReps = R"(kind = "kernel"
policies = ["fifo"]
repetitions = 4
[workload.mm]
type = "matmul"
n = 1024
tasks = 2
start_jitter_s = 0.01
[[experiment]]
tenants = 3
workloads = ["mm"]
)";
  auto out = RunText(kReps);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  const json& run = out->json["runs"][0];
  EXPECT_EQ(run["repetitions"], 4);
  for (const auto& t : run["tenants"]) {
    EXPECT_EQ(t["completions_s"].size(), 8u);
    EXPECT_EQ(t["completion"]["count"], 8u);
    EXPECT_GT(t["completion"]["mean"].get<double>(), 0);
  }
  EXPECT_NE(out->table.find("deviation"), std::string::npos);
}

TEST(KernelScenarioTest, BrokenFilesNameFileLineAndKey) {
  std::string unknown = kSmall;
  unknown.replace(unknown.find("n = 512"), 7, "n = 512\nsize = 3");
  EXPECT_NE(ErrorOf(unknown).find("bad.toml:19: key 'size'"), std::string::npos) << ErrorOf(unknown);

  std::string bad_type = kSmall;
  bad_type.replace(bad_type.find("blocks_per_frame = 3"), 20, "blocks_per_frame = 'x'");
  EXPECT_NE(ErrorOf(bad_type).find("bad.toml:9: key 'blocks_per_frame'"), std::string::npos)
      << ErrorOf(bad_type);

  std::string bad_workload = kSmall;
  const std::string mix = "workloads = [\"frames\", \"mm\"]";
  bad_workload.replace(bad_workload.find(mix), mix.size(), "workloads = [\"frames\", \"nope\"]");
  EXPECT_NE(ErrorOf(bad_workload).find("key 'workloads': unknown workload 'nope'"), std::string::npos)
      << ErrorOf(bad_workload);

  std::string bad_policy = kSmall;
  bad_policy.replace(bad_policy.find("\"rr\""), 4, "\"lottery\"");
  EXPECT_NE(ErrorOf(bad_policy).find("bad.toml:4: key 'policies'"), std::string::npos)
      << ErrorOf(bad_policy);

  std::string no_duration = kSmall;
  no_duration.replace(no_duration.find("duration_s = 2"), 14, "");
  EXPECT_NE(ErrorOf(no_duration).find("key 'duration_s'"), std::string::npos) << ErrorOf(no_duration);

  std::string negative = kSmall;
  negative.replace(negative.find("jitter_s = 2e-4"), 15, "jitter_s = -1");
  EXPECT_NE(ErrorOf(negative).find("bad.toml:10: key 'jitter_s'"), std::string::npos)
      << ErrorOf(negative);

  std::string policy_param = kSmall;
  policy_param += "\n[policy.rr]\nquantum = 3\n";
  EXPECT_NE(ErrorOf(policy_param).find("key 'policy.rr'"), std::string::npos) << ErrorOf(policy_param);

  EXPECT_NE(ErrorOf("kind = \"kernel\"\n[workload.a]\ntype = \"frames\"\n").find("'experiment'"),
            std::string::npos);
}

Result<ScenarioOutput> RunFile(const std::string& name) {
  return RunScenarioFile(std::string(GMUX_SOURCE_DIR) + "/scenarios/" + name);
}

// VMCG: credit's λ is below FIFO's in every parameter group of the reproduction scenario.
TEST(KernelScenarioTest, VmcgCreditIsFairerThanFifoInEveryGroup) {
  auto out = RunFile("vmcg-fairness.toml");
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  std::map<std::string, std::map<std::string, double>> lambda;
  for (const auto& r : out->json["runs"]) {
    lambda[r["params"].dump()][r["policy"].get<std::string>()] = r["lambda"].get<double>();
  }
  ASSERT_EQ(lambda.size(), 8u);
  for (const auto& [params, by_policy] : lambda) {
    ASSERT_EQ(by_policy.count("fifo"), 1u);
    ASSERT_EQ(by_policy.count("credit"), 1u);
    EXPECT_LT(by_policy.at("credit"), by_policy.at("fifo")) << params;
  }
}

// Kang & Yu: split lowers the short-task group's completion-time deviation in every group.
TEST(KernelScenarioTest, KangYuSplitLowersShortTaskDeviation) {
  auto out = RunFile("kangyu-deviation.toml");
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  std::map<std::string, std::map<std::string, double>> short_deviation;
  for (const auto& r : out->json["runs"]) {
    EXPECT_EQ(r["repetitions"], 10);
    ASSERT_EQ(r["tenants"].size(), 6u);
    for (const auto& t : r["tenants"]) EXPECT_EQ(t["completions_s"].size(), 10u);
    // The first workload of every mix is the short one.
    const json& group = r["by_workload"][0];
    EXPECT_EQ(group["tenants"], 3u);
    short_deviation[r["params"].dump()][r["policy"].get<std::string>()] =
        group["deviation"].get<double>();
  }
  ASSERT_EQ(short_deviation.size(), 3u);
  for (const auto& [params, d] : short_deviation) {
    EXPECT_LT(d.at("split"), 0.5 * d.at("fifo")) << params;
  }
}

// Closed loops: the shipped scenario runs, and credit gives every tenant its weight's share
// where fifo follows launch size.
TEST(KernelScenarioTest, ClosedLoopsCreditMeetsTheWeights) {
  auto out = RunFile("closed-loops.toml");
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  int checked = 0;
  for (const auto& r : out->json["runs"]) {
    if (r["params"]["experiment"] == "x1-alone") continue;
    double wsum = 0;
    for (const auto& t : r["tenants"]) wsum += t["weight"].get<double>();
    double worst = 0;
    for (const auto& t : r["tenants"]) {
      worst = std::max(worst, std::fabs(t["share"].get<double>() - t["weight"].get<double>() / wsum));
    }
    const std::string policy = r["policy"];
    if (policy == "credit") {
      EXPECT_LT(worst, 0.03) << r["label"];
      ++checked;
    } else if (policy == "fifo") {
      EXPECT_GT(worst, 0.2) << r["label"];
    }
  }
  EXPECT_EQ(checked, 2);
}

}  // namespace
}  // namespace gmux::sim
