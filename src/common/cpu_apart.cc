#include "common/cpu_apart.h"

#include <sched.h>

#include <algorithm>
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

CpuApart::BackOff& CpuApart::ProcessBackOff() {
  static BackOff shared;
  return shared;
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
  if (now < next_ns_ || now < back_off_->next_ns.load(std::memory_order_relaxed)) return false;
  next_ns_ = now + std::chrono::nanoseconds(min_interval_).count();
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (::sched_getaffinity(0, sizeof(allowed), &allowed) != 0 || !CPU_ISSET(peer_cpu, &allowed) ||
      CPU_COUNT(&allowed) < 2) {
    return false;
  }
  cpu_set_t elsewhere = allowed;
  CPU_CLR(peer_cpu, &elsewhere);
  // The kernel moves a thread whose CPU leaves its mask at once, and the call returns when the
  // thread runs again, there; putting the mask back does not move it again.
  if (::sched_setaffinity(0, sizeof(elsewhere), &elsewhere) != 0) return false;
  const int64_t took = NowNs() - now;
  ++moves_;
  if (took > slow_move_.count()) {
    // The CPUs it could go to were busy: back beside the peer, which yields.
    cpu_set_t back;
    CPU_ZERO(&back);
    CPU_SET(peer_cpu, &back);
    ::sched_setaffinity(0, sizeof(back), &back);
    // Each slow move in a row doubles the wait before the process's threads try again.
    const int64_t was = back_off_->wait_ms.load(std::memory_order_relaxed);
    const int64_t wait_ms = was == 0 ? kFirstBackOff.count()
                                     : std::min<int64_t>(was * 2, kMaxBackOff.count());
    back_off_->wait_ms.store(wait_ms, std::memory_order_relaxed);
    back_off_->next_ns.store(NowNs() + wait_ms * 1000000, std::memory_order_relaxed);
    ++slow_moves_;
  } else {
    back_off_->wait_ms.store(0, std::memory_order_relaxed);
  }
  ::sched_setaffinity(0, sizeof(allowed), &allowed);
  return true;
}

}  // namespace gmux
