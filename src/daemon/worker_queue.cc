#include "daemon/worker_queue.h"

#include "common/cpu_apart.h"

#include "proto/shm_ring.h"

#include <poll.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <future>

namespace gmux::daemon {

namespace {

// The longest an express start or completion goes unreported (the broker's watchdog and
// `gmux status` see a command in flight from its report on, and account it at its Done).
constexpr std::chrono::milliseconds kExpressReportDelay{2};

// The queue whose work this thread runs now (RunOrPost), and whether the thread is a backend's
// completion callback, which may not make blocking OpenCL calls (the specification leaves them
// undefined there): restoring evicted allocations and evicting wait for the loop thread.
thread_local WorkerQueue* t_running = nullptr;
thread_local bool t_device_callback = false;

}  // namespace

WorkerQueue::WorkerQueue(int ctl_fd, size_t devices, std::function<void()> on_broker_gone)
    : ctl_fd_(ctl_fd), on_broker_gone_(std::move(on_broker_gone)) {
  mailbox_.EnableWakeFd();
  slots_.resize(devices);
  waiting_.resize(devices);
  running_.resize(devices);
  express_jobs_.resize(devices);
  backlog_.resize(devices);
  for (size_t i = 0; i < devices; ++i) {
    executors_.push_back(std::make_unique<Executor>(
        static_cast<uint32_t>(i),
        [this](Mailbox::Task t) { RunOrPost(std::move(t), /*device_callback=*/true); },
        [this](uint32_t device, const std::vector<core::Completion>& done) {
          OnComplete(device, done);
        }));
  }
}

WorkerQueue::~WorkerQueue() { Stop(); }

void WorkerQueue::Start() { thread_ = std::thread([this] { Loop(); }); }

void WorkerQueue::Stop(std::chrono::milliseconds timeout) {
  if (!thread_.joinable()) return;
  // Executors must not be destroyed with backend callbacks outstanding.
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    auto idle = std::make_shared<std::promise<bool>>();
    auto f = idle->get_future();
    mailbox_.Post([this, idle] {
      bool all = true;
      for (const auto& e : executors_) all = all && e->Idle();
      idle->set_value(all);
    });
    if (f.wait_for(std::chrono::seconds(1)) == std::future_status::ready && f.get()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  stop_ = true;
  mailbox_.Post([] {});
  thread_.join();
  // A thread that ran the queue's work when stop_ was set leaves before the queue goes.
  while (inline_runners_.load() != 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  // Callbacks still outstanding after the wait above timed out are dropped when they fire,
  // instead of posting to this queue once it is gone.
  for (auto& e : executors_) e->Close();
}

void WorkerQueue::ReportBeforeExit() {
  std::lock_guard<std::mutex> lock(own_mu_);
  if (broker_gone_) return;
  SendReports(/*with_express=*/true);
  ReturnKeptCharge(/*now=*/true);  // the tenant's memory books end exact
}

void WorkerQueue::RunOrPost(Mailbox::Task t, bool device_callback) {
  inline_runners_.fetch_add(1);
  if (stop_.load() || t_running == this) {
    // Called from within this queue's own work (a callback the backend ran at once): whoever
    // runs the queue sees it before letting go. Or stopping: queued for the loop, which runs it
    // if it has not finished its last round; after that the task is dropped unrun with the
    // mailbox (Stop() first waited, up to its timeout, for every executor to be idle).
    if (t_running == this) {
      mailbox_.PostQuiet(std::move(t));
    } else {
      mailbox_.Post(std::move(t));
    }
    inline_runners_.fetch_sub(1);
    return;
  }
  mailbox_.PostQuiet(std::move(t));
  // Whoever holds own_mu_ runs everything queued before letting go, and looks at the queue
  // again after letting go: a task queued while it held the lock is never left behind.
  while (own_mu_.try_lock()) {
    t_running = this;
    t_device_callback = device_callback;
    for (auto& task : mailbox_.TryTakeAll()) task();
    FlushReady();
    // The loop thread's timers: express reports due, evictions, work left for it.
    const bool wake = loop_needed_ || (!loop_timed_ && (!express_unreported_.empty() ||
                                                         !express_done_.empty() ||
                                                         !evict_pending_.empty()));
    loop_needed_ = false;
    t_device_callback = false;
    t_running = nullptr;
    own_mu_.unlock();
    if (wake) mailbox_.Wake();
    if (mailbox_.Empty()) break;
  }
  inline_runners_.fetch_sub(1);
  // A backend's thread that runs beside the spinning client delays it (common/cpu_apart.h).
  if (device_callback) CpuApart::CheckThisThread();
}

void WorkerQueue::Submit(std::vector<std::shared_ptr<Command>> cmds) {
  if (cmds.empty()) return;
  outstanding_.fetch_add(cmds.size());
  // Started on the calling (session) thread when the loop is free: no wake-up of the loop.
  RunOrPost(
      [this, cs = std::move(cmds)]() mutable {
        for (auto& c : cs) Accept(std::move(c));
      },
      /*device_callback=*/false);
}

bool WorkerQueue::WaitUntil(const std::function<bool()>& room) {
  room_waiters_.fetch_add(1);
  bool ok = true;
  {
    std::unique_lock<std::mutex> lock(room_mu_);
    while (!room()) {
      if (stop_) {
        ok = false;
        break;
      }
      if (parked_count_.load() >= outstanding_.load()) {
        // Everything looks held (or nothing is outstanding). The loop decides, after what was
        // posted before (a user event set just now, commands not accepted yet, a completion
        // whose command frees its buffers after it was counted): held commands wait for an
        // event that only a running command or the client could set, and the client waits
        // for us.
        lock.unlock();
        auto stuck = std::make_shared<std::promise<bool>>();
        auto f = stuck->get_future();
        mailbox_.Post([this, stuck] {
          stuck->set_value(parked_count_.load() >= outstanding_.load());
        });
        const bool held = f.wait_for(std::chrono::seconds(5)) != std::future_status::ready ||
                          f.get();
        lock.lock();
        if (held && !room()) {
          ok = false;
          break;
        }
        continue;
      }
      room_cv_.wait_for(lock, std::chrono::milliseconds(2));
    }
  }
  room_waiters_.fetch_sub(1);
  return ok;
}

void WorkerQueue::Rescan(std::shared_ptr<EventRecord> ev) {
  RunOrPost([this, ev = std::move(ev)] { Notify(ev.get()); }, /*device_callback=*/false);
}

std::string WorkerQueue::Status() {
  const uint64_t seq = next_stats_++;
  ctl::StatsQuery q{seq};
  if (!ctl::Send(ctl_fd_, ctl::Type::kStatsQuery, &q, sizeof(q), 1).ok()) return "{}";
  std::unique_lock<std::mutex> lock(stats_mu_);
  if (!stats_cv_.wait_for(lock, std::chrono::seconds(2), [&] { return stats_.count(seq) != 0; })) {
    return "{}";
  }
  std::string out = std::move(stats_[seq]);
  stats_.erase(seq);
  return out;
}

CommandSink::MemoryAnswer WorkerQueue::ReserveMemory(uint32_t device, uint64_t bytes) {
  MemoryAnswer out;
  std::unique_lock<std::mutex> lock(mem_mu_);
  // What the session released a moment ago is still charged to it: taken first. Asking only for
  // the rest gets the broker's verdict on the same sum (live + kept + rest = live + bytes).
  uint64_t from_kept = 0;
  if (device < kept_charge_.size()) {
    from_kept = std::min(bytes, kept_charge_[device]);
    kept_charge_[device] -= from_kept;
  }
  if (from_kept == bytes) return out;
  const uint64_t seq = next_mem_++;
  mem_waiting_.insert(seq);
  ctl::MemReserve r{seq, bytes - from_kept, device, 0};
  out.granted = false;
  bool answered = false;
  if (ctl::Send(ctl_fd_, ctl::Type::kMemReserve, &r, sizeof(r), 1).ok()) {
    answered = mem_cv_.wait_for(lock, std::chrono::seconds(5),
                                [&] { return mem_answers_.count(seq) != 0; });
  }
  mem_waiting_.erase(seq);
  if (!answered) {
    // No broker, or no answer in time: refused (a late grant is given back by OnControl).
    if (from_kept != 0) kept_charge_[device] += from_kept;
    return out;
  }
  ctl::MemAnswer a = mem_answers_[seq];
  mem_answers_.erase(seq);
  out.granted = a.verdict == static_cast<uint32_t>(ctl::MemVerdict::kGranted);
  out.over_quota = a.verdict == static_cast<uint32_t>(ctl::MemVerdict::kQuota);
  // The tenant's use as the application sees it: what was kept is not in use.
  out.used = a.used - std::min(a.used, from_kept);
  out.limit = a.limit;
  if (!out.granted && from_kept != 0) kept_charge_[device] += from_kept;  // still charged
  return out;
}

void WorkerQueue::SendFreeLocked(uint32_t device, uint64_t bytes) {
  if (bytes == 0) return;
  ctl::MemFree f{bytes, device, 0};
  ctl::Send(ctl_fd_, ctl::Type::kMemFree, &f, sizeof(f), 1).IgnoreError();
}

void WorkerQueue::ReleaseMemory(uint32_t device, uint64_t bytes) {
  if (bytes == 0) return;
  bool arm = false;
  {
    std::lock_guard<std::mutex> lock(mem_mu_);
    if (kept_charge_.size() <= device) kept_charge_.resize(device + 1);
    uint64_t& kept = kept_charge_[device];
    kept += bytes;
    if (kept > kKeptChargeMax) {
      SendFreeLocked(device, kept - kKeptChargeMax);
      kept = kKeptChargeMax;
    }
    kept_since_ = std::chrono::steady_clock::now();
    arm = !kept_armed_;
    kept_armed_ = true;
  }
  if (arm) mailbox_.Wake();  // the loop sets its timer
}

int WorkerQueue::ReturnKeptCharge(bool now) {
  std::lock_guard<std::mutex> lock(mem_mu_);
  if (!kept_armed_) return -1;
  if (!now) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          kept_since_ + kept_idle_ - std::chrono::steady_clock::now())
                          .count();
    if (left > 0) return static_cast<int>(left);
  }
  for (size_t d = 0; d < kept_charge_.size(); ++d) {
    SendFreeLocked(static_cast<uint32_t>(d), kept_charge_[d]);
    kept_charge_[d] = 0;
  }
  kept_armed_ = false;
  return -1;
}

void WorkerQueue::Loop() {
  const int wake = mailbox_.EnableWakeFd();
  while (!stop_) {
    pollfd fds[2] = {{wake, POLLIN, 0}, {ctl_fd_, POLLIN, 0}};
    int timeout_ms = -1;
    // The loop wakes within `ms` at the latest (each timer below may bring it sooner).
    auto within = [&timeout_ms](int ms) {
      timeout_ms = timeout_ms < 0 ? ms : std::min(timeout_ms, ms);
    };
    {
      std::lock_guard<std::mutex> lock(own_mu_);
      // Express starts not yet reported go out by kExpressReportDelay at the latest.
      if (!express_unreported_.empty() || !express_done_.empty()) {
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                        express_oldest_ + kExpressReportDelay - std::chrono::steady_clock::now())
                        .count();
        within(static_cast<int>(std::clamp<int64_t>(left + 1, 0, 1000)));
      }
      if (!evict_pending_.empty()) within(1);
      if (const int kept_ms = ReturnKeptCharge(/*now=*/false); kept_ms >= 0) within(kept_ms + 1);
      loop_timed_ = timeout_ms >= 0;
    }
    // Tasks queued without a wake-up while a thread ran the queue's work (RunOrPost), this
    // thread included: looked at after letting go, as every holder does.
    if (!mailbox_.Empty()) timeout_ms = 0;
    int n = ::poll(fds, broker_gone_ ? 1 : 2, timeout_ms);
    if (n < 0) continue;
    std::lock_guard<std::mutex> lock(own_mu_);
    t_running = this;
    if (!broker_gone_ && (fds[1].revents & (POLLIN | POLLHUP | POLLERR)) != 0) {
      ReadControl();  // everything the broker sent so far, then the local work it caused
    }
    for (auto& t : mailbox_.TryTakeAll()) t();
    FlushReady();
    if (!evict_pending_.empty()) EvictWhenIdle();
    loop_needed_ = false;
    t_running = nullptr;
  }
}

