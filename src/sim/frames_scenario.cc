// Scenario kind "frames": vGASA's frame-rate SLA control (see sim/frames_sim.h for the model).
//
// A file holds a policy comparison (`policies`, run on `[[tenants]]`), a control sweep
// (`[sweep]`, run on `[sweep.workload]`), or both:
//
//   kind = "frames"
//   seed = 7                    duration_s = 120          warmup_s = 0
//   control_period_s = 1.0      agent_overhead_ms = 1.0   series_window_s = 1.0
//   device_sharing = "shared"   # or "fifo"
//   policies = ["none", "sa", "fsa", "esa"]
//   criterion_fps = 30          target_usage = 1.0        coef_smoothing = 0.5
//   fsa_headroom = 0.05
//   [controller]                # FrameControllerOptions
//   kp = 0.1                    ki = 0.5                  gpu_history_frames = 4
//   [[tenants]]
//   name = "dirt3"  cpu_ms = 9  gpu_ms = 13  cpu_jitter = 0.05  gpu_jitter = 0.05
//   scenes = [{at_s = 30, cpu_ms = 10, gpu_ms = 15}]
//   [sweep]
//   reference_fps = 60  duration_s = 2  control_start_s = 0.25  settle_tolerance = 0.02
//   configs = [{kp = 0.5, ki = 0}, {kp = 0.1, ki = 0.05}]
//   [sweep.workload]            # one tenant, same keys as [[tenants]]
//
// Output per run: the common fields (label, policy, params, lambda, jain, tenants with name,
// weight, share, commands, completions_s) where `share` is the tenant's share of all GPU time,
// `lambda` VMCG's lambda on GPU time per series window against the weights, `jain` Jain's index
// on GPU share / weight, `commands` the frames presented and `completions_s` empty (frame loops
// do not complete). Added: run "gpu_usage" and "fps_jain"; per tenant "mean_fps", "gpu_usage",
// "frames_over_34ms", "frames_over_60ms" (fractions); sweep runs also "kp", "ki", "pole" (null
// when k_i = 0: Eq. (6) has no pole), "steady_state_error" (FPS, steady mean minus reference)
// and "frames_to_converge" (null when the rate never settles).
#include "sim/frames_scenario.h"

#include <cmath>
#include <sstream>

#include "core/frame_controller.h"
#include "core/sla_policy.h"
#include "sim/frames_sim.h"
#include "sim/text_table.h"

