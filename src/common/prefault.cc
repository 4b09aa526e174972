#include "common/prefault.h"

#include <sched.h>
#include <unistd.h>

#include <system_error>
#include <thread>

namespace gmux {

struct Prefaulter::Job {
  uint8_t* base = nullptr;
  size_t end = 0;         // [base, base + end) is left to populate; guarded by mu_
  bool stop = false;      // guarded by mu_
  std::atomic<bool> stopping{false};  // stop, as the thread reads it between pages
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
  const pid_t owner = owner_.load(std::memory_order_relaxed);
  // A forked child: the parent's jobs and lock state came with the fork, its thread did not.
  if (owner != 0 && owner != ::getpid()) return nullptr;
  if (owner == 0) {
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
  job->stopping.store(true, std::memory_order_relaxed);
  cv_.wait(lock, [&] { return !job->busy; });
}

bool Prefaulter::Wait(const std::shared_ptr<Job>& job) {
  if (!job) return false;
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return job->complete || (job->stop && !job->busy); });
  return job->complete;
}

namespace {

// Reads one byte of `p`: the page's fault is taken here, and the read is the compiler's and the
// sanitizers' business as little as a fault is (the application may be writing the same page;
// nothing is written here, so the race changes no byte).
inline void TouchPage(const uint8_t* p) {
#if defined(__x86_64__)
  uint8_t v;
  asm volatile("movb (%1), %0" : "=q"(v) : "r"(p) : "memory");
#elif defined(__aarch64__)
  uint32_t v;
  asm volatile("ldrb %w0, [%1]" : "=r"(v) : "r"(p) : "memory");
#else
  (void)*reinterpret_cast<const volatile uint8_t*>(p);
#endif
}

}  // namespace

void Prefaulter::Run() {
  // Normal priority, but the CPU is given up after every 64 KiB (below): a thread that wakes
  // for a request waits for one chunk at most. (At idle priority a Stop() could wait long for a
  // thread starved mid-chunk on a busy host; at nice 19 the thread kept its slice, 4-8 ms.)
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return !queue_.empty(); });
    std::shared_ptr<Job> job = queue_.front();
    while (!job->stop && job->end > 0) {
      const size_t n = job->end >= kChunkBytes ? kChunkBytes : job->end;
      uint8_t* at = job->base + (job->end - n);
      job->busy = true;
      lock.unlock();
      // Every page [at, at + n) overlaps, from the last: one byte a page apart, then `at`.
      // A Stop() is seen within a page.
      bool stopped = false;
      for (const uint8_t* q = at + n - 1;; q -= page) {
        if (job->stopping.load(std::memory_order_relaxed)) {
          stopped = true;
          break;
        }
        TouchPage(q);
        if (static_cast<size_t>(q - at) < page) break;
      }
      if (!stopped) TouchPage(at);
      // Pages the application touched first fault no more, and a loop in user space is taken
      // off the CPU only at the next tick where preemption is lazy (4 ms at 250 Hz): a system
      // call per chunk lets a waking thread have the CPU at once.
      ::sched_yield();
      lock.lock();
      job->busy = false;
      cv_.notify_all();  // a Stop() may be waiting for this chunk
      if (stopped) break;
      job->end -= n;
      if (job->end == 0) job->complete = true;
    }
    queue_.pop_front();
    cv_.notify_all();
  }
}

}  // namespace gmux
