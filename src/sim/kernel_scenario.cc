// Scenario kind "kernel": closed-loop kernel and frame submitters sharing simulated devices,
// each experiment run once per policy on identical random streams (common random numbers), so
// the policies are compared on the same workload. The file format is documented in
// docs/simulator.md ("Scenario files, kind = kernel"); in short:
//
//   kind = "kernel"            name, description, seed, policies, duration_s | repetitions,
//                              window_s, lambda_metric, record_completions, max_duration_s
//   [device]                   count, compute_units, wavefront_width, memory_bytes,
//                              bus_bytes_per_s, dispatch_overhead_s, inflight
//   [policy.NAME]              numeric parameters handed to core::MakePolicy
//   [workload.NAME]            type = frames | matmul | sobel | binomial | kernel, plus its keys
//   [[experiment]]             name, tenants = N | [N, ...] (a sweep), workloads, weights,
//                              [[experiment.mix]] (a sweep of mixes), or [[experiment.tenant]];
//                              may override policies, duration_s, repetitions, seed
#include "sim/kernel_scenario.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <map>
#include <numeric>
#include <set>
#include <sstream>

#include "core/metrics.h"
#include "core/policy.h"
#include "sim/kernel_sim.h"
#include "sim/text_table.h"
#include "sim/workloads.h"

