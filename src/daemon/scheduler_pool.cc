// The scheduler's device pool: BioCloud's exclusive leases on the real runtime (Jo et al.,
// Section 3; docs/operations.md "Device pool", docs/policies.md "Device pool on the runtime").
//
// core::LeasePool decides (who gets which device, who waits, what the checker reclaims); this
// file carries its decisions out with the workers and the hooks:
//   - A worker asks for its tenant's lease (ctl::kLeaseAsk) when its session creates a context on
//     the pool, or runs a command there after the lease was reclaimed. The ask waits in the
//     pool's queue up to [pool] wait_s, then is refused (the context creation fails with
//     CL_DEVICE_NOT_AVAILABLE).
//   - A grant becomes usable once the previous holder's workers have moved their data off the
//     device (ctl::kLeaseLost, answered like an eviction) and the attach hook has run; every
//     waiting ask of the tenant is then answered with the device.
//   - The lease ends when the tenant's last pool context is released (ProgramEnd: a pinned
//     lease stays), when its last worker is gone, by `gmux lease release`, when an explicit
//     lease's --for runs out, or when the checker finds it idle (nothing queued or running on
//     the device for idle_s). Its workers are told (kLeaseLost) and move their data off; the
//     detach hook runs after that.
// The pool's own attach/detach times are zero: on the runtime they are what the hooks take,
// measured and reported as the pool's attach cost.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <future>

#include <nlohmann/json.hpp>

#include <spdlog/spdlog.h>

#include "daemon/scheduler.h"

