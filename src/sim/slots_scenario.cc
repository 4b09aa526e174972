// Scenario kind "slots": DymGPU's experiment (Section IV, Table II, Fig. 9(c)). For every
// benchmark set (a mix of low, medium and high utilisation tenants) and every placement policy,
// one SlotsSim run; the result is the number of slots copied per policy and the reduction
// against the baseline and against size-based placement.
//
// File format (every key is checked; unknown keys are errors):
//   kind = "slots"          name = "..."          description = "..." (optional)
//   seed = 7                duration_s = 120      window_s = 1
//   policies = ["baseline", "size", "utilization"]
//   [device]     slots = 54, quantum_ms = 16, slot_copy_ms = 0.25, swap_batch = 0 (gmuxd's)
//   [allocator]  idle_detection, idle_threshold_s, monitor_period_s, utilization_window_s,
//                replacement_period_s, replacement_only_if_better, baseline_weight_per_occupant
//   order = "interleaved" | "grouped" | "shuffled"      repetitions = 1
//   [[levels]]   name, workload (label), burst_ms, think_ms, sizes_slots = [6, 11, 16]
//                or, instead of burst_ms and think_ms, a round of commands repeated:
//                round_bursts_ms = [83, 83, 180], round_thinks_ms = [1, 300, 400] (the think
//                after each command; one entry per command)
//   [[sets]]     set = 1, counts = [11, 2, 2]   (one count per level, in [[levels]] order)
// Tenants of a set are created at t = 0 with the levels interleaved (one of each level in turn
// while any remain); the k-th tenant of a level needs sizes_slots[k mod len] slots.
#include "sim/slots_scenario.h"

#include <cmath>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/slot_allocator.h"
#include "sim/rng.h"
#include "sim/slots_sim.h"
#include "sim/text_table.h"

