// How a waiting application thread spins for a reply (src/proto/spin_wait.h): on a real socket
// pair, and the back-off decisions without a clock. No timing thresholds: what is checked is
// whether a wait spun and whether it saw the reply, never how long it took.
#include "proto/spin_wait.h"

#include <gtest/gtest.h>

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>

namespace gmux::proto {
namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;

struct SocketPair {
  SocketPair() { EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0); }
  ~SocketPair() {
    ::close(fds[0]);
    ::close(fds[1]);
  }
  int fds[2] = {-1, -1};
};

TEST(SpinWaitTest, SeesAReplyThatIsThereAndSpinsOutWithoutOne) {
  SocketPair s;
  SpinWait spin(milliseconds(10), 2);
  ASSERT_EQ(::write(s.fds[1], "x", 1), 1);
  EXPECT_TRUE(spin.Wait(s.fds[0]));
  spin.Arrived();
  char c;
  ASSERT_EQ(::read(s.fds[0], &c, 1), 1);

  // The next wait, with the byte read: nothing there, so the budget runs out.
  EXPECT_FALSE(spin.Wait(s.fds[0]));
  spin.Arrived();
  EXPECT_EQ(spin.spins(), 2u);
}

TEST(SpinWaitTest, ReturnsWithoutAReplyOnceTheBudgetIsSpent) {
  SocketPair s;
  SpinWait spin(microseconds(200), 2);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(spin.Wait(s.fds[0]));
  EXPECT_GE(std::chrono::steady_clock::now() - t0, microseconds(200));
  EXPECT_EQ(spin.spins(), 1u);
}

TEST(SpinWaitTest, ASocketClosedByThePeerEndsTheSpin) {
  SocketPair s;
  SpinWait spin(SpinWait::kMaxBudget, 2);
  ::shutdown(s.fds[1], SHUT_WR);
  EXPECT_TRUE(spin.Wait(s.fds[0]));  // the read then reports the end of the stream
}

TEST(SpinWaitTest, NeverSpinsWithOneCpuOrANullBudget) {
  SocketPair s;
  SpinWait one_cpu(milliseconds(1), 1);
  EXPECT_EQ(one_cpu.budget(), microseconds(0));
  EXPECT_FALSE(one_cpu.WillSpin());
  EXPECT_FALSE(one_cpu.Wait(s.fds[0]));
  EXPECT_EQ(one_cpu.spins(), 0u);
  SpinWait off(microseconds(0), 8);
  EXPECT_FALSE(off.Wait(s.fds[0]));
  EXPECT_EQ(off.spins(), 0u);
  EXPECT_EQ(SpinWait(std::chrono::seconds(5), 2).budget(), SpinWait::kMaxBudget);
}

TEST(SpinWaitTest, SlowRepliesStopTheSpinAndAQuickOneBringsItBack) {
  SpinWait spin(microseconds(100), 2);
  const microseconds fast(40), slow(5000);
  spin.Record(fast);
  EXPECT_TRUE(spin.WillSpin());
  spin.Record(slow);  // one slow reply among fast ones changes nothing
  EXPECT_TRUE(spin.WillSpin());
  spin.Record(fast);
  spin.Record(slow);
  EXPECT_TRUE(spin.WillSpin());
  spin.Record(slow);  // two in a row: waits sleep at once
  EXPECT_FALSE(spin.WillSpin());

  SocketPair s;
  for (int i = 0; i < 100; ++i) {
    EXPECT_FALSE(spin.Wait(s.fds[0]));
    spin.Record(slow);
  }
  EXPECT_EQ(spin.spins(), 0u);

  // Every wait is timed, spun or not: the first quick reply brings the spin back.
  spin.Record(fast);
  EXPECT_TRUE(spin.WillSpin());
  ASSERT_EQ(::write(s.fds[1], "x", 1), 1);
  EXPECT_TRUE(spin.Wait(s.fds[0]));
  EXPECT_EQ(spin.spins(), 1u);
}