namespace gmux::daemon {
namespace {

constexpr std::chrono::seconds kDrainTimeout{30};
constexpr size_t kMaxAsksPerWorker = 8;

std::string LeaseName(uint64_t id) { return "L" + std::to_string(id); }

}  // namespace

gmux::Status Scheduler::EnablePool(const std::vector<uint32_t>& devices,
                                   const PoolOptions& options,
                                   const std::vector<std::string>& names) {
  if (devices.empty()) return InvalidArgument("a pool needs at least one device");
  for (uint32_t d : devices) {
    if (d >= devices_.size()) {
      return InvalidArgument("pool device " + std::to_string(d) + " does not exist (" +
                             std::to_string(devices_.size()) + " devices)");
    }
  }
  core::LeasePoolOptions o;
  o.devices = static_cast<uint32_t>(devices.size());
  o.check_period = FromSeconds(options.check_period_s);
  o.idle_threshold = FromSeconds(options.idle_s);
  o.attach_time = Duration(0);  // the hooks' time, measured, is the runtime's attach cost
  o.detach_time = Duration(0);
  o.origin = Now();
  GMUX_ASSIGN_OR_RETURN(core::LeasePool lp, core::LeasePool::Create(o));
  pool_.lease.emplace(std::move(lp));
  pool_.options = options;
  pool_.names = names;
  pool_.devices.clear();
  for (uint32_t d : devices) {
    PoolDevice pd;
    pd.backend = d;
    pool_.devices.push_back(std::move(pd));
  }
  return Status::Ok();
}

bool Scheduler::PoolDeviceIndex(uint32_t backend, uint32_t& index) const {
  for (uint32_t i = 0; i < pool_.devices.size(); ++i) {
    if (pool_.devices[i].backend == backend) {
      index = i;
      return true;
    }
  }
  return false;
}

Scheduler::PoolTenant& Scheduler::PoolTenantOf(TenantId tenant) {
  auto [it, fresh] = pool_.tenants.try_emplace(tenant);
  // At the pool's own time: a caller may already hold a later Now() for the request it makes.
  if (fresh) pool_.lease->AddTenant(tenant, pool_.lease->now()).IgnoreError();
  return it->second;
}

void Scheduler::OnLeaseAsk(Worker& w, const std::vector<ctl::LeaseAsk>& asks) {
  if (!pool_.lease) {
    for (const ctl::LeaseAsk& a : asks) {
      w.lease_out.push_back({a.seq, static_cast<uint32_t>(ctl::LeaseVerdict::kNoPool), 0});
    }
    return;
  }
  const TimePoint now = Now();
  PoolTenant& pt = PoolTenantOf(w.tenant);
  // A session asks once from its request thread and once for its commands: more open asks are
  // a worker flooding the broker, which ends it.
  size_t open = asks.size();
  for (const PoolAsk& a : pt.asks) open += a.worker == &w ? 1 : 0;
  if (open > kMaxAsksPerWorker) return Drop(w, GoneReason::kMalformed);
  for (const ctl::LeaseAsk& a : asks) {
    pt.asks.push_back({&w, a.seq, now + FromSeconds(pool_.options.wait_s)});
  }
  const core::LeaseView v = pool_.lease->Lease(w.tenant);
  if (v.status == core::LeaseStatus::kNone) {
    pt.lease = pool_.next_lease++;
    pt.pinned = false;
    pt.requested = now;
    pt.usable = false;
  }
  (void)pool_.lease->RequestImplicit(w.tenant, now);
  pool_.lease->NoteActivity(w.tenant, now).IgnoreError();
  PoolEvents();
  if (pt.usable && pt.device < pool_.devices.size()) PoolGranted(pt.device);
}

void Scheduler::OnPoolContexts(Worker& w, uint64_t count) {
  w.pool_contexts = count;
  if (!pool_.lease || count != 0) return;
  uint64_t left = 0;
  for (const auto& [id, o] : workers_) {
    if (!o->dead && o->tenant == w.tenant) left += o->pool_contexts;
  }
  if (left != 0) return;
  // The tenant's program released its last pool context: Message (4), an implicit lease ends
  // (a pinned one stays).
  auto it = pool_.tenants.find(w.tenant);
  if (it == pool_.tenants.end() || it->second.pinned) return;
  pool_.lease->ProgramEnd(w.tenant, Now()).IgnoreError();
  PoolEvents();
}

void Scheduler::PoolEvents() {
  if (!pool_.lease) return;
  for (const core::PoolEvent& e : pool_.lease->TakeEvents()) {
    if (e.device >= pool_.devices.size()) continue;
    PoolDevice& pd = pool_.devices[e.device];
    switch (e.kind) {
      case core::PoolEventKind::kAttachStarted: {
        pd.holder = e.tenant;
        pd.held_since = Now();
        spdlog::info("pool: device {} lent to tenant '{}'", pd.backend, tenants_[e.tenant].name);
        PoolTenant& pt = PoolTenantOf(e.tenant);
        pt.device = e.device;
        pt.usable = false;
        pd.attach_waiting = true;
        if (pd.draining.empty() && !pd.hook_running) PoolAttach(e.device);
        break;
      }
      case core::PoolEventKind::kDetachStarted: {
        auto it = pool_.tenants.find(e.tenant);
        if (it != pool_.tenants.end()) {
          PoolTenant& pt = it->second;
          pt.device = UINT32_MAX;
          pt.usable = false;
          pt.lease = 0;
          pt.pinned = false;
          pt.expires.reset();
          if (e.reason == core::ReleaseReason::kIdle) {
            ++pt.reclaims;
            pt.reclaimed_at = Now();
          }
        }
        if (auto t = tenants_.find(e.tenant); t != tenants_.end()) {
          UsageOf(t->second, pd.backend).lease_s += ToSeconds(Now() - pd.held_since);
        }
        spdlog::info("pool: device {} given back by tenant '{}' ({})", pd.backend,
                     tenants_[e.tenant].name, core::ReleaseReasonName(e.reason));
        pd.holder = kNoTenant;
        pd.drained_from = e.tenant;
        pd.drain_reason = std::string(core::ReleaseReasonName(e.reason));
        pd.drain_since = Now();
        pd.draining.clear();
        // Its workers move their data off the device and forget it (kLeaseLost); the next
        // holder waits for them.
        for (auto& [id, w] : workers_) {
          if (w->dead || w->tenant != e.tenant) continue;
          ctl::LeaseLost l{pd.backend, 0, ++w->evict_epoch};
          w->lost_out.push_back(l);
          pd.draining[id] = l.epoch;
        }
        if (pd.draining.empty()) PoolDrained(e.device);
        break;
      }
      case core::PoolEventKind::kAttachFinished:
      case core::PoolEventKind::kDetachFinished:
        break;  // zero-time in the pool: the drain and the hooks pace the runtime
    }
  }
}

void Scheduler::PoolDrained(uint32_t index) {
  PoolDevice& pd = pool_.devices[index];
  const TenantId from = std::exchange(pd.drained_from, kNoTenant);
  if (pool_.options.detach_hook.empty() || from == kNoTenant) {
    if (pd.attach_waiting && !pd.hook_running) PoolAttach(index);
    return;
  }
  pd.hook_running = true;
  const uint64_t serial = ++pd.hook_serial;
  auto t = tenants_.find(from);
  std::vector<std::string> env = {
      "GMUX_DEVICE=" + std::to_string(pd.backend),
      "GMUX_DEVICE_NAME=" + (pd.backend < pool_.names.size() ? pool_.names[pd.backend] : ""),
      "GMUX_TENANT=" + (t != tenants_.end() ? t->second.name : std::to_string(from)),
      "GMUX_REASON=" + pd.drain_reason, "GMUX_EVENT=detach"};
  RunHook(pool_.options.detach_hook, std::move(env),
          [this, index, serial](bool ok, double secs, const std::string& why) {
            PoolDevice& d = pool_.devices[index];
            if (d.hook_serial != serial) return;
            d.hook_running = false;
            pool_.detach_hook_s += secs;
            ++pool_.detach_hooks;
            if (!ok) {
              ++pool_.hook_failures;
              spdlog::warn("pool: detach hook for device {} failed: {}",
                           d.backend, why.c_str());
            }
            if (d.attach_waiting) PoolAttach(index);
          });
}

void Scheduler::PoolAttach(uint32_t index) {
  PoolDevice& pd = pool_.devices[index];
  if (!pd.attach_waiting || pd.holder == kNoTenant) {
    pd.attach_waiting = false;
    return;
  }
  pd.attach_waiting = false;
  if (pool_.options.attach_hook.empty()) return PoolGranted(index);
  pd.hook_running = true;
  const uint64_t serial = ++pd.hook_serial;
  const TenantId holder = pd.holder;
  PoolTenant& pt = PoolTenantOf(holder);
  auto t = tenants_.find(holder);
  std::vector<std::string> env = {
      "GMUX_DEVICE=" + std::to_string(pd.backend),
      "GMUX_DEVICE_NAME=" + (pd.backend < pool_.names.size() ? pool_.names[pd.backend] : ""),
      "GMUX_TENANT=" + (t != tenants_.end() ? t->second.name : std::to_string(holder)),
      "GMUX_LEASE=" + LeaseName(pt.lease), "GMUX_EVENT=attach",
      std::string("GMUX_LEASE_KIND=") + (pt.pinned ? "explicit" : "implicit")};
  RunHook(pool_.options.attach_hook, std::move(env),
          [this, index, serial, holder](bool ok, double secs, const std::string& why) {
            PoolDevice& d = pool_.devices[index];
            if (d.hook_serial != serial) return;
            d.hook_running = false;
            pool_.attach_hook_s += secs;
            ++pool_.attach_hooks;
            if (d.holder != holder) {
              // Released while its hook ran: the device went on (and may wait for this hook).
              if (d.attach_waiting) PoolAttach(index);
              return;
            }
            if (ok) return PoolGranted(index);
            ++pool_.hook_failures;
            spdlog::warn("pool: attach hook for device {} failed: {}", d.backend,
                         why.c_str());
            PoolRefuse(holder, ctl::LeaseVerdict::kHookFailed);
          });
}

void Scheduler::PoolGranted(uint32_t index) {
  PoolDevice& pd = pool_.devices[index];
  if (pd.holder == kNoTenant) return;
  PoolTenant& pt = PoolTenantOf(pd.holder);
  const TimePoint now = Now();
  if (!pt.usable) {
    pt.usable = true;
    ++pt.grants;
    pt.grant_latency_s += ToSeconds(now - pt.requested);
    if (pt.reclaimed_at) {
      pt.reacquire_s += ToSeconds(now - *pt.reclaimed_at);
      pt.reacquire_latency_s += ToSeconds(now - pt.requested);
      ++pt.reacquires;
      pt.reclaimed_at.reset();
    }
  }
  for (const PoolAsk& a : pt.asks) {
    if (a.worker->dead) continue;
    a.worker->lease_out.push_back(
        {a.seq, static_cast<uint32_t>(ctl::LeaseVerdict::kGranted), pd.backend});
  }
  pt.asks.clear();
  pool_.lease->NoteActivity(pd.holder, now).IgnoreError();
}

void Scheduler::PoolRefuse(TenantId tenant, ctl::LeaseVerdict why) {
  auto it = pool_.tenants.find(tenant);
  if (it == pool_.tenants.end()) return;
  PoolTenant& pt = it->second;
  for (const PoolAsk& a : pt.asks) {
    if (!a.worker->dead) a.worker->lease_out.push_back({a.seq, static_cast<uint32_t>(why), 0});
  }
  pt.asks.clear();
  if (why == ctl::LeaseVerdict::kHookFailed) ++pt.hook_failures;
  // Whatever it waits for or holds goes back (a failed attach leaves no lease).
  const core::LeaseView v = pool_.lease->Lease(tenant);
  if (v.status == core::LeaseStatus::kNone) return;
  if (v.status == core::LeaseStatus::kWaiting || !pt.pinned) {
    pool_.lease->Disconnect(tenant, Now()).IgnoreError();
  } else {
    pool_.lease->ReleaseExplicit(tenant, v.device, Now()).IgnoreError();
  }
  pt.pinned = false;
  pt.lease = 0;
  PoolEvents();
}

void Scheduler::PoolNoteActivity(TenantId tenant) {
  if (pool_.lease && pool_.tenants.count(tenant) != 0) {
    pool_.lease->NoteActivity(tenant, Now()).IgnoreError();
  }
}

bool Scheduler::PoolReadyAllowed(const Worker& w, uint32_t device) const {
  uint32_t index = 0;
  if (!pool_.lease || !PoolDeviceIndex(device, index)) return true;  // a shared device
  const PoolDevice& pd = pool_.devices[index];
  if (pd.holder == w.tenant) {
    auto it = pool_.tenants.find(w.tenant);
    return it != pool_.tenants.end() && it->second.usable;
  }
  // Work it reported before it heard that its lease ended runs before the device moves on.
  return pd.draining.count(w.session) != 0;
}

void Scheduler::PoolSwapped(Worker& w, const ctl::Swapped& r) {
  if (r.out == 0) return;
  for (uint32_t i = 0; i < pool_.devices.size(); ++i) {
    PoolDevice& pd = pool_.devices[i];
    auto it = pd.draining.find(w.session);
    if (it == pd.draining.end() || it->second != r.epoch) continue;
    pd.draining.erase(it);
    if (pd.draining.empty()) PoolDrained(i);
  }
}

void Scheduler::PoolWorkerGone(Worker& w) {
  if (!pool_.lease) return;
  for (uint32_t i = 0; i < pool_.devices.size(); ++i) {
    PoolDevice& pd = pool_.devices[i];
    if (pd.draining.erase(w.session) != 0 && pd.draining.empty()) PoolDrained(i);
  }
  auto it = pool_.tenants.find(w.tenant);
  if (it == pool_.tenants.end()) return;
  std::erase_if(it->second.asks, [&](const PoolAsk& a) { return a.worker == &w; });
  bool others = false;
  uint64_t contexts = 0;
  for (const auto& [id, o] : workers_) {
    if (o.get() == &w || o->dead || o->tenant != w.tenant) continue;
    others = true;
    contexts += o->pool_contexts;
  }
  if (contexts != 0 || it->second.pinned) return;
  // Its last pool context went with its process: an implicit lease ends (Message 4; pinned
  // leases are the operator's and stay until released or expired).
  if (!others || w.pool_contexts != 0 || it->second.asks.empty()) {
    pool_.lease->ProgramEnd(w.tenant, Now()).IgnoreError();
    PoolEvents();
  }
}

void Scheduler::PoolTick() {
  if (!pool_.lease) return;
  const TimePoint now = Now();
  // Waits past [pool] wait_s are refused; an implicit request nobody waits for any more goes.
  for (auto& [tenant, pt] : pool_.tenants) {
    const size_t before = pt.asks.size();
    for (auto it = pt.asks.begin(); it != pt.asks.end();) {
      if (it->deadline > now) {
        ++it;
        continue;
      }
      if (!it->worker->dead) {
        it->worker->lease_out.push_back(
            {it->seq, static_cast<uint32_t>(ctl::LeaseVerdict::kTimedOut), 0});
      }
      ++pt.timeouts;
      it = pt.asks.erase(it);
    }
    if (before != 0 && pt.asks.empty() && !pt.pinned &&
        pool_.lease->Lease(tenant).status == core::LeaseStatus::kWaiting) {
      pool_.lease->ProgramEnd(tenant, now).IgnoreError();
      pt.lease = 0;
    }
    if (pt.expires && *pt.expires <= now) {
      pt.expires.reset();
      const core::LeaseView v = pool_.lease->Lease(tenant);
      if (v.status == core::LeaseStatus::kReady || v.status == core::LeaseStatus::kAttaching) {
        pool_.lease->ReleaseExplicit(tenant, v.device, now).IgnoreError();
      } else if (v.status == core::LeaseStatus::kWaiting) {
        pool_.lease->Disconnect(tenant, now).IgnoreError();
      }
      pt.pinned = false;
    }
  }
  // A lease with work queued or running on its device is in use now (the checker's usage query).
  for (const PoolDevice& pd : pool_.devices) {
    if (pd.holder == kNoTenant) continue;
    const DeviceState& d = devices_[pd.backend];
    bool busy = !d.inflight.empty();
    for (const auto& [block, q] : d.queued) busy = busy || q.worker->tenant == pd.holder;
    for (const auto& [w, r] : d.held) busy = busy || w->tenant == pd.holder;
    if (busy) pool_.lease->NoteActivity(pd.holder, now).IgnoreError();
  }
  pool_.lease->Advance(now).IgnoreError();
  PoolEvents();
  // Workers that do not move their data off in time are not waited for.
  for (uint32_t i = 0; i < pool_.devices.size(); ++i) {
    PoolDevice& pd = pool_.devices[i];
    if (pd.draining.empty() || now - pd.drain_since < kDrainTimeout) continue;
    std::vector<Worker*> late;
    for (const auto& [session, epoch] : pd.draining) {
      auto w = workers_.find(session);
      if (w != workers_.end() && !w->second->dead) late.push_back(w->second.get());
    }
    pd.draining.clear();
    for (Worker* w : late) {
      spdlog::warn("pool: session {} did not give device {} back within {:.0f} s; "
                   "ending it",
                   static_cast<unsigned long long>(w->session), pd.backend,
                   ToSeconds(kDrainTimeout));
      Drop(*w, GoneReason::kWatchdog);
    }
    PoolDrained(i);
  }
}

std::optional<TimePoint> Scheduler::PoolNextTimer() const {
  if (!pool_.lease) return std::nullopt;
  std::optional<TimePoint> next = pool_.lease->NextTimer();
  auto take = [&next](TimePoint t) { next = next ? std::min(*next, t) : t; };
  for (const auto& [tenant, pt] : pool_.tenants) {
    for (const PoolAsk& a : pt.asks) take(a.deadline);
    if (pt.expires) take(*pt.expires);
  }
  for (const PoolDevice& pd : pool_.devices) {
    if (!pd.draining.empty()) take(pd.drain_since + kDrainTimeout);
  }
  return next;
}

void Scheduler::RunHook(const std::string& command, std::vector<std::string> env,
                        std::function<void(bool, double, const std::string&)> done) {
  const double timeout_s = pool_.options.hook_timeout_s;
  // Finished runs' threads are joined here (each run posts its result before it finishes).
  for (auto it = pool_.hooks.begin(); it != pool_.hooks.end();) {
    if (it->finished->load()) {
      it->thread.join();
      it = pool_.hooks.erase(it);
    } else {
      ++it;
    }
  }
  auto finished = std::make_shared<std::atomic<bool>>(false);
  Pool::Hook hook;
  hook.finished = finished;
  hook.thread = std::thread([this, command, env = std::move(env), timeout_s, finished,
                             done = std::move(done)]() mutable {
    const auto t0 = std::chrono::steady_clock::now();
    int out[2] = {-1, -1};
    bool ok = false;
    std::string why;
    if (::pipe2(out, O_CLOEXEC) != 0) {
      why = "pipe failed";
    } else {
      std::vector<std::string> all = env;
      for (char** e = environ; e != nullptr && *e != nullptr; ++e) all.emplace_back(*e);
      std::vector<char*> envp;
      for (auto& s : all) envp.push_back(s.data());
      envp.push_back(nullptr);
      const pid_t pid = ::fork();
      if (pid == 0) {
        ::setpgid(0, 0);
        ::dup2(out[1], 1);
        ::dup2(out[1], 2);
        const char* argv[] = {"/bin/sh", "-c", command.c_str(), nullptr};
        ::execve("/bin/sh", const_cast<char* const*>(argv), envp.data());
        ::_exit(127);
      }
      ::close(out[1]);
      std::string text;
      int status = -1;
      bool exited = false;
      const auto deadline = t0 + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                     std::chrono::duration<double>(timeout_s));
      while (pid > 0) {
        if (::waitpid(pid, &status, WNOHANG) == pid) {
          exited = true;
          break;
        }
        if (std::chrono::steady_clock::now() >= deadline) break;
        pollfd p{out[0], POLLIN, 0};
        if (::poll(&p, 1, 20) > 0) {
          char buf[512];
          const ssize_t n = ::read(out[0], buf, sizeof(buf));
          if (n > 0 && text.size() < 4096) text.append(buf, static_cast<size_t>(n));
        }
      }
      if (pid > 0 && !exited) {
        ::kill(-pid, SIGKILL);
        ::kill(pid, SIGKILL);
        ::waitpid(pid, &status, 0);
        why = "ran past hook_timeout_s (" + std::to_string(timeout_s) + " s)";
      } else if (pid <= 0) {
        why = "fork failed";
      } else if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
        ok = true;
      } else {
        why = WIFEXITED(status) ? "exit " + std::to_string(WEXITSTATUS(status))
                                : "killed by signal " + std::to_string(WTERMSIG(status));
        while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
        if (!text.empty()) why += ": " + text.substr(0, 300);
      }
      ::close(out[0]);
    }
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    mailbox_.Post([done = std::move(done), ok, secs, why] { done(ok, secs, why); });
    finished->store(true);
  });
  pool_.hooks.push_back(std::move(hook));
}

