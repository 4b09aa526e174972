// LocalScheduler: the broker's Scheduler and one WorkerQueue per tenant in one process, joined by
// real control channels (ctl::Pair), so tests drive scheduling and split execution on the real
// backend with Commands as a worker's session builds them, across the same boundary gmuxd uses.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "daemon/control.h"
#include "daemon/scheduler.h"
#include "daemon/worker_queue.h"

namespace gmux::daemon::testing {

class LocalScheduler {
 public:
  LocalScheduler(std::unique_ptr<Scheduler> s, size_t devices)
      : s_(std::move(s)), devices_(devices) {
    s_->Start();
  }
  ~LocalScheduler() {
    for (auto& [t, q] : queues_) q->Stop();
    s_->Stop();
  }

  void AddTenant(TenantId tenant, double weight, const std::string& name = "") {
    s_->AddTenant(tenant, weight, name);
    int fds[2];
    if (!ctl::Pair(fds).ok()) return;
    auto q = std::make_unique<WorkerQueue>(fds[1], devices_, nullptr);
    q->Start();
    s_->AddWorker(next_session_++, tenant, fds[0], 0);
    worker_fds_.push_back(fds[1]);
    queues_[tenant] = std::move(q);
  }
  // Each command goes to its tenant's worker queue, in order.
  void Submit(std::vector<std::shared_ptr<Command>> cmds) {
    std::map<TenantId, std::vector<std::shared_ptr<Command>>> by;
    for (auto& c : cmds) by[c->tenant].push_back(std::move(c));
    for (auto& [t, cs] : by) queues_.at(t)->Submit(std::move(cs));
  }
  void Submit(std::shared_ptr<Command> c) { Submit(std::vector<std::shared_ptr<Command>>{c}); }
  void Rescan(std::shared_ptr<EventRecord> ev) {
    for (auto& [t, q] : queues_) q->Rescan(ev);
  }
  uint64_t Outstanding() const {
    uint64_t n = 0;
    for (const auto& [t, q] : queues_) n += q->Outstanding();
    return n;
  }
  std::string Status() { return s_->Status(); }

 private:
  std::unique_ptr<Scheduler> s_;
  size_t devices_;
  uint64_t next_session_ = 1;
  std::map<TenantId, std::unique_ptr<WorkerQueue>> queues_;
  std::vector<int> worker_fds_;
};

}  // namespace gmux::daemon::testing