void WorkerQueue::ReadControl() {
  // (A session thread that read the release first leaves the loop nothing: EAGAIN.)
  for (int i = 0; !broker_gone_ && i < 256; ++i) {
    auto m = ctl::Receive(ctl_fd_, /*dont_wait=*/true);
    if (!m.ok()) {
      if (m.status().code() != StatusCode::kResourceExhausted) {
        broker_gone_ = true;
        if (on_broker_gone_) on_broker_gone_();
      }
      break;
    }
    OnControl(*m);
    if (m->fd >= 0) ::close(m->fd);
  }
}

void WorkerQueue::SetReleaseSpin(std::chrono::microseconds budget) {
  release_spin_ = std::make_unique<proto::SpinWait>(proto::SpinWait::ForThisThread(budget));
}

bool WorkerQueue::DeviceRunning() const {
  for (const auto& e : executors_) {
    if (e->Running()) return true;
  }
  return false;
}

void WorkerQueue::AwaitRelease(int client_fd, proto::ShmRing* client_ring) {
  if (!release_spin_ || !release_awaited_.load() || broker_gone_.load()) return;
  pollfd fds[2] = {{ctl_fd_, POLLIN, 0}, {client_fd, POLLIN, 0}};
  // gmuxd's broker, woken by what was just sent, makes the release: the spin yields at every
  // look, in case the broker's thread waits for this CPU (proto/spin_wait.h).
  const bool any = release_spin_->WaitFor(
      [&] {
        if (client_ring != nullptr && client_ring->Readable()) return true;
        return ::poll(fds, 2, 0) > 0;
      },
      [] { return true; });
  if (!any) {
    // Not within the budget: the loop thread reads it. Counted as a slow wait, so releases
    // that keep coming late (a busy device, another tenant's turn) stop the spinning.
    release_spin_->Record(release_spin_->budget() + std::chrono::microseconds(1));
    return;
  }
  if ((fds[0].revents & POLLIN) == 0) return;  // the client's next request comes first
  release_spin_->Arrived();
  // In order with the loop thread's reads: both read only while running the queue.
  RunOrPost([this] { ReadControl(); }, /*device_callback=*/false);
}

