#include "sim/frames_sim.h"

#include <algorithm>
#include <cmath>
#include <memory>

#include "core/metrics.h"
#include "sim/event_queue.h"
#include "sim/rng.h"

namespace gmux::sim {
namespace {

// A frame's GPU work is done when less than this is left (seconds); event times are rounded to
// nanoseconds.
constexpr double kDoneEpsilon = 1e-8;

class Simulation {
 public:
  Simulation(const FrameSimOptions& o, core::SlaPolicy policy)
      : o_(o),
        policy_(std::move(policy)),
        agent_(o.policy.kind != core::SlaKind::kNone),
        window_s_(o.series_window_s),
        windows_(static_cast<size_t>(std::ceil(o.duration_s / o.series_window_s - 1e-9))),
        throughput_(o.tenants.size(), FromSeconds(o.series_window_s)) {
    Rng root(o.seed);
    for (size_t i = 0; i < o.tenants.size(); ++i) {
      Tenant t;
      t.rng = std::make_unique<Rng>(root.Fork(i));
      t.controller = std::make_unique<core::FrameController>(
          std::move(core::FrameController::Create(o.controller)).value());
      t.frames_per_window.assign(windows_, 0);
      tenants_.push_back(std::move(t));
    }
    sla_.resize(o.tenants.size());
    period_frames_.assign(o.tenants.size(), 0);
    period_busy_start_.assign(o.tenants.size(), 0.0);
  }

  FrameRunResult Run() {
    for (size_t i = 0; i < tenants_.size(); ++i) {
      double offset = tenants_[i].rng->Uniform(0, o_.first_frame_spread_ms * 1e-3);
      q_.At(AtSeconds(offset), [this, i] { StartFrame(i); });
    }
    q_.At(AtSeconds(o_.control_start_s), [this] { ControlTick(/*first=*/true); });
    q_.At(AtSeconds(o_.warmup_s), [this] { StartMeasuring(); });
    FrameRunResult r;
    r.events = q_.RunUntil(AtSeconds(o_.duration_s));
    Advance(o_.duration_s);
    return Finish(std::move(r));
  }

 private:
  struct Tenant {
    std::unique_ptr<Rng> rng;
    std::unique_ptr<core::FrameController> controller;
    double frame_start = 0;
    double cpu = 0;
    double submit = 0;
    double busy = 0;              // GPU seconds received, whole run
    double busy_at_warmup = 0;
    uint64_t frames = 0;          // after warm-up
    uint64_t over34 = 0, over60 = 0;
    std::vector<uint64_t> frames_per_window;
    std::vector<FramePoint> trace;
    std::vector<FramePoint> references;
  };
  struct Job {
    size_t tenant;
    double remaining;  // seconds of exclusive device time
  };

  double Now() const { return ToSeconds(q_.now()); }

  // Base costs at time t: the last scene change at or before t, else the workload's base.
  void CostsAt(const FrameWorkload& w, double t, double* cpu_ms, double* gpu_ms) const {
    *cpu_ms = w.cpu_ms;
    *gpu_ms = w.gpu_ms;
    for (const SceneChange& s : w.scenes) {
      if (s.at_s > t) break;
      *cpu_ms = s.cpu_ms;
      *gpu_ms = s.gpu_ms;
    }
  }

  static double Noisy(Rng& rng, double base, double jitter) {
    if (jitter <= 0) return base;
    return base * std::max(0.1, rng.Normal(1.0, jitter));
  }

  void StartFrame(size_t i) {
    Tenant& t = tenants_[i];
    const FrameWorkload& w = o_.tenants[i];
    double now = Now();
    t.frame_start = now;
    double cpu_ms, gpu_ms;
    CostsAt(w, now, &cpu_ms, &gpu_ms);
    t.cpu = Noisy(*t.rng, cpu_ms, w.cpu_jitter) * 1e-3;
    double gpu = Noisy(*t.rng, gpu_ms, w.gpu_jitter) * 1e-3;
    q_.After(FromSeconds(t.cpu), [this, i, gpu] { SleepPoint(i, gpu); });
  }

  void SleepPoint(size_t i, double gpu) {
    Tenant& t = tenants_[i];
    double delay = 0;
    if (agent_) {
      core::FrameDecision d = t.controller->Decide(FromSeconds(t.cpu));
      delay = o_.agent_overhead_ms * 1e-3 + ToSeconds(d.sleep);
    }
    q_.After(FromSeconds(delay), [this, i, gpu] { Present(i, gpu); });
  }

  void Present(size_t i, double gpu) {
    tenants_[i].submit = Now();
    Advance(Now());
    jobs_.push_back(Job{i, gpu});
    Reschedule();
  }

