#include "common/prefault.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>
#include <thread>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14
#endif

namespace gmux {

struct Prefaulter::Job {
  uint8_t* base = nullptr;
  size_t end = 0;         // [base, base + end) is left to populate; guarded by mu_
  bool stop = false;      // guarded by mu_
  bool busy = false;      // a chunk of it is being populated; guarded by mu_
  bool complete = false;  // all of it populated; guarded by mu_
};

Prefaulter& Prefaulter::Get() {
  static Prefaulter* p = new Prefaulter();  // never destroyed: its thread outlives main()
  return *p;
}

std::shared_ptr<Prefaulter::Job> Prefaulter::Start(void* map, size_t size) {
  if (map == nullptr || size == 0) return nullptr;
  std::lock_guard<std::mutex> lock(mu_);
  if (owner_.load(std::memory_order_relaxed) != ::getpid()) {
    // The first job of this process.
    try {
      std::thread([this] { Run(); }).detach();
    } catch (const std::system_error&) {
      return nullptr;  // no thread to be had: the application faults the pages in itself
    }
    owner_.store(::getpid(), std::memory_order_relaxed);
  }
  auto job = std::make_shared<Job>();
  job->base = static_cast<uint8_t*>(map);
  job->end = size;
  queue_.push_back(job);
  cv_.notify_all();
  return job;
}

void Prefaulter::Stop(const std::shared_ptr<Job>& job) {
  if (!job) return;
  // A forked child: no thread touches its mappings (and the lock may be held by the parent's).
  if (owner_.load(std::memory_order_relaxed) != ::getpid()) return;
  std::unique_lock<std::mutex> lock(mu_);
  job->stop = true;
  cv_.wait(lock, [&] { return !job->busy; });
}

bool Prefaulter::Wait(const std::shared_ptr<Job>& job) {
  if (!job) return false;
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return job->complete || (job->stop && !job->busy); });
  return job->complete;
}

void Prefaulter::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return !queue_.empty(); });
    std::shared_ptr<Job> job = queue_.front();
    while (!job->stop && job->end > 0) {
      const size_t n = job->end >= kChunkBytes ? kChunkBytes : job->end;
      uint8_t* at = job->base + (job->end - n);
      job->busy = true;
      lock.unlock();
      const int rc = ::madvise(at, n, MADV_POPULATE_WRITE);
      const int err = errno;
      lock.lock();
      job->busy = false;
      cv_.notify_all();  // a Stop() may be waiting for this chunk
      if (rc != 0 && err == EINTR) continue;
      if (rc != 0) {
        // EINVAL: a kernel before 5.14 (one call per job then) or a mapping not writable;
        // ENOMEM/EFAULT: no memory for it now (the application then meets the limit where it
        // touches the pages, as it would without this).
        job->stop = true;
        break;
      }
      job->end -= n;
      if (job->end == 0) job->complete = true;
    }
    queue_.pop_front();
    cv_.notify_all();
  }
}

}  // namespace gmux
