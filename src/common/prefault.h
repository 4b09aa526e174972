// Faults a new buffer's shared memory into this process's page tables on a thread of its own
// while the process goes on (the ICD: the application's mapping; the worker: its own).
//
// A buffer on shared memory (docs/protocol.md, "Buffers on shared memory") is a memfd the
// application maps; its first touch of each page is a page fault, and on this project's VMs
// faulting in a memfd's page costs about 40 % more than an anonymous one (what native PoCL's
// own allocation gives): the first blocking write of a new 256 MiB buffer ran at 0.75-0.89 of
// native (docs/performance.md, "New large buffers faulted in ahead"). A Prefaulter thread reads
// one byte of each page, from the mapping's end backwards, so an application writing the
// buffer from its start meets it halfway and each of them takes half of the faults, on two
// cores. A read fault on a shared file mapping maps the page writable (shmem asks for no write
// notification), so the application's writes then fault no more; nothing is written, so the
// race with the application changes no byte. Faults, unlike MADV_POPULATE_WRITE, do not take
// the process's mmap lock on kernels with per-VMA locks for file-backed faults (Linux 6.7 and
// later), which made the process's own mmap() calls (the next buffer's) wait for milliseconds
// behind a populating thread; on older kernels each fault holds it for one page. A fault that
// finds no memory is what the application's own touch would meet (SIGBUS under strict
// overcommit, the OOM killer under a memory cgroup), for a page it might never have touched.
//
// One thread per process, started by the first job and serving them in order. Thread-safe.
// In a forked child there is no thread: Start() returns null and Stop() returns at once.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>

namespace gmux {

class Prefaulter {
 public:
  // Buffers from this size are worth a job (fewer pages fault in before the thread would).
  static constexpr size_t kMinBytes = 8u << 20;
  static constexpr size_t kChunkBytes = 64u << 10;

  struct Job;

  static Prefaulter& Get();

  // Queues [map, map + size) to be faulted in; null when there is no thread to do it. The
  // mapping must be readable, backed by a file at least `size` long (a memfd sealed against
  // shrinking: a touch past its end would be SIGBUS), and stay mapped until Stop().
  std::shared_ptr<Job> Start(void* map, size_t size);
  // Ends `job` (its chunk in progress, if any, is waited for): the mapping may be unmapped
  // after it returns. Null is ignored.
  void Stop(const std::shared_ptr<Job>& job);
  // Waits until `job` has populated the whole mapping or stopped (tests). True if it populated
  // all of it.
  bool Wait(const std::shared_ptr<Job>& job);

 private:
  Prefaulter() = default;
  void Run();

  std::mutex mu_;
  std::condition_variable cv_;  // jobs queued, a chunk done
  std::deque<std::shared_ptr<Job>> queue_;
  // The process whose thread serves the queue (0: none started; another pid: forked since).
  std::atomic<pid_t> owner_{0};
};

}  // namespace gmux
