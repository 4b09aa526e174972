// Mailbox: the one way threads talk to a daemon thread that owns state (scheduler, executor).
// Any thread posts tasks; the owner runs them in order on its own thread. Thread-safe.
#pragma once

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

  void Post(Task t) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      tasks_.push_back(std::move(t));
    }
    cv_.notify_one();
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
};

}  // namespace gmux::daemon
