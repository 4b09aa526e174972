#include "daemon/scheduler.h"

#include <time.h>

#include <cassert>
#include <future>

#include <nlohmann/json.hpp>

#include "core/split_policy.h"

namespace gmux::daemon {

namespace {

uint64_t ThreadCpuNs() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

}  // namespace

Result<std::unique_ptr<Scheduler>> Scheduler::Create(
    const core::PolicySpec& spec, const std::vector<core::DeviceInfo>& devices,
    uint32_t inflight_per_device, const std::map<uint32_t, core::PolicySpec>& per_device) {
  auto s = std::unique_ptr<Scheduler>(new Scheduler());
  s->inflight_limit_ = inflight_per_device;
  s->devices_.resize(devices.size());
  for (size_t i = 0; i < devices.size(); ++i) {
    auto o = per_device.find(static_cast<uint32_t>(i));
    core::PolicySpec per = o != per_device.end() ? o->second : spec;
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

void Scheduler::AddTenant(TenantId tenant, double weight, const std::string& name) {
  mailbox_.Post([this, tenant, weight, name] {
    if (tenants_.count(tenant) != 0) return;
    TenantStats& t = tenants_[tenant];
    t.name = name;
    t.weight = weight;
    for (auto& d : devices_) d.policy->AddTenant({tenant, name, weight}, Now());
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
        TenantStats& ts = tenants_[tenant];
        ++ts.commands;
        if (c.block.kind == core::BlockKind::kKernel) ts.total_items += c.block.work_items;
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
    std::vector<Job> batch;
    while (d.inflight < inflight_limit_) {
      auto pick = d.policy->Pick(Now());
      if (!pick) break;
      auto it = d.queued.find(pick->block);
      if (it == d.queued.end()) continue;  // a dropped tenant's block
      Job job;
      job.cmd = it->second;
      job.range = pick->range;
      job.last = pick->last;
      const core::CommandBlock& b = job.cmd->block;
      job.whole = pick->last && pick->range.begin == 0 && pick->range.end == b.work_items;
      // A policy splits only splittable blocks; without run_chunk the range cannot be honoured.
      assert(job.whole || job.cmd->run_chunk);
      if (pick->last) {
        job.cmd->event->dispatched = true;
        d.queued.erase(it);
      }
      ++d.inflight;
      ++d.dispatches;
      ++dispatches_;
      auto t = tenants_.find(pick->tenant);
      if (t != tenants_.end()) {
        ++t->second.dispatches;
        ++t->second.inflight;
      }
      batch.push_back(std::move(job));
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
    auto t = tenants_.find(c.tenant);
    if (t != tenants_.end()) {
      TenantStats& ts = t->second;
      if (ts.inflight > 0) --ts.inflight;
      ts.device_time_s += ToSeconds(c.device_time);
      ts.processed_items += c.range.size();
      if (c.last) ++ts.completed;
      d.policy->Complete(c, Now());
    }
    if (c.last) outstanding_.fetch_sub(1);
  }
  Release();
  Pump();
}

std::string Scheduler::Status() {
  if (stop_.load()) return "{}";
  auto promise = std::make_shared<std::promise<std::string>>();
  std::future<std::string> f = promise->get_future();
  mailbox_.Post([this, promise] { promise->set_value(StatusNow()); });
  if (f.wait_for(std::chrono::seconds(2)) != std::future_status::ready) return "{}";
  return f.get();
}

std::string Scheduler::StatusNow() const {
  using nlohmann::json;
  json j;
  j["inflight_per_device"] = inflight_limit_;
  j["outstanding_commands"] = outstanding_.load();
  json devs = json::array();
  for (size_t i = 0; i < devices_.size(); ++i) {
    const DeviceState& d = devices_[i];
    devs.push_back(json{{"index", i},
                        {"policy", std::string(d.policy->name())},
                        {"inflight", d.inflight},
                        {"queued_commands", d.queued.size()},
                        {"dispatches", d.dispatches}});
  }
  j["devices"] = devs;
  // Kang & Yu's N: tenants with work pending or in flight.
  uint64_t active = 0;
  for (const auto& [id, t] : tenants_) {
    if (t.total_items > t.processed_items || t.commands > t.completed) ++active;
  }
  j["active_tenants"] = active;
  json ts = json::array();
  for (const auto& [id, t] : tenants_) {
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
           {"inflight", t.inflight},
           {"device_time_s", t.device_time_s}};
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
      // CPU time of this thread, so preemption on a loaded host does not count as cost.
      const uint64_t t0 = ThreadCpuNs();
      (*task)();
      busy_ns_ += ThreadCpuNs() - t0;
    } else if (mailbox_.closed()) {
      return;
    } else {
      for (auto& d : devices_) d.policy->Tick(Now());
      Pump();
    }
  }
}

}  // namespace gmux::daemon
