// Executor: runs one device's dispatched commands on the backend and reports their completion.
//
// Has no thread of its own: it runs under its owner's lock (a worker's WorkerQueue), which hands
// it the backend's completion callbacks (run on the callback's thread when the owner is free,
// else queued for whoever holds it: WorkerQueue::RunOrPost). Run() enqueues commands on the backend
// (with the backend events of their wait lists) at once; when a backend event completes (the
// callback posts to the loop) it delivers results in dispatch order: first the Completions to
// the scheduler with the device-measured START->END time, then Command::finished and the
// event's completion (its waiters; these may write to the client). Commands of closed sessions
// are not run.
//
// A Job may be one chunk of a split kernel launch: chunks of one launch run in order, each
// waiting for the previous chunk's backend event (so the last chunk's completion means the whole
// launch is done, on in-order and out-of-order queues alike). Only the last chunk delivers the
// command's results and completes its event; every chunk reports its own Completion.
#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <memory>

#include "core/model.h"
#include "daemon/command.h"
#include "daemon/mailbox.h"

namespace gmux::daemon {

// One dispatch: a whole command, or the work-items `range` of a splittable launch.
struct Job {
  std::shared_ptr<Command> cmd;
  core::WorkRange range;
  bool last = true;   // finishes the command
  bool whole = true;  // the range is the whole launch (run with Command::run)
};

class Executor {
 public:
  // Receives the completions of one delivery round, in dispatch order (valid during the call).
  using OnComplete =
      std::function<void(uint32_t device, const std::vector<core::Completion>& done)>;

  // `post` takes a completion callback's work to the owner (called on the backend's thread).
  using Post = std::function<void(Mailbox::Task)>;
  Executor(uint32_t device, Post post, OnComplete on_complete);
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // Under the owner's lock. Commands run in the order given; `jobs` is left empty (its
  // capacity kept for the owner's next batch).
  void Run(std::vector<Job>& jobs);

  // Nothing in flight and no completion callback outstanding: safe to destroy.
  bool Idle() const { return inflight_.empty() && callbacks_.load() == 0; }
  // A completion callback is outstanding: commands run (or wait) on the device. Any thread.
  bool Running() const { return callbacks_.load(std::memory_order_relaxed) != 0; }

  // Shuts the door on the backend's completion callbacks: one that fires later (its owner gave
  // up waiting for the executor to be idle, WorkerQueue::Stop) is dropped instead of reaching
  // a freed executor or owner. Waits for a callback passing through now. Called by the owner
  // before it goes, and by the destructor; never from a callback.
  void Close();

 private:
  // What a callback goes through to reach its executor: closed, it turns callbacks away;
  // `passing` counts those on their way in (Close() waits for them). No lock: a callback may
  // run inside another on the same thread, and callbacks never wait for each other.
  struct Gate {
    std::atomic<bool> open{true};
    std::atomic<int> passing{0};
    Executor* self = nullptr;
  };
  struct Entry {
    Job job;
    Ref<cl_event> ev;
    cl_int status = CL_QUEUED;
    bool done = false;
    bool watched = false;  // a completion callback is registered
    std::shared_ptr<Gate> gate;
  };
  std::shared_ptr<Gate> gate_;
  static void CL_CALLBACK OnEvent(cl_event ev, cl_int status, void* user);

  void Enqueue(Job job);
  void Watch(const std::shared_ptr<Entry>& e);
  void OnDone(const std::shared_ptr<Entry>& e, cl_int status);
  void Deliver();

  const uint32_t device_;
  OnComplete on_complete_;
  Post post_;
  std::deque<std::shared_ptr<Entry>> inflight_;  // under the owner's lock
  std::vector<Ref<cl_command_queue>> unflushed_;  // under the owner's lock
  // Deliver()'s vectors, kept between rounds with their capacity (a round's vectors grew from
  // nothing each time: the allocations of a few KiB that pipelined launches made per round sent
  // the C library's allocator through a consolidation of its small-chunk caches each time).
  // Taken by swapping, so that a delivery nested in another (a completion that starts more
  // commands) gets vectors of its own. Under the owner's lock.
  std::vector<core::Completion> spare_done_;
  std::vector<std::shared_ptr<Entry>> spare_finished_;
  // Completion callbacks registered with the backend and not yet delivered to the loop. Each
  // owns a reference to its entry (an entry can be collected by polling and leave inflight_
  // before its callback fires), and the owner does not destroy the executor while any is
  // outstanding (Idle()) unless it gave up waiting; then Close() turns a late callback away.
  std::atomic<uint64_t> callbacks_{0};
};

}  // namespace gmux::daemon
