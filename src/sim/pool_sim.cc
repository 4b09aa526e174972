#include "sim/pool_sim.h"

#include <algorithm>
#include <set>
#include <unordered_set>

#include "sim/event_queue.h"
#include "sim/rng.h"

namespace gmux::sim {
namespace {

using core::LeaseStatus;
using core::PoolEvent;
using core::PoolEventKind;

// Appends a step to a series sampled at its changes: the old value 1 ms before the change (so
// charts that join points with lines draw a step) and the new value at the change.
void Step(std::vector<SeriesPoint>& series, double t_s, double value) {
  if (!series.empty()) {
    if (series.back().value == value) return;
    const double before = std::max(series.back().t_s, t_s - 1e-3);
    if (before > series.back().t_s) series.push_back({before, series.back().value});
    if (series.back().t_s == t_s) series.pop_back();  // two changes at one instant: keep the last
  }
  series.push_back({t_s, value});
}

class PoolRun {
 public:
  PoolRun(const PoolSimConfig& config, core::LeasePool pool)
      : config_(config), pool_(std::move(pool)) {}

  Result<PoolSimResult> Go();

 private:
  struct TenantRun {
    PoolTenantSpec spec;
    std::vector<double> jobs_s;  // length of each run
    int next_run = 0;            // runs finished so far
    bool wants_device = false;   // a run waits to compute
    TimePoint wants_since{};
    PoolTenantResult result;
  };

  TimePoint now() const { return queue_.now(); }
  void Check(const Status& s) {
    if (!s.ok() && error_.ok()) error_ = Internal("pool simulation: " + s.ToString());
  }
  void StartRun(TenantId i);
  void BeginJob(TenantId i);
  void EndJob(TenantId i);
  void Drain();
  void ScheduleWake();

