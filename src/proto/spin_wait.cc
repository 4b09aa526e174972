#include "proto/spin_wait.h"

#include <poll.h>
#include <sched.h>

#include <algorithm>
#include <cstdlib>

namespace gmux::proto {

SpinWait::SpinWait(std::chrono::microseconds budget, int cpus)
    : budget_(cpus < 2 ? std::chrono::microseconds(0)
                       : std::clamp(budget, std::chrono::microseconds(0), kMaxBudget)) {}

SpinWait SpinWait::FromEnvironment() {
  std::chrono::microseconds budget = kDefaultBudget;
  if (const char* s = std::getenv("GMUX_SPIN_US"); s != nullptr && *s != '\0') {
    char* end = nullptr;
    long v = std::strtol(s, &end, 10);
    if (end != s && *end == '\0' && v >= 0) {
      budget = std::chrono::microseconds(std::min<long>(v, kMaxBudget.count()));
    }
  }
  return ForThisThread(budget);
}

SpinWait SpinWait::ForThisThread(std::chrono::microseconds budget) {
  int cpus = 1;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) == 0) cpus = CPU_COUNT(&set);
  return SpinWait(budget, cpus);
}

bool SpinWait::Begin() {
  began_ = std::chrono::steady_clock::now();
  waiting_ = true;
  if (!WillSpin()) return false;
  ++spins_;
  return true;
}

void SpinWait::Yield() { ::sched_yield(); }

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
  if (waited <= budget_) {
    slow_ = 0;
  } else if (slow_ < kSlowToStop) {
    ++slow_;
  }
}

}  // namespace gmux::proto
