#include "sim/kernel_sim.h"

#include <algorithm>
#include <cassert>
#include <sstream>

namespace gmux::sim {
namespace {

bool Later(const auto& a, const auto& b) { return a.at != b.at ? a.at > b.at : a.seq > b.seq; }

std::string At(TimePoint t) {
  std::ostringstream s;
  s << "t=" << ToSeconds(t) << "s";
  return s.str();
}

}  // namespace

// --- TenantHost -------------------------------------------------------------------------------

TimePoint TenantHost::now() const { return sim_->now_; }

void TenantHost::Submit(const BlockRequest& request) { sim_->SubmitBlock(index_, request); }

void TenantHost::WakeAfter(Duration d, uint64_t arg) {
  sim_->Push(sim_->now_ + std::max(d, Duration{0}), KernelSim::EventKind::kWake, index_, arg);
}

void TenantHost::AddCpuTime(Duration d) {
  auto& t = sim_->tenants_[index_];
  t.cpu += d;
  sim_->policy_.ReportCpuTime(index_, t.cpu, sim_->now_);
}

void TenantHost::TaskDone(Duration latency) {
  auto& t = sim_->tenants_[index_];
  ++t.result.tasks;
  t.latencies.push_back(ToSeconds(latency));
  sim_->tasks_done_->Add(index_, sim_->now_, sim_->now_, 1.0);
}

Rng& TenantHost::rng() { return sim_->tenants_[index_].rng; }

bool TenantHost::stopping() const { return sim_->stopping_; }

// --- KernelSim --------------------------------------------------------------------------------

Status KernelSimOptions::Validate() const {
  if (duration.count() < 0) return InvalidArgument("duration must be >= 0");
  if (duration.count() == 0 && max_duration.count() <= 0) {
    return InvalidArgument("max_duration must be > 0 when duration is 0");
  }
  if (window.count() <= 0) return InvalidArgument("window must be > 0");
  if (devices == 0) return InvalidArgument("devices must be >= 1");
  if (inflight == 0) return InvalidArgument("inflight must be >= 1");
  if (dispatch_overhead.count() < 0) return InvalidArgument("dispatch_overhead must be >= 0");
  if (max_events == 0) return InvalidArgument("max_events must be > 0");
  return Status::Ok();
}

KernelSim::KernelSim(KernelSimOptions options, core::Policy& policy)
    : options_(std::move(options)), policy_(policy) {}

KernelSim::~KernelSim() = default;

Status KernelSim::AddTenant(const std::string& name, double weight,
                            std::unique_ptr<Workload> workload) {
  if (ran_) return FailedPrecondition("AddTenant after Run");
  if (!(weight > 0)) return InvalidArgument("tenant '" + name + "': weight must be > 0");
  if (workload == nullptr) return InvalidArgument("tenant '" + name + "': no workload");
  TenantState t;
  const auto index = static_cast<uint32_t>(tenants_.size());
  t.name = name;
  t.weight = weight;
  t.workload = std::move(workload);
  t.host.reset(new TenantHost(this, index));
  t.rng = Rng(options_.seed).Fork(index);
  tenants_.push_back(std::move(t));
  return Status::Ok();
}

void KernelSim::Push(TimePoint at, EventKind kind, uint32_t index, uint64_t arg) {
  heap_.push_back(Event{at, seq_++, kind, index, arg});
  std::push_heap(heap_.begin(), heap_.end(), [](const Event& a, const Event& b) {
    return Later(a, b);
  });
}

KernelSim::Event KernelSim::PopEvent() {
  std::pop_heap(heap_.begin(), heap_.end(), [](const Event& a, const Event& b) {
    return Later(a, b);
  });
  Event e = heap_.back();
  heap_.pop_back();
  return e;
}

KernelSim::BlockState* KernelSim::FindBlock(BlockId id) {
  if (id < base_id_ || id >= next_id_) return nullptr;
  return &blocks_[id - base_id_];
}

void KernelSim::SubmitBlock(uint32_t tenant, const BlockRequest& request) {
  const BlockId id = next_id_++;
  BlockState b;
  b.tenant = tenant;
  b.work_items = request.kind == core::BlockKind::kKernel ? request.work_items : 0;
  b.cost_s = std::max(0.0, request.cost_s);
  if (request.kind == core::BlockKind::kCopy && options_.device.bus_bytes_per_s > 0) {
    b.cost_s += static_cast<double>(request.bytes) / options_.device.bus_bytes_per_s;
  }
  b.tag = request.tag;
  blocks_.push_back(b);
  ++live_blocks_;
  auto& t = tenants_[tenant];
  t.undispatched.push_back(id);
  ++t.result.submitted;

  core::CommandBlock block;
  block.id = id;
  block.tenant = tenant;
  block.kind = request.kind;
  block.work_items = b.work_items;
  block.work_groups = request.kind == core::BlockKind::kKernel ? request.work_groups : 0;
  block.bytes = request.bytes;
  block.arrival = now_;
  block.splittable = request.kind == core::BlockKind::kKernel ? request.splittable
                                                              : core::Splittable::kNo;
  policy_.Submit(block, now_);
}

Status KernelSim::CheckDispatch(const core::Dispatch& d, BlockState** out) const {
  auto fail = [&](const std::string& rule) {
    std::ostringstream m;
    m << "policy '" << policy_.name() << "' broke its contract at " << At(now_) << ": dispatch of block "
      << d.block << " (tenant " << d.tenant << ", range [" << d.range.begin << ", " << d.range.end
      << "), last=" << d.last << "): " << rule;
    return Internal(m.str());
  };
  if (d.tenant >= tenants_.size()) return fail("unknown tenant");
  const auto& queue = tenants_[d.tenant].undispatched;
  if (queue.empty()) return fail("the tenant has no undispatched block");
  if (queue.front() != d.block) {
    return fail("not the tenant's oldest undispatched block (" + std::to_string(queue.front()) +
                "): per-tenant order violated or block dispatched twice");
  }
  auto* self = const_cast<KernelSim*>(this);
  BlockState* b = self->FindBlock(d.block);
  assert(b != nullptr && b->tenant == d.tenant);
  if (d.range.begin != b->next_offset) return fail("range does not start where the last chunk ended");
  if (d.range.end < d.range.begin || d.range.end > b->work_items) return fail("range out of bounds");
  if (b->work_items > 0 && d.range.size() == 0) return fail("empty chunk");
  const bool final_chunk = d.range.end == b->work_items;
  if (d.last != final_chunk) return fail("'last' does not match whether the range ends the block");
  *out = b;
  return Status::Ok();
}

Status KernelSim::DispatchIdle() {
  // One slot per device per pass, so the devices fill evenly.
  for (uint32_t level = 0; level < options_.inflight; ++level) {
    for (uint32_t dev = 0; dev < devices_.size(); ++dev) {
      if (devices_[dev].queue.size() > level) continue;
      std::optional<core::Dispatch> d = policy_.Pick(now_);
      if (!d) return Status::Ok();
      BlockState* b = nullptr;
      GMUX_RETURN_IF_ERROR(CheckDispatch(*d, &b));
      b->next_offset = d->range.end;
      auto& t = tenants_[d->tenant];
      if (d->last) {
        b->fully_dispatched = true;
        t.undispatched.pop_front();
      }
      ++t.result.dispatches;
      auto& device = devices_[dev];
      device.queue.push_back(*d);
      if (device.queue.size() == 1) StartHead(dev);
    }
  }
  return Status::Ok();
}

void KernelSim::StartHead(uint32_t dev) {
  auto& device = devices_[dev];
  const core::Dispatch& d = device.queue.front();
  const BlockState* b = FindBlock(d.block);
  assert(b != nullptr);
  const double fraction =
      b->work_items == 0 ? 1.0
                         : static_cast<double>(d.range.size()) / static_cast<double>(b->work_items);
  const Duration run = FromSeconds(b->cost_s * fraction) + options_.dispatch_overhead;
  device.started = now_;
  Push(now_ + run, EventKind::kDeviceDone, dev, 0);
}

Status KernelSim::FinishDispatch(uint32_t dev) {
  auto& device = devices_[dev];
  assert(device.busy());
  const core::Dispatch d = device.queue.front();
  device.queue.pop_front();
  const Duration ran = now_ - device.started;
  if (!device.queue.empty()) StartHead(dev);
  busy_ += ran;
  auto& t = tenants_[d.tenant];
  t.result.device_time_s += ToSeconds(ran);
  device_time_->Add(d.tenant, now_ - ran, now_, ToSeconds(ran));

  core::Completion c;
  c.tenant = d.tenant;
  c.block = d.block;
  c.range = d.range;
  c.device_time = ran;
  c.last = d.last;
  policy_.Complete(c, now_);

  BlockState* b = FindBlock(d.block);
  assert(b != nullptr);
  b->completed_items += d.range.size();
  t.result.work_items += d.range.size();
  if (b->fully_dispatched && b->completed_items == b->work_items && !b->done) {
    b->done = true;
    --live_blocks_;
    ++t.result.commands;
    last_completion_ = now_;
    blocks_done_->Add(d.tenant, now_, now_, 1.0);
    const uint64_t tag = b->tag;
    while (!blocks_.empty() && blocks_.front().done) {
      blocks_.pop_front();
      ++base_id_;
    }
    t.workload->OnBlockDone(*t.host, tag);
  }
  return Status::Ok();
}

void KernelSim::ArmPolicyTimer() {
  std::optional<TimePoint> next = policy_.NextTimer();
  if (!next) return;
  // A timer at or before now would re-fire forever; Tick() already ran for this instant.
  TimePoint at = std::max(*next, now_ + Duration{1});
  if (policy_timer_ && *policy_timer_ <= at) return;
  policy_timer_ = at;
  Push(at, EventKind::kPolicyTimer, 0, 0);
}

bool KernelSim::AllFinished() const {
  return std::all_of(tenants_.begin(), tenants_.end(),
                     [](const TenantState& t) { return t.workload->Finished(); });
}

bool KernelSim::AnyPending() const {
  return std::any_of(tenants_.begin(), tenants_.end(),
                     [](const TenantState& t) { return !t.undispatched.empty(); });
}

Result<SimResult> KernelSim::Run() {
  if (ran_) return FailedPrecondition("KernelSim::Run called twice");
  ran_ = true;
  GMUX_RETURN_IF_ERROR(options_.Validate());
  if (tenants_.empty()) return InvalidArgument("a simulation needs at least one tenant");
  const size_t n = tenants_.size();
  device_time_ = std::make_unique<core::WindowedThroughput>(n, options_.window);
  blocks_done_ = std::make_unique<core::WindowedThroughput>(n, options_.window);
  tasks_done_ = std::make_unique<core::WindowedThroughput>(n, options_.window);
  devices_.assign(options_.devices, DeviceState{});
  heap_.reserve(64 + 4 * n);

  for (uint32_t i = 0; i < n; ++i) {
    core::Tenant tenant{i, tenants_[i].name, tenants_[i].weight};
    policy_.AddTenant(tenant, now_);
  }
  for (uint32_t i = 0; i < n; ++i) tenants_[i].workload->Start(*tenants_[i].host);
  const bool bounded = options_.duration.count() > 0;
  const TimePoint stop = TimePoint{} + (bounded ? options_.duration : options_.max_duration);
  Push(stop, EventKind::kStop, 0, 0);

  uint64_t events = 0;
  GMUX_RETURN_IF_ERROR(DispatchIdle());
  ArmPolicyTimer();
  while (!heap_.empty()) {
    if (!bounded && AllFinished() && live_blocks_ == 0) break;
    if (heap_.size() == 1 && AnyPending() &&
        std::none_of(devices_.begin(), devices_.end(), [](const DeviceState& d) { return d.busy(); })) {
      // Only the stop event is left, work is pending and no device runs: nothing can ever
      // dispatch it.
      return Internal("policy '" + std::string(policy_.name()) + "' holds pending work with idle " +
                      "devices and no timer at " + At(now_) + " (deadlock)");
    }
    Event e = PopEvent();
    now_ = e.at;
    if (++events > options_.max_events) {
      return ResourceExhausted("simulation exceeded max_events (" +
                               std::to_string(options_.max_events) + ") at " + At(now_));
    }
    switch (e.kind) {
      case EventKind::kStop:
        if (!bounded) {
          return ResourceExhausted("workloads did not finish within max_duration (" + At(now_) +
                                   "); " + std::to_string(live_blocks_) + " blocks unfinished");
        }
        stopping_ = true;
        break;
      case EventKind::kWake:
        tenants_[e.index].workload->OnWake(*tenants_[e.index].host, e.arg);
        break;
      case EventKind::kDeviceDone:
        GMUX_RETURN_IF_ERROR(FinishDispatch(e.index));
        break;
      case EventKind::kPolicyTimer:
        if (policy_timer_ && *policy_timer_ == e.at) policy_timer_.reset();
        policy_.Tick(now_);
        break;
    }
    if (stopping_) break;
    GMUX_RETURN_IF_ERROR(DispatchIdle());
    ArmPolicyTimer();
  }
  // Dispatches still running when a bounded run stops count up to the stop time.
  for (auto& device : devices_) {
    if (!device.busy() || !bounded) continue;
    const Duration ran = now_ - device.started;
    busy_ += ran;
    const TenantId head = device.queue.front().tenant;
    tenants_[head].result.device_time_s += ToSeconds(ran);
    device_time_->Add(head, device.started, now_, ToSeconds(ran));
  }
  SimResult r = Collect();
  r.events = events;
  return r;
}

SimResult KernelSim::Collect() {
  SimResult r;
  const size_t n = tenants_.size();
  r.end_s = ToSeconds(now_);
  r.makespan_s = ToSeconds(last_completion_);
  r.busy_s = ToSeconds(busy_);
  r.window = options_.window;
  double total = 0;
  for (const auto& t : tenants_) total += t.result.device_time_s;
  for (auto& t : tenants_) {
    TenantResult tr = t.result;
    tr.name = t.name;
    tr.weight = t.weight;
    tr.workload = t.workload->Describe();
    tr.share = total > 0 ? tr.device_time_s / total : 0;
    tr.cpu_time_s = ToSeconds(t.cpu);
    tr.completion = core::Summarize(t.latencies);
    if (options_.record_completions) tr.completions_s = t.latencies;
    r.tenants.push_back(std::move(tr));
  }
  // Windows up to the end of the run (a bounded run has exactly ceil(duration / window)).
  const int64_t w = options_.window.count();
  const size_t windows = static_cast<size_t>((now_.time_since_epoch().count() + w - 1) / w);
  auto rows = [&](const core::WindowedThroughput& acc) {
    std::vector<std::vector<double>> out(windows, std::vector<double>(n, 0.0));
    for (size_t i = 0; i < windows; ++i) {
      for (size_t k = 0; k < n; ++k) out[i][k] = acc.At(i, k);
    }
    return out;
  };
  r.device_time_windows = rows(*device_time_);
  r.block_windows = rows(*blocks_done_);
  r.task_windows = rows(*tasks_done_);
  return r;
}

}  // namespace gmux::sim
