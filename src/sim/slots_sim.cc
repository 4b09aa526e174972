#include "sim/slots_sim.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/metrics.h"
#include "sim/event_queue.h"
#include "sim/rng.h"

namespace gmux::sim {

Status SlotsSimOptions::Validate() const {
  GMUX_RETURN_IF_ERROR(allocator.Validate());
  if (tenants.empty()) return InvalidArgument("slots simulation needs at least one tenant");
  if (quantum <= Duration::zero()) return InvalidArgument("quantum must be > 0");
  if (slot_copy < Duration::zero()) return InvalidArgument("slot_copy must be >= 0");
  if (!(batch >= 0)) return InvalidArgument("batch must be >= 0");
  if (duration <= Duration::zero()) return InvalidArgument("duration must be > 0");
  if (window <= Duration::zero()) return InvalidArgument("window must be > 0");
  for (size_t i = 0; i < tenants.size(); ++i) {
    const SlotsTenantSpec& t = tenants[i];
    std::string who = "tenant " + std::to_string(i) + " ('" + t.name + "')";
    if (t.slots < 1 || t.slots > allocator.slots) {
      return InvalidArgument(who + " needs " + std::to_string(t.slots) +
                             " slots; must be in [1, " + std::to_string(allocator.slots) + "]");
    }
    if (t.burst <= Duration::zero()) return InvalidArgument(who + ": burst must be > 0");
    if (t.think < Duration::zero()) return InvalidArgument(who + ": think must be >= 0");
    if (t.round_bursts.size() != t.round_thinks.size()) {
      return InvalidArgument(who + ": needs one think per command of its round");
    }
    for (size_t k = 0; k < t.round_bursts.size(); ++k) {
      if (t.round_bursts[k] <= Duration::zero() || t.round_thinks[k] < Duration::zero()) {
        return InvalidArgument(who + ": round bursts must be > 0 and thinks >= 0");
      }
    }
  }
  return Status::Ok();
}

namespace {

class Simulation {
 public:
  Simulation(const SlotsSimOptions& o, core::SlotAllocator alloc)
      : o_(o),
        alloc_(std::move(alloc)),
        windows_(o.tenants.size(), o.window),
        rr_last_(o.tenants.size() - 1) {
    Rng root(o.seed);
    for (size_t i = 0; i < o.tenants.size(); ++i) {
      tenants_.push_back(TenantRun{root.Fork(i), false, Duration::zero(), 0, Duration::zero()});
    }
  }

  Result<SlotsSimResult> Run() {
    const TimePoint start{};
    for (size_t i = 0; i < o_.tenants.size(); ++i) {
      GMUX_RETURN_IF_ERROR(alloc_.AddTenant(Id(i), o_.tenants[i].slots, start));
    }
    for (size_t i = 0; i < o_.tenants.size(); ++i) {
      // The first frame starts after one think time, so tenants do not all start in lockstep.
      q_.At(start + Think(i), [this, i] { Arrive(i); });
    }
    q_.At(start + o_.window, [this] { Sample(); });
    const TimePoint end = start + o_.duration;
    q_.RunUntil(end);
    if (!status_.ok()) return status_;
    return Finish(end);
  }

 private:
  struct TenantRun {
    Rng rng;
    bool ready;          // has an unfinished frame
    Duration remaining;  // GPU time left in the current frame
    int64_t frames;
    Duration busy;
  };

  static TenantId Id(size_t i) { return static_cast<TenantId>(i); }

  // Mean think after the command just done, and mean burst of the next one (a round's k-th,
  // or the tenant's one mean).
  Duration MeanThink(size_t i) const {
    const SlotsTenantSpec& spec = o_.tenants[i];
    if (spec.round_thinks.empty()) return spec.think;
    const size_t n = spec.round_thinks.size();
    return spec.round_thinks[(tenants_[i].frames + n - 1) % n];
  }
  Duration MeanBurst(size_t i) const {
    const SlotsTenantSpec& spec = o_.tenants[i];
    if (spec.round_bursts.empty()) return spec.burst;
    return spec.round_bursts[static_cast<size_t>(tenants_[i].frames) % spec.round_bursts.size()];
  }
  Duration Think(size_t i) {
    double ms = tenants_[i].rng.Exponential(ToMs(MeanThink(i)));
    return FromMs(ms);
  }
  Duration Burst(size_t i) {
    double ms = ToMs(MeanBurst(i)) * tenants_[i].rng.Uniform(0.5, 1.5);
    return std::max(FromMs(ms), Duration(std::chrono::microseconds(1)));
  }
  static double ToMs(Duration d) { return ToSeconds(d) * 1e3; }
  static Duration FromMs(double ms) { return FromSeconds(ms * 1e-3); }

  void Arrive(size_t i) {
    TenantRun& t = tenants_[i];
    t.ready = true;
    t.remaining = Burst(i);
    if (!device_busy_) Dispatch();
  }

  // Whether switching to tenant j now would copy nothing (it owns every slot of its range).
  bool Resident(size_t j) const {
    auto start = alloc_.StartOf(Id(j));
    if (!start.ok()) return false;
    const auto& owners = alloc_.owners();
    for (int32_t s = *start; s < *start + o_.tenants[j].slots; ++s) {
      if (owners[static_cast<size_t>(s)] != Id(j)) return false;
    }
    return true;
  }

