#include "daemon/scheduler.h"

#include <sys/epoll.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <future>

#include <nlohmann/json.hpp>

#include <spdlog/spdlog.h>

#include "core/split_policy.h"

namespace gmux::daemon {

namespace {

uint64_t ThreadCpuNs() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

// How often the watchdog looks while anything is in flight.
constexpr std::chrono::milliseconds kWatchdogTick{20};

// Express is granted only on a device no other tenant sent work for or finished work on within
// this long: tenants that take turns (closed loops with gaps between their commands) stay under
// the policy, and the grant/revoke messages are spent only where one tenant runs alone.
constexpr std::chrono::milliseconds kExpressQuiet{20};
// At most this many workers active on a device (within kExpressQuiet; of the holders' tenant,
// or of any tenant where the policy allows holders of several) share its express grant; with
// more, all of them go through the policy (docs/policies.md, "Several holders": on 2 cores, 32
// sharing sessions had 3-4x the tail latency of the policy's FIFO order).
constexpr size_t kMaxExpressSessions = 4;

// How long a revoked holder may take to confirm when its tenant has no command time limit.
constexpr std::chrono::seconds kRevokeLimit{60};
// How long a release waits for the tenants in its way to move their data off the device before
// the late workers are ended (oversubscription; eviction runs at host-memory copy speed).
constexpr std::chrono::seconds kEvictTimeout{30};
// The longest swap batch, whatever the move cost (docs/policies.md, SlotAllocator decision 19).
constexpr std::chrono::seconds kMaxBatch{10};
// A worker found stopped (SIGSTOP by its tenant, whose uid it runs as) this long while others
// wait for it (a move off the device, or a command at the head of a device) is ended: waiting
// for a process that cannot run would hand its tenant a way to stall everyone.
constexpr std::chrono::seconds kStoppedGrace{1};

// Whether `pid` is stopped (state T, or t when traced), from /proc/PID/stat.
bool ProcessStopped(pid_t pid) {
  if (pid <= 0) return false;
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", static_cast<int>(pid));
  FILE* f = std::fopen(path, "re");
  if (f == nullptr) return false;
  char buf[512];
  const size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  const char* close = std::strrchr(buf, ')');  // the command name may hold anything but this
  if (close == nullptr || close[1] != ' ') return false;
  return close[2] == 'T' || close[2] == 't';
}

}  // namespace

Result<std::unique_ptr<Scheduler>> Scheduler::Create(
    const core::PolicySpec& spec, const std::vector<core::DeviceInfo>& devices,
    uint32_t inflight_per_device, const std::map<uint32_t, core::PolicySpec>& per_device,
    bool express) {
  auto s = std::unique_ptr<Scheduler>(new Scheduler());
  s->inflight_limit_ = inflight_per_device;
  s->express_enabled_ = express;
  s->devices_.resize(devices.size());
  for (size_t i = 0; i < devices.size(); ++i) {
    auto o = per_device.find(static_cast<uint32_t>(i));
    core::PolicySpec per = o != per_device.end() ? o->second : spec;
    per.device = devices[i];
    GMUX_ASSIGN_OR_RETURN(s->devices_[i].policy, core::MakePolicy(per));
  }
  s->mailbox_.EnableWakeFd();
  return s;
}

Scheduler::~Scheduler() { Stop(); }

void Scheduler::Start(WorkerGone on_worker_gone) {
  on_worker_gone_ = std::move(on_worker_gone);
  epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = 0;  // the mailbox; workers use their session id (never 0)
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, mailbox_.EnableWakeFd(), &ev);
  thread_ = std::thread([this] { Loop(); });
}

void Scheduler::Stop() {
  if (!thread_.joinable()) return;
  mailbox_.Post([this] {
    for (auto& [id, w] : workers_) Drop(*w, GoneReason::kStopped);
    stop_ = true;
  });
  thread_.join();
  for (auto& h : pool_.hooks) h.thread.join();  // each is bounded by hook_timeout_s
  pool_.hooks.clear();
  workers_.clear();
  if (epoll_fd_ >= 0) ::close(epoll_fd_);
  epoll_fd_ = -1;
}

TimePoint Scheduler::Now() const { return OnPolicyClock(std::chrono::steady_clock::now()); }

TimePoint Scheduler::OnPolicyClock(std::chrono::steady_clock::time_point t) const {
  return TimePoint(std::chrono::duration_cast<Duration>(t - epoch_));
}

void Scheduler::AddTenant(TenantId tenant, double weight, const std::string& name,
                          Duration command_time_limit) {
  mailbox_.Post([this, tenant, weight, name, command_time_limit] {
    auto [it, fresh] = tenants_.try_emplace(tenant);
    TenantStats& t = it->second;
    if (!fresh && t.in_policy) return;
    t.name = name;
    t.weight = weight;
    t.command_time_limit = command_time_limit;
    t.in_policy = true;
    for (auto& d : devices_) d.policy->AddTenant({tenant, name, weight}, Now());
  });
}

void Scheduler::SetTenant(TenantId tenant, double weight, Duration command_time_limit) {
  if (!(weight > 0)) return;
  mailbox_.Post([this, tenant, weight, command_time_limit] {
    auto it = tenants_.find(tenant);
    if (it == tenants_.end()) return;
    it->second.weight = weight;
    it->second.command_time_limit = command_time_limit;
    if (!it->second.in_policy) return;
    for (auto& d : devices_) d.policy->SetWeight(tenant, weight, Now());
  });
}

Scheduler::UsageCounters& Scheduler::UsageOf(TenantStats& t, size_t device) {
  if (t.usage.size() <= device) t.usage.resize(std::max(devices_.size(), device + 1));
  return t.usage[device];
}

void Scheduler::AccrueMemory(TenantStats& t, size_t device) {
  const TimePoint now = Now();
  if (t.mem_since.size() <= device) t.mem_since.resize(devices_.size(), now);
  const uint64_t used = device < t.mem_used.size() ? t.mem_used[device] : 0;
  UsageOf(t, device).memory_byte_s += static_cast<double>(used) *
                                      ToSeconds(now - t.mem_since[device]);
  t.mem_since[device] = now;
}

std::optional<std::vector<Scheduler::UsageRow>> Scheduler::Usage() {
  if (stop_.load() || !thread_.joinable()) return std::nullopt;
  using Rows = std::vector<UsageRow>;
  auto promise = std::make_shared<std::promise<Rows>>();
  std::future<Rows> f = promise->get_future();
  mailbox_.Post([this, promise] {
    Rows rows;
    const TimePoint now = Now();
    for (auto& [id, t] : tenants_) {
      for (size_t di = 0; di < devices_.size(); ++di) AccrueMemory(t, di);
      for (size_t di = 0; di < t.usage.size(); ++di) {
        UsageCounters c = t.usage[di];
        // A lease still held counts up to now.
        for (const PoolDevice& pd : pool_.devices) {
          if (pd.backend == di && pd.holder == id) c.lease_s += ToSeconds(now - pd.held_since);
        }
        if (c.device_s == 0 && c.commands == 0 && c.bytes == 0 && c.memory_byte_s == 0 &&
            c.lease_s == 0) {
          continue;
        }
        rows.push_back(UsageRow{t.name, static_cast<uint32_t>(di), c});
      }
    }
    promise->set_value(std::move(rows));
  });
  if (f.wait_for(std::chrono::seconds(2)) != std::future_status::ready) return std::nullopt;
  return f.get();
}