namespace gmux::sim {
namespace {

using nlohmann::json;

Result<FrameWorkload> ParseWorkload(const TomlDoc& doc, const toml::table& t) {
  GMUX_RETURN_IF_ERROR(doc.OnlyKeys(
      t, {"name", "weight", "cpu_ms", "gpu_ms", "cpu_jitter", "gpu_jitter", "scenes"}));
  FrameWorkload w;
  GMUX_ASSIGN_OR_RETURN(w.name, doc.String(t, "name", std::nullopt));
  GMUX_ASSIGN_OR_RETURN(w.weight, doc.Number(t, "weight", 1.0, 1e-9, 1e9));
  GMUX_ASSIGN_OR_RETURN(w.cpu_ms, doc.Number(t, "cpu_ms", std::nullopt, 1e-6, 1e6));
  GMUX_ASSIGN_OR_RETURN(w.gpu_ms, doc.Number(t, "gpu_ms", std::nullopt, 1e-6, 1e6));
  GMUX_ASSIGN_OR_RETURN(w.cpu_jitter, doc.Number(t, "cpu_jitter", 0.0, 0.0, 1.0));
  GMUX_ASSIGN_OR_RETURN(w.gpu_jitter, doc.Number(t, "gpu_jitter", 0.0, 0.0, 1.0));
  GMUX_ASSIGN_OR_RETURN(auto scenes, doc.Tables(t, "scenes", false));
  double last = -1;
  for (const toml::table* s : scenes) {
    GMUX_RETURN_IF_ERROR(doc.OnlyKeys(*s, {"at_s", "cpu_ms", "gpu_ms"}));
    SceneChange c;
    GMUX_ASSIGN_OR_RETURN(c.at_s, doc.Number(*s, "at_s", std::nullopt, 0.0, 1e9));
    if (c.at_s < last) return doc.Error(s->get("at_s"), "at_s", "scene changes must be in time order");
    last = c.at_s;
    GMUX_ASSIGN_OR_RETURN(c.cpu_ms, doc.Number(*s, "cpu_ms", w.cpu_ms, 1e-6, 1e6));
    GMUX_ASSIGN_OR_RETURN(c.gpu_ms, doc.Number(*s, "gpu_ms", w.gpu_ms, 1e-6, 1e6));
    w.scenes.push_back(c);
  }
  return w;
}

// Reads [controller] into `c` (keeping defaults for absent keys). Gains are checked with Eq. (8)
// so an unstable configuration names its line.
Status ParseController(const TomlDoc& doc, const toml::table* t,
                       core::FrameControllerOptions* c) {
  if (t == nullptr) return Status::Ok();
  GMUX_RETURN_IF_ERROR(doc.OnlyKeys(*t, {"kp", "ki", "gpu_history_frames", "min_fps", "max_fps"}));
  GMUX_ASSIGN_OR_RETURN(c->kp, doc.Number(*t, "kp", c->kp));
  GMUX_ASSIGN_OR_RETURN(c->ki, doc.Number(*t, "ki", c->ki));
  GMUX_ASSIGN_OR_RETURN(int64_t h, doc.Integer(*t, "gpu_history_frames", c->gpu_history_frames, 1, 1024));
  c->gpu_history_frames = static_cast<int>(h);
  GMUX_ASSIGN_OR_RETURN(c->min_fps, doc.Number(*t, "min_fps", c->min_fps, 1e-6, 1e9));
  GMUX_ASSIGN_OR_RETURN(c->max_fps, doc.Number(*t, "max_fps", c->max_fps, 1e-6, 1e9));
  Status s = c->Validate();
  if (!s.ok()) {
    const toml::node* n = t->get("ki");
    return doc.Error(n != nullptr ? n : t->get("kp") != nullptr ? t->get("kp") : t,
                     n != nullptr ? "ki" : "kp", s.message());
  }
  return Status::Ok();
}

json TenantJson(const FrameTenantResult& t) {
  json j;
  j["name"] = t.name;
  j["weight"] = t.weight;
  j["share"] = t.gpu_share;
  j["commands"] = t.frames;
  j["completions_s"] = json::array();
  j["mean_fps"] = t.mean_fps;
  j["gpu_usage"] = t.gpu_usage;
  j["frames_over_34ms"] = t.frames_over_34ms;
  j["frames_over_60ms"] = t.frames_over_60ms;
  if (std::isfinite(t.final_reference_fps)) {
    j["final_reference_fps"] = t.final_reference_fps;
  } else {
    j["final_reference_fps"] = nullptr;
  }
  return j;
}

json RunJson(const std::string& label, const std::string& policy, json params,
             const FrameRunResult& r) {
  json j;
  j["label"] = label;
  j["policy"] = policy;
  j["params"] = std::move(params);
  j["lambda"] = r.lambda;
  j["jain"] = r.jain;
  j["gpu_usage"] = r.gpu_usage;
  j["fps_jain"] = r.fps_jain;
  j["tenants"] = json::array();
  for (const FrameTenantResult& t : r.tenants) j["tenants"].push_back(TenantJson(t));
  return j;
}

std::string Pct(double fraction, int digits = 1) { return Fixed(100 * fraction, digits); }

std::string Num(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

// Settling of one controlled frame trace: the steady rate is frames / time over the second half
// of the controlled interval; the rate has converged after the first controlled frame from which
// every frame's rate stays within `tol` (relative) of it.
struct Settling {
  double steady_fps = 0;
  int64_t frames_to_converge = -1;
};

Settling Settle(const std::vector<FramePoint>& trace, double start_s, double end_s, double tol) {
  Settling s;
  std::vector<FramePoint> ctl;
  for (const FramePoint& p : trace) {
    if (p.end_s > start_s) ctl.push_back(p);
  }
  if (ctl.size() < 4) return s;
  double half = start_s + (end_s - start_s) / 2;
  double time = 0;
  size_t n = 0;
  for (const FramePoint& p : ctl) {
    if (p.end_s > half) {
      time += 1.0 / p.fps;
      ++n;
    }
  }
  if (n == 0 || time <= 0) return s;
  s.steady_fps = static_cast<double>(n) / time;
  int64_t last_out = -1;
  for (size_t k = 0; k < ctl.size(); ++k) {
    if (std::abs(ctl[k].fps - s.steady_fps) > tol * s.steady_fps) last_out = static_cast<int64_t>(k);
  }
  if (last_out + 1 < static_cast<int64_t>(ctl.size())) s.frames_to_converge = last_out + 1;
  return s;
}

}  // namespace

Result<ScenarioOutput> RunFramesScenario(const TomlDoc& doc) {
  const toml::table& root = doc.root();
  GMUX_RETURN_IF_ERROR(doc.OnlyKeys(
      root, {"kind", "name", "description", "seed", "duration_s", "warmup_s", "control_period_s",
             "agent_overhead_ms", "series_window_s", "device_sharing", "policies",
             "criterion_fps", "target_usage", "coef_smoothing", "fsa_headroom", "controller", "tenants",
             "sweep"}));
  std::string stem = doc.path();
  if (auto slash = stem.find_last_of('/'); slash != std::string::npos) stem = stem.substr(slash + 1);
  if (auto dot = stem.rfind('.'); dot != std::string::npos) stem = stem.substr(0, dot);
  GMUX_ASSIGN_OR_RETURN(std::string name, doc.String(root, "name", stem));
  GMUX_ASSIGN_OR_RETURN(std::string description, doc.String(root, "description", std::string()));
  (void)description;

  FrameSimOptions base;
  GMUX_ASSIGN_OR_RETURN(int64_t seed, doc.Integer(root, "seed", 1, 0));
  base.seed = static_cast<uint64_t>(seed);
  GMUX_ASSIGN_OR_RETURN(base.duration_s, doc.Number(root, "duration_s", 60.0, 1e-3, 1e6));
  GMUX_ASSIGN_OR_RETURN(base.warmup_s, doc.Number(root, "warmup_s", 0.0, 0.0, 1e6));
  if (base.warmup_s >= base.duration_s) {
    return doc.Error(root.get("warmup_s"), "warmup_s", "must be shorter than duration_s");
  }
  GMUX_ASSIGN_OR_RETURN(base.control_period_s, doc.Number(root, "control_period_s", 1.0, 1e-3, 1e6));
  GMUX_ASSIGN_OR_RETURN(base.agent_overhead_ms, doc.Number(root, "agent_overhead_ms", 0.0, 0.0, 1e3));
  GMUX_ASSIGN_OR_RETURN(base.series_window_s, doc.Number(root, "series_window_s", 1.0, 1e-3, 1e6));
  GMUX_ASSIGN_OR_RETURN(std::string sharing,
                        doc.Choice(root, "device_sharing", "shared", {"shared", "fifo"}));
  base.sharing = sharing == "fifo" ? DeviceSharing::kFifo : DeviceSharing::kShared;
  GMUX_ASSIGN_OR_RETURN(base.policy.criterion_fps, doc.Number(root, "criterion_fps", 30.0, 1e-3, 1e6));
  GMUX_ASSIGN_OR_RETURN(base.policy.target_usage, doc.Number(root, "target_usage", 1.0, 1e-3, 1.0));
  GMUX_ASSIGN_OR_RETURN(base.policy.coef_smoothing, doc.Number(root, "coef_smoothing", 0.5, 1e-3, 1.0));
  GMUX_ASSIGN_OR_RETURN(base.policy.fsa_headroom, doc.Number(root, "fsa_headroom", 0.05, 0.0, 10.0));
  GMUX_ASSIGN_OR_RETURN(const toml::table* controller, doc.Table(root, "controller", false));
  GMUX_RETURN_IF_ERROR(ParseController(doc, controller, &base.controller));
  GMUX_ASSIGN_OR_RETURN(std::vector<std::string> policies,
                        doc.Strings(root, "policies", std::vector<std::string>{}));
  GMUX_ASSIGN_OR_RETURN(const toml::table* sweep, doc.Table(root, "sweep", false));
  if (policies.empty() && sweep == nullptr) {
    return doc.Error(&root, "policies", "is required (or a [sweep] table)");
  }
  std::vector<core::SlaKind> kinds;
  for (const std::string& p : policies) {
    auto k = core::ParseSlaKind(p);
    if (!k) return doc.Error(root.get("policies"), "policies", "'" + p + "' is not one of: none, sa, fsa, esa");
    kinds.push_back(*k);
  }
  GMUX_ASSIGN_OR_RETURN(auto tenant_tables, doc.Tables(root, "tenants", !policies.empty()));
  for (const toml::table* t : tenant_tables) {
    GMUX_ASSIGN_OR_RETURN(FrameWorkload w, ParseWorkload(doc, *t));
    for (const FrameWorkload& other : base.tenants) {
      if (other.name == w.name) return doc.Error(t->get("name"), "name", "duplicate tenant name '" + w.name + "'");
    }
    base.tenants.push_back(std::move(w));
  }

  ScenarioOutput out;
  out.json = {{"scenario", name}, {"kind", "frames"}, {"runs", json::array()}};
  std::string text;

  if (!kinds.empty()) {
    TextTable table({"policy", "tenant", "mean FPS", "GPU usage %", ">34ms %", ">60ms %",
                     "GPU share"});
    bool first_run = true;
    for (core::SlaKind kind : kinds) {
      FrameSimOptions o = base;
      o.policy.kind = kind;
      auto r = RunFrameSim(o);
      if (!r.ok()) return r.status().WithPrefix(doc.path());
      std::string policy(core::SlaKindName(kind));
      json params = {{"criterion_fps", o.policy.criterion_fps}};
      out.json["runs"].push_back(RunJson(policy, policy, params, *r));
      if (!first_run) table.AddRule();
      first_run = false;
      for (const FrameTenantResult& t : r->tenants) {
        table.AddRow({policy, t.name, Fixed(t.mean_fps, 1), Pct(t.gpu_usage), Pct(t.frames_over_34ms, 2),
                      Pct(t.frames_over_60ms, 2), Fixed(t.gpu_share, 3)});
        Series s{policy, t.name, "fps", "frames/s", {}};
        for (size_t w = 0; w < t.fps_per_window.size(); ++w) {
          s.points.push_back({std::min(o.duration_s, (w + 1) * r->window_s), t.fps_per_window[w]});
        }
        out.series.push_back(std::move(s));
        Series ref{policy, t.name, "reference_fps", "frames/s", {}};
        for (const FramePoint& p : t.references) {
          if (std::isfinite(p.fps)) ref.points.push_back({p.end_s, p.fps});
        }
        if (!ref.points.empty()) out.series.push_back(std::move(ref));
      }
      double mean = 0;
      for (const FrameTenantResult& t : r->tenants) mean += t.mean_fps;
      mean /= static_cast<double>(r->tenants.size());
      table.AddRow({policy, "(all)", Fixed(mean, 1), Pct(r->gpu_usage), "", "",
                    "jain " + Fixed(r->jain, 3)});
      Series u{policy, "device", "gpu_usage", "%", {}};
      for (size_t w = 0; w < r->usage_per_window.size(); ++w) {
        u.points.push_back({std::min(o.duration_s, (w + 1) * r->window_s), 100 * r->usage_per_window[w]});
      }
      out.series.push_back(std::move(u));
    }
    text += name + ": frame-rate SLA control, criterion " + Num(base.policy.criterion_fps) +
            " FPS, " + Num(base.duration_s) + " s simulated\n" + table.Render();
  }

  if (sweep != nullptr) {
    const toml::table& sw = *sweep;
    GMUX_RETURN_IF_ERROR(doc.OnlyKeys(sw, {"reference_fps", "duration_s", "control_start_s",
                                           "settle_tolerance", "configs", "workload"}));
    GMUX_ASSIGN_OR_RETURN(double reference, doc.Number(sw, "reference_fps", 60.0, 1e-3, 1e6));
    GMUX_ASSIGN_OR_RETURN(double duration, doc.Number(sw, "duration_s", 2.0, 1e-3, 1e6));
    GMUX_ASSIGN_OR_RETURN(double start, doc.Number(sw, "control_start_s", 0.25, 0.0, 1e6));
    if (start >= duration) {
      return doc.Error(sw.get("control_start_s"), "control_start_s", "must be before duration_s");
    }
    GMUX_ASSIGN_OR_RETURN(double tol, doc.Number(sw, "settle_tolerance", 0.02, 1e-6, 1.0));
    GMUX_ASSIGN_OR_RETURN(const toml::table* wt, doc.Table(sw, "workload", true));
    GMUX_ASSIGN_OR_RETURN(FrameWorkload workload, ParseWorkload(doc, *wt));
    GMUX_ASSIGN_OR_RETURN(auto configs, doc.Tables(sw, "configs", true));
    TextTable table({"kp", "ki", "pole (Eq. 7)", "steady FPS", "steady-state error",
                     "frames to converge"});
    for (const toml::table* ct : configs) {
      GMUX_RETURN_IF_ERROR(doc.OnlyKeys(*ct, {"kp", "ki"}));
      core::FrameControllerOptions c = base.controller;
      GMUX_ASSIGN_OR_RETURN(c.kp, doc.Number(*ct, "kp", std::nullopt));
      GMUX_ASSIGN_OR_RETURN(c.ki, doc.Number(*ct, "ki", std::nullopt));
      if (Status s = c.Validate(); !s.ok()) return doc.Error(ct->get("ki"), "ki", s.message());
      FrameSimOptions o = base;
      o.tenants = {workload};
      o.duration_s = duration;
      o.warmup_s = 0;
      o.control_start_s = start;
      o.controller = c;
      o.policy.kind = core::SlaKind::kSa;
      o.policy.criterion_fps = reference;
      o.record_frames = true;
      o.series_window_s = std::min(base.series_window_s, duration);
      auto r = RunFrameSim(o);
      if (!r.ok()) return r.status().WithPrefix(doc.path());
      const FrameTenantResult& t = r->tenants.front();
      Settling st = Settle(t.frame_trace, start, duration, tol);
      std::string label = "kp=" + Num(c.kp) + " ki=" + Num(c.ki);
      json j = RunJson(label, "sa", {{"kp", c.kp}, {"ki", c.ki}}, *r);
      j["kp"] = c.kp;
      j["ki"] = c.ki;
      bool has_pole = core::ClosedLoopHasPole(c.ki);
      double pole = core::ClosedLoopPole(c.kp, c.ki);
      j["pole"] = has_pole ? json(pole) : json(nullptr);
      j["reference_fps"] = reference;
      j["steady_fps"] = st.steady_fps;
      j["steady_state_error"] = st.steady_fps - reference;
      j["frames_to_converge"] = st.frames_to_converge >= 0 ? json(st.frames_to_converge) : json(nullptr);
      out.json["runs"].push_back(std::move(j));
      table.AddRow({Num(c.kp), Num(c.ki), has_pole ? Fixed(pole, 4) : "none",
                    Fixed(st.steady_fps, 2), Fixed(st.steady_fps - reference, 2),
                    st.frames_to_converge >= 0 ? std::to_string(st.frames_to_converge) : "never"});
      Series s{label, t.name, "fps", "frames/s", {}};
      for (const FramePoint& p : t.frame_trace) s.points.push_back({p.end_s, p.fps});
      out.series.push_back(std::move(s));
    }
    if (!text.empty()) text += "\n";
    text += name + ": control sweep, reference " + Num(reference) + " FPS on '" + workload.name +
            "' (SA), control from " + Num(start) + " s\n" + table.Render();
  }
  out.table = std::move(text);
  return out;
}

}  // namespace gmux::sim