namespace gmux::sim {
namespace {

struct Level {
  std::string name;
  std::string workload;
  Duration burst{};
  Duration think{};
  std::vector<Duration> round_bursts, round_thinks;
  std::vector<int32_t> sizes;
};

struct SetSpec {
  int64_t number = 0;
  std::vector<int64_t> counts;
};

enum class Order { kInterleaved, kGrouped, kShuffled };

struct Scenario {
  std::string name;
  Order order = Order::kInterleaved;
  int64_t repetitions = 1;
  SlotsSimOptions base;  // everything but the tenants and the policy
  std::vector<core::SlotPolicy> policies;
  std::vector<Level> levels;
  std::vector<SetSpec> sets;
};

Duration Ms(double ms) { return FromSeconds(ms * 1e-3); }

Result<std::vector<int64_t>> NonNegativeIntegers(const TomlDoc& doc, const toml::table& t,
                                                 std::string_view key, int64_t max) {
  GMUX_ASSIGN_OR_RETURN(std::vector<double> xs, doc.Numbers(t, key, std::nullopt));
  std::vector<int64_t> out;
  for (double x : xs) {
    if (x < 0 || x > static_cast<double>(max) || std::floor(x) != x) {
      return doc.Error(t.get(key), key,
                       "expected whole numbers in [0, " + std::to_string(max) + "]");
    }
    out.push_back(static_cast<int64_t>(x));
  }
  return out;
}

Status ParseAllocator(const TomlDoc& doc, const toml::table* t, core::SlotAllocatorOptions& a) {
  if (t == nullptr) return Status::Ok();
  GMUX_RETURN_IF_ERROR(doc.OnlyKeys(*t, {"idle_detection", "idle_threshold_s", "monitor_period_s",
                                         "utilization_window_s", "replacement_period_s",
                                         "baseline_weight_per_occupant",
                                         "replacement_only_if_better"}));
  GMUX_ASSIGN_OR_RETURN(a.idle_detection, doc.Bool(*t, "idle_detection", a.idle_detection));
  GMUX_ASSIGN_OR_RETURN(double idle, doc.Number(*t, "idle_threshold_s", 20, 1e-3, 1e6));
  GMUX_ASSIGN_OR_RETURN(double monitor, doc.Number(*t, "monitor_period_s", 1, 1e-3, 1e6));
  GMUX_ASSIGN_OR_RETURN(double window, doc.Number(*t, "utilization_window_s", 20, 1e-3, 1e6));
  GMUX_ASSIGN_OR_RETURN(double replace, doc.Number(*t, "replacement_period_s", 20, 0, 1e6));
  GMUX_ASSIGN_OR_RETURN(a.baseline_weight_per_occupant,
                        doc.Bool(*t, "baseline_weight_per_occupant", false));
  GMUX_ASSIGN_OR_RETURN(a.replacement_only_if_better,
                        doc.Bool(*t, "replacement_only_if_better", true));
  a.idle_threshold = FromSeconds(idle);
  a.monitor_period = FromSeconds(monitor);
  a.utilization_window = FromSeconds(window);
  a.replacement_period = FromSeconds(replace);
  return Status::Ok();
}

Result<Scenario> Parse(const TomlDoc& doc) {
  const toml::table& root = doc.root();
  GMUX_RETURN_IF_ERROR(doc.OnlyKeys(root, {"kind", "name", "description", "seed", "duration_s",
                                           "window_s", "policies", "order", "repetitions",
                                           "device", "allocator", "levels", "sets"}));
  Scenario sc;
  GMUX_ASSIGN_OR_RETURN(sc.name, doc.String(root, "name", std::string("slots")));
  GMUX_ASSIGN_OR_RETURN(std::string description, doc.String(root, "description", std::string()));
  (void)description;
  GMUX_ASSIGN_OR_RETURN(int64_t seed, doc.Integer(root, "seed", 1, 0));
  GMUX_ASSIGN_OR_RETURN(double duration_s, doc.Number(root, "duration_s", 120, 1e-3, 1e6));
  GMUX_ASSIGN_OR_RETURN(double window_s, doc.Number(root, "window_s", 1, 1e-3, 1e6));
  if (window_s > duration_s) {
    return doc.Error(root.get("window_s"), "window_s", "must not exceed duration_s");
  }
  GMUX_ASSIGN_OR_RETURN(std::string order,
                        doc.Choice(root, "order", std::string("interleaved"),
                                   {"interleaved", "grouped", "shuffled"}));
  sc.order = order == "grouped"    ? Order::kGrouped
             : order == "shuffled" ? Order::kShuffled
                                   : Order::kInterleaved;
  GMUX_ASSIGN_OR_RETURN(sc.repetitions, doc.Integer(root, "repetitions", 1, 1, 10000));
  sc.base.seed = static_cast<uint64_t>(seed);
  sc.base.duration = FromSeconds(duration_s);
  sc.base.window = FromSeconds(window_s);

  GMUX_ASSIGN_OR_RETURN(std::vector<std::string> policies,
                        doc.Strings(root, "policies",
                                    std::vector<std::string>{"baseline", "size", "utilization"}));
  if (policies.empty()) return doc.Error(root.get("policies"), "policies", "must not be empty");
  for (const std::string& p : policies) {
    auto parsed = core::ParseSlotPolicy(p);
    if (!parsed.ok()) return doc.Error(root.get("policies"), "policies", parsed.status().message());
    sc.policies.push_back(*parsed);
  }

  GMUX_ASSIGN_OR_RETURN(const toml::table* device, doc.Table(root, "device", false));
  int64_t slots = 54;
  if (device != nullptr) {
    GMUX_RETURN_IF_ERROR(
        doc.OnlyKeys(*device, {"slots", "quantum_ms", "slot_copy_ms", "swap_batch"}));
    GMUX_ASSIGN_OR_RETURN(slots, doc.Integer(*device, "slots", 54, 1, 1 << 24));
    GMUX_ASSIGN_OR_RETURN(double quantum_ms, doc.Number(*device, "quantum_ms", 16, 1e-3, 1e6));
    GMUX_ASSIGN_OR_RETURN(double copy_ms, doc.Number(*device, "slot_copy_ms", 0.25, 0, 1e6));
    sc.base.quantum = Ms(quantum_ms);
    sc.base.slot_copy = Ms(copy_ms);
    GMUX_ASSIGN_OR_RETURN(sc.base.batch, doc.Number(*device, "swap_batch", 0, 0, 100));
  }
  sc.base.allocator.slots = static_cast<int32_t>(slots);
  GMUX_ASSIGN_OR_RETURN(const toml::table* allocator, doc.Table(root, "allocator", false));
  GMUX_RETURN_IF_ERROR(ParseAllocator(doc, allocator, sc.base.allocator));

  GMUX_ASSIGN_OR_RETURN(std::vector<const toml::table*> levels, doc.Tables(root, "levels", true));
  if (levels.empty()) return doc.Error(root.get("levels"), "levels", "needs at least one level");
  for (const toml::table* t : levels) {
    GMUX_RETURN_IF_ERROR(
        doc.OnlyKeys(*t, {"name", "workload", "burst_ms", "think_ms", "sizes_slots",
                          "round_bursts_ms", "round_thinks_ms"}));
    Level l;
    GMUX_ASSIGN_OR_RETURN(l.name, doc.String(*t, "name", std::nullopt));
    GMUX_ASSIGN_OR_RETURN(l.workload, doc.String(*t, "workload", l.name));
    if (t->contains("round_bursts_ms") || t->contains("round_thinks_ms")) {
      if (t->contains("burst_ms") || t->contains("think_ms")) {
        return doc.Error(t->get("burst_ms") ? t->get("burst_ms") : t->get("think_ms"),
                         t->contains("burst_ms") ? "burst_ms" : "think_ms",
                         "give either burst_ms and think_ms or round_bursts_ms and "
                         "round_thinks_ms, not both");
      }
      GMUX_ASSIGN_OR_RETURN(std::vector<double> bursts,
                            doc.Numbers(*t, "round_bursts_ms", std::nullopt));
      GMUX_ASSIGN_OR_RETURN(std::vector<double> thinks,
                            doc.Numbers(*t, "round_thinks_ms", std::nullopt));
      if (bursts.empty() || bursts.size() != thinks.size()) {
        return doc.Error(t->get("round_thinks_ms"), "round_thinks_ms",
                         "needs one think time per command of round_bursts_ms (and at least one)");
      }
      for (size_t k = 0; k < bursts.size(); ++k) {
        if (!(bursts[k] >= 1e-3 && bursts[k] <= 1e6) || !(thinks[k] >= 0 && thinks[k] <= 1e7)) {
          return doc.Error(t->get("round_bursts_ms"), "round_bursts_ms",
                           "bursts must be in [0.001, 1e6] ms and thinks in [0, 1e7] ms");
        }
        l.round_bursts.push_back(Ms(bursts[k]));
        l.round_thinks.push_back(Ms(thinks[k]));
      }
      // Means over the round, for what reads them (tables, validation).
      Duration b{0}, th{0};
      for (size_t k = 0; k < bursts.size(); ++k) {
        b += l.round_bursts[k];
        th += l.round_thinks[k];
      }
      l.burst = b / static_cast<int64_t>(bursts.size());
      l.think = th / static_cast<int64_t>(bursts.size());
    } else {
      GMUX_ASSIGN_OR_RETURN(double burst_ms, doc.Number(*t, "burst_ms", std::nullopt, 1e-3, 1e6));
      GMUX_ASSIGN_OR_RETURN(double think_ms, doc.Number(*t, "think_ms", std::nullopt, 0, 1e7));
      l.burst = Ms(burst_ms);
      l.think = Ms(think_ms);
    }
    GMUX_ASSIGN_OR_RETURN(std::vector<int64_t> sizes,
                          NonNegativeIntegers(doc, *t, "sizes_slots", slots));
    if (sizes.empty()) return doc.Error(t->get("sizes_slots"), "sizes_slots", "must not be empty");
    for (int64_t s : sizes) {
      if (s < 1) {
        return doc.Error(t->get("sizes_slots"), "sizes_slots",
                         "every size must be in [1, device.slots = " + std::to_string(slots) + "]");
      }
      l.sizes.push_back(static_cast<int32_t>(s));
    }
    sc.levels.push_back(std::move(l));
  }

  GMUX_ASSIGN_OR_RETURN(std::vector<const toml::table*> sets, doc.Tables(root, "sets", true));
  if (sets.empty()) return doc.Error(root.get("sets"), "sets", "needs at least one set");
  for (const toml::table* t : sets) {
    GMUX_RETURN_IF_ERROR(doc.OnlyKeys(*t, {"set", "counts"}));
    SetSpec s;
    GMUX_ASSIGN_OR_RETURN(s.number, doc.Integer(*t, "set", std::nullopt, 0));
    GMUX_ASSIGN_OR_RETURN(s.counts, NonNegativeIntegers(doc, *t, "counts", 100000));
    if (s.counts.size() != sc.levels.size()) {
      return doc.Error(t->get("counts"), "counts",
                       "needs one count per level (" + std::to_string(sc.levels.size()) + ")");
    }
    int64_t total = 0;
    for (int64_t c : s.counts) total += c;
    if (total < 1) return doc.Error(t->get("counts"), "counts", "needs at least one tenant");
    sc.sets.push_back(std::move(s));
  }
  return sc;
}

// The set's tenants in creation order. Names and sizes depend only on the level and the rank k
// within it, so a tenant is the same tenant whatever the order.
std::vector<SlotsTenantSpec> TenantsOf(const Scenario& sc, const SetSpec& set, uint64_t seed) {
  std::vector<SlotsTenantSpec> out;
  auto make = [&](size_t l, size_t k) {
    const Level& level = sc.levels[l];
    SlotsTenantSpec t;
    t.name = level.workload + "-" + std::to_string(k + 1);
    t.level = level.name;
    t.slots = level.sizes[k % level.sizes.size()];
    t.burst = level.burst;
    t.think = level.think;
    t.round_bursts = level.round_bursts;
    t.round_thinks = level.round_thinks;
    out.push_back(std::move(t));
  };
  if (sc.order == Order::kGrouped) {
    for (size_t l = 0; l < sc.levels.size(); ++l) {
      for (int64_t k = 0; k < set.counts[l]; ++k) make(l, static_cast<size_t>(k));
    }
    return out;
  }
  std::vector<int64_t> made(sc.levels.size(), 0);
  for (bool any = true; any;) {
    any = false;
    for (size_t l = 0; l < sc.levels.size(); ++l) {
      if (made[l] >= set.counts[l]) continue;
      make(l, static_cast<size_t>(made[l]++));
      any = true;
    }
  }
  if (sc.order == Order::kShuffled) {
    // Fisher-Yates with the portable Rng; a stream of its own, apart from the workload's.
    Rng rng = Rng(seed).Fork(0x5107);
    for (size_t i = out.size(); i > 1; --i) {
      size_t j = static_cast<size_t>(rng.NextU64() % i);
      std::swap(out[i - 1], out[j]);
    }
  }
  return out;
}

std::string Mix(const SetSpec& set) {
  std::string out;
  for (int64_t c : set.counts) out += (out.empty() ? "" : "/") + std::to_string(c);
  return out;
}

nlohmann::json Reduction(std::optional<double> x, std::optional<double> base) {
  if (!x || !base || *base == 0) return nullptr;
  return 100.0 * (1.0 - *x / *base);
}

std::string Pct(const nlohmann::json& v) {
  return v.is_number() ? Fixed(v.get<double>(), 1) + "%" : "-";
}

// One (set, policy) cell: every repetition's result, plus sums and means across them.
struct Cell {
  std::vector<SlotsSimResult> reps;
  std::vector<std::vector<SlotsTenantSpec>> specs;  // creation order of each repetition
};

Result<Cell> RunCell(const Scenario& sc, const SetSpec& set, core::SlotPolicy policy) {
  Cell cell;
  for (int64_t rep = 0; rep < sc.repetitions; ++rep) {
    SlotsSimOptions o = sc.base;
    o.seed = sc.base.seed + static_cast<uint64_t>(rep);
    o.allocator.policy = policy;
    o.tenants = TenantsOf(sc, set, o.seed);
    GMUX_ASSIGN_OR_RETURN(SlotsSimResult r, RunSlotsSim(o));
    cell.reps.push_back(std::move(r));
    cell.specs.push_back(std::move(o.tenants));
  }
  return cell;
}

}  // namespace

Result<ScenarioOutput> RunSlotsScenario(const TomlDoc& doc) {
  GMUX_ASSIGN_OR_RETURN(Scenario sc, Parse(doc));
  ScenarioOutput out;
  out.json = {{"scenario", sc.name},
              {"kind", "slots"},
              {"repetitions", sc.repetitions},
              {"runs", nlohmann::json::array()}};
  nlohmann::json summary = nlohmann::json::array();

  std::string level_names;
  for (const Level& l : sc.levels) level_names += (level_names.empty() ? "" : "/") + l.name;
  std::vector<std::string> header = {"set", "mix (" + level_names + ")"};
  for (core::SlotPolicy p : sc.policies) header.push_back(std::string(core::SlotPolicyName(p)));
  header.insert(header.end(), {"size vs base", "util vs base", "util vs size"});
  TextTable copies_table(header);
  TextTable runs_table({"run", "switches", "switch copies", "move copies", "slot copies",
                        "shared slots", "copy time s", "device busy", "frames/s", "lambda",
                        "jain"});
  const double duration_s = ToSeconds(sc.base.duration);
  const double reps = static_cast<double>(sc.repetitions);

  for (const SetSpec& set : sc.sets) {
    std::map<core::SlotPolicy, double> copies;
    for (core::SlotPolicy policy : sc.policies) {
      auto cell_or = RunCell(sc, set, policy);
      if (!cell_or.ok()) {
        return cell_or.status().WithPrefix(doc.path() + ": set " + std::to_string(set.number));
      }
      const Cell& cell = *cell_or;
      const std::string policy_name(core::SlotPolicyName(policy));
      const std::string label = "set " + std::to_string(set.number) + " / " + policy_name;

      // Means over repetitions (a single run when repetitions = 1).
      auto mean = [&](auto f) {
        double sum = 0;
        for (const SlotsSimResult& r : cell.reps) sum += static_cast<double>(f(r));
        return sum / reps;
      };
      const double slot_copies = mean([](const SlotsSimResult& r) { return r.counters.total_copies(); });
      copies[policy] = slot_copies;
      nlohmann::json per_rep = nlohmann::json::array();
      for (const SlotsSimResult& r : cell.reps) per_rep.push_back(r.counters.total_copies());

      // Tenants by name across repetitions, listed in the first repetition's creation order.
      struct Acc {
        const SlotsTenantResult* first = nullptr;
        double share = 0, utilization = 0, frames = 0, switch_ins = 0, copies = 0, moves = 0;
        std::vector<double> busy_per_window;
      };
      std::map<std::string, Acc> acc;
      for (const SlotsSimResult& r : cell.reps) {
        for (const SlotsTenantResult& t : r.tenants) {
          Acc& a = acc[t.name];
          if (a.first == nullptr) a.first = &t;
          a.share += t.share / reps;
          a.utilization += t.utilization / reps;
          a.frames += static_cast<double>(t.frames) / reps;
          a.switch_ins += static_cast<double>(t.switch_ins) / reps;
          a.copies += static_cast<double>(t.copies) / reps;
          a.moves += static_cast<double>(t.moves) / reps;
          a.busy_per_window.resize(t.busy_per_window.size(), 0.0);
          for (size_t w = 0; w < t.busy_per_window.size(); ++w) {
            a.busy_per_window[w] += t.busy_per_window[w] / reps;
          }
        }
      }
      nlohmann::json tenants = nlohmann::json::array();
      double frames = 0;
      const double window_s = ToSeconds(sc.base.window);
      for (const SlotsTenantSpec& spec : cell.specs.front()) {
        const Acc& a = acc.at(spec.name);
        frames += a.frames;
        tenants.push_back(
            {{"name", spec.name},
             {"weight", 1.0},
             {"share", a.share},
             {"commands", a.frames},
             {"completions_s", nlohmann::json::array()},
             {"level", spec.level},
             {"slots", spec.slots},
             {"start", a.first->final_start ? nlohmann::json(*a.first->final_start) : nullptr},
             {"utilization", a.utilization},
             {"switch_ins", a.switch_ins},
             {"slot_copies", a.copies},
             {"moves", a.moves}});
        Series u{label, spec.name, "utilization", "fraction", {}};
        for (size_t w = 0; w < a.busy_per_window.size(); ++w) {
          u.points.push_back({window_s * static_cast<double>(w + 1), a.busy_per_window[w]});
        }
        out.series.push_back(std::move(u));
      }

      const double switches = mean([](const SlotsSimResult& r) { return r.counters.switches; });
      const double switch_copies =
          mean([](const SlotsSimResult& r) { return r.counters.switch_copies; });
      const double move_copies = mean([](const SlotsSimResult& r) { return r.counters.move_copies; });
      const double shared = mean([](const SlotsSimResult& r) { return r.shared_slots; });
      const double copy_time = mean([](const SlotsSimResult& r) { return r.copy_time_s; });
      const double busy = mean([](const SlotsSimResult& r) { return r.device_busy; });
      const double lambda = mean([](const SlotsSimResult& r) { return r.lambda; });
      const double jain = mean([](const SlotsSimResult& r) { return r.jain; });
      out.json["runs"].push_back(
          {{"label", label},
           {"policy", policy_name},
           {"params", {{"set", set.number}}},
           {"lambda", lambda},
           {"jain", jain},
           {"slot_copies", slot_copies},
           {"slot_copies_per_repetition", per_rep},
           {"switch_copies", switch_copies},
           {"move_copies", move_copies},
           {"switches", switches},
           {"moves", mean([](const SlotsSimResult& r) { return r.counters.moves; })},
           {"reallocations", mean([](const SlotsSimResult& r) { return r.counters.reallocations; })},
           {"idle_evictions",
            mean([](const SlotsSimResult& r) { return r.counters.idle_evictions; })},
           {"skipped_replacements",
            mean([](const SlotsSimResult& r) { return r.counters.skipped_replacements; })},
           {"shared_slots", shared},
           {"copy_time_s", copy_time},
           {"swap_batch", sc.base.batch},
           {"batches", mean([](const SlotsSimResult& r) { return r.batches; })},
           {"device_busy", busy},
           {"frames", frames},
           {"tenants", tenants}});

      runs_table.AddRow({label, Fixed(switches, 0), Fixed(switch_copies, 0), Fixed(move_copies, 0),
                         Fixed(slot_copies, 0), Fixed(shared, 1), Fixed(copy_time, 2),
                         Fixed(100 * busy, 1) + "%", Fixed(frames / duration_s, 1),
                         Fixed(lambda, 3), Fixed(jain, 3)});

      Series cumulative{label, "all", "slot_copies", "slots", {}};
      const SlotsSimResult& r0 = cell.reps.front();
      for (size_t w = 0; w < r0.window_end_s.size(); ++w) {
        double c = 0;
        for (const SlotsSimResult& r : cell.reps) c += static_cast<double>(r.cumulative_copies[w]);
        cumulative.points.push_back({r0.window_end_s[w], c / reps});
      }
      out.series.push_back(std::move(cumulative));
    }
    runs_table.AddRule();

    auto get = [&](core::SlotPolicy p) -> std::optional<double> {
      auto it = copies.find(p);
      return it == copies.end() ? std::nullopt : std::optional<double>(it->second);
    };
    auto base = get(core::SlotPolicy::kBaseline);
    auto size = get(core::SlotPolicy::kSize);
    auto util = get(core::SlotPolicy::kUtilization);
    nlohmann::json row = {{"set", set.number},
                          {"size_vs_baseline_pct", Reduction(size, base)},
                          {"utilization_vs_baseline_pct", Reduction(util, base)},
                          {"utilization_vs_size_pct", Reduction(util, size)}};
    std::vector<std::string> cells = {std::to_string(set.number), Mix(set)};
    for (core::SlotPolicy p : sc.policies) {
      row[std::string(core::SlotPolicyName(p))] = copies[p];
      cells.push_back(Fixed(copies[p], 0));
    }
    cells.push_back(Pct(row["size_vs_baseline_pct"]));
    cells.push_back(Pct(row["utilization_vs_baseline_pct"]));
    cells.push_back(Pct(row["utilization_vs_size_pct"]));
    copies_table.AddRow(std::move(cells));
    summary.push_back(std::move(row));
  }
  out.json["summary"] = std::move(summary);
  out.table = "Slot copies per policy (switch + move copies";
  if (sc.repetitions > 1) out.table += ", mean of " + std::to_string(sc.repetitions) + " runs";
  out.table += "; reductions: positive = fewer copies)\n" + copies_table.Render() + "\nPer run\n" +
               runs_table.Render();
  return out;
}

}  // namespace gmux::sim
