#include "core/lease_pool.h"

#include <algorithm>
#include <cassert>
#include <string>

namespace gmux::core {
namespace {

std::string Seconds(TimePoint t) { return std::to_string(ToSeconds(t)) + " s"; }

}  // namespace

Status LeasePoolOptions::Validate() const {
  if (devices < 1) return InvalidArgument("lease pool: 'devices' must be >= 1");
  if (devices > (1u << 20)) return InvalidArgument("lease pool: 'devices' must be <= 1048576");
  if (check_period <= Duration::zero()) {
    return InvalidArgument("lease pool: 'check_period' must be > 0");
  }
  if (idle_threshold < Duration::zero()) {
    return InvalidArgument("lease pool: 'idle_threshold' must be >= 0");
  }
  if (attach_time < Duration::zero()) {
    return InvalidArgument("lease pool: 'attach_time' must be >= 0");
  }
  if (detach_time < Duration::zero()) {
    return InvalidArgument("lease pool: 'detach_time' must be >= 0");
  }
  return Status::Ok();
}

std::string_view ReleaseReasonName(ReleaseReason reason) {
  switch (reason) {
    case ReleaseReason::kUser: return "user";
    case ReleaseReason::kProgramEnd: return "program-end";
    case ReleaseReason::kDisconnect: return "disconnect";
    case ReleaseReason::kIdle: return "idle";
  }
  return "unknown";
}

std::string_view PoolEventKindName(PoolEventKind kind) {
  switch (kind) {
    case PoolEventKind::kAttachStarted: return "attach-started";
    case PoolEventKind::kAttachFinished: return "attach-finished";
    case PoolEventKind::kDetachStarted: return "detach-started";
    case PoolEventKind::kDetachFinished: return "detach-finished";
  }
  return "unknown";
}

Result<LeasePool> LeasePool::Create(const LeasePoolOptions& options) {
  GMUX_RETURN_IF_ERROR(options.Validate());
  return LeasePool(options);
}

LeasePool::LeasePool(const LeasePoolOptions& options)
    : options_(options),
      now_(options.origin),
      devices_(options.devices),
      next_check_(options.origin + options.check_period) {
  for (DeviceId d = 0; d < options.devices; ++d) {
    devices_[d].since = options.origin;
    free_.insert(d);
  }
}

Status LeasePool::CheckTime(TimePoint now) const {
  if (now < now_) {
    return InvalidArgument("lease pool: time went backwards (" + Seconds(now) + " after " +
                           Seconds(now_) + ")");
  }
  return Status::Ok();
}

Result<LeasePool::TenantState*> LeasePool::Find(TenantId tenant) {
  auto it = tenants_.find(tenant);
  if (it == tenants_.end()) {
    return NotFound("lease pool: unknown tenant " + std::to_string(tenant));
  }
  return &it->second;
}

Status LeasePool::AddTenant(TenantId tenant, TimePoint now) {
  if (tenant == kNoTenant) return InvalidArgument("lease pool: tenant id is reserved");
  GMUX_RETURN_IF_ERROR(Advance(now));
  if (!tenants_.emplace(tenant, TenantState{}).second) {
    return AlreadyExists("lease pool: tenant " + std::to_string(tenant) + " already registered");
  }
  return Status::Ok();
}

Status LeasePool::RemoveTenant(TenantId tenant, TimePoint now) {
  GMUX_ASSIGN_OR_RETURN(TenantState * t, Find(tenant));
  GMUX_RETURN_IF_ERROR(Advance(now));
  ReleaseHeld(tenant, *t, ReleaseReason::kDisconnect, now);
  tenants_.erase(tenant);
  GMUX_RETURN_IF_ERROR(Advance(now));
  return Status::Ok();
}

Result<LeaseView> LeasePool::RequestImplicit(TenantId tenant, TimePoint now) {
  return Request(tenant, LeaseKind::kImplicit, now);
}

Result<LeaseView> LeasePool::RequestExplicit(TenantId tenant, TimePoint now,
                                             std::optional<DeviceId> device) {
  return Request(tenant, LeaseKind::kPinned, now, device);
}

Result<LeaseView> LeasePool::Request(TenantId tenant, LeaseKind kind, TimePoint now,
                                     std::optional<DeviceId> device) {
  GMUX_ASSIGN_OR_RETURN(TenantState * t, Find(tenant));
  if (device && *device >= devices_.size()) {
    return NotFound("lease pool: no device " + std::to_string(*device) + " (pool has " +
                    std::to_string(devices_.size()) + ")");
  }
  GMUX_RETURN_IF_ERROR(Advance(now));
  if (device && t->status != LeaseStatus::kNone &&
      (t->status == LeaseStatus::kWaiting ? t->want != device : t->device != *device)) {
    return FailedPrecondition("lease pool: tenant " + std::to_string(tenant) +
                              " already holds or waits for another device");
  }
  if (t->status == LeaseStatus::kNone) {
    t->want = device;
    t->kind = kind;
    t->requested_at = now;
    t->wait_seq = seq_++;
    t->status = LeaseStatus::kWaiting;
    t->stats.requests++;
    if (!first_request_) first_request_ = now;
    waiters_.insert({{now, t->wait_seq}, tenant});
    GrantFreeDevices(now);
  } else if (kind == LeaseKind::kPinned) {
    if (t->kind == LeaseKind::kPinned) {
      return AlreadyExists("lease pool: tenant " + std::to_string(tenant) +
                           " already holds or waits for an explicit lease");
    }
    // An explicit request pins what the tenant already has or waits for.
    if (Reclaimable(*t)) candidates_--;
    t->kind = LeaseKind::kPinned;
  } else if (t->status == LeaseStatus::kReady) {
    // WrapCUDA calls checkgpuon() on every wrapped API call: that is use of the device.
    t->last_activity = now;
  }
  GMUX_RETURN_IF_ERROR(Advance(now));  // a zero plug-in time completes at once
  return ViewOf(*t);
}

Status LeasePool::ReleaseExplicit(TenantId tenant, DeviceId device, TimePoint now) {
  GMUX_ASSIGN_OR_RETURN(TenantState * t, Find(tenant));
  if (device >= devices_.size()) {
    return NotFound("lease pool: no device " + std::to_string(device) + " (pool has " +
                    std::to_string(devices_.size()) + ")");
  }
  GMUX_RETURN_IF_ERROR(Advance(now));
  const Device& dev = devices_[device];
  bool held = (dev.state == DeviceState::kAttaching || dev.state == DeviceState::kLeased) &&
              !dev.release_pending;
  if (held && dev.owner != tenant) {
    return PermissionDenied("lease pool: device " + std::to_string(device) +
                            " is leased to another tenant");
  }
  if (!held || (t->status != LeaseStatus::kAttaching && t->status != LeaseStatus::kReady) ||
      t->device != device) {
    return FailedPrecondition("lease pool: tenant " + std::to_string(tenant) +
                              " holds no lease on device " + std::to_string(device) +
                              " (never leased or already released)");
  }
  ReleaseHeld(tenant, *t, ReleaseReason::kUser, now);
  return Advance(now);
}

Status LeasePool::ProgramEnd(TenantId tenant, TimePoint now) {
  GMUX_ASSIGN_OR_RETURN(TenantState * t, Find(tenant));
  GMUX_RETURN_IF_ERROR(Advance(now));
  if (t->kind == LeaseKind::kPinned) return Status::Ok();  // pinned: only the user releases it
  ReleaseHeld(tenant, *t, ReleaseReason::kProgramEnd, now);
  return Advance(now);
}

Status LeasePool::Disconnect(TenantId tenant, TimePoint now) {
  GMUX_ASSIGN_OR_RETURN(TenantState * t, Find(tenant));
  GMUX_RETURN_IF_ERROR(Advance(now));
  ReleaseHeld(tenant, *t, ReleaseReason::kDisconnect, now);
  return Advance(now);
}

Status LeasePool::NoteActivity(TenantId tenant, TimePoint now) {
  GMUX_ASSIGN_OR_RETURN(TenantState * t, Find(tenant));
  GMUX_RETURN_IF_ERROR(Advance(now));
  if (t->status != LeaseStatus::kReady) {
    return FailedPrecondition("lease pool: tenant " + std::to_string(tenant) +
                              " reports activity without a ready lease");
  }
  t->last_activity = now;
  return Status::Ok();
}

Status LeasePool::BeginUse(TenantId tenant, TimePoint now) {
  GMUX_ASSIGN_OR_RETURN(TenantState * t, Find(tenant));
  GMUX_RETURN_IF_ERROR(Advance(now));
  if (t->status != LeaseStatus::kReady) {
    return FailedPrecondition("lease pool: tenant " + std::to_string(tenant) +
                              " uses a device without a ready lease");
  }
  if (Reclaimable(*t)) candidates_--;
  if (t->uses++ == 0) t->use_since = now;
  t->last_activity = now;
  return Status::Ok();
}

Status LeasePool::EndUse(TenantId tenant, TimePoint now) {
  GMUX_ASSIGN_OR_RETURN(TenantState * t, Find(tenant));
  GMUX_RETURN_IF_ERROR(Advance(now));
  if (t->status != LeaseStatus::kReady || t->uses == 0) {
    return FailedPrecondition("lease pool: tenant " + std::to_string(tenant) +
                              " ends a use it did not begin");
  }
  if (--t->uses == 0) t->stats.in_use += now - t->use_since;
  if (Reclaimable(*t)) candidates_++;
  t->last_activity = now;
  return Status::Ok();
}

TimePoint LeasePool::FirstCheckAtOrAfter(TimePoint t) const {
  // Grid points are origin + k * period with k >= 1.
  const TimePoint first = options_.origin + options_.check_period;
  if (t <= first) return first;
  const int64_t period = options_.check_period.count();
  const int64_t k = ((t - options_.origin).count() + period - 1) / period;
  return options_.origin + Duration(k * period);
}

Status LeasePool::Advance(TimePoint now) {
  GMUX_RETURN_IF_ERROR(CheckTime(now));
  for (;;) {
    std::optional<TimePoint> due;
    if (!timers_.empty()) due = timers_.top().at;
    if (candidates_ == 0 && next_check_ <= now) {
      // Nothing the checker could reclaim, and nothing changes that before the next plug-in
      // completes (calls that could, such as EndUse, come after this Advance): the rounds in
      // between are no-ops, so skip them along the grid.
      TimePoint bound = (due && *due < now) ? *due : now;
      next_check_ = std::max(next_check_, FirstCheckAtOrAfter(bound));
    }
    // Plug-in/out completions before a checker round at the same instant.
    if (due && *due <= now && *due <= next_check_) {
      DeviceId d = timers_.top().device;
      timers_.pop();
      FinishTimer(d, *due);
      continue;
    }
    if (next_check_ <= now) {
      RunCheck(next_check_);
      next_check_ += options_.check_period;
      continue;
    }
    break;
  }
  now_ = now;
  return Status::Ok();
}

std::optional<TimePoint> LeasePool::NextTimer() const {
  std::optional<TimePoint> next;
  if (!timers_.empty()) next = timers_.top().at;
  if (candidates_ > 0 && (!next || next_check_ < *next)) next = next_check_;
  return next;
}

std::vector<PoolEvent> LeasePool::TakeEvents() {
  std::vector<PoolEvent> out;
  out.swap(events_);
  return out;
}

void LeasePool::SetDeviceState(DeviceId d, DeviceState state, TenantId owner, TimePoint now) {
  Device& dev = devices_[d];
  Duration spent = now - dev.since;
  switch (dev.state) {
    case DeviceState::kFree: dev.stats.free += spent; break;
    case DeviceState::kAttaching: dev.stats.attaching += spent; break;
    case DeviceState::kLeased: dev.stats.leased += spent; break;
    case DeviceState::kDetaching: dev.stats.detaching += spent; break;
  }
  dev.state = state;
  dev.owner = owner;
  dev.since = now;
}

void LeasePool::StartAttach(DeviceId d, TenantId tenant, TimePoint now) {
  TenantState& t = tenants_.at(tenant);
  free_.erase(d);
  SetDeviceState(d, DeviceState::kAttaching, tenant, now);
  leased_count_++;
  t.status = LeaseStatus::kAttaching;
  t.device = d;
  t.ready_at = now + options_.attach_time;
  t.stats.queue_wait += now - t.requested_at;
  timers_.push(Timer{t.ready_at, seq_++, d});
  events_.push_back(PoolEvent{PoolEventKind::kAttachStarted, now, t.ready_at, d, tenant,
                              ReleaseReason::kUser});
}

void LeasePool::StartDetach(DeviceId d, ReleaseReason reason, TimePoint now) {
  Device& dev = devices_[d];
  TenantId owner = dev.owner;
  SetDeviceState(d, DeviceState::kDetaching, owner, now);
  dev.release_pending = false;
  leased_count_--;
  last_release_ = now;
  TimePoint done = now + options_.detach_time;
  timers_.push(Timer{done, seq_++, d});
  events_.push_back(PoolEvent{PoolEventKind::kDetachStarted, now, done, d, owner, reason});
}

void LeasePool::FinishTimer(DeviceId d, TimePoint now) {
  Device& dev = devices_[d];
  if (dev.state == DeviceState::kAttaching) {
    TenantId owner = dev.owner;
    SetDeviceState(d, DeviceState::kLeased, owner, now);
    events_.push_back(PoolEvent{PoolEventKind::kAttachFinished, now, now, d, owner,
                                ReleaseReason::kUser});
    if (dev.release_pending) {
      // Released while plugging in; the owner's request is already gone (it may even wait again).
      StartDetach(d, dev.pending_reason, now);
      return;
    }
    TenantState& t = tenants_.at(owner);
    assert(t.status == LeaseStatus::kAttaching && t.device == d);
    t.status = LeaseStatus::kReady;
    t.ready_at = now;
    t.last_activity = now;
    Duration wait = now - t.requested_at;
    t.stats.grants++;
    t.stats.total_wait += wait;
    t.stats.max_wait = std::max(t.stats.max_wait, wait);
    if (Reclaimable(t)) candidates_++;
    return;
  }
  assert(dev.state == DeviceState::kDetaching);
  TenantId previous = dev.owner;
  SetDeviceState(d, DeviceState::kFree, kNoTenant, now);
  free_.insert(d);
  events_.push_back(PoolEvent{PoolEventKind::kDetachFinished, now, now, d, previous,
                              ReleaseReason::kUser});
  GrantFreeDevices(now);
}

void LeasePool::GrantFreeDevices(TimePoint now) {
  // Longest waiter first; one that named a device takes only that one.
  for (auto it = waiters_.begin(); it != waiters_.end() && !free_.empty();) {
    const TenantId tenant = it->second;
    const std::optional<DeviceId> want = tenants_.at(tenant).want;
    if (want && free_.count(*want) == 0) {
      ++it;
      continue;
    }
    const DeviceId d = want ? *want : *free_.begin();
    it = waiters_.erase(it);
    StartAttach(d, tenant, now);
  }
}

void LeasePool::CloseUse(TenantState& t, TimePoint now) {
  if (t.uses > 0) {
    t.stats.in_use += now - t.use_since;
    t.uses = 0;
  }
}

void LeasePool::ReleaseHeld(TenantId tenant, TenantState& t, ReleaseReason reason,
                            TimePoint now) {
  switch (t.status) {
    case LeaseStatus::kNone:
      break;
    case LeaseStatus::kWaiting:
      waiters_.erase({{t.requested_at, t.wait_seq}, tenant});
      break;
    case LeaseStatus::kAttaching: {
      Device& dev = devices_[t.device];
      dev.release_pending = true;
      dev.pending_reason = reason;
      break;
    }
    case LeaseStatus::kReady:
      if (Reclaimable(t)) candidates_--;
      CloseUse(t, now);
      t.stats.leased += now - t.ready_at;
      if (reason == ReleaseReason::kIdle) t.stats.reclaimed++;
      StartDetach(t.device, reason, now);
      break;
  }
  t.status = LeaseStatus::kNone;
  t.kind = LeaseKind::kImplicit;
  t.want.reset();
}

bool LeasePool::Reclaimable(const TenantState& t) const {
  return t.status == LeaseStatus::kReady && t.kind == LeaseKind::kImplicit && t.uses == 0;
}

void LeasePool::RunCheck(TimePoint at) {
  // The PoolChecker's round (3.2.2): ask every holder for its usage, reclaim the idle ones.
  for (DeviceId d = 0; d < devices_.size() && candidates_ > 0; ++d) {
    const Device& dev = devices_[d];
    if (dev.state != DeviceState::kLeased || dev.release_pending) continue;
    TenantState& t = tenants_.at(dev.owner);
    if (Reclaimable(t) && at - t.last_activity >= options_.idle_threshold) {
      ReleaseHeld(dev.owner, t, ReleaseReason::kIdle, at);
    }
  }
}

LeaseView LeasePool::ViewOf(const TenantState& t) const {
  LeaseView v;
  v.status = t.status;
  v.kind = t.kind;
  if (t.status == LeaseStatus::kAttaching || t.status == LeaseStatus::kReady) v.device = t.device;
  if (t.status != LeaseStatus::kNone) v.requested_at = t.requested_at;
  if (t.status == LeaseStatus::kAttaching || t.status == LeaseStatus::kReady) {
    v.ready_at = t.ready_at;
  }
  return v;
}

LeaseView LeasePool::Lease(TenantId tenant) const {
  auto it = tenants_.find(tenant);
  if (it == tenants_.end()) return LeaseView{};
  return ViewOf(it->second);
}

PoolMetrics LeasePool::Metrics(TimePoint now) const {
  now = std::max(now, now_);
  PoolMetrics m;
  Duration leased{0}, plug{0}, in_use{0};
  m.devices.reserve(devices_.size());
  for (const Device& dev : devices_) {
    DeviceLeaseStats s = dev.stats;
    Duration open = now - dev.since;
    switch (dev.state) {
      case DeviceState::kFree: s.free += open; break;
      case DeviceState::kAttaching: s.attaching += open; break;
      case DeviceState::kLeased: s.leased += open; break;
      case DeviceState::kDetaching: s.detaching += open; break;
    }
    plug += s.attaching + s.detaching;
    m.devices.push_back(s);
  }
  m.tenants.reserve(tenants_.size());
  for (const auto& [id, t] : tenants_) {
    TenantLeaseStats s = t.stats;
    if (t.status == LeaseStatus::kReady) s.leased += now - t.ready_at;
    if (t.uses > 0) s.in_use += now - t.use_since;
    leased += s.leased;
    in_use += s.in_use;
    m.tenants.emplace_back(id, s);
  }
  std::sort(m.tenants.begin(), m.tenants.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  if (first_request_ && last_release_) m.makespan = *last_release_ - *first_request_;
  double capacity = ToSeconds(now - options_.origin) * static_cast<double>(devices_.size());
  if (capacity > 0) {
    m.leased_fraction = ToSeconds(leased) / capacity;
    m.in_use_fraction = ToSeconds(in_use) / capacity;
    m.plug_fraction = ToSeconds(plug) / capacity;
  }
  return m;
}

}  // namespace gmux::core
