#include "icd/reply_spin.h"

#include <poll.h>
#include <sched.h>

#include <algorithm>
#include <cstdlib>

namespace gmux::icd {

ReplySpin::ReplySpin(std::chrono::microseconds budget, int cpus)
    : budget_(cpus < 2 ? std::chrono::microseconds(0)
                       : std::clamp(budget, std::chrono::microseconds(0), kMaxBudget)) {}

ReplySpin ReplySpin::FromEnvironment() {
  std::chrono::microseconds budget = kDefaultBudget;
  if (const char* s = std::getenv("GMUX_SPIN_US"); s != nullptr && *s != '\0') {
    char* end = nullptr;
    long v = std::strtol(s, &end, 10);
    if (end != s && *end == '\0' && v >= 0) {
      budget = std::chrono::microseconds(std::min<long>(v, kMaxBudget.count()));
    }
  }
  int cpus = 1;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) == 0) cpus = CPU_COUNT(&set);
  return ReplySpin(budget, cpus);
}

bool ReplySpin::Begin() {
  began_ = std::chrono::steady_clock::now();
  waiting_ = true;
  if (!WillSpin()) return false;
  ++spins_;
  return true;
}

void ReplySpin::Yield() { ::sched_yield(); }

bool ReplySpin::Wait(int fd) {
  return WaitFor([fd] {
    pollfd p{fd, POLLIN, 0};
    return ::poll(&p, 1, 0) != 0;  // readable, or an error the read will report
  });
}

void ReplySpin::Arrived() {
  if (!waiting_) return;
  waiting_ = false;
  Record(std::chrono::steady_clock::now() - began_);
}

void ReplySpin::Record(std::chrono::nanoseconds waited) {
  if (waited <= budget_) {
    slow_ = 0;
  } else if (slow_ < kSlowToStop) {
    ++slow_;
  }
}

}  // namespace gmux::icd
