#include "common/cpu_apart.h"

#include <sched.h>

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

namespace gmux {
namespace {

using std::chrono::milliseconds;

// The calling thread's CPUs.
cpu_set_t Allowed() {
  cpu_set_t s;
  CPU_ZERO(&s);
  EXPECT_EQ(::sched_getaffinity(0, sizeof(s), &s), 0);
  return s;
}

// Moves the calling thread onto `cpu` (pinned there, then its mask put back: it stays until the
// scheduler moves it, which a thread that does not sleep rarely sees within a test).
void GoTo(int cpu, const cpu_set_t& allowed) {
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  ASSERT_EQ(::sched_setaffinity(0, sizeof(one), &one), 0);
  ASSERT_EQ(::sched_getcpu(), cpu);
  ASSERT_EQ(::sched_setaffinity(0, sizeof(allowed), &allowed), 0);
}

int FirstCpu(const cpu_set_t& s) {
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &s)) return c;
  }
  return -1;
}

int Quiet() { return 1; }
int Busy() { return 1 << 20; }

// No back-off shared with anyone, no wait between tries, a quiet system.
CpuApart::Options Free(CpuApart::BackOff* back_off) {
  CpuApart::Options o;
  o.min_interval = milliseconds(0);
  o.back_off = back_off;
  o.runnable = &Quiet;
  return o;
}

// Runs `body` on a thread of its own (each test changes its thread's affinity).
template <typename Body>
void OnAThread(Body body) {
  std::thread t(body);
  t.join();
}

TEST(CpuApartTest, MovesOffThePeersCpuAndLeavesItsAffinityAsItWas) {
  OnAThread([] {
    const cpu_set_t allowed = Allowed();
    if (CPU_COUNT(&allowed) < 2) GTEST_SKIP() << "one CPU: nowhere to move";
    CpuApart::BackOff back_off;
    CpuApart apart(Free(&back_off));
    const int peer = FirstCpu(allowed);
    GoTo(peer, allowed);
    EXPECT_TRUE(apart.Check(peer));
    EXPECT_EQ(apart.moves(), 1u);
    const cpu_set_t after = Allowed();
    EXPECT_TRUE(CPU_EQUAL(&after, &allowed)) << "the thread's affinity is its own again";
    if (apart.slow_moves() == 0) {
      EXPECT_NE(::sched_getcpu(), peer);
      EXPECT_EQ(back_off.wait_ms.load(), 0);
    } else {
      // The machine was busy: the move took long enough to go back, and to back off.
      EXPECT_EQ(back_off.wait_ms.load(), CpuApart::kFirstBackOff.count());
    }
  });
}

TEST(CpuApartTest, LeavesAThreadAloneThatIsNotOnThePeersCpu) {
  OnAThread([] {
    const cpu_set_t allowed = Allowed();
    CpuApart::BackOff back_off;
    CpuApart apart(Free(&back_off));
    const int here = ::sched_getcpu();
    // Another CPU, or one this machine does not have; unknown and out-of-range ones.
    EXPECT_FALSE(apart.Check(here + 1));
    EXPECT_FALSE(apart.Check(-1));
    EXPECT_FALSE(apart.Check(CPU_SETSIZE));
    EXPECT_FALSE(apart.Check(1 << 30));
    EXPECT_EQ(apart.moves(), 0u);
    const cpu_set_t after = Allowed();
    EXPECT_TRUE(CPU_EQUAL(&after, &allowed));
  });
}

TEST(CpuApartTest, StaysWhenItMayUseOneCpuOnly) {
  OnAThread([] {
    const cpu_set_t allowed = Allowed();
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(FirstCpu(allowed), &one);
    ASSERT_EQ(::sched_setaffinity(0, sizeof(one), &one), 0);
    CpuApart::BackOff back_off;
    CpuApart apart(Free(&back_off));
    EXPECT_FALSE(apart.Check(::sched_getcpu()));
    EXPECT_EQ(apart.moves(), 0u);
    const cpu_set_t after = Allowed();
    EXPECT_TRUE(CPU_EQUAL(&after, &one)) << "the pin an operator set stays";
    EXPECT_EQ(::sched_getcpu(), FirstCpu(allowed));
  });
}

TEST(CpuApartTest, TriesAtMostOncePerInterval) {
  OnAThread([] {
    const cpu_set_t allowed = Allowed();
    if (CPU_COUNT(&allowed) < 2) GTEST_SKIP() << "one CPU: nowhere to move";
    CpuApart::BackOff back_off;
    CpuApart::Options o = Free(&back_off);
    o.min_interval = std::chrono::hours(1);
    CpuApart apart(o);
    const int peer = FirstCpu(allowed);
    GoTo(peer, allowed);
    EXPECT_TRUE(apart.Check(peer));
    GoTo(peer, allowed);
    EXPECT_FALSE(apart.Check(peer)) << "a second collision within the interval stays";
    EXPECT_EQ(apart.moves(), 1u);
    EXPECT_EQ(::sched_getcpu(), peer);
  });
}

