#include <string>

#include <gtest/gtest.h>

#include "sim/scenario.h"
#include "sim/scenario_test_util.h"
#include "sim/slots_sim.h"

namespace gmux::sim {
namespace {

const std::string kSource = GMUX_SOURCE_DIR;

// A small valid scenario: two levels, one set, 20 simulated seconds.
const char* kSmall = R"(kind = "slots"
name = "small"
seed = 3
duration_s = 20
[device]
slots = 12
[[levels]]
name = "low"
burst_ms = 1
think_ms = 100
sizes_slots = [4]
[[levels]]
name = "high"
burst_ms = 10
think_ms = 10
sizes_slots = [4, 6]
[[sets]]
set = 1
counts = [3, 3]
)";

std::string Error(const std::string& text) {
  auto out = RunText(text);
  EXPECT_FALSE(out.ok());
  return out.ok() ? "" : out.status().message();
}

double Summary(const nlohmann::json& j, int64_t set, const char* policy) {
  for (const auto& row : j["summary"]) {
    if (row["set"] == set) return row[policy].get<double>();
  }
  ADD_FAILURE() << "no set " << set;
  return 0;
}

// --- the simulator itself --------------------------------------------------------------------

TEST(SlotsSimTest, LoneTenantCopiesItsSlotsOnce) {
  SlotsSimOptions o;
  o.allocator.slots = 10;
  o.duration = std::chrono::seconds(10);
  o.tenants = {SlotsTenantSpec{"a", "high", 7, std::chrono::milliseconds(20),
                               std::chrono::milliseconds(5), {}, {}}};
  auto r = RunSlotsSim(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->counters.switches, 1);
  EXPECT_EQ(r->counters.total_copies(), 7);
  EXPECT_GT(r->tenants[0].frames, 300);  // 25 ms per frame, 10 s
  EXPECT_NEAR(r->tenants[0].share, 1.0, 1e-12);
}

TEST(SlotsSimTest, ExclusiveTenantsStopCopyingSharedOnesDoNot) {
  SlotsSimOptions o;
  o.allocator.slots = 8;
  o.duration = std::chrono::seconds(10);
  SlotsTenantSpec t{"x", "high", 4, std::chrono::milliseconds(10), std::chrono::milliseconds(10),
                    {}, {}};
  o.tenants = {t, t};
  auto fit = RunSlotsSim(o);
  ASSERT_TRUE(fit.ok());
  EXPECT_GT(fit->counters.switches, 100);
  EXPECT_EQ(fit->counters.total_copies(), 8);  // each tenant's first load only
  o.tenants[1].slots = 6;                      // now they must share 2 slots
  auto shared = RunSlotsSim(o);
  ASSERT_TRUE(shared.ok());
  // First loads (4 + 6), then every switch copies exactly the 2 shared slots back in.
  EXPECT_EQ(shared->counters.total_copies(), 10 + 2 * (shared->counters.switches - 2));
  EXPECT_GT(shared->copy_time_s, 0);
}

// Swap batching (gmuxd's swap_batch): a tenant switched in with copies keeps the device for a
// multiple of their cost, so two tenants that must share slots switch, and copy, less often.
TEST(SlotsSimTest, SwapBatchingCutsSwitchesAndCopies) {
  SlotsSimOptions o;
  o.allocator.slots = 8;
  o.duration = std::chrono::seconds(20);
  o.slot_copy = std::chrono::milliseconds(5);
  SlotsTenantSpec t{"x", "high", 6, std::chrono::milliseconds(10), std::chrono::milliseconds(2),
                    {}, {}};
  o.tenants = {t, t};
  auto plain = RunSlotsSim(o);
  ASSERT_TRUE(plain.ok());
  o.batch = 4;
  auto batched = RunSlotsSim(o);
  ASSERT_TRUE(batched.ok());
  EXPECT_EQ(plain->batches, 0);
  EXPECT_GT(batched->batches, 10);
  // Each switch copies the 4 shared slots (20 ms); a batch then lasts 80 ms, several frames.
  EXPECT_LT(batched->counters.total_copies() * 2, plain->counters.total_copies());
  EXPECT_GT(batched->tenants[0].frames + batched->tenants[1].frames,
            plain->tenants[0].frames + plain->tenants[1].frames);
  o.batch = -1;
  EXPECT_FALSE(RunSlotsSim(o).ok());
}

// A round of commands: bursts and thinks in order, repeated.
TEST(SlotsSimTest, RoundsRunTheirCommandsInOrder) {
  SlotsSimOptions o;
  o.allocator.slots = 4;
  o.duration = std::chrono::seconds(10);
  SlotsTenantSpec t{"r", "high", 2, std::chrono::milliseconds(1), std::chrono::milliseconds(1),
                    {std::chrono::milliseconds(10), std::chrono::milliseconds(30)},
                    {std::chrono::milliseconds(0), std::chrono::milliseconds(60)}};
  o.tenants = {t};
  auto r = RunSlotsSim(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  // 100 ms per round on average (40 of device time): ~200 commands in 10 s, device busy ~40 %.
  EXPECT_NEAR(static_cast<double>(r->tenants[0].frames), 200, 40);
  EXPECT_NEAR(r->device_busy, 0.4, 0.08);
  o.tenants[0].round_thinks.pop_back();
  EXPECT_FALSE(RunSlotsSim(o).ok());
}

TEST(SlotsSimTest, BadOptionsAreErrors) {
  SlotsSimOptions o;
  EXPECT_FALSE(RunSlotsSim(o).ok());  // no tenants
  o.tenants = {SlotsTenantSpec{"big", "high", 55, std::chrono::milliseconds(1),
                               std::chrono::milliseconds(1), {}, {}}};
  auto r = RunSlotsSim(o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("'big'"), std::string::npos) << r.status().message();
}

// --- scenario files --------------------------------------------------------------------------

TEST(SlotsScenarioTest, SameFileSameOutputByteForByte) {
  ExpectDeterministicInSeed(kSmall, "seed = 3", "seed = 4");
}

TEST(SlotsScenarioTest, JsonHasTheCommonFieldsAndSlotCopies) {
  auto out = RunText(kSmall);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  const nlohmann::json& j = out->json;
  EXPECT_EQ(j["scenario"], "small");
  EXPECT_EQ(j["kind"], "slots");
  ASSERT_EQ(j["runs"].size(), 3u);
  const char* policies[] = {"baseline", "size", "utilization"};
  for (size_t i = 0; i < 3; ++i) {
    const nlohmann::json& run = j["runs"][i];
    EXPECT_EQ(run["policy"], policies[i]);
    EXPECT_EQ(run["params"], nlohmann::json({{"set", 1}}));
    EXPECT_TRUE(run["lambda"].is_number());
    EXPECT_TRUE(run["jain"].is_number());
    EXPECT_GT(run["slot_copies"].get<double>(), 0);
    EXPECT_DOUBLE_EQ(run["slot_copies"].get<double>(),
                     run["switch_copies"].get<double>() + run["move_copies"].get<double>());
    ASSERT_EQ(run["tenants"].size(), 6u);
    double share = 0;
    for (const auto& t : run["tenants"]) {
      for (const char* key : {"name", "weight", "share", "commands", "completions_s"}) {
        EXPECT_TRUE(t.contains(key)) << key;
      }
      share += t["share"].get<double>();
    }
    EXPECT_NEAR(share, 1.0, 1e-9);
  }
  // The series: cumulative copies never decrease and end at the run's total.
  bool found = false;
  for (const Series& s : out->series) {
    if (s.tenant != "all") continue;
    found = true;
    ASSERT_EQ(s.points.size(), 20u);
    for (size_t k = 1; k < s.points.size(); ++k) EXPECT_GE(s.points[k].value, s.points[k - 1].value);
  }
  EXPECT_TRUE(found);
  EXPECT_NE(out->table.find("util vs size"), std::string::npos);
}

TEST(SlotsScenarioTest, BrokenFilesNameFileLineAndKey) {
  std::string text = kSmall;
  std::string typo = text;
  typo.replace(typo.find("slots = 12"), 10, "slotz = 12");
  EXPECT_NE(Error(typo).find("t.toml:6: key 'slotz'"), std::string::npos) << Error(typo);

  std::string counts = text;
  counts.replace(counts.find("counts = [3, 3]"), 15, "counts = [3, 3, 1]");
  EXPECT_NE(Error(counts).find("key 'counts'"), std::string::npos) << Error(counts);
  EXPECT_NE(Error(counts).find("one count per level"), std::string::npos);

  std::string big = text;
  big.replace(big.find("sizes_slots = [4, 6]"), 20, "sizes_slots = [4, 60]");
  EXPECT_NE(Error(big).find("t.toml:16: key 'sizes_slots'"), std::string::npos) << Error(big);

  std::string policy = "policies = ['baseline', 'largest']\n" + text;
  EXPECT_NE(Error(policy).find("t.toml:1: key 'policies'"), std::string::npos) << Error(policy);

  std::string negative = text;
  negative.replace(negative.find("think_ms = 100"), 14, "think_ms = -1");
  EXPECT_NE(Error(negative).find("key 'think_ms'"), std::string::npos) << Error(negative);

  EXPECT_NE(Error("kind = \"slots\"\n").find("key 'levels'"), std::string::npos);

  std::string both = text;
  both.replace(both.find("think_ms = 100"), 14,
               "think_ms = 100\nround_bursts_ms = [1]\nround_thinks_ms = [1]");
  EXPECT_NE(Error(both).find("not both"), std::string::npos) << Error(both);
  std::string round = text;
  round.replace(round.find("burst_ms = 1\nthink_ms = 100"), 27,
                "round_bursts_ms = [3]\nround_thinks_ms = [1, 2]");
  EXPECT_NE(Error(round).find("one think time per command"), std::string::npos) << Error(round);
}

// The direction of the paper's results on the shipped scenario files.
TEST(SlotsScenarioTest, TableTwoUtilizationCopiesLeastAndBeatsSizeOnSetFour) {
  auto out = RunScenarioFile(kSource + "/scenarios/dymgpu-slots.toml");
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  const nlohmann::json& j = out->json;
  ASSERT_EQ(j["summary"].size(), 5u);
  double base_total = 0, size_total = 0;
  for (int64_t set = 1; set <= 5; ++set) {
    double base = Summary(j, set, "baseline");
    double size = Summary(j, set, "size");
    double util = Summary(j, set, "utilization");
    EXPECT_LT(util, base) << "set " << set;
    EXPECT_LT(util, size) << "set " << set;
    base_total += base;
    size_total += size;
  }
  EXPECT_LT(size_total, base_total);
  // Set 4 mixes every level: utilization-based well below size-based (paper: about 40 %).
  EXPECT_LT(Summary(j, 4, "utilization"), 0.8 * Summary(j, 4, "size"));
}

TEST(SlotsScenarioTest, SameWorkloadSizeBasedBeatsBaselineWhenSizesDiffer) {
  auto out = RunScenarioFile(kSource + "/scenarios/dymgpu-same-workload.toml");
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  const nlohmann::json& j = out->json;
  // 6, 9 and 12 VMs of the 3D workload: memory is oversubscribed and sizes differ.
  for (int64_t set : {2, 3, 4}) {
    EXPECT_LT(Summary(j, set, "size"), 0.95 * Summary(j, set, "baseline")) << "set " << set;
  }
  // 3 VMs fit: nobody shares, every policy copies each tenant's slots once.
  EXPECT_EQ(Summary(j, 1, "baseline"), Summary(j, 1, "size"));
  EXPECT_EQ(Summary(j, 1, "utilization"), Summary(j, 1, "size"));
}

// The runtime demo's mirror: four tenants of 7 slots on 16, every policy oversubscribed, so
// every policy copies, and more than the 28 slots of one placement each.
TEST(SlotsScenarioTest, DemoMemoryMirrorCopiesUnderEveryPolicy) {
  auto out = RunScenarioFile(kSource + "/scenarios/dymgpu-demo-memory.toml");
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  for (const char* policy : {"baseline", "size", "utilization"}) {
    EXPECT_GT(Summary(out->json, 1, policy), 28.0) << policy;
  }
}

// With swap batching (the daemon's default), the mirror copies less under every policy.
TEST(SlotsScenarioTest, DemoMemoryMirrorWithBatchingCopiesLess) {
  auto plain = RunScenarioFile(kSource + "/scenarios/dymgpu-demo-memory.toml");
  auto batch = RunScenarioFile(kSource + "/scenarios/dymgpu-demo-memory-batch.toml");
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  ASSERT_TRUE(batch.ok()) << batch.status().ToString();
  for (const char* policy : {"baseline", "size", "utilization"}) {
    EXPECT_LT(Summary(batch->json, 1, policy), Summary(plain->json, 1, policy)) << policy;
  }
}

}  // namespace
}  // namespace gmux::sim
