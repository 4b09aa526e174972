// `gmux top`'s figures and frame from made-up Stats replies at made-up times (the view itself,
// against a real gmuxd in a terminal, is tests/runtime/top_test.cc).
#include "gmux/top_frame.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

namespace gmux::cli {
namespace {

using nlohmann::json;

json Tenant(int id, const std::string& name, double weight, double device_s, uint64_t pending = 0,
            uint64_t inflight = 0) {
  return json{{"id", id},
              {"name", name},
              {"weight", weight},
              {"device_time_s", device_s},
              {"pending_commands", pending},
              {"inflight", inflight},
              {"sessions", 1},
              {"memory", json::array({json{{"device", 0}, {"used", 3 << 20}, {"quota", 0}}})}};
}

json Device(int index, double busy_s) {
  return json{{"index", index},          {"policy", "credit"}, {"inflight", 1},
              {"queued_commands", 2},    {"held_commands", 0}, {"dispatches", 40},
              {"busy_s", busy_s},        {"memory_capacity", 1 << 30},
              {"memory_used", 6 << 20},  {"express_session", nullptr}};
}

json Stats(std::vector<json> tenants, double busy_s = 0) {
  return json{{"inflight_per_device", 32},
              {"devices", json::array({Device(0, busy_s)})},
              {"active_tenants", tenants.size()},
              {"tenants", std::move(tenants)},
              {"scheduler", json{{"ns_per_dispatch", 900.0}}}};
}

const TopTenant& Find(const std::vector<TopTenant>& rows, const std::string& name) {
  auto it = std::find_if(rows.begin(), rows.end(), [&](const auto& r) { return r.name == name; });
  EXPECT_NE(it, rows.end()) << name;
  return *it;
}

TEST(TopHistoryTest, ShareNowIsTheLastIntervalsDeviceTimeOverAllTenants) {
  TopHistory h(10);
  h.Add(0, Stats({Tenant(1, "a", 1, 1.0), Tenant(2, "b", 1, 5.0)}));
  h.Add(1, Stats({Tenant(1, "a", 1, 1.3), Tenant(2, "b", 1, 5.1)}));
  const auto rows = h.Tenants(TopSort::kName);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_NEAR(*Find(rows, "a").share_now, 0.75, 1e-12);
  EXPECT_NEAR(*Find(rows, "b").share_now, 0.25, 1e-12);
  EXPECT_DOUBLE_EQ(h.interval_s(), 1.0);
}

TEST(TopHistoryTest, NoShareBeforeTwoSamplesNorWhenNobodyUsedTheDevice) {
  TopHistory h(10);
  h.Add(0, Stats({Tenant(1, "a", 1, 2.0)}));
  EXPECT_FALSE(h.Tenants(TopSort::kShare)[0].share_now);
  EXPECT_FALSE(h.Tenants(TopSort::kShare)[0].share_window);
  EXPECT_EQ(h.interval_s(), 0.0);
  h.Add(1, Stats({Tenant(1, "a", 1, 2.0)}));
  EXPECT_FALSE(h.Tenants(TopSort::kShare)[0].share_now);
}

// A went first for 5 s, then B alone for 10 s: over the last 10 s B had everything, though
// A's cumulative device time is still the larger.
TEST(TopHistoryTest, WindowShareCoversTheWindowOnly) {
  TopHistory h(10);
  double a = 0, b = 0;
  for (int t = 0; t <= 15; ++t) {
    h.Add(t, Stats({Tenant(1, "a", 1, a), Tenant(2, "b", 1, b)}));
    (t < 5 ? a : b) += 1.0;
  }
  const auto rows = h.Tenants(TopSort::kName);
  EXPECT_DOUBLE_EQ(*Find(rows, "a").share_window, 0.0);
  EXPECT_DOUBLE_EQ(*Find(rows, "b").share_window, 1.0);
  EXPECT_DOUBLE_EQ(h.window_span_s(), 10.0);
  EXPECT_DOUBLE_EQ(Find(rows, "a").device_time_s, 5.0);
}

TEST(TopHistoryTest, WindowSpanGrowsUntilTheWindowIsCovered) {
  TopHistory h(10);
  h.Add(0, Stats({Tenant(1, "a", 1, 0)}));
  h.Add(2, Stats({Tenant(1, "a", 1, 1)}));
  h.Add(4, Stats({Tenant(1, "a", 1, 2)}));
  EXPECT_DOUBLE_EQ(h.window_span_s(), 4.0);
  EXPECT_DOUBLE_EQ(h.interval_s(), 2.0);
  h.Clear();
  EXPECT_TRUE(h.empty());
  EXPECT_TRUE(h.latest().is_object());
}

// A tenant that connected between two polls, and a daemon that restarted (its counters went
// back), count from zero rather than showing a negative share.
TEST(TopHistoryTest, NewTenantsAndRestartedCountersCountFromZero) {
  TopHistory h(10);
  h.Add(0, Stats({Tenant(1, "a", 1, 9.0)}));
  h.Add(1, Stats({Tenant(1, "a", 1, 0.5), Tenant(2, "b", 1, 0.5)}));
  const auto rows = h.Tenants(TopSort::kName);
  EXPECT_DOUBLE_EQ(*Find(rows, "a").share_now, 0.5);
  EXPECT_DOUBLE_EQ(*Find(rows, "b").share_now, 0.5);
}

TEST(TopHistoryTest, WeightShareIsOverTheBusyTenantsOnly) {
  TopHistory h(10);
  h.Add(0, Stats({Tenant(1, "a", 3, 0), Tenant(2, "b", 1, 0, /*pending=*/4),
                  Tenant(3, "idle", 4, 7.0)}));
  h.Add(1, Stats({Tenant(1, "a", 3, 0.2), Tenant(2, "b", 1, 0, 4), Tenant(3, "idle", 4, 7.0)}));
  const auto rows = h.Tenants(TopSort::kName);
  EXPECT_DOUBLE_EQ(*Find(rows, "a").weight_share, 0.75);  // used the device
  EXPECT_DOUBLE_EQ(*Find(rows, "b").weight_share, 0.25);  // has commands queued
  EXPECT_FALSE(Find(rows, "idle").weight_share);
}

TEST(TopHistoryTest, DeviceBusyIsDeviceTimePerWallSecondOverTheInterval) {
  TopHistory h(10);
  h.Add(0, Stats({}, 1.0));
  EXPECT_FALSE(h.Devices()[0].busy_now);
  h.Add(2, Stats({}, 2.5));
  const auto d = h.Devices();
  ASSERT_EQ(d.size(), 1u);
  EXPECT_DOUBLE_EQ(*d[0].busy_now, 0.75);
  EXPECT_EQ(d[0].inflight_limit, 32u);
  EXPECT_EQ(d[0].policy, "credit");
}

TEST(TopHistoryTest, EachSortOrdersItsColumnLargestFirstAndTiesByName) {
  TopHistory h(10);
  json small = Tenant(1, "small", 1, 0, 9);
  json big = Tenant(2, "big", 5, 1.0);
  big["memory"][0]["used"] = 1 << 30;
  json tie = Tenant(3, "tie", 1, 0, 9);
  h.Add(0, Stats({small, big, tie}));
  auto names = [&](TopSort s) {
    std::vector<std::string> out;
    for (const auto& r : h.Tenants(s)) out.push_back(r.name);
    return out;
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(names(TopSort::kName), (V{"big", "small", "tie"}));
  EXPECT_EQ(names(TopSort::kWeight), (V{"big", "small", "tie"}));
  EXPECT_EQ(names(TopSort::kQueue), (V{"small", "tie", "big"}));
  EXPECT_EQ(names(TopSort::kMemory), (V{"big", "small", "tie"}));
  EXPECT_EQ(names(TopSort::kDeviceTime), (V{"big", "small", "tie"}));
}

TEST(TopSortTest, NamesParseAndCycleBothWays) {
  TopSort s = TopSort::kName;
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(ParseTopSort(TopSortName(s)), s);
    s = CycleTopSort(s, 1);
  }
  EXPECT_EQ(s, TopSort::kName);
  EXPECT_EQ(CycleTopSort(TopSort::kName, -1), TopSort::kDeviceTime);
  EXPECT_EQ(CycleTopSort(TopSort::kShare, 1), TopSort::kWeight);
  EXPECT_FALSE(ParseTopSort("cpu"));
}

TEST(RenderTopFrameTest, ShowsDevicesAndTenantsAndMarksTheSortColumn) {
  TopHistory h(10);
  h.Add(0, Stats({Tenant(1, "alpha", 2, 0)}));
  h.Add(1, Stats({Tenant(1, "alpha", 2, 0.4, 0, 1)}, 0.4));
  TopView v{"/tmp/s.sock", "12:00:00", 1.0, TopSort::kWeight, false, ""};
  const TopFrame f = RenderTopFrame(h, v);
  ASSERT_GE(f.tenant_header, 0);
  const std::string& header = f.lines[static_cast<size_t>(f.tenant_header)];
  EXPECT_EQ(header.substr(f.sort_begin, f.sort_len), "WEIGHT");
  EXPECT_EQ(f.lines[0].find("gmux top: gmuxd at /tmp/s.sock"), 0u);
  EXPECT_NE(f.lines[0].find("sort: weight"), std::string::npos);
  const auto& row = f.lines[static_cast<size_t>(f.tenant_header) + 1];
  EXPECT_EQ(row.find("alpha"), 0u) << row;
  EXPECT_NE(row.find("2.00"), std::string::npos) << row;
  EXPECT_NE(row.find("100.0%"), std::string::npos) << row;
  bool device_row = false;
  for (const auto& l : f.lines) {
    EXPECT_LE(l.size(), 100u) << l;
    device_row |= l.rfind("  0 credit", 0) == 0 && l.find("40.0%") != std::string::npos;
  }
  EXPECT_TRUE(device_row);
  v.sort = TopSort::kShare;
  const TopFrame g = RenderTopFrame(h, v);
  EXPECT_EQ(g.lines[static_cast<size_t>(g.tenant_header)].substr(g.sort_begin, g.sort_len),
            "SHARE");
}

TEST(RenderTopFrameTest, UnreachableDaemonShowsWhyAndThatItRetries) {
  TopHistory h(10);
  TopView v{"/tmp/s.sock", "", 0.5, TopSort::kShare, false, "cannot connect: refused"};
  const TopFrame f = RenderTopFrame(h, v);
  ASSERT_GE(f.error_line, 0);
  EXPECT_EQ(f.lines[static_cast<size_t>(f.error_line)],
            "gmuxd not reachable: cannot connect: refused (retrying every 0.5 s)");
  EXPECT_EQ(f.tenant_header, -1);
}

TEST(RenderTopFrameTest, PoolLeasesAndFrameAgentsFollowWhenReported) {
  json s = Stats({Tenant(1, "alpha", 1, 0)});
  s["pool"] = json{{"devices", json::array({json{{"device", 1}, {"state", "leased"},
                                                 {"lease", "L3"}, {"tenant", "alpha"}}})},
                   {"leases", json::array({json{{"lease", "L3"}, {"tenant", "alpha"},
                                                {"kind", "explicit"}, {"held_s", 12.5}}})},
                   {"waiting", json::array({json{{"tenant", "beta"}}})},
                   {"grants", 4},
                   {"reclaims", 1}};
  s["frames"] = json{{"groups", json::array({json{
                         {"renderer", "llvmpipe"}, {"policy", "esa"},
                         {"agents", json::array({json{{"tenant", "games"}, {"pid", 42},
                                                      {"program", "glxgears"}, {"fps", 59.5},
                                                      {"target_fps", 60.0}}})}}})}};
  TopHistory h(10);
  h.Add(0, s);
  const TopFrame f = RenderTopFrame(h, TopView{});
  std::string all;
  for (const auto& l : f.lines) all += l + "\n";
  EXPECT_NE(all.find("   1 leased    L3     alpha            explicit      12.5"),
            std::string::npos)
      << all;
  EXPECT_NE(all.find("pool: 1 waiting: beta; 4 grants, 1 reclaimed"), std::string::npos);
  EXPECT_NE(all.find("frames on 'llvmpipe', SLA policy esa"), std::string::npos);
  EXPECT_NE(all.find("glxgears"), std::string::npos);
  EXPECT_NE(all.find("59.5"), std::string::npos);
  const json j = TopJson(h, TopSort::kName);
  EXPECT_EQ(j["pool"]["grants"], 4);
  EXPECT_EQ(j["frames"]["groups"][0]["policy"], "esa");
  EXPECT_TRUE(j["tenants"][0]["share_now"].is_null());
}

// Names reach the terminal: a control character in one must not become an escape sequence.
TEST(RenderTopFrameTest, ControlCharactersInNamesAreShownAsQuestionMarks) {
  TopHistory h(10);
  h.Add(0, Stats({Tenant(1, "evil\x1b[2Jname", 1, 0)}));
  const TopFrame f = RenderTopFrame(h, TopView{});
  for (const auto& l : f.lines) EXPECT_EQ(l.find('\x1b'), std::string::npos) << l;
}

TEST(TopJsonTest, HasTheFiguresOfTheFrame) {
  TopHistory h(10);
  h.Add(0, Stats({Tenant(1, "a", 3, 0), Tenant(2, "b", 1, 0)}));
  h.Add(1, Stats({Tenant(1, "a", 3, 0.3), Tenant(2, "b", 1, 0.1)}));
  const json j = TopJson(h, TopSort::kShare);
  EXPECT_EQ(j["sort"], "share");
  EXPECT_DOUBLE_EQ(j["interval_s"].get<double>(), 1.0);
  ASSERT_EQ(j["tenants"].size(), 2u);
  EXPECT_EQ(j["tenants"][0]["name"], "a");
  EXPECT_NEAR(j["tenants"][0]["share_now"].get<double>(), 0.75, 1e-12);
  EXPECT_DOUBLE_EQ(j["tenants"][0]["weight_share"].get<double>(), 0.75);
  EXPECT_EQ(j["tenants"][0]["memory_bytes"], 3u << 20);
  EXPECT_EQ(j["devices"][0]["policy"], "credit");
  EXPECT_FALSE(j.contains("pool"));
}

}  // namespace
}  // namespace gmux::cli
