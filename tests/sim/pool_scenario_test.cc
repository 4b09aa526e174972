#include "sim/pool_scenario.h"

#include <gtest/gtest.h>

#include <string>

#include "sim/pool_sim.h"
#include "sim/scenario_test_util.h"

namespace gmux::sim {
namespace {

const std::string kScenarioFile = std::string(GMUX_SOURCE_DIR) + "/scenarios/biocloud-sharing.toml";

// The run of `out` with the given policy and params; fails the test when there is none.
const nlohmann::json& FindRun(const ScenarioOutput& out, const std::string& policy, double sleep_s,
                              int devices) {
  for (const nlohmann::json& run : out.json["runs"]) {
    if (run["policy"] == policy && run["params"]["sleep_s"].get<double>() == sleep_s &&
        run["params"]["devices"].get<int>() == devices) {
      return run;
    }
  }
  ADD_FAILURE() << "no run " << policy << " S=" << sleep_s << " N=" << devices;
  static const nlohmann::json kNull;
  return kNull;
}

class BioCloudScenarioTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto doc = TomlDoc::Load(kScenarioFile);
    ASSERT_TRUE(doc.ok()) << doc.status().ToString();
    auto out = RunPoolScenario(*doc);
    ASSERT_TRUE(out.ok()) << out.status().ToString();
    out_ = new ScenarioOutput(std::move(out).value());
  }
  static void TearDownTestSuite() {
    delete out_;
    out_ = nullptr;
  }
  static ScenarioOutput* out_;
};
ScenarioOutput* BioCloudScenarioTest::out_ = nullptr;

TEST_F(BioCloudScenarioTest, HasTheCommonJsonFields) {
  ASSERT_NE(out_, nullptr);
  const nlohmann::json& j = out_->json;
  EXPECT_EQ(j["scenario"], "biocloud-sharing");
  EXPECT_EQ(j["kind"], "pool");
  ASSERT_EQ(j["runs"].size(), 3u * 4u * 3u);  // sleeps x device counts x policies
  for (const nlohmann::json& run : j["runs"]) {
    for (const char* key : {"label", "policy", "params", "lambda", "jain", "tenants",
                            "makespan_s", "normalized_time", "theoretical_s", "mean_wait_s"}) {
      EXPECT_TRUE(run.contains(key)) << key;
    }
    ASSERT_EQ(run["tenants"].size(), 4u);
    double shares = 0;
    for (const nlohmann::json& t : run["tenants"]) {
      EXPECT_EQ(t["commands"], 5);
      EXPECT_EQ(t["completions_s"].size(), 5u);
      EXPECT_TRUE(t.contains("mean_wait_s"));
      shares += t["share"].get<double>();
    }
    EXPECT_NEAR(shares, 1.0, 1e-9);
  }
  EXPECT_FALSE(out_->table.empty());
  EXPECT_EQ(out_->series.size(), 2u * j["runs"].size());
}

TEST_F(BioCloudScenarioTest, OneDeviceBeatsTheoreticalTimeByFarWithLongSleeps) {
  ASSERT_NE(out_, nullptr);
  const double s9 = FindRun(*out_, "pool", 9, 1)["normalized_time"].get<double>();
  const double s36 = FindRun(*out_, "pool", 36, 1)["normalized_time"].get<double>();
  EXPECT_LT(s9, 0.9);    // paper: -20 %
  EXPECT_LT(s36, 0.6);   // paper: -53 %
  EXPECT_LT(s36, s9);    // longer sleeps leave more to share
}

TEST_F(BioCloudScenarioTest, NoGainWhenDevicesEqualTenants) {
  ASSERT_NE(out_, nullptr);
  for (double s : {9.0, 18.0, 36.0}) {
    const double n4 = FindRun(*out_, "pool", s, 4)["normalized_time"].get<double>();
    EXPECT_GE(n4, 1.0) << "S=" << s;   // plug-in/out only costs
    EXPECT_LT(n4, 1.15) << "S=" << s;
    EXPECT_NEAR(FindRun(*out_, "pool", s, 4)["mean_wait_s"].get<double>(), 1.3, 1e-6);
  }
}