std::string Scheduler::LeaseAcquire(TenantId tenant, const std::string& name, double for_s,
                                    int device) {
  auto promise = std::make_shared<std::promise<std::string>>();
  std::future<std::string> f = promise->get_future();
  mailbox_.Post([this, tenant, name, for_s, device, promise] {
    using nlohmann::json;
    if (!pool_.lease) {
      promise->set_value(json{{"error", "gmuxd has no pool devices ([[scheduler.device]] "
                                        "mode = \"exclusive\")"}}.dump());
      return;
    }
    TenantStats& ts = tenants_[tenant];
    if (ts.name.empty()) ts.name = name;
    PoolTenant& pt = PoolTenantOf(tenant);
    const TimePoint now = Now();
    std::optional<DeviceId> want;
    if (device >= 0) {
      uint32_t index = 0;
      if (!PoolDeviceIndex(static_cast<uint32_t>(device), index)) {
        promise->set_value(
            json{{"error", "device " + std::to_string(device) + " is not in the pool"}}.dump());
        return;
      }
      want = index;
    }
    const core::LeaseView before = pool_.lease->Lease(tenant);
    auto r = pool_.lease->RequestExplicit(tenant, now, want);
    if (!r.ok()) {
      promise->set_value(json{{"error", "tenant '" + name + "': " + r.status().message()}}.dump());
      return;
    }
    if (before.status == core::LeaseStatus::kNone) {
      pt.lease = pool_.next_lease++;
      pt.requested = now;
      pt.usable = false;
    }
    pt.pinned = true;
    if (for_s > 0) pt.expires = now + FromSeconds(for_s);
    PoolEvents();
    promise->set_value(json{{"lease", LeaseName(pt.lease)}, {"tenant", name}}.dump());
  });
  if (f.wait_for(std::chrono::seconds(5)) != std::future_status::ready) {
    return R"({"error":"gmuxd did not answer"})";
  }
  return f.get();
}