void Scheduler::RemoveTenant(TenantId tenant) {
  mailbox_.Post([this, tenant] {
    auto it = tenants_.find(tenant);
    if (it == tenants_.end() || !it->second.in_policy) return;
    // Its counters stay for `gmux status`; its V-channels go.
    it->second.in_policy = false;
    for (auto& d : devices_) {
      d.policy->RemoveTenant(tenant, Now());
      std::erase_if(d.held, [&](const auto& h) { return h.first->tenant == tenant; });
      for (auto q = d.queued.begin(); q != d.queued.end();) {
        if (q->second.worker->tenant == tenant) {
          outstanding_.fetch_sub(1);
          if (q->second.worker->queued_on[q->second.device] > 0) {
            --q->second.worker->queued_on[q->second.device];
          }
          q = d.queued.erase(q);
        } else {
          ++q;
        }
      }
    }
    Pump();
  });
}

void Scheduler::AddWorker(uint64_t session, TenantId tenant, int fd, pid_t pid) {
  mailbox_.Post([this, session, tenant, fd, pid] {
    auto w = std::make_unique<Worker>();
    w->session = session;
    w->tenant = tenant;
    w->fd = fd;
    w->pid = pid;
    w->queued_on.resize(devices_.size());
    w->active_on.resize(devices_.size());
    w->mem_held.resize(devices_.size());
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = session;
    if (session == 0 || workers_.count(session) != 0 ||
        ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
      ::close(fd);
      if (on_worker_gone_) on_worker_gone_(session, pid, GoneReason::kMalformed);
      return;
    }
    ++tenants_[tenant].sessions;
    workers_[session] = std::move(w);
  });
}

void Scheduler::SetLimits(uint64_t session, const ctl::Limits& limits) {
  mailbox_.Post([this, session, limits] {
    auto it = workers_.find(session);
    if (it == workers_.end() || it->second->dead) return;
    // One small record on a channel sized for bursts; a worker that lets it fill is not waited
    // for (it keeps its previous share).
    ctl::Send(it->second->fd, ctl::Type::kLimits, &limits, sizeof(limits), 1, -1, true)
        .IgnoreError();
  });
}

void Scheduler::SetMemoryCapacity(uint32_t device, uint64_t bytes) {
  mailbox_.Post([this, device, bytes] {
    if (device < devices_.size()) devices_[device].mem_capacity = bytes;
  });
}

gmux::Status Scheduler::EnableSlots(uint32_t device, const core::SlotAllocatorOptions& options,
                              uint64_t slot_bytes, double swap_batch) {
  if (slot_bytes == 0) return InvalidArgument("slot_bytes must be positive");
  if (!(swap_batch >= 0)) return InvalidArgument("swap_batch must be 0 or more");
  GMUX_ASSIGN_OR_RETURN(core::SlotAllocator alloc, core::SlotAllocator::Create(options));
  mailbox_.Post([this, device, slot_bytes, swap_batch, a = std::move(alloc)]() mutable {
    if (device >= devices_.size()) return;
    devices_[device].slots.emplace(std::move(a));
    devices_[device].slot_bytes = slot_bytes;
    swap_batch_ = swap_batch;
  });
  return gmux::Status::Ok();
}

void Scheduler::SetMemoryQuota(TenantId tenant, uint64_t bytes) {
  mailbox_.Post([this, tenant, bytes] {
    // Only a tenant the scheduler knows (AddTenant comes first): a quota change for one that
    // never ran must not create a nameless entry in the status.
    auto it = tenants_.find(tenant);
    if (it != tenants_.end()) it->second.memory_quota = bytes;
  });
}

void Scheduler::OnMemReserve(Worker& w, const std::vector<ctl::MemReserve>& asks) {
  TenantStats& t = tenants_[w.tenant];
  t.mem_used.resize(devices_.size());
  t.mem_peak.resize(devices_.size());
  for (const ctl::MemReserve& a : asks) {
    if (a.device >= devices_.size() || a.bytes == 0) return Drop(w, GoneReason::kMalformed);
    AccrueMemory(t, a.device);
    DeviceState& d = devices_[a.device];
    uint64_t& used = t.mem_used[a.device];
    ctl::MemAnswer ans{a.seq, a.bytes, static_cast<uint32_t>(ctl::MemVerdict::kGranted),
                       a.device, used, t.memory_quota};
    // Overflow-safe: bytes above a limit fail before they are added.
    if (t.memory_quota != 0 && (a.bytes > t.memory_quota || used > t.memory_quota - a.bytes)) {
      ans.verdict = static_cast<uint32_t>(ctl::MemVerdict::kQuota);
    } else if (d.mem_capacity != 0 &&
               (a.bytes > d.mem_capacity ||
                // Oversubscribed: the tenant's own data must fit the device, not everyone's.
                (d.slots ? used : d.mem_used) > d.mem_capacity - a.bytes)) {
      ans.verdict = static_cast<uint32_t>(ctl::MemVerdict::kCapacity);
      ans.limit = d.mem_capacity;
    } else {
      used += a.bytes;
      d.mem_used += a.bytes;
      if (d.slots) {
        // The new allocation is on the device; a tenant's first one gives it a place in the
        // layout (a later change of size is placed again at its next release).
        d.resident[w.tenant] = true;
        if (!d.slots->Contains(w.tenant)) {
          const int32_t need = SlotNeed(d, w.tenant);
          if (d.slots->AddTenant(w.tenant, need, Now()).ok()) d.slot_need[w.tenant] = need;
        }
      }
      w.mem_held[a.device] += a.bytes;
      t.mem_peak[a.device] = std::max(t.mem_peak[a.device], used);
      ans.used = used;
    }
    if (ans.verdict != static_cast<uint32_t>(ctl::MemVerdict::kGranted)) ++t.mem_refused;
    // The worker waits for this answer: a worker that lets its channel fill gets none, and
    // its grant is taken back (it gives up waiting and refuses the allocation).
    if (!ctl::Send(w.fd, ctl::Type::kMemAnswer, &ans, sizeof(ans), 1, -1, true).ok() &&
        ans.verdict == static_cast<uint32_t>(ctl::MemVerdict::kGranted)) {
      FreeMemory(w, a.device, a.bytes);
    }
  }
}

void Scheduler::FreeMemory(Worker& w, uint32_t device, uint64_t bytes) {
  if (device >= devices_.size()) return;
  bytes = std::min(bytes, w.mem_held[device]);
  w.mem_held[device] -= bytes;
  DeviceState& d = devices_[device];
  d.mem_used -= std::min(bytes, d.mem_used);
  auto t = tenants_.find(w.tenant);
  if (t != tenants_.end() && device < t->second.mem_used.size()) {
    AccrueMemory(t->second, device);
    t->second.mem_used[device] -= std::min(bytes, t->second.mem_used[device]);
    // A tenant without device memory holds no slots.
    if (d.slots && t->second.mem_used[device] == 0 && d.slots->Contains(w.tenant) &&
        !(d.switching && d.switching->pick.tenant == w.tenant)) {
      d.slots->RemoveTenant(w.tenant, Now()).IgnoreError();
      d.slot_need.erase(w.tenant);
      d.resident.erase(w.tenant);
    }
  }
}

void Scheduler::CountWorkerDeath(TenantId tenant, bool watchdog) {
  mailbox_.Post([this, tenant, watchdog] {
    ++worker_deaths_;
    TenantStats& t = tenants_[tenant];
    ++t.worker_deaths;
    if (watchdog) ++t.watchdog_kills;
  });
}