void WorkerQueue::OnControl(const ctl::Message& m) {
  switch (m.type) {
    case ctl::Type::kRelease: {
      release_awaited_.store(false);
      std::vector<std::vector<Job>> per_device(executors_.size());
      std::vector<EventRecord*> dispatched;
      for (const ctl::Release& r : m.As<ctl::Release>()) {
        auto it = ready_.find(r.cmd);
        if (it == ready_.end()) continue;  // never ours (the broker checks what it releases)
        std::shared_ptr<Command> c = it->second;
        if (c->device >= executors_.size()) continue;
        Job job;
        job.cmd = c;
        job.range = {r.begin, r.end};
        job.last = r.last != 0;
        job.whole = r.whole != 0;
        // Only a splittable launch can honour a range; anything else runs whole.
        if (!job.whole && !c->run_chunk) {
          if (!job.last) continue;
          job.whole = true;
        }
        if (job.last) {
          c->event->dispatched = true;
          dispatched.push_back(c->event.get());
          ready_.erase(it);
          --waiting_[c->device];
          ++running_[c->device];
        }
        per_device[c->device].push_back(std::move(job));
      }
      for (size_t d = 0; d < per_device.size(); ++d) {
        if (!per_device[d].empty()) RunJobs(static_cast<uint32_t>(d), per_device[d]);
        DrainBacklog(static_cast<uint32_t>(d));  // the last release may let the backlog go
      }
      // Commands of other devices that waited for these to be dispatched.
      for (EventRecord* e : dispatched) Notify(e);
      break;
    }
    case ctl::Type::kExpress:
      for (const ctl::Express& e : m.As<ctl::Express>()) OnExpress(e);
      break;
    case ctl::Type::kEvict:
      // The broker sizes the device's layout by the tenant's memory: only what is in use.
      ReturnKeptCharge(/*now=*/true);
      for (const ctl::Evict& e : m.As<ctl::Evict>()) evict_pending_.push_back(e);
      EvictWhenIdle();
      break;
    case ctl::Type::kLeaseAnswer:
      for (const ctl::LeaseAnswer& a : m.As<ctl::LeaseAnswer>()) OnLeaseAnswer(a);
      break;
    case ctl::Type::kLeaseLost:
      ReturnKeptCharge(/*now=*/true);
      for (const ctl::LeaseLost& l : m.As<ctl::LeaseLost>()) {
        // The lease ended: nothing new goes to the device; the session's data moves off it once
        // what runs there is done, answered like an eviction.
        if (pool_device_.load() == l.device) pool_device_.store(kNoDevice);
        evict_pending_.push_back(ctl::Evict{l.device, kLeaseLostMark, l.epoch});
      }
      // Express work not yet reported goes first: once the answer is in, the device is the next
      // holder's, and a report of this session's work there would be a protocol violation.
      FlushReady(/*force_report=*/true);
      EvictWhenIdle();
      break;
    case ctl::Type::kLimits: {
      auto l = m.As<ctl::Limits>();
      if (l.size() == 1 && on_limits_) on_limits_(l[0]);
      break;
    }
    case ctl::Type::kMemAnswer: {
      for (const ctl::MemAnswer& a : m.As<ctl::MemAnswer>()) {
        std::lock_guard<std::mutex> lock(mem_mu_);
        if (mem_waiting_.count(a.seq) != 0) {
          mem_answers_[a.seq] = a;
        } else if (a.verdict == static_cast<uint32_t>(ctl::MemVerdict::kGranted)) {
          // Granted after its caller gave up: not ours to keep.
          SendFreeLocked(a.device, a.bytes);
        }
      }
      mem_cv_.notify_all();
      break;
    }
    case ctl::Type::kStatsReply: {
      if (m.body.size() < sizeof(uint64_t)) break;
      uint64_t seq;
      std::memcpy(&seq, m.body.data(), sizeof(seq));
      {
        std::lock_guard<std::mutex> lock(stats_mu_);
        stats_[seq].assign(m.body.begin() + sizeof(seq), m.body.end());
      }
      stats_cv_.notify_all();
      break;
    }
    default:
      break;  // nothing else is meant for a running session
  }
}