TEST(CpuApartTest, ASlowMoveGoesBackAndBacksOffLongerEachTime) {
  OnAThread([] {
    const cpu_set_t allowed = Allowed();
    if (CPU_COUNT(&allowed) < 2) GTEST_SKIP() << "one CPU: nowhere to move";
    CpuApart::BackOff back_off;
    // Every move counts as slow (as onto the CPU of a thread that never yields).
    CpuApart::Options o = Free(&back_off);
    o.slow_move = std::chrono::nanoseconds(0);
    CpuApart apart(o);
    const int peer = FirstCpu(allowed);
    GoTo(peer, allowed);
    EXPECT_TRUE(apart.Check(peer));
    EXPECT_EQ(apart.slow_moves(), 1u);
    EXPECT_EQ(::sched_getcpu(), peer) << "back beside the peer";
    const cpu_set_t after = Allowed();
    EXPECT_TRUE(CPU_EQUAL(&after, &allowed));
    EXPECT_EQ(back_off.wait_ms.load(), CpuApart::kFirstBackOff.count());
    // Another thread of the process sharing the back-off does not try meanwhile either.
    CpuApart other(Free(&back_off));
    EXPECT_FALSE(other.Check(peer));
    EXPECT_FALSE(apart.Check(peer));
    std::this_thread::sleep_for(CpuApart::kFirstBackOff + milliseconds(20));
    GoTo(peer, allowed);
    EXPECT_TRUE(apart.Check(peer));
    EXPECT_EQ(back_off.wait_ms.load(), 2 * CpuApart::kFirstBackOff.count());
    EXPECT_EQ(apart.moves(), 2u);
  });
}

TEST(CpuApartTest, AMoveTheSchedulerUndoesSoonCountsAsFailed) {
  OnAThread([] {
    const cpu_set_t allowed = Allowed();
    if (CPU_COUNT(&allowed) < 2) GTEST_SKIP() << "one CPU: nowhere to move";
    CpuApart::BackOff back_off;
    CpuApart::Options o = Free(&back_off);
    o.slow_move = std::chrono::hours(1);  // every move is quick
    CpuApart apart(o);
    const int peer = FirstCpu(allowed);
    GoTo(peer, allowed);
    EXPECT_TRUE(apart.Check(peer));
    // Back beside the peer within kStick (as the scheduler would put it): no move, and the
    // process backs off.
    GoTo(peer, allowed);
    EXPECT_FALSE(apart.Check(peer));
    EXPECT_EQ(apart.unstuck(), 1u);
    EXPECT_EQ(back_off.wait_ms.load(), CpuApart::kFirstBackOff.count());
    EXPECT_EQ(::sched_getcpu(), peer);
    // After the back-off it tries again; a move that then stays apart longer than kStick ends
    // the failures in a row.
    std::this_thread::sleep_for(CpuApart::kFirstBackOff + milliseconds(20));
    GoTo(peer, allowed);
    EXPECT_TRUE(apart.Check(peer));
    EXPECT_EQ(back_off.wait_ms.load(), CpuApart::kFirstBackOff.count());
    std::this_thread::sleep_for(CpuApart::kStick + milliseconds(20));
    GoTo(peer, allowed);
    EXPECT_TRUE(apart.Check(peer));
    EXPECT_EQ(back_off.wait_ms.load(), 0);
    EXPECT_EQ(apart.moves(), 3u);
  });
}

TEST(CpuApartTest, StaysWhileTheSystemHasMoreRunnableThreadsThanTwoPerCpu) {
  OnAThread([] {
    const cpu_set_t allowed = Allowed();
    if (CPU_COUNT(&allowed) < 2) GTEST_SKIP() << "one CPU: nowhere to move";
    CpuApart::BackOff back_off;
    CpuApart::Options o = Free(&back_off);
    o.runnable = &Busy;
    CpuApart apart(o);
    const int peer = FirstCpu(allowed);
    GoTo(peer, allowed);
    EXPECT_FALSE(apart.Check(peer));
    EXPECT_EQ(apart.busy(), 1u);
    EXPECT_EQ(apart.moves(), 0u);
    EXPECT_EQ(::sched_getcpu(), peer);
    // It looks again only after kBusyRetry, whatever its own interval.
    EXPECT_FALSE(apart.Check(peer));
    EXPECT_EQ(apart.busy(), 1u);
  });
}

TEST(CpuApartTest, CountsTheSystemsRunnableThreads) {
  // This thread runs while it reads the count.
  EXPECT_GE(CpuApart::RunnableThreads(), 1);
}

TEST(CpuApartTest, TheProcessWidePeerCpuDrivesEachThreadsOwnCheck) {
  OnAThread([] {
    if (!CpuApart::Enabled()) GTEST_SKIP() << "GMUX_CPU_APART=0";
    const cpu_set_t allowed = Allowed();
    if (CPU_COUNT(&allowed) < 2) GTEST_SKIP() << "one CPU: nowhere to move";
    const int peer = FirstCpu(allowed);
    CpuApart::SetPeerCpu(-1);
    GoTo(peer, allowed);
    EXPECT_FALSE(CpuApart::CheckThisThread()) << "no peer said where it runs";
    CpuApart::SetPeerCpu(peer);
    EXPECT_EQ(CpuApart::PeerCpu(), peer);
    // Whether it moves now depends on the machine's load (the system's runnable threads) and
    // on the process's back-off; the moves themselves are checked above. What holds either way:
    // the thread's affinity is its own afterwards, and a second look within the interval stays.
    CpuApart::CheckThisThread();
    const cpu_set_t after = Allowed();
    EXPECT_TRUE(CPU_EQUAL(&after, &allowed));
    GoTo(peer, allowed);
    EXPECT_FALSE(CpuApart::CheckThisThread());
    EXPECT_EQ(::sched_getcpu(), peer);
    CpuApart::SetPeerCpu(-1);
  });
}

}  // namespace
}  // namespace gmux