void Scheduler::OnMessage(Worker& w, const ctl::Message& m) {
  switch (m.type) {
    case ctl::Type::kReady:
      if (m.body.size() % sizeof(ctl::Ready) != 0) return Drop(w, GoneReason::kMalformed);
      return OnReady(w, m.As<ctl::Ready>());
    case ctl::Type::kDone:
      if (m.body.size() % sizeof(ctl::Done) != 0) return Drop(w, GoneReason::kMalformed);
      return OnDone(w, m.As<ctl::Done>());
    case ctl::Type::kExpressEnd: {
      if (m.body.size() % sizeof(ctl::ExpressEnd) != 0) return Drop(w, GoneReason::kMalformed);
      for (const ctl::ExpressEnd& e : m.As<ctl::ExpressEnd>()) {
        // Only the answer to the revoke this worker was sent.
        if (e.device >= devices_.size()) return Drop(w, GoneReason::kMalformed);
        DeviceState& d = devices_[e.device];
        if (!Holds(d, w) || !d.revoking || e.epoch != d.express_epoch) {
          return Drop(w, GoneReason::kMalformed);
        }
        LeaveExpress(w, e.device);
      }
      return;
    }
    case ctl::Type::kMemReserve:
      if (m.body.size() % sizeof(ctl::MemReserve) != 0) return Drop(w, GoneReason::kMalformed);
      return OnMemReserve(w, m.As<ctl::MemReserve>());
    case ctl::Type::kMemFree:
      if (m.body.size() % sizeof(ctl::MemFree) != 0) return Drop(w, GoneReason::kMalformed);
      for (const ctl::MemFree& f : m.As<ctl::MemFree>()) {
        // Only what this worker holds.
        if (f.device >= devices_.size() || f.bytes > w.mem_held[f.device]) {
          return Drop(w, GoneReason::kMalformed);
        }
        FreeMemory(w, f.device, f.bytes);
      }
      return;
    case ctl::Type::kSwapped:
      if (m.body.size() % sizeof(ctl::Swapped) != 0) return Drop(w, GoneReason::kMalformed);
      return OnSwapped(w, m.As<ctl::Swapped>());
    case ctl::Type::kLeaseAsk:
      if (m.body.size() % sizeof(ctl::LeaseAsk) != 0) return Drop(w, GoneReason::kMalformed);
      return OnLeaseAsk(w, m.As<ctl::LeaseAsk>());
    case ctl::Type::kPoolContexts: {
      auto c = m.As<ctl::PoolContexts>();
      if (c.size() != 1) return Drop(w, GoneReason::kMalformed);
      return OnPoolContexts(w, c[0].count);
    }
    case ctl::Type::kStatsQuery: {
      auto q = m.As<ctl::StatsQuery>();
      if (q.size() != 1) return Drop(w, GoneReason::kMalformed);
      std::string text = StatusNow(w.tenant);
      const size_t room = ctl::kMaxMessageBytes - sizeof(ctl::Header) - sizeof(uint64_t);
      if (text.size() > room) text = "{}";
      std::vector<uint8_t> body(sizeof(uint64_t) + text.size());
      std::memcpy(body.data(), &q[0].seq, sizeof(uint64_t));
      std::memcpy(body.data() + sizeof(uint64_t), text.data(), text.size());
      ctl::Send(w.fd, ctl::Type::kStatsReply, body.data(), 1, body.size(), -1, true)
          .IgnoreError();
      return;
    }
    default:
      return Drop(w, GoneReason::kMalformed);
  }
}

void Scheduler::OnReady(Worker& w, const std::vector<ctl::Ready>& ready) {
  auto t = tenants_.find(w.tenant);
  std::vector<bool> touched(devices_.size());
  for (const ctl::Ready& r : ready) {
    // A worker runs tenant code: check everything against what a real session can send.
    const bool kernel = r.kind == static_cast<uint8_t>(core::BlockKind::kKernel);
    const bool known_kind = r.kind <= static_cast<uint8_t>(core::BlockKind::kMarker);
    const bool split = r.splittable == static_cast<uint8_t>(core::Splittable::kYes);
    if (r.device >= devices_.size() || !known_kind || r.splittable > 1 || r.express > 1 ||
        (split && (!kernel || r.work_groups == 0 || r.work_items % r.work_groups != 0)) ||
        w.blocks.count(r.cmd) != 0) {
      return Drop(w, GoneReason::kMalformed);
    }
    // A pool device only while the tenant's lease on it is usable (or ending: work reported
    // before its worker heard of that runs first).
    if (!PoolReadyAllowed(w, r.device)) return Drop(w, GoneReason::kMalformed);
    PoolNoteActivity(w.tenant);
    DeviceState& d = devices_[r.device];
    w.active_on[r.device] = Now();
    if (r.express != 0) {
      // Started under a grant this worker holds (or is giving back), behind nothing of its own
      // that still waits in the policy: anything else bypassed the scheduler.
      if (!Holds(d, w) || w.queued_on[r.device] != 0) return Drop(w, GoneReason::kMalformed);
      // (A holder's tenant leaves the policies only after its last worker is gone.)
      if (t == tenants_.end() || !t->second.in_policy) return Drop(w, GoneReason::kClosed);
      d.last_active[w.tenant] = Now();
      StartExpress(w, r);
      continue;
    }
    if (t == tenants_.end() || !t->second.in_policy) continue;  // the tenant is leaving
    d.last_active[w.tenant] = Now();
    if (!d.express.empty() && !Holds(d, w) && !MayJoinExpress(d, w, r.device, Now())) {
      // Another tenant's turn on an express device, or more sessions than share: take the
      // grant back first. (A session that may join goes to the policy once and joins the grant
      // below.)
      d.held.emplace_back(&w, r);
      if (!d.revoking) Revoke(r.device);
      continue;
    }
    Submit(w, r);
    touched[r.device] = true;
  }
  for (uint32_t i = 0; i < devices_.size(); ++i) {
    if (touched[i] && !w.dead) MaybeGrant(w, i);
  }
}

namespace {
bool UnsplitKernel(const core::CommandBlock& b) {
  return b.kind == core::BlockKind::kKernel && b.splittable == core::Splittable::kNo;
}
}  // namespace

core::CommandBlock Scheduler::NewBlock(const Worker& w, const ctl::Ready& r) {
  core::CommandBlock b;
  b.id = next_block_++;
  b.tenant = w.tenant;
  b.kind = static_cast<core::BlockKind>(r.kind);
  b.work_items = r.work_items;
  b.work_groups = r.work_groups;
  b.bytes = r.bytes;
  b.splittable = static_cast<core::Splittable>(r.splittable);
  b.arrival = Now();
  outstanding_.fetch_add(1);
  auto t = tenants_.find(w.tenant);
  if (t != tenants_.end()) {
    ++t->second.commands;
    if (b.kind == core::BlockKind::kKernel) t->second.total_items += r.work_items;
    if (r.device < devices_.size()) {
      UsageCounters& u = UsageOf(t->second, r.device);
      ++u.commands;
      if (b.kind == core::BlockKind::kCopy) u.bytes += r.bytes;
    }
  }
  return b;
}

void Scheduler::Submit(Worker& w, const ctl::Ready& r) {
  auto t = tenants_.find(w.tenant);
  if (t == tenants_.end() || !t->second.in_policy) return;
  core::CommandBlock b = NewBlock(w, r);
  DeviceState& d = devices_[r.device];
  d.queued[b.id] = Queued{&w, r.cmd, r.device, r.work_items, UnsplitKernel(b)};
  ++w.queued_on[r.device];
  w.blocks[r.cmd] = b.id;
  d.policy->Submit(b, Now());
}

void Scheduler::StartExpress(Worker& w, const ctl::Ready& r) {
  DeviceState& d = devices_[r.device];
  core::CommandBlock b = NewBlock(w, r);
  const TimePoint now = Now();
  d.policy->Express(b, now);
  // Released when the worker started it: its report comes in a batch, up to
  // kExpressReportDelay later (or with its Done), and the dispatch's wall time, which caps the
  // device time charged (OnDone), counts from the release. The worker's word is kept between
  // its grant and now; an earlier start claimed would only let it be charged more.
  TimePoint released = now;
  const ExpressHolder* holder = HolderOf(d, w);
  if (holder != nullptr && r.started_ns != 0) {
    const TimePoint started = OnPolicyClock(
        std::chrono::steady_clock::time_point(std::chrono::nanoseconds(r.started_ns)));
    released = std::clamp(started, std::min(holder->since, now), now);
  }
  Dispatched(d, Flight{&w, r.cmd, b.id, w.tenant, {0, r.work_items}, true, released,
                       UnsplitKernel(b)});
  auto t = tenants_.find(w.tenant);
  if (t != tenants_.end()) ++t->second.express;
}