  void FrameDone(size_t i) {
    Tenant& t = tenants_[i];
    double now = Now();
    double period = now - t.frame_start;
    if (agent_) {
      t.controller->Observe(core::FrameSample{q_.now(), FromSeconds(now - t.submit)});
    }
    ++period_frames_[i];
    size_t w = std::min(windows_ - 1, static_cast<size_t>(now / window_s_));
    if (windows_ > 0) ++t.frames_per_window[w];
    if (measuring_) {
      ++t.frames;
      if (period > 0.034) ++t.over34;
      if (period > 0.060) ++t.over60;
    }
    if (o_.record_frames && period > 0) t.trace.push_back(FramePoint{now, 1.0 / period});
    StartFrame(i);
  }

  // Brings the device's jobs forward to time `now`, crediting each tenant the GPU time it got.
  void Advance(double now) {
    double dt = now - device_time_;
    if (dt <= 0 || jobs_.empty()) {
      device_time_ = std::max(device_time_, now);
      return;
    }
    TimePoint from = AtSeconds(device_time_);
    TimePoint to = AtSeconds(now);
    if (o_.sharing == DeviceSharing::kShared) {
      double each = dt / static_cast<double>(jobs_.size());
      for (Job& j : jobs_) {
        j.remaining -= each;
        tenants_[j.tenant].busy += each;
        throughput_.Add(j.tenant, from, to, each);
      }
    } else {
      Job& j = jobs_.front();
      j.remaining -= dt;
      tenants_[j.tenant].busy += dt;
      throughput_.Add(j.tenant, from, to, dt);
    }
    device_busy_ += dt;
    if (measuring_) device_busy_measured_ += dt;
    device_time_ = now;
  }

  void Reschedule() {
    ++device_version_;
    if (jobs_.empty()) return;
    double next;
    if (o_.sharing == DeviceSharing::kShared) {
      double least = jobs_.front().remaining;
      for (const Job& j : jobs_) least = std::min(least, j.remaining);
      next = std::max(0.0, least) * static_cast<double>(jobs_.size());
    } else {
      next = std::max(0.0, jobs_.front().remaining);
    }
    uint64_t version = device_version_;
    // Round up so the job is really done when the event runs.
    Duration d(static_cast<int64_t>(std::ceil(next * 1e9)));
    q_.After(d, [this, version] { DeviceEvent(version); });
  }

  void DeviceEvent(uint64_t version) {
    if (version != device_version_) return;  // superseded by a later arrival or completion
    Advance(Now());
    std::vector<size_t> done;
    if (o_.sharing == DeviceSharing::kShared) {
      auto it = std::stable_partition(jobs_.begin(), jobs_.end(),
                                      [](const Job& j) { return j.remaining > kDoneEpsilon; });
      for (auto d = it; d != jobs_.end(); ++d) done.push_back(d->tenant);
      jobs_.erase(it, jobs_.end());
    } else if (!jobs_.empty() && jobs_.front().remaining <= kDoneEpsilon) {
      done.push_back(jobs_.front().tenant);
      jobs_.erase(jobs_.begin());
    }
    Reschedule();
    for (size_t i : done) FrameDone(i);
  }

  void StartMeasuring() {
    Advance(Now());
    measuring_ = true;
    for (Tenant& t : tenants_) t.busy_at_warmup = t.busy;
  }

  void ControlTick(bool first) {
    double now = Now();
    Advance(now);
    double span = first ? 0 : o_.control_period_s;
    for (size_t i = 0; i < tenants_.size(); ++i) {
      sla_[i].fps = span > 0 ? static_cast<double>(period_frames_[i]) / span : 0;
      sla_[i].gpu_usage = span > 0 ? (tenants_[i].busy - period_busy_start_[i]) / span : 0;
      period_frames_[i] = 0;
      period_busy_start_[i] = tenants_[i].busy;
    }
    // At the start of control there are no measurements yet: SA and none need none, while FSA
    // and ESA keep every tenant uncapped until the first period has been measured.
    if (!first || o_.policy.kind == core::SlaKind::kSa || o_.policy.kind == core::SlaKind::kNone) {
      policy_.Update(sla_);
    }
    for (size_t i = 0; i < tenants_.size(); ++i) {
      tenants_[i].controller->SetReference(sla_[i].reference_fps);
      tenants_[i].references.push_back(FramePoint{now, sla_[i].reference_fps});
    }
    q_.After(FromSeconds(o_.control_period_s), [this] { ControlTick(false); });
  }