std::string Scheduler::LeaseRelease(TenantId caller, bool admin, uint64_t id) {
  auto promise = std::make_shared<std::promise<std::string>>();
  std::future<std::string> f = promise->get_future();
  mailbox_.Post([this, caller, admin, id, promise] {
    using nlohmann::json;
    for (auto& [tenant, pt] : pool_.tenants) {
      if (pt.lease != id || id == 0) continue;
      if (tenant != caller && !admin) {
        promise->set_value(json{{"error", LeaseName(id) + " is another tenant's lease"}}.dump());
        return;
      }
      const core::LeaseView v = pool_.lease->Lease(tenant);
      const TimePoint now = Now();
      if (v.status == core::LeaseStatus::kWaiting) {
        pool_.lease->Disconnect(tenant, now).IgnoreError();
        for (const PoolAsk& a : pt.asks) {
          if (!a.worker->dead) {
            a.worker->lease_out.push_back(
                {a.seq, static_cast<uint32_t>(ctl::LeaseVerdict::kTimedOut), 0});
          }
        }
        pt.asks.clear();
        pt.lease = 0;
      } else if (v.status != core::LeaseStatus::kNone) {
        pool_.lease->ReleaseExplicit(tenant, v.device, now).IgnoreError();
      }
      pt.pinned = false;
      pt.expires.reset();
      PoolEvents();
      promise->set_value(json{{"released", LeaseName(id)}}.dump());
      return;
    }
    promise->set_value(json{{"error", "no lease " + LeaseName(id)}}.dump());
  });
  if (f.wait_for(std::chrono::seconds(5)) != std::future_status::ready) {
    return R"({"error":"gmuxd did not answer"})";
  }
  return f.get();
}