void WorkerQueue::Accept(std::shared_ptr<Command> c) {
  c->block.id = next_cmd_++;
  c->event->staged = true;
  TryRelease(c);
}

ctl::Ready WorkerQueue::ReadyOf(const Command& c) {
  ctl::Ready r;
  r.cmd = c.block.id;
  r.work_items = c.block.work_items;
  r.work_groups = c.block.work_groups;
  r.bytes = c.block.bytes;
  r.device = c.device;
  r.kind = static_cast<uint8_t>(c.block.kind);
  r.splittable = static_cast<uint8_t>(c.block.splittable);
  return r;
}

void WorkerQueue::ToScheduler(const std::shared_ptr<Command>& c) {
  ready_[c->block.id] = c;
  ++waiting_[c->device];
  ready_out_.push_back(ReadyOf(*c));
}

void WorkerQueue::StartExpress(const std::shared_ptr<Command>& c) {
  // Started whole; the broker accounts it when the express Ready arrives (before its Done),
  // its wall time counted from `started_ns`.
  ctl::Ready r = ReadyOf(*c);
  r.express = 1;
  const auto now = std::chrono::steady_clock::now();
  r.started_ns = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(now.time_since_epoch()).count());
  if (express_unreported_.empty() && express_done_.empty()) express_oldest_ = now;
  express_unreported_.push_back(r);
  express_running_.insert(c->block.id);
  Job job;
  job.cmd = c;
  job.range = {0, c->block.work_items};
  c->event->dispatched = true;
  ++running_[c->device];
  express_jobs_[c->device].push_back(std::move(job));
}