TEST_F(BioCloudScenarioTest, BenefitShrinksAsDevicesGrow) {
  ASSERT_NE(out_, nullptr);
  for (double s : {9.0, 18.0, 36.0}) {
    // While the devices stay the bottleneck (N = 1, 2 at short sleeps) the ratio is flat; it
    // never improves by more than noise as devices are added, and N = 3 is clearly worse than 1.
    double previous = 0;
    for (int n = 1; n <= 4; ++n) {
      const double x = FindRun(*out_, "pool", s, n)["normalized_time"].get<double>();
      EXPECT_GT(x, previous - 0.01) << "S=" << s << " N=" << n;
      previous = x;
    }
    EXPECT_GT(FindRun(*out_, "pool", s, 3)["normalized_time"].get<double>(),
              FindRun(*out_, "pool", s, 1)["normalized_time"].get<double>() + 0.05)
        << "S=" << s;
  }
}

TEST_F(BioCloudScenarioTest, TwoDevicesWaitFarLessThanOne) {
  ASSERT_NE(out_, nullptr);
  for (double s : {9.0, 18.0, 36.0}) {
    const double w1 = FindRun(*out_, "pool", s, 1)["mean_wait_s"].get<double>();
    const double w2 = FindRun(*out_, "pool", s, 2)["mean_wait_s"].get<double>();
    EXPECT_GT(w1, 10.0) << "S=" << s;
    EXPECT_LT(w2, w1 / 2) << "S=" << s;
  }
}

TEST_F(BioCloudScenarioTest, IdleReclaimAloneCannotShareShortSleeps) {
  ASSERT_NE(out_, nullptr);
  // S = 9 s is below the 10 s idle limit: the checker never takes the GPU back between runs.
  const nlohmann::json& run = FindRun(*out_, "idle-reclaim", 9, 1);
  EXPECT_GE(run["normalized_time"].get<double>(), 1.0);
  for (const nlohmann::json& t : run["tenants"]) EXPECT_EQ(t["reclaimed"], 0);
  // S = 36 s: reclaimed between runs, so it shares, but later than at program end.
  const nlohmann::json& long_sleep = FindRun(*out_, "idle-reclaim", 36, 1);
  EXPECT_LT(long_sleep["normalized_time"].get<double>(), 1.0);
  EXPECT_GT(long_sleep["normalized_time"].get<double>(),
            FindRun(*out_, "pool", 36, 1)["normalized_time"].get<double>());
  // A pinned lease is held through the sleeps: no sharing at all.
  EXPECT_GE(FindRun(*out_, "explicit", 36, 1)["normalized_time"].get<double>(), 1.0);
}

TEST(PoolScenarioTest, SameFileSameOutputAndSeedMatters) {
  const std::string text =
      "kind = 'pool'\nseed = 7\n[pool]\ndevices = [1, 2]\n"
      "[workload]\ntenants = 3\nruns = 3\njob_s = 10\nsleep_s = [5]\njob_jitter_s = 2\n";
  ExpectDeterministicInSeed(text, "seed = 7", "seed = 8");
}

TEST(PoolScenarioTest, BrokenFilesNameFileLineAndKey) {
  struct Case {
    std::string text;
    std::string expect;
  };
  const Case cases[] = {
      {"kind = 'pool'\n[pool]\ndevices = [1]\nspeed = 3\n", "b.toml:4: key 'speed'"},
      {"kind = 'pool'\n[pool]\n\ndevices = [0, 2]\n", "b.toml:4: key 'devices'"},
      {"kind = 'pool'\n[pool]\ndevices = [1.5]\n", "key 'devices'"},
      {"kind = 'pool'\npolicies = ['lottery']\n", "b.toml:2: key 'policies'"},
      {"kind = 'pool'\n[workload]\nsleep_s = [9, -1]\n", "b.toml:3: key 'sleep_s'"},
      {"kind = 'pool'\n[workload]\nruns = 0\n", "b.toml:3: key 'runs'"},
      {"kind = 'pool'\n[pool]\nattach_s = 'slow'\n", "b.toml:3: key 'attach_s'"},
      {"kind = 'pool'\n[[tenant]]\nweight = 2\n", "key 'name'"},
      {"kind = 'pool'\n[[tenant]]\nname = 'a'\n[[tenant]]\nname = 'a'\n", "b.toml:5: key 'name'"},
      {"kind = 'pool'\n[workload]\ntenants = 2\n[[tenant]]\nname = 'a'\n",
       "b.toml:3: key 'tenants'"},
      {"kind = 'pool'\ncolour = 'red'\n", "b.toml:2: key 'colour'"},
  };
  for (const Case& c : cases) {
    auto out = RunText(c.text, "b.toml");
    ASSERT_FALSE(out.ok()) << c.text;
    EXPECT_EQ(out.status().code(), StatusCode::kInvalidArgument) << c.text;
    EXPECT_NE(out.status().message().find(c.expect), std::string::npos)
        << c.text << " -> " << out.status().message();
  }
}

