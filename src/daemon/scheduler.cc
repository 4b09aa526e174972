#include "daemon/scheduler.h"

namespace gmux::daemon {

Result<std::unique_ptr<Scheduler>> Scheduler::Create(const core::PolicySpec& spec,
                                                     const std::vector<core::DeviceInfo>& devices,
                                                     uint32_t inflight_per_device) {
  auto s = std::unique_ptr<Scheduler>(new Scheduler());
  s->inflight_limit_ = inflight_per_device;
  s->devices_.resize(devices.size());
  for (size_t i = 0; i < devices.size(); ++i) {
    core::PolicySpec per = spec;
    per.device = devices[i];
    GMUX_ASSIGN_OR_RETURN(s->devices_[i].policy, core::MakePolicy(per));
    Scheduler* self = s.get();
    s->devices_[i].executor = std::make_unique<Executor>(
        static_cast<uint32_t>(i), [self](uint32_t device, std::vector<core::Completion> done) {
          self->mailbox_.Post([self, device, d = std::move(done)] { self->OnComplete(device, d); });
        });
  }
  return s;
}

Scheduler::~Scheduler() { Stop(); }

void Scheduler::Start() {
  for (auto& d : devices_) d.executor->Start();
  thread_ = std::thread([this] { Loop(); });
}

void Scheduler::Stop() {
  if (!thread_.joinable()) return;
  // Executors first: their completions post here, and this thread must still be running to
  // take them; then the scheduler thread.
  for (auto& d : devices_) d.executor->Stop();
  stop_ = true;
  mailbox_.Close();
  thread_.join();
}

TimePoint Scheduler::Now() const {
  return TimePoint(std::chrono::duration_cast<Duration>(std::chrono::steady_clock::now() - epoch_));
}

void Scheduler::AddTenant(TenantId tenant, double weight) {
  mailbox_.Post([this, tenant, weight] {
    if (tenants_.count(tenant) != 0) return;
    tenants_[tenant] = true;
    for (auto& d : devices_) d.policy->AddTenant({tenant, "", weight}, Now());
  });
}

void Scheduler::RemoveTenant(TenantId tenant) {
  mailbox_.Post([this, tenant] {
    if (tenants_.erase(tenant) == 0) return;
    auto it = staging_.find(tenant);
    if (it != staging_.end()) {
      for (auto& c : it->second) {
        c->event->staged = false;
        c->event->Complete(CL_INVALID_OPERATION);
        outstanding_.fetch_sub(1);
      }
      staging_.erase(it);
    }
    for (auto& d : devices_) {
      d.policy->RemoveTenant(tenant, Now());
      for (auto q = d.queued.begin(); q != d.queued.end();) {
        if (q->second->tenant == tenant) {
          q->second->event->Complete(CL_INVALID_OPERATION);
          outstanding_.fetch_sub(1);
          q = d.queued.erase(q);
        } else {
          ++q;
        }
      }
    }
    Pump();
  });
}

void Scheduler::Submit(std::shared_ptr<Command> cmd) {
  std::vector<std::shared_ptr<Command>> one;
  one.push_back(std::move(cmd));
  Submit(std::move(one));
}

void Scheduler::Submit(std::vector<std::shared_ptr<Command>> cmds) {
  if (cmds.empty()) return;
  outstanding_.fetch_add(cmds.size());
  mailbox_.Post([this, cs = std::move(cmds)]() mutable {
    for (auto& c : cs) Accept(std::move(c));
    Release();
    Pump();
  });
}

void Scheduler::Accept(std::shared_ptr<Command> c) {
  if (tenants_.count(c->tenant) == 0 || c->device >= devices_.size()) {
    c->event->Complete(CL_INVALID_OPERATION);
    if (c->finished) c->finished(CL_INVALID_OPERATION);
    outstanding_.fetch_sub(1);
    return;
  }
  c->event->staged = true;
  staging_[c->tenant].push_back(std::move(c));
}

void Scheduler::Rescan() {
  mailbox_.Post([this] {
    Release();
    Pump();
  });
}

bool Scheduler::Blocked(const Command& c) const {
  auto blocks = [&](const std::shared_ptr<EventRecord>& d) {
    if (d->user()) return d->status() == CL_SUBMITTED;  // not set yet
    if (d->staged) return true;
    if (d->device() != c.device && !d->dispatched && !d->done()) return true;
    return false;
  };
  for (const auto& d : c.deps) {
    if (blocks(d)) return true;
  }
  for (const auto& d : c.order_deps) {
    if (blocks(d)) return true;
  }
  return false;
}

void Scheduler::Release() {
  // Repeat until nothing moves: releasing one tenant's command can unblock another's.
  bool moved = true;
  while (moved) {
    moved = false;
    for (auto& [tenant, list] : staging_) {
      for (auto it = list.begin(); it != list.end();) {
        Command& c = **it;
        if (Blocked(c)) {
          ++it;
          continue;
        }
        c.event->staged = false;
        c.block.id = next_block_++;
        c.block.tenant = tenant;
        c.block.arrival = Now();
        DeviceState& d = devices_[c.device];
        d.queued[c.block.id] = *it;
        d.policy->Submit(c.block, Now());
        it = list.erase(it);
        moved = true;
      }
    }
  }
}

void Scheduler::Pump() {
  bool dispatched_any = false;
  for (auto& d : devices_) {
    std::vector<std::shared_ptr<Command>> batch;
    while (d.inflight < inflight_limit_) {
      auto pick = d.policy->Pick(Now());
      if (!pick) break;
      auto it = d.queued.find(pick->block);
      if (it == d.queued.end()) continue;  // a dropped tenant's block
      std::shared_ptr<Command> c = std::move(it->second);
      d.queued.erase(it);
      c->event->dispatched = true;
      ++d.inflight;
      batch.push_back(std::move(c));
      dispatched_any = true;
    }
    if (!batch.empty()) d.executor->Run(std::move(batch));
  }
  // A dispatch can unblock another device's staged command.
  if (dispatched_any && devices_.size() > 1) Release();
}

void Scheduler::OnComplete(uint32_t device, const std::vector<core::Completion>& done) {
  DeviceState& d = devices_[device];
  for (const auto& c : done) {
    if (d.inflight > 0) --d.inflight;
    if (tenants_.count(c.tenant) != 0) d.policy->Complete(c, Now());
    outstanding_.fetch_sub(1);
  }
  Release();
  Pump();
}

void Scheduler::Loop() {
  for (;;) {
    std::optional<std::chrono::steady_clock::time_point> deadline;
    for (auto& d : devices_) {
      if (auto t = d.policy->NextTimer()) {
        auto at = epoch_ + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                               t->time_since_epoch());
        if (!deadline || at < *deadline) deadline = at;
      }
    }
    auto task = mailbox_.Take(deadline);
    if (task) {
      (*task)();
    } else if (mailbox_.closed()) {
      return;
    } else {
      for (auto& d : devices_) d.policy->Tick(Now());
      Pump();
    }
  }
}

}  // namespace gmux::daemon