void Scheduler::MaybeGrant(Worker& w, uint32_t device) {
  DeviceState& d = devices_[device];
  if (!express_enabled_ || d.revoking || !d.held.empty() || Holds(d, w)) return;
  // Oversubscribed memory: every release goes through the slot layout (PrepareSwitch), which
  // commands a worker starts itself would bypass (docs/policies.md, "Device memory").
  if (d.slots) return;
  const TimePoint now = Now();
  // Several holders where the policy's accounting allows it: of one tenant, or of any where
  // the policy keeps nothing between tenants; a few at most (see kMaxExpressSessions).
  const bool shared = d.policy->ExpressSharedOk();
  const bool across = shared && d.policy->ExpressAcrossTenantsOk();
  if (!d.express.empty()) {
    if (!MayJoinExpress(d, w, device, now)) return;
  } else if (shared && ActiveWorkers(across ? std::nullopt : std::optional(w.tenant), device,
                                     now) > kMaxExpressSessions) {
    return;
  }
  for (const auto& [tenant, when] : d.last_active) {
    if (!across && tenant != w.tenant && now - when < kExpressQuiet) return;
  }
  for (const Flight& f : d.inflight) {
    if (f.worker != &w && !across && (f.tenant != w.tenant || !shared)) return;
  }
  for (const auto& [id, other] : workers_) {
    if (other.get() != &w && !other->dead && other->queued_on[device] != 0) return;
  }
  if (!d.policy->ExpressOk(w.tenant, now)) return;
  if (d.express.empty()) ++d.express_epoch;
  d.express.push_back({&w, 0, now});
  ShareSlots(device);
}

void Scheduler::ShareSlots(uint32_t device) {
  DeviceState& d = devices_[device];
  // Together the holders have the device's in-flight slots, as one holder alone would (at least
  // one each: more holders than slots may have one more command each in flight).
  const uint32_t share =
      std::max<uint32_t>(1, inflight_limit_ / static_cast<uint32_t>(d.express.size()));
  for (ExpressHolder& h : d.express) {
    if (h.slots == share) continue;
    h.slots = share;
    h.worker->express_out.push_back({device, share, d.express_epoch});
  }
}

size_t Scheduler::ActiveWorkers(std::optional<TenantId> tenant, uint32_t device,
                                TimePoint now) const {
  size_t n = 0;
  for (const auto& [id, w] : workers_) {
    n += !w->dead && (!tenant || w->tenant == *tenant) &&
         now - w->active_on[device] < kExpressQuiet;
  }
  return n;
}

bool Scheduler::MayJoinExpress(const DeviceState& d, const Worker& w, uint32_t device,
                               TimePoint now) const {
  if (d.revoking || !d.policy->ExpressSharedOk()) return false;
  if (d.policy->ExpressAcrossTenantsOk()) {
    return ActiveWorkers(std::nullopt, device, now) <= kMaxExpressSessions;
  }
  // (Holders of one tenant only, here.)
  return HeldBy(d, w.tenant) && ActiveWorkers(w.tenant, device, now) <= kMaxExpressSessions;
}

bool Scheduler::HeldBy(const DeviceState& d, TenantId tenant) {
  return std::any_of(d.express.begin(), d.express.end(),
                     [&](const ExpressHolder& h) { return h.worker->tenant == tenant; });
}

const Scheduler::ExpressHolder* Scheduler::HolderOf(const DeviceState& d, const Worker& w) {
  for (const ExpressHolder& h : d.express) {
    if (h.worker == &w) return &h;
  }
  return nullptr;
}

void Scheduler::LeaveExpress(Worker& w, uint32_t device) {
  DeviceState& d = devices_[device];
  if (std::erase_if(d.express, [&](const ExpressHolder& h) { return h.worker == &w; }) == 0) return;
  if (d.express.empty()) return EndExpress(device);
  if (!d.revoking) ShareSlots(device);
}

void Scheduler::Revoke(uint32_t device) {
  DeviceState& d = devices_[device];
  if (d.express.empty() || d.revoking) return;
  d.revoking = true;
  d.revoke_since = Now();
  for (ExpressHolder& h : d.express) h.worker->express_out.push_back({device, 0, d.express_epoch});
}

void Scheduler::EndExpress(uint32_t device) {
  DeviceState& d = devices_[device];
  d.express.clear();
  d.revoking = false;
  std::vector<std::pair<Worker*, ctl::Ready>> held = std::move(d.held);
  d.held.clear();
  for (auto& [w, r] : held) {
    if (!w->dead) Submit(*w, r);
  }
}

void Scheduler::OnDone(Worker& w, const std::vector<ctl::Done>& done) {
  const TimePoint now = Now();
  for (const ctl::Done& r : done) {
    bool found = false;
    for (auto& d : devices_) {
      auto it = std::find_if(d.inflight.begin(), d.inflight.end(), [&](const Flight& f) {
        return f.worker == &w && f.cmd == r.cmd && f.range.begin == r.begin &&
               f.range.end == r.end;
      });
      if (it == d.inflight.end()) continue;
      found = true;
      Flight f = *it;
      d.last_active[f.tenant] = now;
      w.active_on[static_cast<size_t>(&d - devices_.data())] = now;
      const bool head = it == d.inflight.begin();
      d.inflight.erase(it);
      if (head) d.head_since = now;
      // The device's own START->END, but never more than the broker saw pass.
      const Duration wall = now - f.released;
      // A swap-in before the command ran is the tenant's too (DymGPU's switch cost).
      uint64_t device_ns = r.device_ns;
      auto t = tenants_.find(f.tenant);
      const size_t di = static_cast<size_t>(&d - devices_.data());
      if (t != tenants_.end() && di < t->second.swap_charge_ns.size()) {
        device_ns += std::exchange(t->second.swap_charge_ns[di], 0);
      }
      const Duration used = std::min(Duration(static_cast<int64_t>(
                                         std::min<uint64_t>(device_ns, INT64_MAX))),
                                     wall);
      if (t != tenants_.end()) {
        TenantStats& ts = t->second;
        if (ts.inflight > 0) --ts.inflight;
        ts.device_time_s += ToSeconds(used);
        UsageOf(ts, di).device_s += ToSeconds(used);
        d.busy_s += ToSeconds(used);
        if (f.unsplit_kernel) ts.unsplit_kernel_s += ToSeconds(used);
        ts.processed_items += f.range.size();
        if (f.last) ++ts.completed;
      }
      d.policy->Complete({f.tenant, f.block, f.range, used, f.last}, now);
      if (d.slots) d.slots->RecordUse(f.tenant, f.released, now).IgnoreError();
      PoolNoteActivity(f.tenant);
      if (f.last) outstanding_.fetch_sub(1);
      break;
    }
    if (!found) return Drop(w, GoneReason::kMalformed);
  }
}

