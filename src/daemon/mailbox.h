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
    bool was_empty;
    {
      std::lock_guard<std::mutex> lock(mu_);
      was_empty = tasks_.empty();
      tasks_.push_back(std::move(t));
    }
    if (wake_fd_ >= 0) {
      if (was_empty) {
        uint64_t one = 1;
        (void)!::write(wake_fd_, &one, sizeof(one));
      }
    } else {
      cv_.notify_one();
    }
  }

  // Every task posted so far, without waiting (the wake fd is cleared first, so a Post racing
  // with this call makes the fd readable again).
  std::deque<Task> TryTakeAll() {
    if (wake_fd_ >= 0) {
      uint64_t n;
      (void)!::read(wake_fd_, &n, sizeof(n));
    }
    std::lock_guard<std::mutex> lock(mu_);
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
  mutable std::mutex mu_;  // guards tasks_ and closed_
  std::condition_variable cv_;
  std::deque<Task> tasks_;
  bool closed_ = false;
  int wake_fd_ = -1;
};

}  // namespace gmux::daemon
