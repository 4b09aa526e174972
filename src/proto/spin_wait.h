// How a thread waits for its peer's next message when it is likely to come soon: polling the
// socket (or looking at the reply ring in shared memory, proto/shm_ring.h) for a short while,
// yielding the CPU between looks, before sleeping in the kernel. Two users:
//  - an application thread waiting for the reply to a blocking call (the ICD's connection);
//  - a worker's session thread after it answered a blocking call, waiting for its client's next
//    request (daemon/session.cc; the budget is gmuxd's `worker_spin_us`).
//
// A blocking call's reply often comes within tens of microseconds (a small launch and
// `clFinish`), and a program that makes blocking calls in a loop sends its next one as soon.
// Sleeping costs the waking side a cross-CPU wake-up and the sleeper a trip through the
// scheduler, which on a virtual machine take longer than the work itself: a tiny launch +
// `clFinish` through gmux took 63-88 us with the client's sleep and 33-44 us with a 100 us spin
// on a 2-core VM, native PoCL (which sleeps) 26-57 us (docs/performance.md, "Waiting for a reply:
// a short spin before sleeping"; the worker's side: "A worker that waits awake"). The spin
// yields (sched_yield), so a thread the host needs the CPU for (the worker's own, on a host
// with more runnable threads than CPUs) gets it soon: eight clients on two cores were no slower
// with it than without, while a spin that did not yield doubled their latency. It is the
// choice CUDA's default (cudaDeviceScheduleAuto) makes: spin while the host has room, yield
// when it does not. Between yields the looks are separated by a pause instruction: the first
// look yields, then one every kDefaultYieldEvery, every look while the caller says others need
// the CPU (a worker whose device threads run) or after waits ran long (docs/policies.md, "Spins
// pause between yields"): a yield at every look left a one-client launch loop at ~20 us in most
// runs on the 2-core VM, the pauses at 9-13 us.
//
// It spins only while messages come within the budget: every wait is timed, spun or not, and
// after two in a row that took longer (long kernels, large transfers, a program computing
// between calls) the waits sleep at once until a message comes within the budget again. So a
// program waiting milliseconds per call spins twice, not on every call; one that alternates
// quick calls and slower ones spends at most the budget per slower call. A process allowed one
// CPU never spins (its spinning would only delay the message; counted are the CPUs of the thread
// that makes the SpinWait, when it makes it). GMUX_SPIN_US sets the application's budget
// (0: never spin; default 100, at most 10000).
// Thread-compatible: one thread waits at a time.
#pragma once

#include <chrono>
#include <cstdint>

namespace gmux::proto {

class SpinWait {
 public:
  static constexpr std::chrono::microseconds kDefaultBudget{100};
  static constexpr std::chrono::microseconds kMaxBudget{10000};
  // Messages in a row slower than the budget after which waits no longer spin.
  static constexpr uint32_t kSlowToStop = 2;
  // Between two yields, looks are separated by a pause instruction, not a system call, for
  // this long (kDefaultYieldEvery, or GMUX_SPIN_YIELD_US; 0: yield between every two looks).
  // Waits that take longer than that kLongToYield times in a row mean the spin holds a CPU
  // that a thread it waits for needs (more runnable threads than CPUs): the next
  // kYieldOftenWaits waits yield between every two looks, then one tries the pause again.
  static constexpr std::chrono::microseconds kDefaultYieldEvery{20};
  static constexpr uint32_t kLongToYield = 2;
  static constexpr uint32_t kYieldOftenWaits = 64;

  // `budget` 0: never spins. `cpus`: the CPUs this process may run on. `yield_every`: see
  // kDefaultYieldEvery (at most the budget).
  SpinWait(std::chrono::microseconds budget, int cpus,
           std::chrono::microseconds yield_every = kDefaultYieldEvery);
  // From GMUX_SPIN_US and GMUX_SPIN_YIELD_US (a malformed value: the default) and the
  // process's CPU affinity.
  static SpinWait FromEnvironment();
  // `budget`, GMUX_SPIN_YIELD_US and the calling thread's CPU affinity.
  static SpinWait ForThisThread(std::chrono::microseconds budget);

  // Before sleeping for a message on `fd`: spins (poll, pausing and yielding as WaitFor does)
  // until `fd` is readable or the budget is spent, if the policy says it is worth it. True when
  // `fd` became readable.
  bool Wait(int fd);
  // The same, spinning until `ready()` (say, the reply ring has bytes: no system call per
  // turn, or a read that found something).
  template <typename Ready>
  bool WaitFor(const Ready& ready) {
    return WaitFor(ready, [] { return false; });
  }
  // The same, yielding at every look while `others_need_cpu()` (threads this one woke may wait
  // for its CPU: a worker's device threads while its commands run).
  template <typename Ready, typename OthersNeedCpu>
  bool WaitFor(const Ready& ready, const OthersNeedCpu& others_need_cpu) {
    if (!Begin()) return false;
    const auto until = began_ + budget_;
    // The first look yields: the threads this one just woke run now if they share its CPU.
    auto next_yield = began_;
    for (;;) {
      if (ready()) return true;
      const auto now = std::chrono::steady_clock::now();
      if (now >= until) return false;
      if (now >= next_yield || others_need_cpu()) {
        Yield();
        next_yield = std::chrono::steady_clock::now() + yield_every();
      } else {
        Relax();
      }
    }
  }
  // After the message that Wait() preceded arrived: its time since Wait() began decides whether
  // the next waits spin.
  void Arrived();

  // For tests and docs: the budget, whether the next Wait() spins, and the spins so far.
  std::chrono::microseconds budget() const { return budget_; }
  // How long the next spinning Wait() pauses between yields (0: it yields at every look).
  std::chrono::microseconds yield_every() const {
    return yield_often_ > 0 ? std::chrono::microseconds(0) : yield_every_;
  }
  bool WillSpin() const { return budget_.count() > 0 && slow_ < kSlowToStop; }
  uint64_t spins() const { return spins_; }

  // The decision without the clock (tests): a message took `waited`.
  void Record(std::chrono::nanoseconds waited);

 private:
  // Starts a wait's clock; whether it spins.
  bool Begin();
  static void Yield();
  static void Relax();

  std::chrono::microseconds budget_;
  std::chrono::microseconds yield_every_;
  uint32_t slow_ = 0;         // messages in a row slower than the budget
  uint32_t long_ = 0;         // messages in a row slower than yield_every_
  uint32_t yield_often_ = 0;  // waits left that yield at every look
  uint64_t spins_ = 0;
  std::chrono::steady_clock::time_point began_{};
  bool waiting_ = false;
};

}  // namespace gmux::proto