void WorkerQueue::DrainBacklog(uint32_t dev) {
  // In batches: refilled once half the slots are free, so the executor gets many commands per
  // flush and completion callback instead of one per finished command.
  if (running_[dev] > slots_[dev] / 2) return;
  while (!backlog_[dev].empty() && slots_[dev] > 0 && waiting_[dev] == 0 &&
         running_[dev] < slots_[dev]) {
    std::shared_ptr<Command> c = std::move(backlog_[dev].front());
    backlog_[dev].pop_front();
    StartExpress(c);
    Notify(c->event.get());  // commands of other devices that waited for it to be dispatched
  }
}

const EventRecord* WorkerQueue::Blocker(const Command& c) const {
  auto blocks = [&](const std::shared_ptr<EventRecord>& d) {
    if (d->user()) return d->status() == CL_SUBMITTED;  // not set yet
    if (d->staged) return true;
    if (d->device() != c.device && !d->dispatched && !d->done()) return true;
    return false;
  };
  for (const auto& d : c.deps) {
    if (blocks(d)) return d.get();
  }
  for (const auto& d : c.order_deps) {
    if (blocks(d)) return d.get();
  }
  for (const auto& d : c.after) {
    if (blocks(d)) return d.get();
  }
  return nullptr;
}

void WorkerQueue::TryRelease(const std::shared_ptr<Command>& first) {
  // Iterative: releasing one command can release a long chain held behind it. The usual case,
  // nothing held behind it, allocates nothing (a deque here cost two allocations per command).
  std::vector<std::shared_ptr<Command>> work;
  std::shared_ptr<Command> next = first;
  for (size_t taken = 0;;) {
    std::shared_ptr<Command> c;
    if (next) {
      c = std::move(next);
    } else if (taken < work.size()) {
      c = std::move(work[taken++]);
    } else {
      break;
    }
    if (const EventRecord* b = Blocker(*c)) {
      parked_[const_cast<EventRecord*>(b)].push_back(std::move(c));
      parked_count_.fetch_add(1);
      continue;
    }
    if (OnPool(c->device)) {
      // The pool's device is the one the tenant's lease lends now; without one, the command
      // waits for the lease (asked for again: the pool may lend another device of the kind).
      const uint32_t lent = pool_device_.load();
      if (lent == kNoDevice) {
        lease_wait_.push_back(std::move(c));
        AskLease();
        continue;  // not dispatched yet: what waits on it stays parked
      }
      c->device = lent;
    }
    c->event->staged = false;
    const uint32_t dev = c->device;
    if (dev < slots_.size() && slots_[dev] > 0) {
      if (waiting_[dev] == 0 && running_[dev] < slots_[dev] && backlog_[dev].empty()) {
        StartExpress(c);
      } else {
        // Started once the commands before it were released and a slot is free.
        backlog_[dev].push_back(c);
        continue;  // not dispatched yet: what waits on it stays parked
      }
    } else {
      ToScheduler(c);
    }
    auto it = parked_.find(c->event.get());
    if (it != parked_.end()) {
      parked_count_.fetch_sub(it->second.size());
      for (auto& w : it->second) work.push_back(std::move(w));
      parked_.erase(it);
    }
  }
}

void WorkerQueue::Notify(EventRecord* ev) {
  auto it = parked_.find(ev);
  if (it == parked_.end()) return;
  std::vector<std::shared_ptr<Command>> waiting = std::move(it->second);
  parked_.erase(it);
  parked_count_.fetch_sub(waiting.size());
  for (auto& c : waiting) TryRelease(c);
}

