// Executor: runs one device's dispatched commands on the backend and reports their completion.
//
// Owns its thread. Run() posts a command; the thread enqueues it on the backend (with the
// backend events of its wait list), and when the backend event completes (a callback posts to
// the thread) it delivers results in dispatch order: Command::finished, then the event's
// completion (its waiters), then the Completion to the scheduler with the device-measured
// START->END time. Commands of closed sessions are not run.
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
#include <thread>

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
  // Receives the completions of one delivery round, in dispatch order.
  using OnComplete = std::function<void(uint32_t device, std::vector<core::Completion> done)>;

  Executor(uint32_t device, OnComplete on_complete);
  ~Executor();

  void Start();
  // Finishes what is in flight, then stops the thread.
  void Stop();

  // Thread-safe. Commands run in the order given.
  void Run(std::vector<Job> jobs);

 private:
  struct Entry {
    Job job;
    Ref<cl_event> ev;
    cl_int status = CL_QUEUED;
    bool done = false;
    bool watched = false;  // a completion callback is registered
    Executor* self = nullptr;
  };
  static void CL_CALLBACK OnEvent(cl_event ev, cl_int status, void* user);

  void Loop();
  void Enqueue(Job job);
  void Watch(Entry& e);
  void OnDone(Entry* e, cl_int status);
  void Deliver();

  const uint32_t device_;
  OnComplete on_complete_;
  Mailbox mailbox_;
  std::thread thread_;
  std::deque<std::shared_ptr<Entry>> inflight_;  // executor thread only
  std::vector<Ref<cl_command_queue>> unflushed_;  // executor thread only
  std::atomic<bool> stopping_{false};
};

}  // namespace gmux::daemon