TEST(SpinWaitTest, PausesBetweenYieldsUntilWaitsRunLongThenYieldsAtEveryLookForAWhile) {
  SpinWait spin(microseconds(100), 2);
  EXPECT_EQ(spin.yield_every(), SpinWait::kDefaultYieldEvery);
  const microseconds quick(5), long_wait(50);
  spin.Record(long_wait);  // one long wait among quick ones changes nothing
  spin.Record(quick);
  spin.Record(long_wait);
  EXPECT_EQ(spin.yield_every(), SpinWait::kDefaultYieldEvery);
  spin.Record(long_wait);  // two in a row: the spin may hold a CPU that someone needs
  EXPECT_EQ(spin.yield_every(), microseconds(0));
  EXPECT_TRUE(spin.WillSpin());  // still spinning: the waits are within the budget
  for (uint32_t i = 0; i + 1 < SpinWait::kYieldOftenWaits; ++i) spin.Record(quick);
  EXPECT_EQ(spin.yield_every(), microseconds(0));
  spin.Record(quick);  // then the pause is tried again
  EXPECT_EQ(spin.yield_every(), SpinWait::kDefaultYieldEvery);
  // A budget shorter than the pause bounds it; no budget, no pause.
  EXPECT_EQ(SpinWait(microseconds(8), 2).yield_every(), microseconds(8));
  EXPECT_EQ(SpinWait(microseconds(0), 2).yield_every(), microseconds(0));
  // Yielding at every look: long waits never switch anything.
  SpinWait every(microseconds(100), 2, microseconds(0));
  every.Record(long_wait);
  every.Record(long_wait);
  EXPECT_EQ(every.yield_every(), microseconds(0));
}

TEST(SpinWaitTest, AsksWhetherOthersNeedTheCpuAtEachLookAndStillSeesTheReply) {
  SocketPair s;
  int asked = 0;
  auto others = [&asked] {
    ++asked;
    return asked % 2 == 0;
  };
  // The "reply" comes once the spin asked three times: a spin that did not ask never sees it.
  // (A wait whose budget ran out before, on a thread kept off the CPU that long, tries again.)
  bool seen = false;
  for (int i = 0; i < 100 && !seen; ++i) {
    SpinWait spin(SpinWait::kMaxBudget, 2);
    asked = 0;
    seen = spin.WaitFor([&asked] { return asked >= 3; }, others);
  }
  EXPECT_TRUE(seen);
  // And a real reply on a socket, with a spin that is told someone needs the CPU.
  SpinWait spin(SpinWait::kMaxBudget, 2);
  ASSERT_EQ(::write(s.fds[1], "x", 1), 1);
  EXPECT_TRUE(spin.WaitFor(
      [&s] {
        pollfd p{s.fds[0], POLLIN, 0};
        return ::poll(&p, 1, 0) != 0;
      },
      [] { return true; }));
  spin.Arrived();
  EXPECT_EQ(spin.spins(), 1u);
}

TEST(SpinWaitTest, BudgetFromTheEnvironment) {
  ::setenv("GMUX_SPIN_US", "0", 1);
  EXPECT_EQ(SpinWait::FromEnvironment().budget(), microseconds(0));
  ::setenv("GMUX_SPIN_US", "250", 1);
  const auto b = SpinWait::FromEnvironment().budget();
  EXPECT_TRUE(b == microseconds(250) || b == microseconds(0));  // 0 on a one-CPU machine
  ::setenv("GMUX_SPIN_US", "lots", 1);
  const auto d = SpinWait::FromEnvironment().budget();
  EXPECT_TRUE(d == SpinWait::kDefaultBudget || d == microseconds(0));
  ::unsetenv("GMUX_SPIN_US");

  ::setenv("GMUX_SPIN_YIELD_US", "0", 1);
  EXPECT_EQ(SpinWait::FromEnvironment().yield_every(), microseconds(0));
  ::setenv("GMUX_SPIN_YIELD_US", "7", 1);
  const auto y = SpinWait::ForThisThread(microseconds(100)).yield_every();
  EXPECT_TRUE(y == microseconds(7) || y == microseconds(0));  // 0 on a one-CPU machine
  ::setenv("GMUX_SPIN_YIELD_US", "-3", 1);
  const auto z = SpinWait::FromEnvironment().yield_every();
  EXPECT_TRUE(z == SpinWait::kDefaultYieldEvery || z == microseconds(0));
  ::unsetenv("GMUX_SPIN_YIELD_US");
}

}  // namespace
}  // namespace gmux::proto