void Scheduler::Drop(Worker& w, GoneReason why) {
  if (w.dead) return;
  w.dead = true;
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, w.fd, nullptr);
  ::close(w.fd);
  w.fd = -1;
  w.out.clear();
  const TimePoint now = Now();
  for (uint32_t di = 0; di < devices_.size(); ++di) {
    DeviceState& d = devices_[di];
    std::erase_if(d.held, [&](const auto& h) { return h.first == &w; });
    LeaveExpress(w, di);
    if (d.switching) {
      d.switching->waiting.erase(w.session);  // its data went with its process
      if (d.switching->q.worker == &w) {
        // The release it waited for will not happen: the policy sees it complete.
        const core::Dispatch p = d.switching->pick;
        d.switching.reset();
        d.policy->Complete({p.tenant, p.block, p.range, Duration(0), p.last}, now);
        if (p.last) outstanding_.fetch_sub(1);
      }
    }
    for (auto q = d.queued.begin(); q != d.queued.end();) {
      if (q->second.worker == &w) {
        outstanding_.fetch_sub(1);
        q = d.queued.erase(q);
      } else {
        ++q;
      }
    }
    for (auto it = d.inflight.begin(); it != d.inflight.end();) {
      if (it->worker != &w) {
        ++it;
        continue;
      }
      // Charged what it held the device for: the policy sees every dispatch complete.
      const bool head = it == d.inflight.begin();
      Flight f = *it;
      it = d.inflight.erase(it);
      if (head) d.head_since = now;
      auto t = tenants_.find(f.tenant);
      if (t != tenants_.end() && t->second.inflight > 0) --t->second.inflight;
      d.policy->Complete({f.tenant, f.block, f.range, now - f.released, f.last}, now);
      if (f.last) outstanding_.fetch_sub(1);
    }
  }
  std::fill(w.queued_on.begin(), w.queued_on.end(), 0);
  PoolWorkerGone(w);
  // Its device memory went with its process.
  for (uint32_t di = 0; di < devices_.size(); ++di) FreeMemory(w, di, w.mem_held[di]);
  auto t = tenants_.find(w.tenant);
  if (t != tenants_.end() && t->second.sessions > 0) --t->second.sessions;
  if (t == tenants_.end() || t->second.sessions == 0) {
    // Nobody left to batch for: the device is not held for a tenant that is gone.
    for (auto& d : devices_) {
      if (d.batch && d.batch->tenant == w.tenant) d.batch.reset();
    }
  }
  if (on_worker_gone_) on_worker_gone_(w.session, w.pid, why);
}

bool Scheduler::EndIfStopped(Worker& w, const char* what) {
  if (w.dead) return false;
  if (!ProcessStopped(w.pid)) {
    w.stopped_since.reset();
    return false;
  }
  const TimePoint now = Now();
  if (!w.stopped_since) w.stopped_since = now;
  if (now - *w.stopped_since < kStoppedGrace) return false;
  auto t = tenants_.find(w.tenant);
  spdlog::warn("tenant '{}' (session {}): its worker (pid {}) was stopped while others "
               "waited for {}; ending its session",
               t != tenants_.end() ? t->second.name.c_str() : "?",
               static_cast<unsigned long long>(w.session), static_cast<int>(w.pid), what);
  if (t != tenants_.end()) ++t->second.watchdog_kills;
  Drop(w, GoneReason::kWatchdog);
  return true;
}

void Scheduler::Watchdog() {
  const TimePoint now = Now();
  for (auto& d : devices_) {
    if (!d.express.empty() && d.revoking) {
      // Every holder that has not confirmed within its tenant's limit (dropping one may end
      // the grant: a copy).
      std::vector<ExpressHolder> holders = d.express;
      for (const ExpressHolder& h : holders) {
        auto t = tenants_.find(h.worker->tenant);
        const Duration limit = t != tenants_.end() && t->second.command_time_limit.count() > 0
                                   ? t->second.command_time_limit
                                   : std::chrono::duration_cast<Duration>(kRevokeLimit);
        if (now - d.revoke_since > limit) {
          spdlog::warn("watchdog: session {} (worker pid {}) did not give back express "
                       "dispatch within {:.1f} s; ending its session",
                       static_cast<unsigned long long>(h.worker->session),
                       static_cast<int>(h.worker->pid), ToSeconds(limit));
          if (t != tenants_.end()) ++t->second.watchdog_kills;
          Drop(*h.worker, GoneReason::kWatchdog);
        }
      }
    }
    if (d.inflight.empty()) continue;
    // A stopped worker at the head of a device holds everyone behind it. Looked at only once the
    // head has run for kStoppedGrace (a /proc read is not for every pass of the loop).
    if (const Flight& head = d.inflight.front();
        now - std::max(head.released, d.head_since) >= kStoppedGrace) {
      bool others_wait = false;
      for (const auto& [block, q] : d.queued) {
        others_wait = others_wait || (q.worker != nullptr && q.worker->tenant != head.tenant);
      }
      if (others_wait && EndIfStopped(*head.worker, "its command to finish")) continue;
    }
    if (d.inflight.empty()) continue;
    const Flight& f = d.inflight.front();
    auto t = tenants_.find(f.tenant);
    if (t == tenants_.end() || t->second.command_time_limit.count() <= 0) continue;
    const TimePoint since = std::max(f.released, d.head_since);
    if (now - since <= t->second.command_time_limit) continue;
    spdlog::warn("watchdog: tenant '{}' (session {}, worker pid {}) held a device "
                 "{:.1f} s, past its command time limit of {:.1f} s; ending its session",
                 t->second.name.c_str(), static_cast<unsigned long long>(f.worker->session),
                 static_cast<int>(f.worker->pid), ToSeconds(now - since),
                 ToSeconds(t->second.command_time_limit));
    ++t->second.watchdog_kills;
    Drop(*f.worker, GoneReason::kWatchdog);
  }
}

void Scheduler::Pump() {
  for (size_t di = 0; di < devices_.size(); ++di) {
    DeviceState& d = devices_[di];
    while (d.inflight.size() < inflight_limit_) {
      if (d.switching) {
        if (!AdvanceSwitch(static_cast<uint32_t>(di))) break;
        continue;
      }
      std::optional<core::Dispatch> pick;
      if (d.batch) {
        bool hold = false;
        pick = BatchPick(static_cast<uint32_t>(di), hold);
        if (hold) break;
      }
      if (!pick) pick = d.policy->Pick(Now());
      if (!pick) break;
      auto it = d.queued.find(pick->block);
      if (it == d.queued.end()) {
        // A dropped worker's block: the policy counts it in flight until it completes.
        d.policy->Complete({pick->tenant, pick->block, pick->range, Duration(0), pick->last},
                           Now());
        continue;
      }
      Queued q = it->second;
      if (d.slots) {
        std::vector<TenantId> victims = PrepareSwitch(static_cast<uint32_t>(di), pick->tenant);
        if (!victims.empty()) {
          // Held, and nothing else released here, until the victims are off the device.
          ++d.switches_waited;
          d.switching = Switch{*pick, q, std::move(victims), {}, false, Now(), {}, {}};
          if (!AdvanceSwitch(static_cast<uint32_t>(di))) break;
          continue;
        }
      }
      Release(static_cast<uint32_t>(di), *pick, q);
    }
  }
}

int32_t Scheduler::SlotNeed(const DeviceState& d, TenantId tenant) const {
  const int32_t slots = d.slots->options().slots;
  auto t = tenants_.find(tenant);
  const size_t di = static_cast<size_t>(&d - devices_.data());
  uint64_t bytes = 0;
  if (t != tenants_.end() && di < t->second.mem_used.size()) bytes = t->second.mem_used[di];
  const uint64_t need = (bytes + d.slot_bytes - 1) / d.slot_bytes;
  return static_cast<int32_t>(std::clamp<uint64_t>(need, 1, static_cast<uint64_t>(slots)));
}

