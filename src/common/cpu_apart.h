// CpuApart: keeps a spinning thread off the CPU its peer spins on.
//
// A worker's session thread and its client's calling thread wait for each other by spinning
// (proto/spin_wait.h): each looks at shared memory for the other's next message. On separate
// CPUs a message is seen within a fraction of a microsecond; on one CPU each message waits for
// the other thread's yield and a switch between two address spaces, and every thread of both
// processes then runs slower (the caches and TLB refill after each switch). The scheduler puts
// them together easily: a thread woken by another is placed beside its waker. On the 2-core VM
// a launch + clFinish loop took 16.5-20 us with the two on one CPU and 9.7-13.5 us with the
// session thread held off the client's (docs/performance.md, "The session thread keeps off its
// client's CPU"; docs/policies.md, the same title).
//
// The backend's threads too: the worker's session thread wakes them, and the scheduler may
// place them beside a client that spins, which then waits for them to yield. A completion
// callback (ours, on the backend's thread) checks the thread it runs on the same way.
//
// So when both are found on one CPU, this thread moves to another of the CPUs it may use and
// leaves its affinity as it was (the scheduler stays free to place it later): one move per
// collision, at most one per kMinInterval, none when it may use one CPU only or the peer's CPU
// is not among its own. The peer's CPU is a hint the peer writes (a hostile one can at most make
// this thread move once per interval). Thread-compatible: the thread that owns it calls it.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace gmux {

class CpuApart {
 public:
  static constexpr std::chrono::milliseconds kMinInterval{5};
  // A move that took longer found the other CPUs busy (a thread that does not yield ran there,
  // and this one waited for its time slice): the thread goes back beside its peer, and tries
  // again only after kFirstBackOff, twice that after a second failed move in a row (slow, or
  // not sticking: kStick), and so on up to kMaxBackOff. (Moves took 6-40 us on the 2-core VM;
  // one onto the CPU of a CPU-bound loop, 1.5-12 ms.)
  static constexpr std::chrono::microseconds kSlowMove{200};
  static constexpr std::chrono::milliseconds kFirstBackOff{50};
  static constexpr std::chrono::milliseconds kMaxBackOff{5000};
  // A thread found on its peer's CPU again sooner than this after a quick move was put back by
  // the scheduler: the move counts as failed, as a slow one does.
  static constexpr std::chrono::milliseconds kStick{100};
  // With more runnable threads than two per CPU there is nowhere to go: the thread looks again
  // after this long.
  static constexpr std::chrono::milliseconds kBusyRetry{50};

  // The wait after failed moves: the thread's own, or one that threads share (tests).
  struct BackOff {
    std::atomic<int64_t> next_ns{0};  // steady clock: no move before
    std::atomic<int64_t> wait_ms{0};  // after the last failed move (0: none in a row)
  };

  // The threads runnable now in the whole system (/proc/loadavg's "R" of "R/T"); -1 when it
  // cannot be read.
  static int RunnableThreads();

  struct Options {
    std::chrono::milliseconds min_interval = kMinInterval;
    BackOff* back_off = nullptr;  // null: its own
    std::chrono::nanoseconds slow_move = kSlowMove;
    int (*runnable)() = &RunnableThreads;  // tests give their own count
  };
  CpuApart() : CpuApart(Options{}) {}
  explicit CpuApart(const Options& o) : o_(o) {
    if (o_.back_off == nullptr) o_.back_off = &own_back_off_;
  }
  CpuApart(const CpuApart&) = delete;
  CpuApart& operator=(const CpuApart&) = delete;

  // Whether the environment allows it: GMUX_CPU_APART=0 turns it off (comparisons). Read once.
  static bool Enabled();
  // The CPU this process's peer last ran on (a worker's client: its session thread reads it
  // from each request), for the threads that do not see the peer's messages (the backend's,
  // which run its completion callbacks). -1: unknown. Ignored when not Enabled().
  static void SetPeerCpu(int cpu);
  static int PeerCpu();
  // Check(PeerCpu()) with a CpuApart of the calling thread's own.
  static bool CheckThisThread();

  // `peer_cpu`: the CPU the peer last ran on (-1: unknown). Moves the calling thread off it when
  // it runs there too, at most once per `min_interval` and not while the back-off lasts. True
  // when it moved (or tried, and went back).
  bool Check(int peer_cpu);
  // For tests: moves so far, and those that went back.
  uint64_t moves() const { return moves_; }
  uint64_t slow_moves() const { return slow_moves_; }
  // Collisions left alone because the system was busy, or because the last move did not stick.
  uint64_t busy() const { return busy_; }
  uint64_t unstuck() const { return unstuck_; }

 private:
  Options o_;
  BackOff own_back_off_;
  int64_t next_ns_ = 0;  // steady clock: this thread tries no move before
  uint64_t moves_ = 0;
  uint64_t slow_moves_ = 0;
  uint64_t busy_ = 0;
  uint64_t unstuck_ = 0;
  int64_t last_move_ns_ = 0;  // steady clock: this thread's last quick move (0: none pending)

  void BackOffLonger();
};

}  // namespace gmux
