#include "common/cpu_apart.h"

#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace gmux {

namespace {

std::atomic<int> g_peer_cpu{-1};

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

int CpuApart::RunnableThreads() {
  const int fd = ::open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  char buf[128];
  const ssize_t n = ::read(fd, buf, sizeof(buf) - 1);
  ::close(fd);
  if (n <= 0) return -1;
  buf[n] = '\0';
  double avg[3];
  int running = -1, total = 0;
  return std::sscanf(buf, "%lf %lf %lf %d/%d", &avg[0], &avg[1], &avg[2], &running, &total) == 5
             ? running
             : -1;
}

bool CpuApart::Enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("GMUX_CPU_APART");
    return v == nullptr || std::strcmp(v, "0") != 0;
  }();
  return enabled;
}

void CpuApart::SetPeerCpu(int cpu) {
  if (!Enabled()) return;
  if (g_peer_cpu.load(std::memory_order_relaxed) != cpu) {
    g_peer_cpu.store(cpu, std::memory_order_relaxed);
  }
}

int CpuApart::PeerCpu() { return g_peer_cpu.load(std::memory_order_relaxed); }

bool CpuApart::CheckThisThread() {
  const int peer = PeerCpu();
  if (peer < 0) return false;
  thread_local CpuApart mine;
  return mine.Check(peer);
}

bool CpuApart::Check(int peer_cpu) {
  if (peer_cpu < 0 || peer_cpu >= CPU_SETSIZE) return false;
  if (::sched_getcpu() != peer_cpu) return false;
  const int64_t now = NowNs();
  if (now < next_ns_ || now < o_.back_off->next_ns.load(std::memory_order_relaxed)) return false;
  next_ns_ = now + std::chrono::nanoseconds(o_.min_interval).count();
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (::sched_getaffinity(0, sizeof(allowed), &allowed) != 0 || !CPU_ISSET(peer_cpu, &allowed) ||
      CPU_COUNT(&allowed) < 2) {
    return false;
  }
  // A thread found beside its peer again soon after a move was put back by the scheduler (it
  // had reasons: the CPU it went to was busy): that move failed too.
  const bool unstuck = last_move_ns_ != 0 && now - last_move_ns_ < kStick.count() * 1000000;
  // One that stayed apart longer succeeded: the failures in a row end there.
  if (last_move_ns_ != 0 && !unstuck) o_.back_off->wait_ms.store(0, std::memory_order_relaxed);
  last_move_ns_ = 0;
  if (unstuck) {
    ++unstuck_;
    BackOffLonger();
    return false;
  }
  // Somewhere to go: more runnable threads than two per CPU (many tenants on few CPUs, whose
  // clients mostly sleep through their waits) leave none, and each move would only trade one
  // busy CPU for another. Counted are the system's; PoCL's threads just woken are among them.
  const int runnable = o_.runnable();
  if (runnable < 0 || runnable > 2 * CPU_COUNT(&allowed)) {
    next_ns_ = now + std::chrono::nanoseconds(kBusyRetry).count();
    ++busy_;
    return false;
  }
  cpu_set_t elsewhere = allowed;
  CPU_CLR(peer_cpu, &elsewhere);
  // The kernel moves a thread whose CPU leaves its mask at once, and the call returns when the
  // thread runs again, there; putting the mask back does not move it again.
  const int64_t before = NowNs();
  if (::sched_setaffinity(0, sizeof(elsewhere), &elsewhere) != 0) return false;
  const int64_t took = NowNs() - before;
  ++moves_;
  if (took > o_.slow_move.count()) {
    // The CPUs it could go to were busy: back beside the peer, which yields.
    cpu_set_t back;
    CPU_ZERO(&back);
    CPU_SET(peer_cpu, &back);
    ::sched_setaffinity(0, sizeof(back), &back);
    ++slow_moves_;
    BackOffLonger();
  } else {
    last_move_ns_ = NowNs();
  }
  ::sched_setaffinity(0, sizeof(allowed), &allowed);
  return true;
}

void CpuApart::BackOffLonger() {
  // Each failed move in a row doubles the wait before a thread sharing this back-off tries
  // again.
  const int64_t was = o_.back_off->wait_ms.load(std::memory_order_relaxed);
  const int64_t wait_ms =
      was == 0 ? kFirstBackOff.count() : std::min<int64_t>(was * 2, kMaxBackOff.count());
  o_.back_off->wait_ms.store(wait_ms, std::memory_order_relaxed);
  o_.back_off->next_ns.store(NowNs() + wait_ms * 1000000, std::memory_order_relaxed);
}

}  // namespace gmux