std::vector<TenantId> Scheduler::PrepareSwitch(uint32_t di, TenantId tenant) {
  DeviceState& d = devices_[di];
  core::SlotAllocator& a = *d.slots;
  const TimePoint now = Now();
  const int32_t need = SlotNeed(d, tenant);
  auto known = d.slot_need.find(tenant);
  if (!a.Contains(tenant)) {
    a.AddTenant(tenant, need, now).IgnoreError();
    d.slot_need[tenant] = need;
  } else if (known == d.slot_need.end() || known->second != need) {
    // Its working set changed size: placed again as a new tenant of that size (docs/policies.md).
    a.RemoveTenant(tenant, now).IgnoreError();
    a.AddTenant(tenant, need, now).IgnoreError();
    d.slot_need[tenant] = need;
  }
  auto start = a.StartOf(tenant);
  if (!start.ok()) {
    // Idle, so not placed: switching to it places it again (the monitor's rule).
    (void)a.SwitchTo(tenant, now);
    start = a.StartOf(tenant);
  }
  std::vector<TenantId> victims;
  if (!start.ok()) return victims;
  const int32_t begin = *start, end = *start + need;
  for (const auto& [u, on] : d.resident) {
    if (!on || u == tenant) continue;
    auto su = a.StartOf(u);
    auto nu = d.slot_need.find(u);
    // A resident tenant without a place (idle, or never dispatched) is in nobody's way only
    // once it is off the device.
    if (!su.ok() || nu == d.slot_need.end() || (*su < end && begin < *su + nu->second)) {
      victims.push_back(u);
    }
  }
  std::sort(victims.begin(), victims.end());
  return victims;
}

void Scheduler::AskEvict(uint32_t di, TenantId tenant, Switch* sw) {
  DeviceState& d = devices_[di];
  d.resident[tenant] = false;
  for (auto& [id, w] : workers_) {
    if (w->dead || w->tenant != tenant) continue;
    ctl::Evict e;
    e.device = di;
    e.epoch = ++w->evict_epoch;
    if (!ctl::Send(w->fd, ctl::Type::kEvict, &e, sizeof(e), 1, -1, /*dont_wait=*/true).ok()) {
      // A worker that does not read its channel cannot be waited for (nor trusted with the
      // device): it goes, and its data with it.
      Drop(*w, GoneReason::kClosed);
      continue;
    }
    if (sw != nullptr) sw->waiting[id] = e.epoch;
  }
}

bool Scheduler::AdvanceSwitch(uint32_t di) {
  DeviceState& d = devices_[di];
  Switch& sw = *d.switching;
  if (!sw.asked) {
    for (const Flight& f : d.inflight) {
      if (std::binary_search(sw.victims.begin(), sw.victims.end(), f.tenant)) return false;
    }
    if (std::any_of(d.express.begin(), d.express.end(), [&](const ExpressHolder& h) {
          return std::binary_search(sw.victims.begin(), sw.victims.end(), h.worker->tenant);
        })) {
      if (!d.revoking) Revoke(di);
      return false;
    }
    sw.asked = true;
    sw.asked_at = Now();
    for (TenantId v : sw.victims) {
      TenantStats& vt = tenants_[v];
      if (di < vt.came_back.size() && vt.came_back[di] != 0) {
        vt.came_back[di] = 0;
        sw.came_back.push_back(v);
      }
    }
    for (TenantId v : sw.victims) AskEvict(di, v, &sw);
    if (!d.switching) return true;  // a dropped worker was the one waiting
  }
  if (!d.switching->waiting.empty() && Now() - d.switching->asked_at >= kStoppedGrace) {
    // Moves off normally take well under this; only then is a stopped worker looked for.
    for (Worker* w : WaitingWorkers(*d.switching)) {
      EndIfStopped(*w, "its data to move off the device");
    }
    if (!d.switching) return true;
  }
  if (!d.switching->waiting.empty()) {
    if (Now() - d.switching->since < kEvictTimeout) return false;
    // A worker that does not move its data off in time is not waited for any longer: it ends,
    // and its data with it (its tenant's next session starts afresh).
    for (Worker* w : WaitingWorkers(*d.switching)) {
      spdlog::warn("tenant '{}' (session {}) did not move its device memory off device "
                   "{} within {:.0f} s; ending its session",
                   tenants_[w->tenant].name.c_str(), static_cast<unsigned long long>(w->session),
                   di, ToSeconds(kEvictTimeout));
      Drop(*w, GoneReason::kWatchdog);
    }
    if (!d.switching) return true;
    d.switching->waiting.clear();
  }
  Switch done = std::move(*d.switching);
  d.switching.reset();
  // The victims' moves off the device (from kEvict to the last answer; waiting for their own
  // commands to finish is theirs) are the incoming tenant's switch cost, DymGPU's rule: added
  // to its next completion's device time, as its own swap-in is.
  d.last_switch_wait = done.asked ? Now() - done.asked_at : Duration(0);
  // Unless a victim's data was on the device only because it brought it back outside a command
  // (docs/policies.md, SlotAllocator decision 15): then moving it off again is that victim's
  // cost, not the incoming tenant's, who would otherwise pay for another's detours.
  std::vector<TenantId> payers = done.came_back;
  if (payers.empty()) payers.push_back(done.pick.tenant);
  const Duration share = d.last_switch_wait / static_cast<int64_t>(payers.size());
  for (TenantId u : payers) {
    TenantStats& p = tenants_[u];
    p.swap_charge_ns.resize(devices_.size());
    p.swap_charge_ns[di] += static_cast<uint64_t>(share.count());
    p.evict_wait_s += ToSeconds(share);
  }
  Release(di, done.pick, done.q);
  return true;
}

std::vector<Scheduler::Worker*> Scheduler::WaitingWorkers(const Switch& sw) {
  // Collected first: ending one changes `sw.waiting` (and may end the switch).
  std::vector<Worker*> out;
  for (const auto& [session, epoch] : sw.waiting) {
    auto it = workers_.find(session);
    if (it != workers_.end()) out.push_back(it->second.get());
  }
  return out;
}

Duration Scheduler::BatchLength(Duration cost) const {
  // swap_batch x the move, but never more than kMaxBatch: a tenant with a huge working set
  // does not get the device for as long as it likes by making its moves slow.
  return std::min<Duration>(std::chrono::duration_cast<Duration>(cost * swap_batch_), kMaxBatch);
}

std::optional<core::Dispatch> Scheduler::BatchPick(uint32_t di, bool& hold) {
  DeviceState& d = devices_[di];
  DeviceState::Batch& b = *d.batch;
  const TimePoint now = Now();
  auto on = d.resident.find(b.tenant);
  if (now >= b.until || on == d.resident.end() || !on->second) {
    d.batch.reset();
    return std::nullopt;
  }
  if (d.policy->Pending(b.tenant) > 0) {
    auto pick = d.policy->PickTenant(b.tenant, now);
    if (pick) {
      ++d.batched;
    } else {
      d.batch.reset();  // the policy takes no out-of-turn picks: it switches as it says
    }
    return pick;
  }
  // Nothing queued: a closed-loop tenant between a completion and its next command. The device
  // waits for it (at most as long as bringing its data in cost, the move the wait saves) when
  // the alternative is a tenant whose data is off the device.
  bool running = false;
  for (const Flight& f : d.inflight) running = running || f.tenant == b.tenant;
  auto last = d.last_active.find(b.tenant);
  const bool thinking = running || (last != d.last_active.end() && now - last->second < b.cost);
  if (!thinking) {
    d.batch.reset();
    return std::nullopt;
  }
  bool others_off = false;
  for (const auto& [block, q] : d.queued) {
    if (q.worker == nullptr || q.worker->tenant == b.tenant) continue;
    auto r = d.resident.find(q.worker->tenant);
    others_off = others_off || r == d.resident.end() || !r->second;
  }
  if (!others_off) return std::nullopt;  // whoever runs next is on the device already
  hold = true;
  if (!running) {
    const TimePoint until = std::min(b.until, last->second + b.cost);
    if (d.hold_until < now) d.hold_until = now;
    if (until > d.hold_until) {
      d.batch_held += until - d.hold_until;
      d.hold_until = until;
    }
  }
  return std::nullopt;
}

