// Runner for scenario files of kind "pool": BioCloud's GPU sharing experiment (Jo et al., 4.3).
//
// File layout (every key optional unless marked; unknown keys are errors):
//   kind = "pool"                          (required)
//   name, description                      strings; name defaults to the file's stem
//   seed = 1                               job-length jitter draws
//   policies = ["pool"]                    client modes: "pool", "idle-reclaim", "explicit"
//   [pool]      devices = [1]              one run per value (integers >= 1)
//               check_period_s = 5, idle_threshold_s = 10, attach_s = 1.3, detach_s = 1.3
//   [workload]  tenants = 4                generated tenants vm1..vmN (or give [[tenant]])
//               runs = 5, job_s = 18, sleep_s = [9] (one run per value), job_jitter_s = 0,
//               start_stagger_s = 0        tenant k (from 0) starts at k * stagger
//   [[tenant]]  name (required), weight = 1, start_s, runs, job_s (defaults from [workload])
// Runs: every (sleep_s, devices, policy); params = {"sleep_s", "devices"}.
#include "sim/pool_scenario.h"

#include <cmath>
#include <filesystem>
#include <sstream>

#include "core/metrics.h"
#include "sim/pool_sim.h"
#include "sim/text_table.h"

namespace gmux::sim {
namespace {

struct PoolScenario {
  std::string name;
  std::string description;
  uint64_t seed = 1;
  std::vector<PoolClientMode> modes;
  std::vector<uint32_t> devices;
  std::vector<double> sleeps_s;
  core::LeasePoolOptions pool;
  std::vector<PoolTenantSpec> tenants;  // sleep_s filled per run
  double job_jitter_s = 0;
};

// Reads `key` of `t` as an array of integers >= 1 (a single integer is a one-element array).
Result<std::vector<uint32_t>> DeviceCounts(const TomlDoc& doc, const toml::table& t,
                                           std::string_view key) {
  GMUX_ASSIGN_OR_RETURN(std::vector<double> xs, doc.Numbers(t, key, std::vector<double>{1}));
  std::vector<uint32_t> out;
  for (double x : xs) {
    if (x < 1 || x > 4096 || std::floor(x) != x) {
      return doc.Error(t.get(key), key, "expected integers in [1, 4096]");
    }
    out.push_back(static_cast<uint32_t>(x));
  }
  if (out.empty()) return doc.Error(t.get(key), key, "expected at least one device count");
  return out;
}

Result<PoolScenario> Parse(const TomlDoc& doc) {
  const toml::table& root = doc.root();
  GMUX_RETURN_IF_ERROR(doc.OnlyKeys(root, {"kind", "name", "description", "seed", "policies",
                                          "pool", "workload", "tenant"}));
  PoolScenario s;
  GMUX_ASSIGN_OR_RETURN(s.name, doc.String(root, "name",
                                           std::filesystem::path(doc.path()).stem().string()));
  GMUX_ASSIGN_OR_RETURN(s.description, doc.String(root, "description", std::string()));
  GMUX_ASSIGN_OR_RETURN(int64_t seed, doc.Integer(root, "seed", 1, 0));
  s.seed = static_cast<uint64_t>(seed);
  GMUX_ASSIGN_OR_RETURN(std::vector<std::string> policies,
                        doc.Strings(root, "policies", std::vector<std::string>{"pool"}));
  if (policies.empty()) return doc.Error(root.get("policies"), "policies", "is empty");
  for (const std::string& p : policies) {
    if (p == "pool") {
      s.modes.push_back(PoolClientMode::kPool);
    } else if (p == "idle-reclaim") {
      s.modes.push_back(PoolClientMode::kIdleReclaim);
    } else if (p == "explicit") {
      s.modes.push_back(PoolClientMode::kExplicit);
    } else {
      return doc.Error(root.get("policies"), "policies",
                       "unknown policy '" + p + "' (allowed: pool, idle-reclaim, explicit)");
    }
  }

  static const toml::table kEmpty;
  GMUX_ASSIGN_OR_RETURN(const toml::table* pool_t, doc.Table(root, "pool", false));
  const toml::table& pt = pool_t != nullptr ? *pool_t : kEmpty;
  GMUX_RETURN_IF_ERROR(doc.OnlyKeys(pt, {"devices", "check_period_s", "idle_threshold_s",
                                         "attach_s", "detach_s"}));
  GMUX_ASSIGN_OR_RETURN(s.devices, DeviceCounts(doc, pt, "devices"));
  GMUX_ASSIGN_OR_RETURN(double period, doc.Number(pt, "check_period_s", 5.0, 1e-3, 1e6));
  GMUX_ASSIGN_OR_RETURN(double idle, doc.Number(pt, "idle_threshold_s", 10.0, 0, 1e6));
  GMUX_ASSIGN_OR_RETURN(double attach, doc.Number(pt, "attach_s", 1.3, 0, 1e4));
  GMUX_ASSIGN_OR_RETURN(double detach, doc.Number(pt, "detach_s", 1.3, 0, 1e4));
  s.pool.check_period = FromSeconds(period);
  s.pool.idle_threshold = FromSeconds(idle);
  s.pool.attach_time = FromSeconds(attach);
  s.pool.detach_time = FromSeconds(detach);

  GMUX_ASSIGN_OR_RETURN(const toml::table* wl_t, doc.Table(root, "workload", false));
  const toml::table& wt = wl_t != nullptr ? *wl_t : kEmpty;
  GMUX_RETURN_IF_ERROR(doc.OnlyKeys(wt, {"tenants", "runs", "job_s", "sleep_s", "job_jitter_s",
                                         "start_stagger_s"}));
  GMUX_ASSIGN_OR_RETURN(int64_t runs, doc.Integer(wt, "runs", 5, 1, 100000));
  GMUX_ASSIGN_OR_RETURN(double job_s, doc.Number(wt, "job_s", 18.0, 1e-3, 1e7));
  GMUX_ASSIGN_OR_RETURN(s.sleeps_s, doc.Numbers(wt, "sleep_s", std::vector<double>{9}));
  if (s.sleeps_s.empty()) return doc.Error(wt.get("sleep_s"), "sleep_s", "is empty");
  for (double x : s.sleeps_s) {
    if (!(x >= 0 && x <= 1e7)) return doc.Error(wt.get("sleep_s"), "sleep_s", "expected values >= 0");
  }
  GMUX_ASSIGN_OR_RETURN(s.job_jitter_s, doc.Number(wt, "job_jitter_s", 0.0, 0, job_s));
  GMUX_ASSIGN_OR_RETURN(double stagger, doc.Number(wt, "start_stagger_s", 0.0, 0, 1e7));

  GMUX_ASSIGN_OR_RETURN(std::vector<const toml::table*> listed, doc.Tables(root, "tenant", false));
  if (!listed.empty() && wt.contains("tenants")) {
    return doc.Error(wt.get("tenants"), "tenants", "give either [workload] tenants or [[tenant]]");
  }
  if (listed.empty()) {
    GMUX_ASSIGN_OR_RETURN(int64_t n, doc.Integer(wt, "tenants", 4, 1, 100000));
    for (int64_t k = 0; k < n; ++k) {
      PoolTenantSpec t;
      t.name = "vm" + std::to_string(k + 1);
      t.start_s = stagger * static_cast<double>(k);
      t.runs = static_cast<int>(runs);
      t.job_s = job_s;
      s.tenants.push_back(t);
    }
  }
  for (size_t k = 0; k < listed.size(); ++k) {
    const toml::table& tt = *listed[k];
    GMUX_RETURN_IF_ERROR(doc.OnlyKeys(tt, {"name", "weight", "start_s", "runs", "job_s"}));
    PoolTenantSpec t;
    GMUX_ASSIGN_OR_RETURN(t.name, doc.String(tt, "name", std::nullopt));
    for (const PoolTenantSpec& other : s.tenants) {
      if (other.name == t.name) return doc.Error(tt.get("name"), "name", "used by two tenants");
    }
    GMUX_ASSIGN_OR_RETURN(t.weight, doc.Number(tt, "weight", 1.0, 1e-9, 1e9));
    GMUX_ASSIGN_OR_RETURN(t.start_s, doc.Number(tt, "start_s", stagger * static_cast<double>(k),
                                                0, 1e7));
    GMUX_ASSIGN_OR_RETURN(int64_t r, doc.Integer(tt, "runs", runs, 1, 100000));
    t.runs = static_cast<int>(r);
    GMUX_ASSIGN_OR_RETURN(t.job_s, doc.Number(tt, "job_s", job_s, 1e-3, 1e7));
    s.tenants.push_back(t);
  }
  return s;
}

std::string Percent(double fraction) { return Fixed(100.0 * fraction, 1) + " %"; }

}  // namespace

Result<ScenarioOutput> RunPoolScenario(const TomlDoc& doc) {
  GMUX_ASSIGN_OR_RETURN(PoolScenario s, Parse(doc));

  ScenarioOutput out;
  out.json = {{"scenario", s.name}, {"kind", "pool"}, {"description", s.description},
              {"seed", s.seed}, {"runs", nlohmann::json::array()}};
  TextTable table({"policy", "sleep_s", "devices", "makespan_s", "theory_s", "normalized",
                   "change", "mean_wait_s", "leased", "in_use", "plug", "jain"});
  for (double sleep_s : s.sleeps_s) {
    table.AddRule();
    for (uint32_t devices : s.devices) {
      for (PoolClientMode mode : s.modes) {
        PoolSimConfig config;
        config.pool = s.pool;
        config.pool.devices = devices;
        config.tenants = s.tenants;
        for (PoolTenantSpec& t : config.tenants) t.sleep_s = sleep_s;
        config.mode = mode;
        config.job_jitter_s = s.job_jitter_s;
        config.seed = s.seed;
        Result<PoolSimResult> r = SimulatePool(config);
        if (!r.ok()) return r.status().WithPrefix(doc.path());

        const std::string policy(PoolClientModeName(mode));
        std::ostringstream label;
        label << policy << " S=" << sleep_s << " N=" << devices;
        // A pool's fairness is about device-time: share_i = leased_i / Σ leased (what each
        // tenant took from the pool), λ and Jain over those shares and the weights.
        std::vector<double> weights, leased, shares;
        double total = 0;
        for (const PoolTenantResult& t : r->tenants) total += t.leased_s;
        nlohmann::json tenants = nlohmann::json::array();
        for (const PoolTenantResult& t : r->tenants) {
          double share = total > 0 ? t.leased_s / total : 0;
          weights.push_back(t.weight);
          leased.push_back(t.leased_s);
          shares.push_back(share);
          tenants.push_back({{"name", t.name},
                             {"weight", t.weight},
                             {"share", share},
                             {"commands", t.completions_s.size()},
                             {"completions_s", t.completions_s},
                             {"mean_wait_s", t.mean_wait_s},
                             {"waits_s", t.waits_s},
                             {"leased_s", t.leased_s},
                             {"in_use_s", t.in_use_s},
                             {"reclaimed", t.reclaimed}});
        }
        const double lambda = core::FairnessLambda(weights, leased);
        const double jain = core::JainIndex(weights, shares);
        out.json["runs"].push_back(
            {{"label", label.str()},
             {"policy", policy},
             {"params", {{"sleep_s", sleep_s}, {"devices", devices}}},
             {"lambda", lambda},
             {"jain", jain},
             {"makespan_s", r->makespan_s},
             {"theoretical_s", r->theoretical_s},
             {"normalized_time", r->normalized_time},
             {"mean_wait_s", r->mean_wait_s},
             {"device_utilization",
              {{"leased", r->leased_fraction},
               {"in_use", r->in_use_fraction},
               {"plug", r->plug_fraction}}},
             {"tenants", tenants}});
        const int sleep_digits =
            sleep_s == static_cast<double>(static_cast<int64_t>(sleep_s)) ? 0 : 2;
        table.AddRow({policy, Fixed(sleep_s, sleep_digits), std::to_string(devices),
                      Fixed(r->makespan_s, 1),
                      Fixed(r->theoretical_s, 1), Fixed(r->normalized_time, 3),
                      (r->normalized_time >= 1 ? "+" : "") +
                          Percent(r->normalized_time - 1.0),
                      Fixed(r->mean_wait_s, 2), Percent(r->leased_fraction),
                      Percent(r->in_use_fraction), Percent(r->plug_fraction), Fixed(jain, 3)});
        out.series.push_back(
            Series{label.str(), "pool", "devices_leased", "devices", r->devices_leased});
        out.series.push_back(
            Series{label.str(), "pool", "waiting", "tenants", r->waiting_tenants});
      }
    }
  }
  std::ostringstream text;
  text << "scenario " << s.name << " (pool)";
  if (!s.description.empty()) text << ": " << s.description;
  text << "\n" << table.Render();
  text << "normalized = makespan / theoretical time (the workloads back to back on dedicated "
          "devices, spread over N); change = normalized - 1; mean_wait_s: request to usable "
          "device, plug-in included; leased/in_use/plug: share of device-time until the "
          "makespan.\n";
  out.table = text.str();
  return out;
}

}  // namespace gmux::sim
