// Executor: runs one device's dispatched commands on the backend and reports their completion.
//
// Owns its thread. Run() posts a command; the thread enqueues it on the backend (with the
// backend events of its wait list), and when the backend event completes (a callback posts to
// the thread) it delivers results in dispatch order: Command::finished, then the event's
// completion (its waiters), then the Completion to the scheduler with the device-measured
// START->END time. Commands of closed sessions are not run.
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
  void Run(std::vector<std::shared_ptr<Command>> cmds);

 private:
  struct Entry {
    std::shared_ptr<Command> cmd;
    Ref<cl_event> ev;
    cl_int status = CL_QUEUED;
    bool done = false;
    bool watched = false;  // a completion callback is registered
    Executor* self = nullptr;
  };
  static void CL_CALLBACK OnEvent(cl_event ev, cl_int status, void* user);

  void Loop();
  void Enqueue(std::shared_ptr<Command> cmd);
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