std::string Scheduler::LeaseList(std::optional<TenantId> only) {
  auto promise = std::make_shared<std::promise<std::string>>();
  std::future<std::string> f = promise->get_future();
  mailbox_.Post([this, only, promise] { promise->set_value(LeaseListNow(only)); });
  if (f.wait_for(std::chrono::seconds(5)) != std::future_status::ready) {
    return R"({"error":"gmuxd did not answer"})";
  }
  return f.get();
}

std::string Scheduler::LeaseListNow(std::optional<TenantId> only) const {
  using nlohmann::json;
  json j = json::parse(PoolStatus());
  if (!only || !j.is_object()) return j.dump();
  // A tenant sees the devices' states, and only its own leases and waits.
  auto name_of = [&](TenantId t) {
    auto it = tenants_.find(t);
    return it != tenants_.end() ? it->second.name : std::to_string(t);
  };
  const std::string mine = name_of(*only);
  for (auto& d : j["devices"]) {
    if (d.value("tenant", std::string()) != mine) {
      d.erase("tenant");
      d.erase("lease");
    }
  }
  json leases = json::array(), waiting = json::array();
  for (const auto& l : j["leases"]) {
    if (l.value("tenant", std::string()) == mine) leases.push_back(l);
  }
  for (const auto& w : j["waiting"]) {
    if (w.value("tenant", std::string()) == mine) waiting.push_back(w);
  }
  j["leases"] = leases;
  j["waiting"] = waiting;
  return j.dump();
}