void WorkerQueue::OnComplete(uint32_t device, const std::vector<core::Completion>& done) {
  std::vector<ctl::Done>& out = done_out_;
  bool freed = false;
  for (const auto& c : done) {
    ctl::Done d;
    d.cmd = c.block;
    d.begin = c.range.begin;
    d.end = c.range.end;
    d.device_ns = static_cast<uint64_t>(std::max<int64_t>(0, c.device_time.count()));
    d.last = c.last ? 1 : 0;
    // An express command's completion waits for the next report while the grant holds: no other
    // tenant's dispatch depends on it, and the broker is not woken once per command.
    if (c.last && express_running_.erase(c.block) != 0 && device < slots_.size() &&
        slots_[device] > 0) {
      if (express_unreported_.empty() && express_done_.empty()) {
        express_oldest_ = std::chrono::steady_clock::now();
      }
      express_done_.push_back(d);
    } else {
      out.push_back(d);
    }
    if (c.last) {
      outstanding_.fetch_sub(1);
      freed = true;
      if (device < running_.size() && running_[device] > 0) --running_[device];
    }
  }
  if (freed && room_waiters_.load() != 0) {
    std::lock_guard<std::mutex> lock(room_mu_);
    room_cv_.notify_all();
  }
  if (device < backlog_.size()) DrainBacklog(device);
  if (residency_) residency_->CollectIfPending();
  if (!evict_pending_.empty()) {
    if (t_device_callback) {
      loop_needed_ = true;  // evicting reads the allocations back with blocking calls
    } else {
      EvictWhenIdle();
    }
  }
  // Reported when the loop has finished this round, after the executor has delivered the
  // results to the client: the broker's accounting is not on the client's critical path.
}

void WorkerQueue::OnExpress(const ctl::Express& e) {
  if (e.device >= slots_.size()) return;
  slots_[e.device] = e.slots;
  if (e.slots > 0) return;
  // Revoked: whatever express already let through starts and is reported before the answer, so
  // the broker has every express record of this grant when it reads kExpressEnd; the backlog
  // goes to the scheduler as ordinary Ready records, in order.
  std::deque<std::shared_ptr<Command>> backlog = std::move(backlog_[e.device]);
  backlog_[e.device].clear();
  for (auto& c : backlog) ToScheduler(c);
  for (auto& c : backlog) Notify(c->event.get());  // what waited for them to be handed over
  FlushReady(/*force_report=*/true);
  ctl::ExpressEnd end;
  end.device = e.device;
  end.epoch = e.epoch;
  if (!broker_gone_) ctl::Send(ctl_fd_, ctl::Type::kExpressEnd, &end, sizeof(end), 1).IgnoreError();
}

void WorkerQueue::FlushReady(bool force_report) {
  // The device first: it need not wait for the report. Starting can finish commands at once
  // (a closed session's), which starts more from the backlog: until nothing is left to start.
  for (bool more = true; more;) {
    more = false;
    for (size_t d = 0; d < express_jobs_.size(); ++d) {
      if (express_jobs_[d].empty()) continue;
      if (t_device_callback && residency_ && residency_->Evicted(static_cast<uint32_t>(d))) {
        loop_needed_ = true;  // restoring writes the allocations back with blocking calls
        continue;
      }
      // Run from a spare vector (starting may queue more express jobs), swapped back when
      // nothing was queued meanwhile, so the vectors keep their capacity from batch to batch.
      std::vector<Job> jobs;
      jobs.swap(spare_jobs_);
      jobs.swap(express_jobs_[d]);
      RunJobs(static_cast<uint32_t>(d), jobs);
      if (express_jobs_[d].empty()) express_jobs_[d].swap(jobs);
      spare_jobs_.swap(jobs);
      more = true;
    }
  }
  if (broker_gone_) {
    ready_out_.clear();
    done_out_.clear();
    express_unreported_.clear();
    express_done_.clear();
    express_running_.clear();
    return;
  }
  // Express starts and completions are reported in batches: with the next report that cannot
  // wait (an ordinary Ready or Done), after kExpressReportDelay, or at a revoke. The Readys of a
  // report go before its Dones, so the broker never hears of a command's end before its start.
  SendReports((!express_unreported_.empty() || !express_done_.empty()) &&
              (!ready_out_.empty() || !done_out_.empty() || force_report ||
               std::chrono::steady_clock::now() - express_oldest_ >= kExpressReportDelay));
}