TEST(PoolScenarioTest, ListedTenantsWithWeightsAndStarts) {
  auto out = RunText(
      "kind = 'pool'\n[pool]\ndevices = 1\n[workload]\nruns = 2\njob_s = 10\nsleep_s = 0\n"
      "[[tenant]]\nname = 'big'\nweight = 3\n[[tenant]]\nname = 'late'\nstart_s = 100\n");
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  const nlohmann::json& run = out->json["runs"][0];
  EXPECT_EQ(run["tenants"][0]["name"], "big");
  EXPECT_EQ(run["tenants"][0]["weight"], 3.0);
  // No contention, but with no sleep the second run asks while its own device is still being
  // plugged out: it waits plug-out + plug-in (2.6 s) instead of plug-in alone (1.3 s).
  EXPECT_NEAR(run["tenants"][1]["mean_wait_s"].get<double>(), (1.3 + 2.6) / 2, 1e-6);
  EXPECT_NEAR(run["makespan_s"].get<double>(), 100 + 1.3 + 10 + 2.6 + 10, 1e-6);
  // Equal device-time against weights 3:1 is unfair by λ.
  EXPECT_NEAR(run["lambda"].get<double>(), 0.5, 1e-6);
}

TEST(PoolSimTest, WaitsMatchThePoolsOwnAccountingAndPlugTimeIsCounted) {
  PoolSimConfig c;
  c.pool.devices = 1;
  for (int i = 0; i < 3; ++i) {
    PoolTenantSpec t;
    t.name = "t" + std::to_string(i);
    t.runs = 2;
    t.job_s = 10;
    t.sleep_s = 4;
    c.tenants.push_back(t);
  }
  auto r = SimulatePool(c);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  // t0: wait 1.3, runs 1.3-11.3; plug-out to 12.6; t1 plug-in to 13.9, runs to 23.9; t2 from
  // 26.5 to 36.5. t0's second request (at 15.3) waits behind nobody else: plug-in at 37.8 ...
  EXPECT_NEAR(r->tenants[0].waits_s[0], 1.3, 1e-9);
  EXPECT_NEAR(r->tenants[1].waits_s[0], 13.9, 1e-9);
  EXPECT_NEAR(r->tenants[2].waits_s[0], 26.5, 1e-9);
  EXPECT_NEAR(r->tenants[0].waits_s[1], 39.1 - 15.3, 1e-9);
  // The device is never idle while someone waits: makespan = 6 x (1.3 + 10 + 1.3) - 1.3.
  EXPECT_NEAR(r->makespan_s, 6 * 12.6 - 1.3, 1e-9);
  EXPECT_NEAR(r->theoretical_s, 3 * (2 * 10 + 4), 1e-9);
  EXPECT_NEAR(r->in_use_fraction, 60 / r->makespan_s, 1e-9);
  // Series: never more devices leased than exist, never negative.
  for (const SeriesPoint& p : r->devices_leased) {
    EXPECT_GE(p.value, 0);
    EXPECT_LE(p.value, 1);
  }
}

TEST(PoolSimTest, InvalidConfigIsRejected) {
  PoolSimConfig c;
  EXPECT_EQ(SimulatePool(c).status().code(), StatusCode::kInvalidArgument);  // no tenants
  c.tenants.push_back(PoolTenantSpec{"a", 1, 0, 0, 18, 9});
  EXPECT_EQ(SimulatePool(c).status().code(), StatusCode::kInvalidArgument);  // runs = 0
}

}  // namespace
}  // namespace gmux::sim