std::string Scheduler::PoolStatus() const {
  using nlohmann::json;
  if (!pool_.lease) return json{{"devices", json::array()}, {"leases", json::array()},
                                {"waiting", json::array()}}.dump();
  const TimePoint now = Now();
  auto name_of = [&](TenantId t) {
    auto it = tenants_.find(t);
    return it != tenants_.end() && !it->second.name.empty() ? it->second.name
                                                           : std::to_string(t);
  };
  json devs = json::array(), leases = json::array(), waiting = json::array();
  for (uint32_t i = 0; i < pool_.devices.size(); ++i) {
    const PoolDevice& pd = pool_.devices[i];
    std::string state = "free";
    if (!pd.draining.empty()) {
      state = "draining";
    } else if (pd.hook_running) {
      state = pd.holder != kNoTenant ? "attaching" : "detaching";
    } else if (pd.holder != kNoTenant) {
      auto it = pool_.tenants.find(pd.holder);
      state = it != pool_.tenants.end() && it->second.usable ? "leased" : "attaching";
    }
    json d{{"device", pd.backend},
           {"name", pd.backend < pool_.names.size() ? pool_.names[pd.backend] : ""},
           {"state", state}};
    if (pd.holder != kNoTenant) {
      d["tenant"] = name_of(pd.holder);
      auto it = pool_.tenants.find(pd.holder);
      if (it != pool_.tenants.end()) d["lease"] = LeaseName(it->second.lease);
    }
    devs.push_back(d);
  }
  double grants = 0, latency = 0, reacq = 0, reacq_s = 0, reacq_latency = 0;
  uint64_t reclaims = 0, timeouts = 0;
  for (const auto& [tenant, pt] : pool_.tenants) {
    grants += static_cast<double>(pt.grants);
    latency += pt.grant_latency_s;
    reacq += static_cast<double>(pt.reacquires);
    reacq_s += pt.reacquire_s;
    reacq_latency += pt.reacquire_latency_s;
    reclaims += pt.reclaims;
    timeouts += pt.timeouts;
    const core::LeaseView v = pool_.lease->Lease(tenant);
    if (v.status == core::LeaseStatus::kWaiting) {
      waiting.push_back(json{{"tenant", name_of(tenant)},
                             {"lease", LeaseName(pt.lease)},
                             {"kind", pt.pinned ? "explicit" : "implicit"},
                             {"waiting_s", ToSeconds(now - v.requested_at)},
                             {"sessions_waiting", pt.asks.size()}});
    } else if (v.status != core::LeaseStatus::kNone) {
      json l{{"lease", LeaseName(pt.lease)},
             {"tenant", name_of(tenant)},
             {"device", v.device < pool_.devices.size() ? pool_.devices[v.device].backend : 0},
             {"kind", pt.pinned ? "explicit" : "implicit"},
             {"state", pt.usable ? "ready" : "attaching"},
             {"held_s", pt.usable ? ToSeconds(now - v.ready_at) : 0.0}};
      if (pt.expires) l["expires_in_s"] = ToSeconds(*pt.expires - now);
      leases.push_back(l);
    }
  }
  const core::PoolMetrics m = pool_.lease->Metrics(now);
  json tenants = json::array();
  for (const auto& [tenant, st] : m.tenants) {
    auto it = pool_.tenants.find(tenant);
    if (it == pool_.tenants.end()) continue;
    const PoolTenant& pt = it->second;
    tenants.push_back(json{{"tenant", name_of(tenant)},
                           {"grants", pt.grants},
                           {"reclaimed", pt.reclaims},
                           {"timeouts", pt.timeouts},
                           {"hook_failures", pt.hook_failures},
                           {"mean_wait_s", st.MeanWaitSeconds()},
                           {"leased_s", ToSeconds(st.leased)}});
  }
  return json{{"devices", devs},
              {"leases", leases},
              {"waiting", waiting},
              {"tenants", tenants},
              {"check_period_s", pool_.options.check_period_s},
              {"idle_s", pool_.options.idle_s},
              {"wait_s", pool_.options.wait_s},
              {"grants", static_cast<uint64_t>(grants)},
              {"mean_grant_latency_s", grants > 0 ? latency / grants : 0.0},
              {"reclaims", reclaims},
              {"reacquires", static_cast<uint64_t>(reacq)},
              {"mean_reclaim_to_reacquire_s", reacq > 0 ? reacq_s / reacq : 0.0},
              {"mean_reacquire_latency_s", reacq > 0 ? reacq_latency / reacq : 0.0},
              {"timeouts", timeouts},
              {"attach_hooks", pool_.attach_hooks},
              {"attach_hook_s", pool_.attach_hook_s},
              {"detach_hooks", pool_.detach_hooks},
              {"detach_hook_s", pool_.detach_hook_s},
              {"hook_failures", pool_.hook_failures},
              {"leased_fraction", m.leased_fraction}}
      .dump();
}

}  // namespace gmux::daemon