  const PoolSimConfig& config_;
  core::LeasePool pool_;
  EventQueue queue_;
  std::vector<TenantRun> tenants_;
  std::set<TimePoint> wakes_;  // Advance() calls already queued
  Status error_;
  int runs_left_ = 0;
  std::optional<core::PoolMetrics> final_metrics_;
  PoolSimResult out_;
};

void PoolRun::StartRun(TenantId i) {
  if (!error_.ok()) return;
  TenantRun& t = tenants_[i];
  t.wants_device = true;
  t.wants_since = now();
  // First API use of the run: WrapCUDA's implicit request (a no-op, counted as use, when the
  // tenant still holds its device). The explicit client pins a device before its first run.
  Result<core::LeaseView> view = (config_.mode == PoolClientMode::kExplicit && t.next_run == 0)
                                     ? pool_.RequestExplicit(i, now())
                                     : pool_.RequestImplicit(i, now());
  Check(view.status());
  Drain();
  if (view.ok() && view->status == LeaseStatus::kReady && t.wants_device) BeginJob(i);
}

void PoolRun::BeginJob(TenantId i) {
  if (!error_.ok()) return;
  TenantRun& t = tenants_[i];
  t.wants_device = false;
  t.result.waits_s.push_back(ToSeconds(now() - t.wants_since));
  Check(pool_.BeginUse(i, now()));
  queue_.After(FromSeconds(t.jobs_s[static_cast<size_t>(t.next_run)]), [this, i] { EndJob(i); });
  Drain();
}

void PoolRun::EndJob(TenantId i) {
  if (!error_.ok()) return;
  TenantRun& t = tenants_[i];
  Check(pool_.EndUse(i, now()));
  t.result.completions_s.push_back(ToSeconds(now().time_since_epoch()));
  t.next_run++;
  const bool last = t.next_run == t.spec.runs;
  if (--runs_left_ == 0) final_metrics_ = pool_.Metrics(now());  // all workloads done
  switch (config_.mode) {
    case PoolClientMode::kPool:
      Check(pool_.ProgramEnd(i, now()));
      break;
    case PoolClientMode::kIdleReclaim:
      break;  // the program stays up; the device goes back only when the checker reclaims it
    case PoolClientMode::kExplicit:
      if (last) {
        core::LeaseView v = pool_.Lease(i);
        Check(pool_.ReleaseExplicit(i, v.device, now()));
      }
      break;
  }
  if (last) {
    Check(pool_.Disconnect(i, now()));
  } else {
    queue_.After(FromSeconds(t.spec.sleep_s), [this, i] { StartRun(i); });
  }
  Drain();
}

void PoolRun::Drain() {
  for (;;) {
    std::vector<PoolEvent> events = pool_.TakeEvents();
    if (events.empty()) break;
    for (const PoolEvent& e : events) {
      out_.pool_events++;
      if (e.kind == PoolEventKind::kAttachFinished && e.tenant < tenants_.size() &&
          tenants_[e.tenant].wants_device && pool_.Lease(e.tenant).status == LeaseStatus::kReady) {
        BeginJob(e.tenant);
      }
    }
  }
  const double t_s = ToSeconds(now().time_since_epoch());
  Step(out_.devices_leased, t_s, static_cast<double>(pool_.leased_devices()));
  Step(out_.waiting_tenants, t_s, static_cast<double>(pool_.waiting()));
  ScheduleWake();
}

void PoolRun::ScheduleWake() {
  std::optional<TimePoint> at = pool_.NextTimer();
  if (!at || !error_.ok() || !wakes_.insert(*at).second) return;
  queue_.At(*at, [this, at = *at] {
    wakes_.erase(at);
    if (!error_.ok()) return;
    Check(pool_.Advance(at));
    Drain();
  });
}

Result<PoolSimResult> PoolRun::Go() {
  Rng rng(config_.seed);
  double work_s = 0;
  double longest_s = 0;
  for (size_t i = 0; i < config_.tenants.size(); ++i) {
    TenantRun t;
    t.spec = config_.tenants[i];
    t.result.name = t.spec.name;
    t.result.weight = t.spec.weight;
    Rng mine = rng.Fork(i);
    for (int r = 0; r < t.spec.runs; ++r) {
      double job = t.spec.job_s;
      if (config_.job_jitter_s > 0) job += mine.Uniform(-config_.job_jitter_s, config_.job_jitter_s);
      t.jobs_s.push_back(std::max(job, 1e-3));
      work_s += t.jobs_s.back();
    }
    double sleeps = (t.spec.runs - 1) * t.spec.sleep_s;
    work_s += sleeps;
    double mine_s = sleeps;
    for (double j : t.jobs_s) mine_s += j;
    longest_s = std::max(longest_s, mine_s);
    runs_left_ += t.spec.runs;
    GMUX_RETURN_IF_ERROR(pool_.AddTenant(static_cast<TenantId>(i), TimePoint{}));
    tenants_.push_back(std::move(t));
  }
  // Fig. 7's theoretical time: the workloads back to back on exclusively held devices, spread
  // evenly over the N devices; a workload cannot use two devices at once, hence the max.
  out_.theoretical_s = std::max(work_s / static_cast<double>(config_.pool.devices), longest_s);

  Step(out_.devices_leased, 0, 0);
  Step(out_.waiting_tenants, 0, 0);
  for (size_t i = 0; i < tenants_.size(); ++i) {
    TenantId id = static_cast<TenantId>(i);
    queue_.At(AtSeconds(tenants_[i].spec.start_s), [this, id] { StartRun(id); });
  }
  while (!queue_.empty() && error_.ok()) queue_.RunUntil(TimePoint::max());
  if (!error_.ok()) return error_;
  if (!final_metrics_) return Internal("pool simulation: the workloads did not finish");

  const core::PoolMetrics& m = *final_metrics_;
  double wait_sum = 0;
  size_t wait_n = 0;
  double leased = 0, in_use = 0;
  for (size_t i = 0; i < tenants_.size(); ++i) {
    TenantRun& t = tenants_[i];
    PoolTenantResult& r = t.result;
    for (double w : r.waits_s) wait_sum += w;
    wait_n += r.waits_s.size();
    double mine = 0;
    for (double w : r.waits_s) mine += w;
    r.mean_wait_s = r.waits_s.empty() ? 0 : mine / static_cast<double>(r.waits_s.size());
    for (const auto& [id, st] : m.tenants) {
      if (id != i) continue;
      r.leased_s = ToSeconds(st.leased);
      r.in_use_s = ToSeconds(st.in_use);
      r.reclaimed = st.reclaimed;
    }
    leased += r.leased_s;
    in_use += r.in_use_s;
    out_.makespan_s = std::max(out_.makespan_s, r.completions_s.back());
    out_.tenants.push_back(std::move(r));
  }
  double plug = 0;
  for (const core::DeviceLeaseStats& d : m.devices) plug += ToSeconds(d.attaching + d.detaching);
  out_.mean_wait_s = wait_n == 0 ? 0 : wait_sum / static_cast<double>(wait_n);
  out_.normalized_time = out_.theoretical_s > 0 ? out_.makespan_s / out_.theoretical_s : 0;
  const double capacity = out_.makespan_s * static_cast<double>(config_.pool.devices);
  if (capacity > 0) {
    out_.leased_fraction = leased / capacity;
    out_.in_use_fraction = in_use / capacity;
    out_.plug_fraction = plug / capacity;
  }
  return std::move(out_);
}

}  // namespace

std::string_view PoolClientModeName(PoolClientMode mode) {
  switch (mode) {
    case PoolClientMode::kPool: return "pool";
    case PoolClientMode::kIdleReclaim: return "idle-reclaim";
    case PoolClientMode::kExplicit: return "explicit";
  }
  return "unknown";
}

Status PoolSimConfig::Validate() const {
  GMUX_RETURN_IF_ERROR(pool.Validate());
  if (pool.origin != TimePoint{}) return InvalidArgument("pool simulation: origin must be 0");
  if (tenants.empty()) return InvalidArgument("pool simulation: no tenants");
  if (!(job_jitter_s >= 0)) return InvalidArgument("pool simulation: job_jitter_s must be >= 0");
  std::unordered_set<std::string> names;
  for (const PoolTenantSpec& t : tenants) {
    const std::string who = "pool simulation: tenant '" + t.name + "': ";
    if (t.name.empty()) return InvalidArgument("pool simulation: a tenant has no name");
    if (!names.insert(t.name).second) return InvalidArgument(who + "name used twice");
    if (!(t.weight > 0)) return InvalidArgument(who + "weight must be > 0");
    if (!(t.start_s >= 0)) return InvalidArgument(who + "start_s must be >= 0");
    if (t.runs < 1) return InvalidArgument(who + "runs must be >= 1");
    if (!(t.job_s > 0)) return InvalidArgument(who + "job_s must be > 0");
    if (!(t.sleep_s >= 0)) return InvalidArgument(who + "sleep_s must be >= 0");
  }
  return Status::Ok();
}

Result<PoolSimResult> SimulatePool(const PoolSimConfig& config) {
  GMUX_RETURN_IF_ERROR(config.Validate());
  GMUX_ASSIGN_OR_RETURN(core::LeasePool pool, core::LeasePool::Create(config.pool));
  PoolRun run(config, std::move(pool));
  return run.Go();
}

}  // namespace gmux::sim
