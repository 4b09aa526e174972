// Mailbox: the one way threads talk to a daemon thread that owns state (scheduler, executor).
// Any thread posts tasks; the owner runs them in order on its own thread. Thread-safe.
#pragma once

#include <sys/eventfd.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>

namespace gmux::daemon {

class Mailbox {
 public:
  using Task = std::function<void()>;

  Mailbox() = default;
  ~Mailbox() {
    if (wake_fd_ >= 0) ::close(wake_fd_);
  }
  Mailbox(const Mailbox&) = delete;
  Mailbox& operator=(const Mailbox&) = delete;

  // For an owner thread that also polls descriptors: an eventfd made readable by Post() (and
  // cleared by TryTakeAll()). Call before any Post().
  int EnableWakeFd() {
    if (wake_fd_ < 0) wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    return wake_fd_;
  }

  void Post(Task t) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      tasks_.push_back(std::move(t));
      // Written under the lock: a TryTakeAll between setting woken_ and the write would leave
      // the fd readable with woken_ clear, and the owner's poll returning at once for ever.
      if (wake_fd_ >= 0) {
        WakeLocked();
        return;
      }
    }
    cv_.notify_one();
  }

  // Queues `t` without waking the owner: for a caller that runs the queue itself now, or
  // whose queue is run by the thread running it now (WorkerQueue::RunOrPost).
  void PostQuiet(Task t) {
    std::lock_guard<std::mutex> lock(mu_);
    tasks_.push_back(std::move(t));
  }

  // Makes the wake fd readable (the owner looks at its queue and state).
  void Wake() {
    std::lock_guard<std::mutex> lock(mu_);
    if (wake_fd_ >= 0) WakeLocked();
  }

  // Every task posted so far, without waiting (the wake fd is cleared with them, so a later
  // Post makes it readable again).
  std::deque<Task> TryTakeAll() {
    std::lock_guard<std::mutex> lock(mu_);
    if (woken_) {
      uint64_t n;
      (void)!::read(wake_fd_, &n, sizeof(n));
      woken_ = false;
    }
    std::deque<Task> out;
    out.swap(tasks_);
    return out;
  }

  // Waits for a task, `deadline` or Close(). nullopt on timeout or when closed and drained.
  std::optional<Task> Take(std::optional<std::chrono::steady_clock::time_point> deadline) {
    std::unique_lock<std::mutex> lock(mu_);
    auto ready = [&] { return !tasks_.empty() || closed_; };
    if (deadline) {
      cv_.wait_until(lock, *deadline, ready);
    } else {
      cv_.wait(lock, ready);
    }
    if (tasks_.empty()) return std::nullopt;
    Task t = std::move(tasks_.front());
    tasks_.pop_front();
    return t;
  }

  bool Empty() const {
    std::lock_guard<std::mutex> lock(mu_);
    return tasks_.empty();
  }

  void Close() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      closed_ = true;
    }
    cv_.notify_all();
  }
  bool closed() const {
    std::lock_guard<std::mutex> lock(mu_);
    return closed_;
  }

 private:
  void WakeLocked() {
    if (woken_) return;
    woken_ = true;
    uint64_t one = 1;
    (void)!::write(wake_fd_, &one, sizeof(one));
  }

  mutable std::mutex mu_;  // guards tasks_ and closed_
  std::condition_variable cv_;
  std::deque<Task> tasks_;
  bool closed_ = false;
  int wake_fd_ = -1;
  bool woken_ = false;  // the wake fd was written and not read since
};

}  // namespace gmux::daemon
