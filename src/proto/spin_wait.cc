#include "proto/spin_wait.h"

#include <poll.h>
#include <sched.h>

#include <algorithm>
#include <cstdlib>

namespace gmux::proto {

SpinWait::SpinWait(std::chrono::microseconds budget, int cpus,
                   std::chrono::microseconds yield_every)
    : budget_(cpus < 2 ? std::chrono::microseconds(0)
                       : std::clamp(budget, std::chrono::microseconds(0), kMaxBudget)),
      yield_every_(std::clamp(yield_every, std::chrono::microseconds(0), budget_)) {}

namespace {

// Microseconds from the environment, at most SpinWait::kMaxBudget; `fallback` when the variable
// is unset or malformed.
std::chrono::microseconds MicrosFromEnv(const char* name, std::chrono::microseconds fallback) {
  const char* s = std::getenv(name);
  if (s == nullptr || *s == '\0') return fallback;
  char* end = nullptr;
  long v = std::strtol(s, &end, 10);
  if (end == s || *end != '\0' || v < 0) return fallback;
  return std::chrono::microseconds(std::min<long>(v, SpinWait::kMaxBudget.count()));
}

}  // namespace

SpinWait SpinWait::FromEnvironment() {
  return ForThisThread(MicrosFromEnv("GMUX_SPIN_US", kDefaultBudget));
}

SpinWait SpinWait::ForThisThread(std::chrono::microseconds budget) {
  int cpus = 1;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) == 0) cpus = CPU_COUNT(&set);
  return SpinWait(budget, cpus, MicrosFromEnv("GMUX_SPIN_YIELD_US", kDefaultYieldEvery));
}

bool SpinWait::Begin() {
  began_ = std::chrono::steady_clock::now();
  waiting_ = true;
  if (!WillSpin()) return false;
  ++spins_;
  return true;
}

void SpinWait::Yield() { ::sched_yield(); }

void SpinWait::Relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

bool SpinWait::Wait(int fd) {
  return WaitFor([fd] {
    pollfd p{fd, POLLIN, 0};
    return ::poll(&p, 1, 0) != 0;  // readable, or an error the read will report
  });
}

void SpinWait::Arrived() {
  if (!waiting_) return;
  waiting_ = false;
  Record(std::chrono::steady_clock::now() - began_);
}

void SpinWait::Record(std::chrono::nanoseconds waited) {
  if (yield_often_ > 0) {
    if (--yield_often_ == 0) long_ = 0;  // the next wait tries the pause again
  } else if (yield_every_.count() > 0 && waited > yield_every_) {
    if (++long_ >= kLongToYield) yield_often_ = kYieldOftenWaits;
  } else {
    long_ = 0;
  }
  if (waited <= budget_) {
    slow_ = 0;
  } else if (slow_ < kSlowToStop) {
    ++slow_;
  }
}

}  // namespace gmux::proto
