// A worker's memory books against the broker (worker_queue.h, kept_charge_): memory a session
// releases stays charged to it for a moment, and the next reservations take it without asking
// the broker. The broker here is the test, on the other end of a real control channel, so it
// sees exactly which kMemReserve and kMemFree records the worker sends, and in which order.
#include <gtest/gtest.h>
#include <poll.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <optional>

#include "daemon/control.h"
#include "daemon/worker_queue.h"

namespace gmux::daemon {
namespace {

using namespace std::chrono_literals;
constexpr uint64_t kMiB = uint64_t{1} << 20;

class KeptChargeTest : public ::testing::Test {
 protected:
  // Longer than gmuxd's 20 ms, so that a loaded machine cannot let the charge go back between
  // a release and the reservation after it.
  static constexpr std::chrono::milliseconds kIdle{1000};
  void SetUp() override { Open(kIdle); }
  // A worker queue that keeps released memory charged for `idle`.
  void Open(std::chrono::milliseconds idle) {
    int fds[2];
    ASSERT_TRUE(ctl::Pair(fds).ok());
    broker_ = fds[0];
    worker_fd_ = fds[1];
    queue_ = std::make_unique<WorkerQueue>(worker_fd_, 2, nullptr);
    queue_->SetKeptChargeIdle(idle);
    queue_->Start();
  }
  // As Open, for tests of the other ways back: nothing goes back by itself meanwhile.
  void Reopen(std::chrono::milliseconds idle) {
    TearDown();
    Open(idle);
  }
  void TearDown() override {
    queue_.reset();
    ::close(broker_);
    ::close(worker_fd_);
  }

  // The next message from the worker within `ms` (nullopt: none came).
  std::optional<ctl::Message> Next(int ms) {
    pollfd p{broker_, POLLIN, 0};
    if (::poll(&p, 1, ms) <= 0) return std::nullopt;
    auto m = ctl::Receive(broker_);
    if (!m.ok()) return std::nullopt;
    return *m;
  }
  std::optional<ctl::MemFree> NextFree(int ms = 5000) {
    auto m = Next(ms);
    if (!m || m->type != ctl::Type::kMemFree || m->As<ctl::MemFree>().size() != 1) {
      return std::nullopt;
    }
    return m->As<ctl::MemFree>()[0];
  }

  // Runs ReserveMemory on another thread; the broker's side expects the kMemReserve for
  // `asked` bytes and answers `verdict` (used: `used`). With `asked` 0 no message may come.
  CommandSink::MemoryAnswer Reserve(uint32_t device, uint64_t bytes, uint64_t asked,
                                    ctl::MemVerdict verdict = ctl::MemVerdict::kGranted,
                                    uint64_t used = 0) {
    auto f = std::async(std::launch::async,
                        [this, device, bytes] { return queue_->ReserveMemory(device, bytes); });
    if (asked == 0) {
      EXPECT_EQ(f.wait_for(5s), std::future_status::ready) << "waited for the broker";
      return f.get();
    }
    auto m = Next(5000);
    EXPECT_TRUE(m.has_value());
    if (!m) return f.get();
    EXPECT_EQ(m->type, ctl::Type::kMemReserve);
    auto r = m->As<ctl::MemReserve>();
    EXPECT_EQ(r.size(), 1u);
    if (r.size() != 1) return f.get();
    EXPECT_EQ(r[0].bytes, asked);
    EXPECT_EQ(r[0].device, device);
    ctl::MemAnswer a{r[0].seq, r[0].bytes, static_cast<uint32_t>(verdict), device, used, 1000};
    EXPECT_TRUE(ctl::Send(broker_, ctl::Type::kMemAnswer, &a, sizeof(a), 1).ok());
    return f.get();
  }

  int broker_ = -1;
  int worker_fd_ = -1;
  std::unique_ptr<WorkerQueue> queue_;
};

TEST_F(KeptChargeTest, ReleasedMemoryIsTakenAgainWithoutAskingAndGivenBackOnceIdle) {
  EXPECT_TRUE(Reserve(0, 400, 400).granted);
  const auto released = std::chrono::steady_clock::now();
  queue_->ReleaseMemory(0, 400);
  // Taken from what was released: no message to the broker.
  EXPECT_TRUE(Reserve(0, 300, 0).granted);
  // The rest goes back by itself once nothing was released for a while, not before.
  auto f = NextFree();
  ASSERT_TRUE(f.has_value());
  EXPECT_GE(std::chrono::steady_clock::now() - released, kIdle);
  EXPECT_EQ(f->bytes, 100u);
  EXPECT_EQ(f->device, 0u);
  // Nothing kept now: the broker is asked again, for all of it.
  EXPECT_TRUE(Reserve(0, 250, 250).granted);
  EXPECT_FALSE(Next(100).has_value());
}

TEST_F(KeptChargeTest, ALargerAllocationAsksOnlyForWhatIsNotKeptAndARefusalKeepsIt) {
  EXPECT_TRUE(Reserve(1, 300, 300).granted);
  queue_->ReleaseMemory(1, 300);
  // 500 = 300 kept + 200 asked: the broker's sum is the same as if the 300 had gone back first.
  EXPECT_TRUE(Reserve(1, 500, 200).granted);
  queue_->ReleaseMemory(1, 500);
  // Refused: the tenant's use the application sees leaves out what was kept.
  auto a = Reserve(1, 900, 400, ctl::MemVerdict::kQuota, /*used=*/700);
  EXPECT_FALSE(a.granted);
  EXPECT_TRUE(a.over_quota);
  EXPECT_EQ(a.used, 200u);
  // Still charged, still given back once idle: all 500.
  auto f = NextFree();
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->bytes, 500u);
  EXPECT_EQ(f->device, 1u);
}

TEST_F(KeptChargeTest, BeyondTheBoundItGoesBackAtOnceAndAnEvictionReturnsTheRest) {
  Reopen(std::chrono::hours(1));
  EXPECT_TRUE(Reserve(0, 100 * kMiB, 100 * kMiB).granted);
  EXPECT_TRUE(Reserve(1, 10 * kMiB, 10 * kMiB).granted);
  queue_->ReleaseMemory(0, 100 * kMiB);
  auto f = NextFree(1000);
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->bytes, 36 * kMiB);
  queue_->ReleaseMemory(1, 10 * kMiB);
  // The broker evicts the session from device 1: whatever is kept goes back first, on every
  // device (the layout is sized by what is in use).
  ctl::Evict e{1, 0, 7};
  ASSERT_TRUE(ctl::Send(broker_, ctl::Type::kEvict, &e, sizeof(e), 1).ok());
  uint64_t back[2] = {0, 0};
  for (int i = 0; i < 2; ++i) {
    auto m = NextFree(1000);
    ASSERT_TRUE(m.has_value()) << i;
    ASSERT_LT(m->device, 2u);
    back[m->device] += m->bytes;
  }
  EXPECT_EQ(back[0], 64 * kMiB);
  EXPECT_EQ(back[1], 10 * kMiB);
}

TEST_F(KeptChargeTest, AWorkerAboutToEndGivesItAllBack) {
  Reopen(std::chrono::hours(1));
  EXPECT_TRUE(Reserve(0, 4096, 4096).granted);
  queue_->ReleaseMemory(0, 4096);
  queue_->ReportBeforeExit();
  auto f = NextFree(1000);
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->bytes, 4096u);
}

}  // namespace
}  // namespace gmux::daemon