namespace gmux::sim {
namespace {

using nlohmann::json;

// ---- Parsed scenario ---------------------------------------------------------------------------

struct WorkloadDef {
  std::string name;
  bool frames = false;
  KernelLoopOptions kernel;
  FrameLoopOptions frame;
  bool Bounded() const { return frames ? frame.frames > 0 : kernel.tasks > 0; }
  Result<std::unique_ptr<Workload>> Make() const {
    return frames ? MakeFrameLoop(frame) : MakeKernelLoop(kernel);
  }
};

struct TenantDef {
  std::string name;
  double weight = 1;
  const WorkloadDef* workload = nullptr;
};

// One set of tenants, run once per policy.
struct Variant {
  std::string experiment;
  json params;  // what varies between variants (never the policy)
  std::string label;
  std::vector<TenantDef> tenants;
  std::vector<std::string> policies;
  const toml::node* policies_node = nullptr;  // for error messages
  double duration_s = 0;                      // 0: until the workloads finish
  int64_t repetitions = 1;
  uint64_t seed = 1;
};

struct Scenario {
  std::string name;
  std::string description;
  double window_s = 1;
  std::string lambda_metric = "blocks";
  bool record_completions = true;
  double max_duration_s = 3600;
  uint32_t devices = 1;
  uint32_t inflight = 1;
  core::DeviceInfo device;
  double dispatch_overhead_s = 0;
  std::map<std::string, std::map<std::string, double>> policy_params;
  std::map<std::string, WorkloadDef> workloads;
  std::vector<Variant> variants;
};

uint64_t Mix(uint64_t a, uint64_t b) {
  uint64_t z = a ^ (b + 0x9E3779B97F4A7C15ULL + (a << 6) + (a >> 2));
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

std::string WeightsText(const std::vector<TenantDef>& tenants) {
  std::ostringstream s;
  for (size_t i = 0; i < tenants.size(); ++i) {
    if (i > 0) s << ":";
    s << tenants[i].weight;
  }
  return s.str();
}

Status ParseWorkload(const TomlDoc& doc, const std::string& name, const toml::table& t,
                     WorkloadDef* out) {
  GMUX_ASSIGN_OR_RETURN(std::string type,
                        doc.Choice(t, "type", std::nullopt,
                                   {"frames", "matmul", "sobel", "binomial", "kernel"}));
  out->name = name;
  InterferenceOptions in;
  GMUX_ASSIGN_OR_RETURN(in.jitter_s, doc.Number(t, "jitter_s", 0.0, 0.0, 1e6));
  GMUX_ASSIGN_OR_RETURN(in.burst_prob, doc.Number(t, "burst_prob", 0.0, 0.0, 1.0));
  GMUX_ASSIGN_OR_RETURN(int64_t burst_blocks, doc.Integer(t, "burst_blocks", 0, 0, 1'000'000));
  in.burst_blocks = static_cast<uint32_t>(burst_blocks);
  GMUX_ASSIGN_OR_RETURN(int64_t burst_len, doc.Integer(t, "burst_len", 1, 1, 1'000'000'000));
  in.burst_len = static_cast<uint32_t>(burst_len);
  GMUX_ASSIGN_OR_RETURN(int64_t burst_depth, doc.Integer(t, "burst_depth", 0, 0, 1'000'000));
  in.burst_depth = static_cast<uint32_t>(burst_depth);
  if (type != "frames" && burst_depth != 0) {
    return doc.Error(t.get("burst_depth"), "burst_depth", "applies to frame workloads only");
  }
  GMUX_ASSIGN_OR_RETURN(in.cost_cv, doc.Number(t, "cost_cv", 0.0, 0.0, 100.0));
  GMUX_ASSIGN_OR_RETURN(in.think_s, doc.Number(t, "think_s", 0.0, 0.0, 1e6));
  GMUX_ASSIGN_OR_RETURN(in.start_jitter_s, doc.Number(t, "start_jitter_s", 0.0, 0.0, 1e6));

  if (type == "frames") {
    GMUX_RETURN_IF_ERROR(doc.OnlyKeys(
        t, {"type", "jitter_s", "burst_prob", "burst_len", "burst_blocks", "cost_cv", "think_s",
            "start_jitter_s", "burst_depth", "blocks_per_frame", "block_cost_s", "block_items", "present_cost_s",
            "cpu_per_frame_s", "cpu_per_block_s", "frames_in_flight", "frames"}));
    FrameLoopOptions f;
    f.label = name;
    f.interference = in;
    GMUX_ASSIGN_OR_RETURN(int64_t bpf, doc.Integer(t, "blocks_per_frame", f.blocks_per_frame, 1, 1'000'000));
    f.blocks_per_frame = static_cast<uint32_t>(bpf);
    GMUX_ASSIGN_OR_RETURN(f.block_cost_s, doc.Number(t, "block_cost_s", f.block_cost_s, 0.0, 1e6));
    GMUX_ASSIGN_OR_RETURN(int64_t items, doc.Integer(t, "block_items", static_cast<int64_t>(f.block_items), 1, INT64_MAX));
    f.block_items = static_cast<uint64_t>(items);
    GMUX_ASSIGN_OR_RETURN(f.present_cost_s, doc.Number(t, "present_cost_s", f.present_cost_s, 0.0, 1e6));
    GMUX_ASSIGN_OR_RETURN(f.cpu_per_frame_s, doc.Number(t, "cpu_per_frame_s", f.cpu_per_frame_s, 0.0, 1e6));
    GMUX_ASSIGN_OR_RETURN(f.cpu_per_block_s, doc.Number(t, "cpu_per_block_s", f.cpu_per_block_s, 0.0, 1e6));
    GMUX_ASSIGN_OR_RETURN(int64_t fif, doc.Integer(t, "frames_in_flight", f.frames_in_flight, 1, 1'000'000));
    f.frames_in_flight = static_cast<uint32_t>(fif);
    GMUX_ASSIGN_OR_RETURN(int64_t frames, doc.Integer(t, "frames", 0, 0, INT64_MAX));
    f.frames = static_cast<uint64_t>(frames);
    out->frames = true;
    out->frame = f;
    Status s = f.Validate();
    if (!s.ok()) return doc.Error(&t, name, s.message());
    return Status::Ok();
  }

  KernelLoopOptions k;
  if (type == "matmul") {
    GMUX_RETURN_IF_ERROR(doc.OnlyKeys(
        t, {"type", "jitter_s", "burst_prob", "burst_len", "burst_blocks", "cost_cv", "think_s",
            "start_jitter_s", "burst_depth", "n", "local_size", "splittable", "upload_bytes", "kernels_per_task", "tasks",
            "cpu_per_task_s", "cpu_per_kernel_s"}));
    GMUX_ASSIGN_OR_RETURN(int64_t n, doc.Integer(t, "n", std::nullopt, 1, 4'000'000));
    k = MatmulKernel(static_cast<uint64_t>(n));
  } else if (type == "sobel") {
    GMUX_RETURN_IF_ERROR(doc.OnlyKeys(
        t, {"type", "jitter_s", "burst_prob", "burst_len", "burst_blocks", "cost_cv", "think_s",
            "start_jitter_s", "burst_depth", "width", "height", "local_size", "splittable", "upload_bytes", "kernels_per_task",
            "tasks", "cpu_per_task_s", "cpu_per_kernel_s"}));
    GMUX_ASSIGN_OR_RETURN(int64_t w, doc.Integer(t, "width", std::nullopt, 1, 4'000'000));
    GMUX_ASSIGN_OR_RETURN(int64_t h, doc.Integer(t, "height", std::nullopt, 1, 4'000'000));
    k = SobelKernel(static_cast<uint64_t>(w), static_cast<uint64_t>(h));
  } else if (type == "binomial") {
    GMUX_RETURN_IF_ERROR(doc.OnlyKeys(
        t, {"type", "jitter_s", "burst_prob", "burst_len", "burst_blocks", "cost_cv", "think_s",
            "start_jitter_s", "burst_depth", "samples", "local_size", "splittable", "upload_bytes", "kernels_per_task", "tasks",
            "cpu_per_task_s", "cpu_per_kernel_s"}));
    GMUX_ASSIGN_OR_RETURN(int64_t s, doc.Integer(t, "samples", std::nullopt, 1, INT64_MAX));
    k = BinomialKernel(static_cast<uint64_t>(s));
  } else {
    GMUX_RETURN_IF_ERROR(doc.OnlyKeys(
        t, {"type", "jitter_s", "burst_prob", "burst_len", "burst_blocks", "cost_cv", "think_s",
            "start_jitter_s", "burst_depth", "work_items", "kernel_cost_s", "local_size", "splittable", "upload_bytes",
            "kernels_per_task", "tasks", "cpu_per_task_s", "cpu_per_kernel_s"}));
    GMUX_ASSIGN_OR_RETURN(int64_t items, doc.Integer(t, "work_items", std::nullopt, 1, INT64_MAX));
    k.work_items = static_cast<uint64_t>(items);
    GMUX_ASSIGN_OR_RETURN(k.kernel_cost_s, doc.Number(t, "kernel_cost_s", std::nullopt, 0.0, 1e6));
  }
  k.label = name;
  k.interference = in;
  GMUX_ASSIGN_OR_RETURN(int64_t local, doc.Integer(t, "local_size", static_cast<int64_t>(k.local_size), 1, 1 << 20));
  k.local_size = static_cast<uint64_t>(local);
  GMUX_ASSIGN_OR_RETURN(k.splittable, doc.Bool(t, "splittable", k.splittable));
  GMUX_ASSIGN_OR_RETURN(double upload, doc.Number(t, "upload_bytes", static_cast<double>(k.upload_bytes), 0.0, 1e15));
  k.upload_bytes = static_cast<uint64_t>(upload);
  GMUX_ASSIGN_OR_RETURN(int64_t kpt, doc.Integer(t, "kernels_per_task", 1, 1, 1'000'000));
  k.kernels_per_task = static_cast<uint32_t>(kpt);
  GMUX_ASSIGN_OR_RETURN(int64_t tasks, doc.Integer(t, "tasks", 0, 0, INT64_MAX));
  k.tasks = static_cast<uint64_t>(tasks);
  GMUX_ASSIGN_OR_RETURN(k.cpu_per_task_s, doc.Number(t, "cpu_per_task_s", k.cpu_per_task_s, 0.0, 1e6));
  GMUX_ASSIGN_OR_RETURN(k.cpu_per_kernel_s, doc.Number(t, "cpu_per_kernel_s", k.cpu_per_kernel_s, 0.0, 1e6));
  out->kernel = k;
  Status s = k.Validate();
  if (!s.ok()) return doc.Error(&t, name, s.message());
  return Status::Ok();
}

// A key read from the experiment table when present there, else from the file's top level.
const toml::table& Owner(const toml::table& exp, const toml::table& root, std::string_view key) {
  return exp.contains(key) ? exp : root;
}

Result<const WorkloadDef*> LookupWorkload(const TomlDoc& doc, const Scenario& sc,
                                          const toml::table& t, std::string_view key,
                                          const std::string& name) {
  auto it = sc.workloads.find(name);
  if (it == sc.workloads.end()) {
    std::string known;
    for (const auto& [k, v] : sc.workloads) known += (known.empty() ? "" : ", ") + k;
    return doc.Error(t.get(key), key,
                     "unknown workload '" + name + "' (defined: " +
                         (known.empty() ? std::string("none; add a [workload.NAME] table") : known) + ")");
  }
  return &it->second;
}

Status ParseExperiment(const TomlDoc& doc, Scenario& sc, const toml::table& exp, size_t index) {
  const toml::table& root = doc.root();
  GMUX_RETURN_IF_ERROR(doc.OnlyKeys(exp, {"name", "tenants", "workloads", "weights", "mix",
                                          "tenant", "tenant_prefix", "policies", "duration_s",
                                          "repetitions", "seed"}));
  GMUX_ASSIGN_OR_RETURN(std::string name,
                        doc.String(exp, "name", "experiment" + std::to_string(index + 1)));
  GMUX_ASSIGN_OR_RETURN(std::vector<std::string> policies,
                        doc.Strings(Owner(exp, root, "policies"), "policies",
                                    std::vector<std::string>{"fifo"}));
  if (policies.empty()) return doc.Error(Owner(exp, root, "policies").get("policies"), "policies", "is empty");
  const toml::node* policies_node = Owner(exp, root, "policies").get("policies");
  GMUX_ASSIGN_OR_RETURN(int64_t seed, doc.Integer(Owner(exp, root, "seed"), "seed", 1));
  GMUX_ASSIGN_OR_RETURN(double duration_s,
                        doc.Number(Owner(exp, root, "duration_s"), "duration_s", 0.0, 0.0, 1e7));
  GMUX_ASSIGN_OR_RETURN(int64_t reps,
                        doc.Integer(Owner(exp, root, "repetitions"), "repetitions", 1, 1, 100000));
  GMUX_ASSIGN_OR_RETURN(std::string prefix, doc.String(exp, "tenant_prefix", "vm"));

  // The tenant sets this experiment sweeps over: (tenant defs, params) pairs.
  struct Set {
    std::vector<TenantDef> tenants;
    json params;
  };
  std::vector<Set> sets;
  GMUX_ASSIGN_OR_RETURN(auto explicit_tenants, doc.Tables(exp, "tenant", false));
  if (!explicit_tenants.empty()) {
    for (auto key : {"tenants", "workloads", "weights", "mix"}) {
      if (exp.contains(key)) {
        return doc.Error(exp.get(key), key, "cannot be combined with [[experiment.tenant]] entries");
      }
    }
    Set s;
    std::set<std::string> names;
    for (const toml::table* t : explicit_tenants) {
      GMUX_RETURN_IF_ERROR(doc.OnlyKeys(*t, {"name", "weight", "workload"}));
      TenantDef d;
      GMUX_ASSIGN_OR_RETURN(d.name, doc.String(*t, "name", prefix + std::to_string(s.tenants.size() + 1)));
      if (!names.insert(d.name).second) return doc.Error(t->get("name"), "name", "duplicate tenant name '" + d.name + "'");
      GMUX_ASSIGN_OR_RETURN(d.weight, doc.Number(*t, "weight", 1.0, 1e-9, 1e9));
      GMUX_ASSIGN_OR_RETURN(std::string w, doc.String(*t, "workload", std::nullopt));
      GMUX_ASSIGN_OR_RETURN(d.workload, LookupWorkload(doc, sc, *t, "workload", w));
      s.tenants.push_back(d);
    }
    s.params = json{{"tenants", s.tenants.size()}, {"weights", WeightsText(s.tenants)}};
    sets.push_back(std::move(s));
  } else {
    GMUX_ASSIGN_OR_RETURN(std::vector<double> counts, doc.Numbers(exp, "tenants", std::nullopt));
    for (double c : counts) {
      if (c < 1 || c > 100000 || c != std::floor(c)) {
        return doc.Error(exp.get("tenants"), "tenants", "expected whole numbers in [1, 100000]");
      }
    }
    GMUX_ASSIGN_OR_RETURN(std::vector<double> weights, doc.Numbers(exp, "weights", std::vector<double>{1.0}));
    if (weights.empty()) return doc.Error(exp.get("weights"), "weights", "is empty");
    for (double w : weights) {
      if (!(w > 0)) return doc.Error(exp.get("weights"), "weights", "weights must be > 0");
    }
    // Mixes: [[experiment.mix]] {name, workloads}, or one implicit mix from `workloads`.
    struct MixDef {
      std::string name;
      std::vector<const WorkloadDef*> workloads;
    };
    std::vector<MixDef> mixes;
    GMUX_ASSIGN_OR_RETURN(auto mix_tables, doc.Tables(exp, "mix", false));
    if (!mix_tables.empty() && exp.contains("workloads")) {
      return doc.Error(exp.get("workloads"), "workloads", "give either workloads or [[experiment.mix]] entries, not both");
    }
    for (const toml::table* m : mix_tables) {
      GMUX_RETURN_IF_ERROR(doc.OnlyKeys(*m, {"name", "workloads"}));
      MixDef md;
      GMUX_ASSIGN_OR_RETURN(md.name, doc.String(*m, "name", std::nullopt));
      GMUX_ASSIGN_OR_RETURN(std::vector<std::string> ws, doc.Strings(*m, "workloads", std::nullopt));
      if (ws.empty()) return doc.Error(m->get("workloads"), "workloads", "is empty");
      for (const auto& w : ws) {
        GMUX_ASSIGN_OR_RETURN(const WorkloadDef* def, LookupWorkload(doc, sc, *m, "workloads", w));
        md.workloads.push_back(def);
      }
      mixes.push_back(std::move(md));
    }
    if (mix_tables.empty()) {
      GMUX_ASSIGN_OR_RETURN(std::vector<std::string> ws, doc.Strings(exp, "workloads", std::nullopt));
      if (ws.empty()) return doc.Error(exp.get("workloads"), "workloads", "is empty");
      MixDef md;
      std::set<std::string> distinct(ws.begin(), ws.end());
      md.name = distinct.size() == 1 ? "same" : "mixed";
      for (const auto& w : ws) {
        GMUX_ASSIGN_OR_RETURN(const WorkloadDef* def, LookupWorkload(doc, sc, exp, "workloads", w));
        md.workloads.push_back(def);
      }
      mixes.push_back(std::move(md));
    }
    for (double c : counts) {
      for (const auto& m : mixes) {
        Set s;
        const auto n = static_cast<size_t>(c);
        for (size_t i = 0; i < n; ++i) {
          TenantDef d;
          d.name = prefix + std::to_string(i + 1);
          d.weight = weights[i % weights.size()];
          d.workload = m.workloads[i % m.workloads.size()];
          s.tenants.push_back(d);
        }
        s.params = json{{"tenants", n}, {"mix", m.name}, {"weights", WeightsText(s.tenants)}};
        sets.push_back(std::move(s));
      }
    }
  }

  for (size_t i = 0; i < sets.size(); ++i) {
    Variant v;
    v.experiment = name;
    v.params = sets[i].params;
    v.params["experiment"] = name;
    v.tenants = std::move(sets[i].tenants);
    v.policies = policies;
    v.policies_node = policies_node;
    v.duration_s = duration_s;
    v.repetitions = reps;
    v.seed = Mix(Mix(static_cast<uint64_t>(seed), index), i);
    std::ostringstream label;
    label << name << " n=" << v.tenants.size();
    if (v.params.contains("mix") && v.params["mix"] != "same") label << " " << v.params["mix"].get<std::string>();
    std::set<double> ws;
    for (const auto& t : v.tenants) ws.insert(t.weight);
    if (ws.size() > 1) label << " w=" << WeightsText(v.tenants);
    v.label = label.str();
    if (duration_s <= 0) {
      for (const auto& t : v.tenants) {
        if (!t.workload->Bounded()) {
          return doc.Error(&exp, "duration_s",
                           "is required: workload '" + t.workload->name +
                               "' has no task/frame limit, so a run would never end "
                               "(set duration_s, or tasks/frames in the workload)");
        }
      }
    }
    sc.variants.push_back(std::move(v));
  }
  return Status::Ok();
}

Result<Scenario> Parse(const TomlDoc& doc) {
  const toml::table& root = doc.root();
  GMUX_RETURN_IF_ERROR(doc.OnlyKeys(
      root, {"kind", "name", "description", "seed", "policies", "duration_s", "repetitions",
             "window_s", "lambda_metric", "record_completions", "max_duration_s", "device",
             "policy", "workload", "experiment"}));
  Scenario sc;
  GMUX_ASSIGN_OR_RETURN(sc.name,
                        doc.String(root, "name", std::filesystem::path(doc.path()).stem().string()));
  GMUX_ASSIGN_OR_RETURN(sc.description, doc.String(root, "description", ""));
  GMUX_ASSIGN_OR_RETURN(sc.window_s, doc.Number(root, "window_s", 1.0, 1e-6, 1e6));
  GMUX_ASSIGN_OR_RETURN(sc.lambda_metric, doc.Choice(root, "lambda_metric", "blocks",
                                                     {"blocks", "device_time", "tasks"}));
  GMUX_ASSIGN_OR_RETURN(sc.record_completions, doc.Bool(root, "record_completions", true));
  GMUX_ASSIGN_OR_RETURN(sc.max_duration_s, doc.Number(root, "max_duration_s", 3600.0, 1e-6, 1e9));

  GMUX_ASSIGN_OR_RETURN(const toml::table* device, doc.Table(root, "device", false));
  if (device != nullptr) {
    GMUX_RETURN_IF_ERROR(doc.OnlyKeys(*device, {"count", "compute_units", "wavefront_width",
                                                "memory_bytes", "bus_bytes_per_s",
                                                "dispatch_overhead_s", "inflight"}));
    GMUX_ASSIGN_OR_RETURN(int64_t count, doc.Integer(*device, "count", 1, 1, 4096));
    sc.devices = static_cast<uint32_t>(count);
    GMUX_ASSIGN_OR_RETURN(int64_t cu, doc.Integer(*device, "compute_units", 32, 1, 1 << 24));
    sc.device.compute_units = static_cast<uint64_t>(cu);
    GMUX_ASSIGN_OR_RETURN(int64_t wf, doc.Integer(*device, "wavefront_width", 64, 1, 1 << 16));
    sc.device.wavefront_width = static_cast<uint64_t>(wf);
    GMUX_ASSIGN_OR_RETURN(double mem, doc.Number(*device, "memory_bytes", 8e9, 0.0, 1e15));
    sc.device.memory_bytes = static_cast<uint64_t>(mem);
    GMUX_ASSIGN_OR_RETURN(sc.device.bus_bytes_per_s, doc.Number(*device, "bus_bytes_per_s", 16e9, 0.0, 1e15));
    GMUX_ASSIGN_OR_RETURN(sc.dispatch_overhead_s, doc.Number(*device, "dispatch_overhead_s", 0.0, 0.0, 10.0));
    GMUX_ASSIGN_OR_RETURN(int64_t inflight, doc.Integer(*device, "inflight", 1, 1, 64));
    sc.inflight = static_cast<uint32_t>(inflight);
  } else {
    sc.device.compute_units = 32;
    sc.device.wavefront_width = 64;
    sc.device.memory_bytes = 8'000'000'000ULL;
    sc.device.bus_bytes_per_s = 16e9;
  }

  GMUX_ASSIGN_OR_RETURN(const toml::table* policy, doc.Table(root, "policy", false));
  if (policy != nullptr) {
    for (const auto& [k, v] : *policy) {
      const toml::table* params = v.as_table();
      if (params == nullptr) return doc.Error(&v, k.str(), "expected a table of policy parameters ([policy." + std::string(k.str()) + "])");
      auto& out = sc.policy_params[std::string(k.str())];
      for (const auto& [pk, pv] : *params) {
        GMUX_ASSIGN_OR_RETURN(out[std::string(pk.str())], doc.Number(*params, pk.str(), std::nullopt));
      }
    }
  }

  GMUX_ASSIGN_OR_RETURN(const toml::table* workloads, doc.Table(root, "workload", true));
  for (const auto& [k, v] : *workloads) {
    const toml::table* t = v.as_table();
    if (t == nullptr) return doc.Error(&v, k.str(), "expected a table ([workload." + std::string(k.str()) + "])");
    WorkloadDef def;
    GMUX_RETURN_IF_ERROR(ParseWorkload(doc, std::string(k.str()), *t, &def));
    sc.workloads.emplace(std::string(k.str()), std::move(def));
  }

  GMUX_ASSIGN_OR_RETURN(auto experiments, doc.Tables(root, "experiment", true));
  if (experiments.empty()) return doc.Error(root.get("experiment"), "experiment", "needs at least one [[experiment]]");
  for (size_t i = 0; i < experiments.size(); ++i) {
    GMUX_RETURN_IF_ERROR(ParseExperiment(doc, sc, *experiments[i], i));
  }

  // Every policy must exist and accept its parameters before anything runs.
  std::set<std::string> checked;
  for (const auto& v : sc.variants) {
    for (const auto& p : v.policies) {
      if (!checked.insert(p).second) continue;
      core::PolicySpec spec{p, sc.policy_params[p], sc.device};
      auto made = core::MakePolicy(spec);
      if (!made.ok()) {
        const toml::node* where = v.policies_node;
        std::string key = "policies";
        if (policy != nullptr && policy->contains(p)) {
          where = policy->get(p);
          key = "policy." + p;
        }
        return doc.Error(where, key, made.status().message());
      }
    }
  }
  for (const auto& [p, params] : sc.policy_params) {
    if (checked.count(p) == 0) {
      return doc.Error(policy->get(p), "policy." + p, "parameters for a policy no experiment runs");
    }
  }
  return sc;
}

// ---- Running -----------------------------------------------------------------------------------

struct RunResult {
  std::string label;
  std::string policy;
  const Variant* variant = nullptr;
  std::vector<TenantResult> tenants;             // aggregated over repetitions
  std::vector<std::vector<double>> windows[3];   // blocks, device_time, tasks; reps appended
  std::vector<double> makespans_s;
  double sim_time_s = 0;
  double busy_s = 0;
  uint64_t events = 0;
  double lambda[3] = {0, 0, 0};
  double jain = 1;
};

constexpr const char* kMetricUnits[3] = {"blocks/s", "device s/s", "tasks/s"};

int MetricIndex(const std::string& m) { return m == "blocks" ? 0 : m == "device_time" ? 1 : 2; }

double MeanLambda(const std::vector<double>& weights, const std::vector<std::vector<double>>& rows) {
  double sum = 0;
  size_t n = 0;
  for (const auto& row : rows) {
    if (std::accumulate(row.begin(), row.end(), 0.0) <= 0) continue;
    sum += core::FairnessLambda(weights, row);
    ++n;
  }
  return n == 0 ? 0 : sum / static_cast<double>(n);
}

Result<RunResult> RunOne(const TomlDoc& doc, const Scenario& sc, const Variant& v,
                         const std::string& policy_name) {
  RunResult rr;
  rr.policy = policy_name;
  rr.variant = &v;
  rr.label = v.label + " / " + policy_name;
  const size_t n = v.tenants.size();
  std::vector<std::vector<double>> latencies(n);
  for (int64_t rep = 0; rep < v.repetitions; ++rep) {
    auto spec_params = sc.policy_params.count(policy_name) ? sc.policy_params.at(policy_name)
                                                           : std::map<std::string, double>{};
    core::PolicySpec spec{policy_name, spec_params, sc.device};
    GMUX_ASSIGN_OR_RETURN(std::unique_ptr<core::Policy> policy, core::MakePolicy(spec));
    KernelSimOptions o;
    o.duration = FromSeconds(v.duration_s);
    o.max_duration = FromSeconds(sc.max_duration_s);
    o.window = FromSeconds(sc.window_s);
    o.seed = Mix(v.seed, static_cast<uint64_t>(rep));
    o.devices = sc.devices;
    o.inflight = sc.inflight;
    o.dispatch_overhead = FromSeconds(sc.dispatch_overhead_s);
    o.device = sc.device;
    o.record_completions = true;
    KernelSim sim(o, *policy);
    for (const auto& t : v.tenants) {
      GMUX_ASSIGN_OR_RETURN(std::unique_ptr<Workload> w, t.workload->Make());
      GMUX_RETURN_IF_ERROR(sim.AddTenant(t.name, t.weight, std::move(w)));
    }
    auto result = sim.Run();
    if (!result.ok()) {
      return result.status().WithPrefix(doc.path() + ": run '" + rr.label + "' repetition " +
                                        std::to_string(rep + 1));
    }
    SimResult& r = *result;
    if (rep == 0) rr.tenants = r.tenants;
    for (size_t i = 0; i < n; ++i) {
      if (rep > 0) {
        TenantResult& a = rr.tenants[i];
        const TenantResult& b = r.tenants[i];
        a.device_time_s += b.device_time_s;
        a.submitted += b.submitted;
        a.commands += b.commands;
        a.dispatches += b.dispatches;
        a.work_items += b.work_items;
        a.tasks += b.tasks;
        a.cpu_time_s += b.cpu_time_s;
      }
      latencies[i].insert(latencies[i].end(), r.tenants[i].completions_s.begin(),
                          r.tenants[i].completions_s.end());
    }
    auto append = [](std::vector<std::vector<double>>& to, std::vector<std::vector<double>>& from) {
      to.insert(to.end(), std::make_move_iterator(from.begin()), std::make_move_iterator(from.end()));
    };
    append(rr.windows[0], r.block_windows);
    append(rr.windows[1], r.device_time_windows);
    append(rr.windows[2], r.task_windows);
    rr.makespans_s.push_back(r.makespan_s);
    rr.sim_time_s += r.end_s;
    rr.busy_s += r.busy_s;
    rr.events += r.events;
  }
  double total = 0;
  for (const auto& t : rr.tenants) total += t.device_time_s;
  std::vector<double> weights, shares;
  for (size_t i = 0; i < n; ++i) {
    TenantResult& t = rr.tenants[i];
    t.share = total > 0 ? t.device_time_s / total : 0;
    t.completion = core::Summarize(latencies[i]);
    t.completions_s = sc.record_completions ? latencies[i] : std::vector<double>{};
    weights.push_back(t.weight);
    shares.push_back(t.share);
  }
  for (int m = 0; m < 3; ++m) rr.lambda[m] = MeanLambda(weights, rr.windows[m]);
  rr.jain = core::JainIndex(weights, shares);
  return rr;
}

// ---- Output ------------------------------------------------------------------------------------

json StatsJson(const core::CompletionStats& s) {
  return json{{"count", s.count}, {"mean", s.mean},     {"min", s.min},       {"max", s.max},
              {"q1", s.q1},       {"median", s.median}, {"q3", s.q3},         {"iqr", s.iqr},
              {"deviation", s.deviation},               {"stddev", s.stddev}};
}

// Per workload of a run: tenants running it, pooled mean completion and the mean of the
// tenants' deviations (Kang & Yu report deviation per VM; a group is summarised by its mean).
struct WorkloadSummary {
  std::string workload;
  size_t tenants = 0;
  double mean_s = 0;
  double deviation = 0;        // mean of per-tenant deviations
  double pooled_deviation = 0; // (max − min) / mean over the group's pooled completions
  double iqr_s = 0;            // mean of per-tenant IQRs
};

std::vector<WorkloadSummary> SummarizeByWorkload(const RunResult& r) {
  std::vector<WorkloadSummary> out;
  std::map<std::string, std::vector<size_t>> by;
  std::vector<std::string> order;
  for (size_t i = 0; i < r.tenants.size(); ++i) {
    const std::string& w = r.variant->tenants[i].workload->name;
    if (!by.count(w)) order.push_back(w);
    by[w].push_back(i);
  }
  for (const auto& w : order) {
    WorkloadSummary s;
    s.workload = w;
    std::vector<double> pooled;
    double sum_mean = 0, count = 0;
    for (size_t i : by[w]) {
      const auto& c = r.tenants[i].completion;
      if (c.count == 0) continue;
      s.deviation += c.deviation;
      s.iqr_s += c.iqr;
      sum_mean += c.mean * static_cast<double>(c.count);
      count += static_cast<double>(c.count);
      pooled.push_back(c.min);
      pooled.push_back(c.max);
      ++s.tenants;
    }
    if (s.tenants > 0) {
      s.deviation /= static_cast<double>(s.tenants);
      s.iqr_s /= static_cast<double>(s.tenants);
      s.mean_s = sum_mean / count;
      auto [lo, hi] = std::minmax_element(pooled.begin(), pooled.end());
      s.pooled_deviation = s.mean_s > 0 ? (*hi - *lo) / s.mean_s : 0;
    }
    out.push_back(s);
  }
  return out;
}

json RunJson(const Scenario& sc, const RunResult& r) {
  json j;
  j["label"] = r.label;
  j["policy"] = r.policy;
  j["params"] = r.variant->params;
  const int m = MetricIndex(sc.lambda_metric);
  j["lambda"] = r.lambda[m];
  j["lambda_metric"] = sc.lambda_metric;
  j["lambda_by_metric"] = json{{"blocks", r.lambda[0]}, {"device_time", r.lambda[1]}, {"tasks", r.lambda[2]}};
  j["jain"] = r.jain;
  j["repetitions"] = r.variant->repetitions;
  j["sim_time_s"] = r.sim_time_s;
  j["device_busy"] = r.sim_time_s > 0 ? r.busy_s / (r.sim_time_s * sc.devices) : 0;
  j["events"] = r.events;
  j["makespan_s"] = core::Summarize(r.makespans_s).mean;
  json tenants = json::array();
  uint64_t commands = 0;
  for (const auto& t : r.tenants) {
    commands += t.commands;
    tenants.push_back(json{{"name", t.name},
                           {"weight", t.weight},
                           {"workload", t.workload},
                           {"share", t.share},
                           {"commands", t.commands},
                           {"dispatches", t.dispatches},
                           {"device_time_s", t.device_time_s},
                           {"tasks", t.tasks},
                           {"cpu_time_s", t.cpu_time_s},
                           {"throughput_per_s", r.sim_time_s > 0 ? static_cast<double>(t.commands) / r.sim_time_s : 0},
                           {"completions_s", t.completions_s},
                           {"completion", StatsJson(t.completion)}});
  }
  j["tenants"] = tenants;
  j["throughput_per_s"] = r.sim_time_s > 0 ? static_cast<double>(commands) / r.sim_time_s : 0;
  json by_workload = json::array();
  for (const auto& s : SummarizeByWorkload(r)) {
    by_workload.push_back(json{{"workload", s.workload}, {"tenants", s.tenants}, {"mean_s", s.mean_s},
                               {"deviation", s.deviation}, {"pooled_deviation", s.pooled_deviation},
                               {"iqr_s", s.iqr_s}});
  }
  j["by_workload"] = by_workload;
  return j;
}

std::string Pct(double base, double value) {
  if (base <= 0) return "-";
  return Fixed(100.0 * (base - value) / base, 1) + "%";
}

// Completed blocks per simulated second, with digits enough to tell slow runs apart.
std::string Rate(const RunResult& r) {
  double c = 0;
  for (const auto& t : r.tenants) c += static_cast<double>(t.commands);
  const double rate = r.sim_time_s > 0 ? c / r.sim_time_s : 0;
  return Fixed(rate, rate >= 100 ? 0 : 3);
}

std::string SharesText(const RunResult& r) {
  std::string s;
  for (const auto& t : r.tenants) s += (s.empty() ? "" : "/") + Fixed(t.share, 2);
  return s;
}

}  // namespace

Result<ScenarioOutput> RunKernelScenario(const TomlDoc& doc) {
  GMUX_ASSIGN_OR_RETURN(Scenario sc, Parse(doc));
  const int metric = MetricIndex(sc.lambda_metric);

  // groups[g] = the runs of variant g, one per policy, in the order of `policies`.
  std::vector<std::vector<RunResult>> groups;
  for (const auto& v : sc.variants) {
    std::vector<RunResult> runs;
    for (const auto& p : v.policies) {
      GMUX_ASSIGN_OR_RETURN(RunResult r, RunOne(doc, sc, v, p));
      runs.push_back(std::move(r));
    }
    groups.push_back(std::move(runs));
  }

  ScenarioOutput out;
  json runs = json::array();
  json comparisons = json::array();
  bool any_completions = false;
  for (const auto& g : groups) {
    json cmp{{"params", g.front().variant->params}, {"baseline", g.front().policy}};
    for (const auto& r : g) {
      runs.push_back(RunJson(sc, r));
      cmp["lambda"][r.policy] = r.lambda[metric];
      if (&r != &g.front()) {
        const double base = g.front().lambda[metric];
        cmp["lambda_improvement_pct"][r.policy] = base > 0 ? 100.0 * (base - r.lambda[metric]) / base : 0.0;
      }
      for (const auto& t : r.tenants) any_completions |= t.completion.count > 1 && r.variant->repetitions > 1;
    }
    comparisons.push_back(cmp);
  }
  out.json = json{{"scenario", sc.name},
                  {"kind", "kernel"},
                  {"description", sc.description},
                  {"lambda_metric", sc.lambda_metric},
                  {"window_s", sc.window_s},
                  {"runs", runs},
                  {"comparisons", comparisons}};

  // Fairness table: one block of rows per parameter group, the first policy as the baseline.
  std::ostringstream text;
  text << "scenario " << sc.name;
  if (!sc.description.empty()) text << ": " << sc.description;
  text << "\n";
  text << "λ = mean over " << Fixed(sc.window_s, 2) << " s windows of Σ|w_i − w'_i| on "
       << sc.lambda_metric << " (lower is fairer); Δλ = improvement over the first policy\n\n";
  TextTable fair({"experiment", "tenants", "mix", "weights", "policy", "lambda", "dlambda", "jain",
                  "shares", "blocks/s"});
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    if (gi > 0) fair.AddRule();
    const auto& g = groups[gi];
    for (const auto& r : g) {
      const json& p = r.variant->params;
      fair.AddRow({r.variant->experiment, std::to_string(r.tenants.size()),
                   p.contains("mix") ? p["mix"].get<std::string>() : "-",
                   p["weights"].get<std::string>(), r.policy, Fixed(r.lambda[metric], 3),
                   &r == &g.front() ? "" : Pct(g.front().lambda[metric], r.lambda[metric]),
                   Fixed(r.jain, 3), SharesText(r), Rate(r)});
    }
  }
  text << fair.Render();

  if (any_completions) {
    text << "\ncompletion times over repetitions (seconds); deviation = (max − min) / mean\n\n";
    TextTable comp({"run", "policy", "tenant", "workload", "mean", "min", "max", "iqr", "deviation"});
    for (size_t gi = 0; gi < groups.size(); ++gi) {
      if (gi > 0) comp.AddRule();
      for (const auto& r : groups[gi]) {
        for (const auto& t : r.tenants) {
          comp.AddRow({r.variant->label, r.policy, t.name, t.workload, Fixed(t.completion.mean, 2),
                       Fixed(t.completion.min, 2), Fixed(t.completion.max, 2),
                       Fixed(t.completion.iqr, 2), Fixed(t.completion.deviation, 3)});
        }
      }
    }
    text << comp.Render();
    text << "\nper workload group: mean completion and mean per-tenant deviation\n\n";
    TextTable sum({"run", "workload", "policy", "mean", "vs first", "deviation", "vs first", "iqr"});
    for (size_t gi = 0; gi < groups.size(); ++gi) {
      if (gi > 0) sum.AddRule();
      const auto base = SummarizeByWorkload(groups[gi].front());
      for (size_t wi = 0; wi < base.size(); ++wi) {
        for (const auto& r : groups[gi]) {
          const auto s = SummarizeByWorkload(r)[wi];
          const bool first = &r == &groups[gi].front();
          sum.AddRow({r.variant->label, s.workload, r.policy, Fixed(s.mean_s, 2),
                      first ? "" : (base[wi].mean_s > 0 ? Fixed(100.0 * (s.mean_s - base[wi].mean_s) / base[wi].mean_s, 1) + "%" : "-"),
                      Fixed(s.deviation, 3), first ? "" : Pct(base[wi].deviation, s.deviation),
                      Fixed(s.iqr_s, 2)});
        }
      }
    }
    text << sum.Render();
  }
  out.table = text.str();

  // Per-tenant throughput per window, every run; repetitions follow one another on the time axis.
  const double window = sc.window_s;
  for (const auto& g : groups) {
    for (const auto& r : g) {
      for (size_t i = 0; i < r.tenants.size(); ++i) {
        Series s;
        s.run_label = r.label;
        s.tenant = r.tenants[i].name;
        s.metric = "throughput";
        s.unit = kMetricUnits[metric];
        const auto& rows = r.windows[metric];
        for (size_t w = 0; w < rows.size(); ++w) {
          s.points.push_back(SeriesPoint{static_cast<double>(w) * window, rows[w][i] / window});
        }
        out.series.push_back(std::move(s));
      }
    }
  }
  return out;
}

}  // namespace gmux::sim