void Scheduler::SlotMonitor() {
  const TimePoint now = Now();
  for (uint32_t di = 0; di < devices_.size(); ++di) {
    DeviceState& d = devices_[di];
    if (!d.slots) continue;
    d.slots->Tick(now);
    // DymGPU's idle tenants leave the layout; their data leaves the device too, once nothing of
    // theirs runs there (an idle tenant is evicted first: before anyone needs its slots).
    std::vector<TenantId> idle;
    for (const auto& [u, on] : d.resident) {
      if (!on || !d.slots->Contains(u) || d.slots->StartOf(u).ok()) continue;
      if (d.switching && d.switching->pick.tenant == u) continue;
      bool busy = false;
      for (const Flight& f : d.inflight) busy = busy || f.tenant == u;
      if (HeldBy(d, u)) busy = true;
      if (!busy) idle.push_back(u);
    }
    for (TenantId u : idle) AskEvict(di, u, nullptr);
  }
}

void Scheduler::OnSwapped(Worker& w, const std::vector<ctl::Swapped>& swapped) {
  TenantStats& t = tenants_[w.tenant];
  t.swap_charge_ns.resize(devices_.size());
  for (const ctl::Swapped& r : swapped) {
    if (r.device >= devices_.size() || (r.out == 0 && r.epoch != 0) ||
        (r.out != 0 && (r.epoch == 0 || r.epoch > w.evict_epoch || r.on_demand != 0))) {
      return Drop(w, GoneReason::kMalformed);
    }
    DeviceState& d = devices_[r.device];
    if (r.out != 0 && d.switching) {
      auto it = d.switching->waiting.find(w.session);
      if (it != d.switching->waiting.end() && it->second == r.epoch) {
        d.switching->waiting.erase(it);
      }
    }
    PoolSwapped(w, r);
    d.swaps.Add(r);
    t.swaps.Add(r);
    if (r.out == 0) t.swap_charge_ns[r.device] += r.ns;
    if (r.on_demand != 0 && r.objects != 0 && d.slots) {
      // Its worker brought data back outside a command (an info query on an evicted image, a
      // sub-buffer of an evicted buffer): the data is on the device, so the tenant is in the way
      // of the next one it overlaps and is moved off again then. (If this crosses an eviction
      // on the way, the tenant is asked once more and moves nothing.)
      d.resident[w.tenant] = true;
      t.came_back.resize(devices_.size());
      t.came_back[r.device] = 1;
    }
    if (r.out == 0 && d.batch && d.batch->tenant == w.tenant) {
      const Duration in(static_cast<int64_t>(r.ns));
      d.batch->cost += in;
      d.batch->until = d.batch->start + BatchLength(d.batch->cost);
    }
  }
}

void Scheduler::SwapCounters::Add(const ctl::Swapped& r) {
  const double secs = static_cast<double>(r.ns) * 1e-9;
  if (r.out != 0) {
    if (r.objects == 0) return;
    ++evictions;
    bytes_out += r.bytes;
    swap_out_s += secs;
  } else {
    // A restore before a command brings back everything evicted (one per eviction); one on
    // demand brings back a single allocation, counted apart so that evictions and restores pair.
    if (r.on_demand != 0) {
      ++on_demand_restores;
    } else {
      ++restores;
    }
    bytes_in += r.bytes;
    swap_in_s += secs;
  }
}

void Scheduler::Release(uint32_t di, const core::Dispatch& pick, const Queued& q) {
  DeviceState& d = devices_[di];
  if (d.slots) {
    (void)d.slots->SwitchTo(pick.tenant, Now());
    bool& on = d.resident[pick.tenant];
    if (!on && swap_batch_ > 0 && d.policy->PicksOutOfTurn()) {
      // Its data comes back: a batch starts, as long as swap_batch × what the move costs (the
      // wait for victims now, its swap-in time when its worker reports it).
      const Duration cost = d.last_switch_wait;
      d.batch = DeviceState::Batch{pick.tenant, Now(), Now() + BatchLength(cost), cost};
      ++d.batches;
    }
    d.last_switch_wait = Duration(0);
    on = true;  // its worker brings its data back before it runs
  }
  Dispatched(d, Flight{q.worker, q.cmd, pick.block, pick.tenant, pick.range, pick.last, Now(),
                       q.unsplit_kernel});
  ctl::Release r;
  r.cmd = q.cmd;
  r.begin = pick.range.begin;
  r.end = pick.range.end;
  r.last = pick.last ? 1 : 0;
  r.whole = pick.last && pick.range.begin == 0 && pick.range.end == q.work_items ? 1 : 0;
  q.worker->out.push_back(r);
  if (pick.last) {
    q.worker->blocks.erase(q.cmd);
    if (q.worker->queued_on[di] > 0) --q.worker->queued_on[di];
    d.queued.erase(pick.block);
  }
}

void Scheduler::Dispatched(DeviceState& d, const Flight& f) {
  if (d.inflight.empty()) d.head_since = f.released;
  d.inflight.push_back(f);
  ++d.dispatches;
  ++dispatches_;
  auto t = tenants_.find(f.tenant);
  if (t != tenants_.end()) {
    ++t->second.dispatches;
    ++t->second.inflight;
  }
}

template <typename T>
void Scheduler::SendPending(Worker& w, ctl::Type type, std::vector<T>& records) {
  if (w.dead || records.empty()) return;
  size_t sent = 0;
  gmux::Status s = ctl::Send(w.fd, type, records.data(), sizeof(T), records.size(), -1,
                             /*dont_wait=*/true, &sent);
  records.erase(records.begin(), records.begin() + static_cast<ptrdiff_t>(sent));
  // A worker that does not read its channel is not waited for: the rest goes next round (and
  // its dispatches count against it, so the watchdog ends it if it never takes them).
  if (!s.ok() && s.code() != StatusCode::kResourceExhausted) Drop(w, GoneReason::kClosed);
}

void Scheduler::SendReleases() {
  for (auto& [id, w] : workers_) {
    // Grants and revokes go ahead of releases.
    SendPending(*w, ctl::Type::kExpress, w->express_out);
    SendPending(*w, ctl::Type::kLeaseAnswer, w->lease_out);
    SendPending(*w, ctl::Type::kRelease, w->out);
    // An ended lease after the releases of work reported before it ended.
    SendPending(*w, ctl::Type::kLeaseLost, w->lost_out);
  }
}

void Scheduler::Loop() {
  epoll_event evs[64];
  while (!stop_) {
    int timeout_ms = -1;
    std::optional<TimePoint> next;
    for (auto& d : devices_) {
      if (auto t = d.policy->NextTimer()) next = next ? std::min(*next, *t) : *t;
      if (!d.inflight.empty() || d.revoking) {
        TimePoint w = Now() + kWatchdogTick;
        next = next ? std::min(*next, w) : w;
      }
    }
    bool pending_out = false;
    for (auto& [id, w] : workers_) {
      pending_out = pending_out || !w->out.empty() || !w->express_out.empty() ||
                    !w->lease_out.empty() || !w->lost_out.empty();
    }
    if (pending_out) next = Now() + std::chrono::milliseconds(1);
    if (auto t = PoolNextTimer()) next = next ? std::min(*next, *t) : *t;
    for (auto& d : devices_) {
      if (d.batch && d.hold_until > Now()) next = next ? std::min(*next, d.hold_until) : d.hold_until;
      if (!d.slots || (d.resident.empty() && !d.switching)) continue;
      TimePoint m = Now() + std::min<Duration>(d.slots->options().monitor_period, kEvictTimeout);
      next = next ? std::min(*next, m) : m;
    }
    if (next) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*next - Now()).count();
      timeout_ms = static_cast<int>(std::clamp<int64_t>(left + 1, 0, 1000));
    }
    int n = ::epoll_wait(epoll_fd_, evs, 64, timeout_ms);
    // CPU time of this thread, so preemption on a loaded host does not count as cost.
    const uint64_t t0 = ThreadCpuNs();
    for (int i = 0; i < n; ++i) {
      const uint64_t key = evs[i].data.u64;
      if (key == 0) {
        for (auto& task : mailbox_.TryTakeAll()) task();
        continue;
      }
      auto it = workers_.find(key);
      if (it == workers_.end() || it->second->dead) continue;
      Worker& w = *it->second;
      for (int k = 0; k < 64 && !w.dead; ++k) {
        auto m = ctl::Receive(w.fd, /*dont_wait=*/true);
        if (!m.ok()) {
          if (m.status().code() == StatusCode::kResourceExhausted) break;
          Drop(w, m.status().code() == StatusCode::kDataLoss ? GoneReason::kMalformed
                                                             : GoneReason::kClosed);
          break;
        }
        if (m->fd >= 0) ::close(m->fd);  // workers pass no descriptors
        OnMessage(w, *m);
      }
    }
    const TimePoint now = Now();
    for (auto& d : devices_) {
      if (auto t = d.policy->NextTimer(); t && *t <= now) d.policy->Tick(now);
    }
    SlotMonitor();
    PoolTick();
    Pump();
    Watchdog();
    Pump();
    SendReleases();
    for (auto it = workers_.begin(); it != workers_.end();) {
      it = it->second->dead ? workers_.erase(it) : std::next(it);
    }
    busy_ns_ += ThreadCpuNs() - t0;
  }
}