  // Round robin: the next tenant after the last one that ran, with pending work; a batch's
  // tenant first while its batch lasts.
  void Dispatch() {
    if (device_busy_) return;
    const size_t n = tenants_.size();
    const TimePoint now = q_.now();
    if (batch_ && now < batch_until_) {
      const size_t b = *batch_;
      if (tenants_[b].ready) return RunOn(b, now);
      if (now < batch_last_end_ + batch_hold_) {
        std::optional<size_t> next;
        for (size_t step = 1; step <= n && !next; ++step) {
          size_t i = (rr_last_ + step) % n;
          if (tenants_[i].ready) next = i;
        }
        if (next && !Resident(*next)) {
          // Held for the batch's tenant: woken by its next frame or when the hold ends.
          const TimePoint wake = std::min(batch_until_, batch_last_end_ + batch_hold_);
          q_.At(wake, [this] { Dispatch(); });
          return;
        }
      } else {
        batch_.reset();
      }
    } else {
      batch_.reset();
    }
    for (size_t step = 1; step <= n; ++step) {
      size_t i = (rr_last_ + step) % n;
      if (!tenants_[i].ready) continue;
      return RunOn(i, now);
    }
  }

  void RunOn(size_t i, TimePoint now) {
    auto copies = alloc_.SwitchTo(Id(i), now);
    if (!copies.ok()) {
      status_ = copies.status();
      return;
    }
    Duration copy_time = o_.slot_copy * *copies;
    copy_time_ += copy_time;
    if (o_.batch > 0 && *copies > 0) {
      batch_ = i;
      batch_hold_ = copy_time;
      batch_until_ = now + copy_time +
                     std::chrono::duration_cast<Duration>(copy_time * o_.batch);
      ++batches_;
    }
    Duration run = std::min(o_.quantum, tenants_[i].remaining);
    TimePoint begin = now + copy_time;
    device_busy_ = true;
    rr_last_ = i;
    q_.At(begin + run, [this, i, begin, run] { EndQuantum(i, begin, run); });
  }

  void EndQuantum(size_t i, TimePoint begin, Duration run) {
    TenantRun& t = tenants_[i];
    const TimePoint now = q_.now();
    Status s = alloc_.RecordUse(Id(i), begin, now);
    if (!s.ok()) status_ = s;
    t.busy += run;
    windows_.Add(i, begin, now, ToSeconds(run));
    t.remaining -= run;
    if (t.remaining <= Duration::zero()) {
      t.ready = false;
      ++t.frames;
      q_.At(now + Think(i), [this, i] { Arrive(i); });
    }
    if (batch_ && *batch_ == i) batch_last_end_ = now;
    device_busy_ = false;
    Dispatch();
  }

  void Sample() {
    const TimePoint now = q_.now();
    alloc_.Tick(now);
    window_end_s_.push_back(ToSeconds(now));
    cumulative_.push_back(alloc_.counters().total_copies());
    q_.At(now + o_.window, [this] { Sample(); });
  }

  SlotsSimResult Finish(TimePoint end) {
    SlotsSimResult r;
    r.counters = alloc_.counters();
    r.shared_slots = alloc_.SharedSlots();
    r.copy_time_s = ToSeconds(copy_time_);
    r.batches = batches_;
    r.window_end_s = window_end_s_;
    r.cumulative_copies = cumulative_;
    const size_t n = tenants_.size();
    std::vector<core::SlotTenantInfo> info = alloc_.Tenants();  // id order == index order
    double total_busy = 0;
    for (const TenantRun& t : tenants_) total_busy += ToSeconds(t.busy);
    std::vector<double> weights(n, 1.0), shares(n, 0.0);
    // Only complete windows count for λ: the last one may be cut short by the end of the run.
    const size_t full_windows = static_cast<size_t>(o_.duration / o_.window);
    for (size_t i = 0; i < n; ++i) {
      SlotsTenantResult x;
      x.name = o_.tenants[i].name;
      x.level = o_.tenants[i].level;
      x.slots = o_.tenants[i].slots;
      x.final_start = info[i].start;
      x.busy_s = ToSeconds(tenants_[i].busy);
      x.share = total_busy > 0 ? x.busy_s / total_busy : 0;
      x.utilization = x.busy_s / ToSeconds(o_.duration);
      x.frames = tenants_[i].frames;
      x.switch_ins = info[i].switch_ins;
      x.copies = info[i].copies;
      x.moves = info[i].moves;
      for (size_t w = 0; w < full_windows; ++w) {
        x.busy_per_window.push_back(windows_.At(w, i) / ToSeconds(o_.window));
      }
      shares[i] = x.share;
      r.tenants.push_back(std::move(x));
    }
    r.device_busy = total_busy / ToSeconds(end - TimePoint{});
    r.lambda = windows_.MeanLambda(weights, 0, full_windows);
    r.jain = core::JainIndex(weights, shares);
    return r;
  }

  const SlotsSimOptions& o_;
  core::SlotAllocator alloc_;
  core::WindowedThroughput windows_;
  EventQueue q_;
  std::vector<TenantRun> tenants_;
  size_t rr_last_;
  bool device_busy_ = false;
  std::optional<size_t> batch_;  // the tenant whose batch runs
  TimePoint batch_until_{}, batch_last_end_{};
  Duration batch_hold_{0};
  int64_t batches_ = 0;
  Duration copy_time_{0};
  std::vector<double> window_end_s_;
  std::vector<int64_t> cumulative_;
  Status status_;
};

}  // namespace

Result<SlotsSimResult> RunSlotsSim(const SlotsSimOptions& options) {
  GMUX_RETURN_IF_ERROR(options.Validate());
  GMUX_ASSIGN_OR_RETURN(core::SlotAllocator alloc, core::SlotAllocator::Create(options.allocator));
  Simulation sim(options, std::move(alloc));
  return sim.Run();
}

}  // namespace gmux::sim