void WorkerQueue::SendReports(bool with_express) {
  if (with_express) {
    ready_out_.insert(ready_out_.begin(), express_unreported_.begin(), express_unreported_.end());
    express_unreported_.clear();
    done_out_.insert(done_out_.begin(), express_done_.begin(), express_done_.end());
    express_done_.clear();
  }
  if (std::any_of(ready_out_.begin(), ready_out_.end(),
                  [](const ctl::Ready& r) { return r.express == 0; })) {
    release_awaited_.store(true);
  }
  if (!ready_out_.empty()) ctl::SendRecords(ctl_fd_, ctl::Type::kReady, ready_out_).IgnoreError();
  ready_out_.clear();
  if (!done_out_.empty()) ctl::SendRecords(ctl_fd_, ctl::Type::kDone, done_out_).IgnoreError();
  done_out_.clear();
}

namespace {
// The broker's record of one Evict() (out, answering `epoch`) or Restore() (in, epoch 0).
ctl::Swapped SwappedOf(uint32_t device, bool out, uint64_t epoch, const Residency::Moved& m) {
  ctl::Swapped s;
  s.epoch = epoch;
  s.device = device;
  s.out = out ? 1 : 0;
  s.ok = m.error == CL_SUCCESS ? 1 : 0;
  s.objects = m.objects;
  s.bytes = m.bytes;
  s.ns = static_cast<uint64_t>(m.time.count());
  return s;
}
}  // namespace

void WorkerQueue::AttachResidency(std::shared_ptr<Residency> residency) {
  // On-demand restores happen on the session thread, under the residency lock: told to the
  // broker from there (one datagram per send, so it does not interleave with the loop's).
  residency->SetOnDemand([this](uint32_t device, const Residency::Moved& m) {
    if (broker_gone_) return;
    ctl::Swapped s = SwappedOf(device, false, 0, m);
    s.on_demand = 1;
    ctl::Send(ctl_fd_, ctl::Type::kSwapped, &s, sizeof(s), 1).IgnoreError();
  });
  mailbox_.Post([this, r = std::move(residency)]() mutable { residency_ = std::move(r); });
}

void WorkerQueue::RunJobs(uint32_t device, std::vector<Job>& jobs) {
  if (residency_ && residency_->Evicted(device)) {
    Residency::Moved m = residency_->Restore(device);
    if (!broker_gone_ && m.objects != 0) {
      ctl::Swapped s = SwappedOf(device, false, 0, m);
      ctl::Send(ctl_fd_, ctl::Type::kSwapped, &s, sizeof(s), 1).IgnoreError();
    }
  }
  executors_[device]->Run(jobs);
}

void WorkerQueue::EvictWhenIdle() {
  // Nothing of the session may be on any device: an allocation can belong to several, and a
  // running command holds the handles it was started with.
  for (size_t d = 0; d < executors_.size(); ++d) {
    if (!executors_[d]->Idle() || running_[d] != 0 || !express_jobs_[d].empty()) return;
  }
  // A device given back (the pool) is answered only once nothing reported there waits for a
  // release either: the answer hands the device to its next holder, and the work the broker
  // still holds of this session must run before that.
  for (const ctl::Evict& e : evict_pending_) {
    if (e.reserved == kLeaseLostMark && e.device < waiting_.size() &&
        (waiting_[e.device] != 0 || !backlog_[e.device].empty())) {
      return;
    }
  }
  std::vector<ctl::Evict> asks = std::move(evict_pending_);
  evict_pending_.clear();
  for (const ctl::Evict& e : asks) {
    Residency::Moved m;
    if (residency_ && e.device < executors_.size()) m = residency_->Evict(e.device);
    ctl::Swapped s = SwappedOf(e.device, true, e.epoch, m);
    if (!broker_gone_) ctl::Send(ctl_fd_, ctl::Type::kSwapped, &s, sizeof(s), 1).IgnoreError();
  }
}

void WorkerQueue::SetPool(uint64_t mask, const cl_icd_dispatch* cl,
                          std::vector<cl_device_id> devices) {
  pool_mask_ = mask;
  cl_ = cl;
  devices_ = std::move(devices);
}