  FrameRunResult Finish(FrameRunResult r) {
    const double measured = o_.duration_s - o_.warmup_s;
    std::vector<double> weights, busy;
    double total_busy = 0;
    for (size_t i = 0; i < tenants_.size(); ++i) {
      weights.push_back(o_.tenants[i].weight);
      busy.push_back(tenants_[i].busy - tenants_[i].busy_at_warmup);
      total_busy += busy.back();
    }
    std::vector<double> shares, fps, ones(tenants_.size(), 1.0);
    for (size_t i = 0; i < tenants_.size(); ++i) {
      Tenant& t = tenants_[i];
      FrameTenantResult tr;
      tr.name = o_.tenants[i].name;
      tr.weight = o_.tenants[i].weight;
      tr.frames = t.frames;
      tr.mean_fps = static_cast<double>(t.frames) / measured;
      tr.gpu_usage = busy[i] / measured;
      tr.gpu_share = total_busy > 0 ? busy[i] / total_busy : 0;
      tr.frames_over_34ms = t.frames ? static_cast<double>(t.over34) / t.frames : 0;
      tr.frames_over_60ms = t.frames ? static_cast<double>(t.over60) / t.frames : 0;
      tr.final_reference_fps = t.controller->reference_fps();
      for (size_t w = 0; w < windows_; ++w) {
        double len = std::min(window_s_, o_.duration_s - w * window_s_);
        tr.fps_per_window.push_back(static_cast<double>(t.frames_per_window[w]) / len);
        tr.usage_per_window.push_back(throughput_.At(w, i) / len);
      }
      tr.frame_trace = std::move(t.trace);
      tr.references = std::move(t.references);
      shares.push_back(tr.gpu_share);
      fps.push_back(tr.mean_fps);
      r.tenants.push_back(std::move(tr));
    }
    r.gpu_usage = device_busy_measured_ / measured;
    size_t first = static_cast<size_t>(o_.warmup_s / window_s_);
    r.lambda = throughput_.MeanLambda(weights, first, windows_);
    r.jain = core::JainIndex(weights, shares);
    r.fps_jain = core::JainIndex(ones, fps);
    r.window_s = window_s_;
    for (size_t w = 0; w < windows_; ++w) {
      double len = std::min(window_s_, o_.duration_s - w * window_s_);
      double sum = 0;
      for (size_t i = 0; i < tenants_.size(); ++i) sum += throughput_.At(w, i);
      r.usage_per_window.push_back(sum / len);
    }
    return r;
  }

  const FrameSimOptions& o_;
  core::SlaPolicy policy_;
  const bool agent_;
  const double window_s_;
  const size_t windows_;
  core::WindowedThroughput throughput_;
  EventQueue q_;
  std::vector<Tenant> tenants_;
  std::vector<core::SlaTenantState> sla_;
  std::vector<uint64_t> period_frames_;
  std::vector<double> period_busy_start_;
  std::vector<Job> jobs_;
  double device_time_ = 0;
  double device_busy_ = 0;
  double device_busy_measured_ = 0;
  uint64_t device_version_ = 0;
  bool measuring_ = false;
};

}  // namespace

Status FrameSimOptions::Validate() const {
  if (tenants.empty()) return InvalidArgument("frames simulation: no tenants");
  for (const FrameWorkload& w : tenants) {
    if (!(w.cpu_ms > 0) || !(w.gpu_ms > 0)) {
      return InvalidArgument("tenant '" + w.name + "': cpu_ms and gpu_ms must be > 0");
    }
    if (!(w.weight > 0)) return InvalidArgument("tenant '" + w.name + "': weight must be > 0");
    if (w.cpu_jitter < 0 || w.cpu_jitter > 1 || w.gpu_jitter < 0 || w.gpu_jitter > 1) {
      return InvalidArgument("tenant '" + w.name + "': jitter must be in [0, 1]");
    }
    double last = -1;
    for (const SceneChange& s : w.scenes) {
      if (s.at_s < last) {
        return InvalidArgument("tenant '" + w.name + "': scene changes must be sorted by at_s");
      }
      if (!(s.cpu_ms > 0) || !(s.gpu_ms > 0)) {
        return InvalidArgument("tenant '" + w.name + "': scene cpu_ms and gpu_ms must be > 0");
      }
      last = s.at_s;
    }
  }
  if (!(duration_s > 0) || !(control_period_s > 0) || !(series_window_s > 0)) {
    return InvalidArgument("frames simulation: duration_s, control_period_s and series_window_s "
                           "must be > 0");
  }
  if (warmup_s < 0 || warmup_s >= duration_s || control_start_s < 0 ||
      control_start_s >= duration_s) {
    return InvalidArgument("frames simulation: warmup_s and control_start_s must lie in "
                           "[0, duration_s)");
  }
  if (agent_overhead_ms < 0 || first_frame_spread_ms < 0) {
    return InvalidArgument("frames simulation: agent_overhead_ms and first_frame_spread_ms must "
                           "be >= 0");
  }
  GMUX_RETURN_IF_ERROR(controller.Validate());
  GMUX_RETURN_IF_ERROR(policy.Validate());
  return Status::Ok();
}

Result<FrameRunResult> RunFrameSim(const FrameSimOptions& options) {
  GMUX_RETURN_IF_ERROR(options.Validate());
  GMUX_ASSIGN_OR_RETURN(core::SlaPolicy policy, core::SlaPolicy::Create(options.policy));
  Simulation sim(options, std::move(policy));
  return sim.Run();
}

}  // namespace gmux::sim