std::string Scheduler::Status(std::optional<TenantId> only) {
  if (stop_.load() || !thread_.joinable()) return "{}";
  auto promise = std::make_shared<std::promise<std::string>>();
  std::future<std::string> f = promise->get_future();
  mailbox_.Post([this, promise, only] { promise->set_value(StatusNow(only)); });
  if (f.wait_for(std::chrono::seconds(2)) != std::future_status::ready) return "{}";
  return f.get();
}

namespace {
nlohmann::json SwapJson(const auto& c) {
  return nlohmann::json{{"evictions", c.evictions}, {"restores", c.restores},
                        {"on_demand_restores", c.on_demand_restores},
                        {"bytes_out", c.bytes_out}, {"bytes_in", c.bytes_in},
                        {"swap_out_s", c.swap_out_s}, {"swap_in_s", c.swap_in_s}};
}
}  // namespace

std::string Scheduler::StatusNow(std::optional<TenantId> only) const {
  using nlohmann::json;
  json j;
  j["inflight_per_device"] = inflight_limit_;
  j["outstanding_commands"] = outstanding_.load();
  json devs = json::array();
  for (size_t i = 0; i < devices_.size(); ++i) {
    const DeviceState& d = devices_[i];
    // A tenant sees which sessions hold express only when they are its own.
    json holders = json::array();
    for (const ExpressHolder& h : d.express) {
      if (!only || h.worker->tenant == *only) holders.push_back(h.worker->session);
    }
    devs.push_back(json{{"index", i},
                        {"policy", std::string(d.policy->name())},
                        {"inflight", d.inflight.size()},
                        {"queued_commands", d.queued.size()},
                        {"express_session", holders.empty() ? json(nullptr) : holders[0]},
                        {"express_sessions", holders},
                        {"held_commands", d.held.size()},
                        {"dispatches", d.dispatches},
                        {"busy_s", d.busy_s},
                        // Others' use is not a tenant's business; the capacity is.
                        {"memory_capacity", d.mem_capacity},
                        {"memory_used", only ? json(nullptr) : json(d.mem_used)}});
    if (d.slots) {
      // Oversubscription: DymGPU's counts (slot copies) next to the bytes really moved.
      const core::SlotCounters& c = d.slots->counters();
      json placed = json::array();
      for (const auto& ti : d.slots->Tenants()) {
        if (only && ti.id != *only) continue;
        auto r = d.resident.find(ti.id);
        placed.push_back(json{{"tenant", ti.id},
                              {"need", ti.need},
                              {"start", ti.start ? json(*ti.start) : json(nullptr)},
                              {"utilization", ti.utilization},
                              {"resident", r != d.resident.end() && r->second},
                              {"switch_ins", ti.switch_ins},
                              {"copies", ti.copies}});
      }
      json slots_json = SwapJson(d.swaps);
      slots_json.update(json{{"policy", std::string(core::SlotPolicyName(
                                                 d.slots->options().policy))},
                                  {"slots", d.slots->options().slots},
                                  {"slot_bytes", d.slot_bytes},
                                  {"shared_slots", d.slots->SharedSlots()},
                                  {"switches", c.switches},
                                  {"switch_copies", c.switch_copies},
                                  {"move_copies", c.move_copies},
                                  {"slot_copies", c.total_copies()},
                                  {"idle_evictions", c.idle_evictions},
                                  {"releases_waited", d.switches_waited},
                                  {"swap_batch", swap_batch_},
                                  {"batches", d.batches},
                                  {"batched_dispatches", d.batched},
                                  {"batch_held_s", ToSeconds(d.batch_held)},
                                  {"tenants", std::move(placed)}});
      devs.back()["slots"] = std::move(slots_json);
    }
  }
  j["devices"] = devs;
  if (pool_.lease) j["pool"] = nlohmann::json::parse(LeaseListNow(only));
  // Kang & Yu's N: tenants with work pending or in flight.
  uint64_t active = 0;
  for (const auto& [id, t] : tenants_) {
    if (t.total_items > t.processed_items || t.commands > t.completed) ++active;
  }
  if (!only) j["active_tenants"] = active;
  j["worker_deaths"] = worker_deaths_;
  json ts = json::array();
  for (const auto& [id, t] : tenants_) {
    if (only && id != *only) continue;
    json x{{"id", id},
           {"name", t.name},
           {"weight", t.weight},
           {"active_tenants", active},
           {"total_items", t.total_items},
           {"processed_items", t.processed_items},
           {"remaining_items", t.total_items - t.processed_items},
           {"commands", t.commands},
           {"completed_commands", t.completed},
           {"dispatches", t.dispatches},
           {"express_dispatches", t.express},
           {"inflight", t.inflight},
           {"device_time_s", t.device_time_s},
           {"unsplit_kernel_s", t.unsplit_kernel_s},
           {"sessions", t.sessions},
           {"worker_deaths", t.worker_deaths},
           {"watchdog_kills", t.watchdog_kills},
           {"command_time_limit_s", ToSeconds(t.command_time_limit)},
           {"swap", SwapJson(t.swaps)}};
    // Others' data moved off a device to make room for this tenant, charged to it.
    x["swap"]["evict_wait_s"] = t.evict_wait_s;
    size_t pending = 0;
    for (const auto& d : devices_) {
      pending += d.policy->Pending(id);
      if (const auto* sp = dynamic_cast<const core::SplitPolicy*>(d.policy.get())) {
        if (auto m = sp->Monitor(id)) {
          x["usage_s"] = m->usage_s;  // Eq. (1)
          x["next_chunk_items"] = m->next_chunk_items;
          x["rounds"] = m->rounds;
        }
      }
    }
    x["pending_commands"] = pending;
    json mem = json::array();
    for (size_t di = 0; di < devices_.size(); ++di) {
      mem.push_back(json{{"device", di},
                         {"used", di < t.mem_used.size() ? t.mem_used[di] : 0},
                         {"peak", di < t.mem_peak.size() ? t.mem_peak[di] : 0},
                         {"quota", t.memory_quota}});
    }
    x["memory"] = std::move(mem);
    x["memory_refused"] = t.mem_refused;
    ts.push_back(std::move(x));
  }
  j["tenants"] = ts;
  j["scheduler"] = json{{"dispatches", dispatches_},
                        {"busy_s", static_cast<double>(busy_ns_) * 1e-9},
                        {"ns_per_dispatch", dispatches_ > 0 ? static_cast<double>(busy_ns_) /
                                                                   static_cast<double>(dispatches_)
                                                             : 0.0}};
  return j.dump();
}

}  // namespace gmux::daemon