CommandSink::LeaseAnswer WorkerQueue::AcquireLease(uint32_t fallback, int client_fd) {
  LeaseAnswer out;
  const uint32_t lent = pool_device_.load();
  if (lent != kNoDevice) {
    out.device = lent;
    return out;
  }
  const uint64_t seq = next_lease_++;
  std::unique_lock<std::mutex> lock(pool_mu_);
  lease_waiting_.insert(seq);
  ctl::LeaseAsk ask{seq};
  bool answered = false;
  if (!broker_gone_ && ctl::Send(ctl_fd_, ctl::Type::kLeaseAsk, &ask, sizeof(ask), 1).ok()) {
    // The broker always answers: a grant, or a refusal once [pool] wait_s has passed.
    while (!(answered = lease_answers_.count(seq) != 0) && !broker_gone_) {
      lease_cv_.wait_for(lock, std::chrono::milliseconds(100));
      // A client that went away while it waited: its session ends, and with it the wait.
      pollfd p{client_fd, POLLRDHUP, 0};
      if (client_fd >= 0 && ::poll(&p, 1, 0) > 0 &&
          (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0) {
        break;
      }
    }
  }
  lease_waiting_.erase(seq);
  out.granted = false;
  out.device = fallback;
  if (!answered) {
    out.why = "no answer from gmuxd";
    return out;
  }
  const ctl::LeaseAnswer a = lease_answers_[seq];
  lease_answers_.erase(seq);
  switch (static_cast<ctl::LeaseVerdict>(a.verdict)) {
    case ctl::LeaseVerdict::kGranted:
      out.granted = true;
      out.device = a.device;
      break;
    case ctl::LeaseVerdict::kTimedOut:
      out.why = "every pool device stayed leased for [pool] wait_s (see `gmux lease list`)";
      break;
    case ctl::LeaseVerdict::kHookFailed:
      out.why = "the pool's attach hook failed (see gmuxd's log)";
      break;
    case ctl::LeaseVerdict::kNoPool:
      out.why = "gmuxd has no pool";
      break;
    default:
      out.why = "the pool refused";
      break;
  }
  return out;
}

void WorkerQueue::PoolContexts(uint64_t count) {
  // In order after the commands submitted before, with their reports sent first: the lease may
  // end with this message, and a Ready after it would be work on a device no longer held (the
  // broker ends a session for that).
  RunOrPost(
      [this, count] {
        FlushReady(/*force_report=*/true);
        ctl::PoolContexts c{count};
        if (!broker_gone_) {
          ctl::Send(ctl_fd_, ctl::Type::kPoolContexts, &c, sizeof(c), 1).IgnoreError();
        }
      },
      /*device_callback=*/false);
}

void WorkerQueue::AddPoolQueue(const Ref<cl_command_queue>& queue, const Ref<cl_context>& context,
                               cl_command_queue_properties properties, uint32_t device) {
  std::lock_guard<std::mutex> lock(pool_mu_);
  std::erase_if(pool_queues_, [](const PoolQueue& q) { return q.queue.expired(); });
  pool_queues_.push_back({queue, context, properties, device});
}

uint32_t WorkerQueue::PoolDevice(uint32_t fallback) const {
  const uint32_t lent = pool_device_.load();
  return lent == kNoDevice ? fallback : lent;
}

void WorkerQueue::AskLease() {
  if (loop_ask_ != 0 || broker_gone_) return;
  loop_ask_ = next_lease_++;
  ctl::LeaseAsk ask{loop_ask_};
  if (!ctl::Send(ctl_fd_, ctl::Type::kLeaseAsk, &ask, sizeof(ask), 1).ok()) loop_ask_ = 0;
}

void WorkerQueue::MovePoolQueues(uint32_t device) {
  if (cl_ == nullptr || device >= devices_.size()) return;
  std::lock_guard<std::mutex> lock(pool_mu_);
  for (PoolQueue& pq : pool_queues_) {
    Ref<cl_command_queue> q = pq.queue.lock();
    Ref<cl_context> ctx = pq.context.lock();
    if (!q || !ctx || pq.device == device) continue;
    // Nothing of the session runs on the pool now (its lease was given back only when idle):
    // the queue's backend handle is replaced by one on the new device, and every command that
    // holds the queue runs there from now on. The old handle is kept until the session ends
    // (an info query may still read it).
    cl_int err = CL_SUCCESS;
    cl_command_queue fresh =
        cl_->clCreateCommandQueue(ctx->h, devices_[device], pq.properties, &err);
    if (fresh == nullptr) continue;  // its commands fail on the old device's queue
    retired_.push_back(Adopt(std::exchange(q->h, fresh)));
    pq.device = device;
  }
}

void WorkerQueue::OnLeaseAnswer(const ctl::LeaseAnswer& a) {
  const bool granted = a.verdict == static_cast<uint32_t>(ctl::LeaseVerdict::kGranted);
  if (granted && OnPool(a.device)) {
    MovePoolQueues(a.device);
    pool_device_.store(a.device);
  }
  if (a.seq == loop_ask_) loop_ask_ = 0;
  {
    std::lock_guard<std::mutex> lock(pool_mu_);
    if (lease_waiting_.count(a.seq) != 0) lease_answers_[a.seq] = a;
  }
  lease_cv_.notify_all();
  if (pool_device_.load() != kNoDevice) {
    // Commands that waited for the lease go on, in the order they came.
    std::vector<std::shared_ptr<Command>> waiting = std::move(lease_wait_);
    lease_wait_.clear();
    for (auto& c : waiting) TryRelease(c);
  } else if (!lease_wait_.empty()) {
    AskLease();  // refused (no device in time): they keep waiting, and the ask goes again
  }
}

}  // namespace gmux::daemon
