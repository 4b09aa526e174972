// Express dispatch across the broker's control channel (control.h, scheduler.h): the broker
// grants a lone worker, revokes when another tenant's worker has work, holds that work until the
// holder confirms, and drops a worker that claims express it was not given. The workers here are
// raw control channels, as a hostile worker process would use them.
#include <gtest/gtest.h>
#include <poll.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "daemon/control.h"
#include "daemon/scheduler.h"

namespace gmux::daemon {
namespace {

// A worker's end of the control channel.
struct FakeWorker {
  int fd = -1;
  ~FakeWorker() {
    if (fd >= 0) ::close(fd);
  }
  // `started`: an express command's start as the worker reports it (none: 0).
  void Ready(uint64_t cmd, bool express = false,
             std::optional<std::chrono::steady_clock::time_point> started = std::nullopt) {
    ctl::Ready r;
    r.cmd = cmd;
    r.work_items = 1;
    r.work_groups = 1;
    r.express = express ? 1 : 0;
    if (started) {
      r.started_ns = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                               started->time_since_epoch()).count());
    }
    ASSERT_TRUE(ctl::Send(fd, ctl::Type::kReady, &r, sizeof(r), 1).ok());
  }
  void Done(uint64_t cmd, uint64_t device_ns = 1000) {
    ctl::Done d;
    d.cmd = cmd;
    d.begin = 0;
    d.end = 1;
    d.device_ns = device_ns;
    ASSERT_TRUE(ctl::Send(fd, ctl::Type::kDone, &d, sizeof(d), 1).ok());
  }
  void End(uint64_t epoch) {
    ctl::ExpressEnd e;
    e.epoch = epoch;
    ASSERT_TRUE(ctl::Send(fd, ctl::Type::kExpressEnd, &e, sizeof(e), 1).ok());
  }
  // The next message within `ms`, or nullopt (nothing came, or the channel closed: `closed`).
  std::optional<ctl::Message> Next(int ms = 2000, bool* closed = nullptr) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, ms) <= 0) return std::nullopt;
    auto m = ctl::Receive(fd);
    if (!m.ok()) {
      if (closed != nullptr) *closed = true;
      return std::nullopt;
    }
    return *m;
  }
  // Waits for a message of `type`, skipping others (kLimits and the like).
  std::optional<ctl::Message> Expect(ctl::Type type, int ms = 2000) {
    auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
    while (std::chrono::steady_clock::now() < until) {
      auto m = Next(50);
      if (m && m->type == type) return m;
    }
    return std::nullopt;
  }
  // The one record of the next message of `type` within `ms` (nullopt: none, or not one record).
  template <typename T>
  std::optional<T> ExpectOne(ctl::Type type, int ms = 2000) {
    auto m = Expect(type, ms);
    if (!m) return std::nullopt;
    auto records = m->As<T>();
    if (records.size() != 1) return std::nullopt;
    return records[0];
  }
  bool ClosedWithin(int ms) {
    auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
    while (std::chrono::steady_clock::now() < until) {
      bool closed = false;
      Next(50, &closed);
      if (closed) return true;
    }
    return false;
  }
};

class ExpressTest : public ::testing::Test {
 protected:
  void SetUpScheduler(bool express = true, const std::string& policy = "fifo") {
    auto s = Scheduler::Create({policy, {}, {}}, {core::DeviceInfo{}}, 4, {}, express);
    ASSERT_TRUE(s.ok()) << s.status().message();
    sched_ = std::move(*s);
    sched_->Start([this](uint64_t session, pid_t, Scheduler::GoneReason why) {
      std::lock_guard<std::mutex> lock(mu_);
      gone_[session] = why;
    });
  }
  void TearDown() override {
    if (sched_) sched_->Stop();
  }
  std::unique_ptr<FakeWorker> AddWorker(uint64_t session, TenantId tenant) {
    sched_->AddTenant(tenant, 1.0, "t" + std::to_string(tenant));
    int fds[2];
    EXPECT_TRUE(ctl::Pair(fds).ok());
    sched_->AddWorker(session, tenant, fds[0], 0);
    auto w = std::make_unique<FakeWorker>();
    w->fd = fds[1];
    return w;
  }
  // How session `session`'s worker was dropped (waits up to `ms` for the scheduler to say).
  std::optional<Scheduler::GoneReason> Gone(uint64_t session, int ms = 2000) {
    auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
    for (;;) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = gone_.find(session);
        if (it != gone_.end()) return it->second;
      }
      if (std::chrono::steady_clock::now() >= until) return std::nullopt;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  nlohmann::json Status() { return nlohmann::json::parse(sched_->Status()); }
  // The status once `ready(status)` holds, or the last one read after about a second.
  template <typename Ready>
  nlohmann::json StatusWhen(const Ready& ready) {
    nlohmann::json st;
    for (int i = 0; i < 100; ++i) {
      st = Status();
      if (ready(st)) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return st;
  }
  // Sends command `cmd` ready from `w`; the one grant record that answers it (nullopt: none).
  static std::optional<ctl::Express> ReadyAndGrant(FakeWorker& w, uint64_t cmd) {
    w.Ready(cmd);
    return w.ExpectOne<ctl::Express>(ctl::Type::kExpress);
  }

  std::unique_ptr<Scheduler> sched_;
  std::mutex mu_;
  std::map<uint64_t, Scheduler::GoneReason> gone_;
};

TEST_F(ExpressTest, ALoneWorkerIsGrantedAndItsExpressCommandsAreAccounted) {
  SetUpScheduler();
  auto a = AddWorker(1, 1);
  auto grant = ReadyAndGrant(*a, 1);
  ASSERT_TRUE(grant.has_value()) << "no grant for the only tenant";
  EXPECT_EQ(grant->device, 0u);
  EXPECT_EQ(grant->slots, 4u) << "the grant's slots are the device's in-flight limit";
  ASSERT_TRUE(a->Expect(ctl::Type::kRelease).has_value());
  a->Done(1);
  for (uint64_t cmd = 2; cmd <= 5; ++cmd) {
    a->Ready(cmd, /*express=*/true);
    a->Done(cmd);
  }
  nlohmann::json st =
      StatusWhen([](nlohmann::json& s) { return s["tenants"][0]["completed_commands"] == 5; });
  EXPECT_EQ(st["tenants"][0]["completed_commands"], 5);
  EXPECT_EQ(st["tenants"][0]["express_dispatches"], 4);
  EXPECT_EQ(st["devices"][0]["express_session"], 1);
  EXPECT_FALSE(Gone(1, 0).has_value());
}

TEST_F(ExpressTest, ExpressCommandsReportedLateAreChargedFromTheirStartWithinTheGrant) {
  SetUpScheduler();
  auto a = AddWorker(1, 1);
  const auto before_grant = std::chrono::steady_clock::now();
  ASSERT_TRUE(ReadyAndGrant(*a, 1).has_value());
  ASSERT_TRUE(a->Expect(ctl::Type::kRelease).has_value());
  a->Done(1, 0);
  // Started, then reported with its end 80 ms later (a batch): its 50 ms of device time count,
  // though the broker heard of its start only with its end.
  const auto started = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(std::chrono::milliseconds(80));
  a->Ready(2, /*express=*/true, started);
  a->Done(2, 50'000'000);
  // A start claimed long before the grant: its wall time counts from the grant, so the
  // 10 s it reports are not all charged.
  a->Ready(3, /*express=*/true, before_grant - std::chrono::seconds(20));
  a->Done(3, 10'000'000'000);
  nlohmann::json st =
      StatusWhen([](nlohmann::json& s) { return s["tenants"][0]["completed_commands"] == 3; });
  const double since_grant =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - before_grant).count();
  ASSERT_EQ(st["tenants"][0]["completed_commands"], 3);
  const double charged = st["tenants"][0]["device_time_s"];
  // Command 2: 0.05 s; command 3: at least the 80 ms since the grant, at most all of it.
  EXPECT_GE(charged, 0.05 + 0.08);
  EXPECT_LE(charged, 0.05 + since_grant);
  EXPECT_FALSE(Gone(1, 0).has_value());
}

TEST_F(ExpressTest, ExpressWithoutAGrantEndsTheWorker) {
  SetUpScheduler();
  auto a = AddWorker(1, 1);
  a->Ready(1, /*express=*/true);
  EXPECT_TRUE(a->ClosedWithin(2000));
  EXPECT_EQ(Gone(1), Scheduler::GoneReason::kMalformed);
}

TEST_F(ExpressTest, DisabledMeansNoGrant) {
  SetUpScheduler(/*express=*/false);
  auto a = AddWorker(1, 1);
  a->Ready(1);
  auto m = a->Next();
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->type, ctl::Type::kRelease) << "the first thing a worker hears is its release";
  EXPECT_FALSE(a->Expect(ctl::Type::kExpress, 200).has_value());
}

TEST_F(ExpressTest, PoliciesThatHoldBackOrSplitNeverGrant) {
  SetUpScheduler(/*express=*/true, "split");
  auto a = AddWorker(1, 1);
  a->Ready(1);
  ASSERT_TRUE(a->Expect(ctl::Type::kRelease).has_value());
  EXPECT_FALSE(a->Expect(ctl::Type::kExpress, 200).has_value());
}

TEST_F(ExpressTest, AnotherTenantRevokesAndWaitsForTheHolderToConfirm) {
  // credit: one holder, whom another tenant's work revokes (fifo and rr share instead).
  SetUpScheduler(/*express=*/true, "credit");
  auto a = AddWorker(1, 1);
  auto grant = ReadyAndGrant(*a, 1);
  ASSERT_TRUE(grant.has_value());
  const uint64_t epoch = grant->epoch;
  ASSERT_TRUE(a->Expect(ctl::Type::kRelease).has_value());
  a->Done(1);
  a->Ready(2, /*express=*/true);  // running when the other tenant arrives

  auto b = AddWorker(2, 2);
  b->Ready(1);
  auto revoke = a->Expect(ctl::Type::kExpress);
  ASSERT_TRUE(revoke.has_value()) << "the holder was not told to give express back";
  EXPECT_EQ(revoke->As<ctl::Express>()[0].slots, 0u);
  EXPECT_EQ(revoke->As<ctl::Express>()[0].epoch, epoch);
  // B's work waits while A may still be starting commands of its own.
  EXPECT_FALSE(b->Expect(ctl::Type::kRelease, 200).has_value()) << "released before the revoke";
  a->Ready(3, /*express=*/true);  // started before A read the revoke: still A's to report
  a->End(epoch);
  a->Done(2);  // (credit's turn for A ends with its commands)
  a->Done(3);
  EXPECT_TRUE(b->Expect(ctl::Type::kRelease).has_value()) << "held work not released after";
  // Express is over for A: claiming it now bypasses the scheduler.
  a->Ready(4, /*express=*/true);
  EXPECT_TRUE(a->ClosedWithin(2000));
  EXPECT_EQ(Gone(1), Scheduler::GoneReason::kMalformed);
  EXPECT_FALSE(Gone(2, 0).has_value());
}

// The next grant record `w` hears within `ms` (skipping releases and the like), or nullopt.
std::optional<ctl::Express> NextGrant(FakeWorker& w, int ms = 2000) {
  return w.ExpectOne<ctl::Express>(ctl::Type::kExpress, ms);
}

TEST_F(ExpressTest, SessionsShareTheGrantAndTheDevicesSlotsUnderFifo) {
  SetUpScheduler();  // fifo, 4 in flight per device
  auto a = AddWorker(1, 1);
  auto first = ReadyAndGrant(*a, 1);
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->slots, 4u);
  ASSERT_TRUE(a->Expect(ctl::Type::kRelease).has_value());
  a->Done(1);
  a->Ready(2, /*express=*/true);  // running

  // A second session of the same tenant goes through the policy once, then joins the grant:
  // the two share the device's in-flight limit.
  auto b = AddWorker(2, 1);
  auto b_grant = ReadyAndGrant(*b, 1);  // (the grant is sent before the release)
  ASSERT_TRUE(b_grant.has_value()) << "the tenant's second session did not join the grant";
  ASSERT_TRUE(b->Expect(ctl::Type::kRelease).has_value()) << "the newcomer's work was held";
  EXPECT_EQ(b_grant->slots, 2u);
  EXPECT_EQ(b_grant->epoch, first->epoch) << "one grant, shared";
  auto a_share = NextGrant(*a);
  ASSERT_TRUE(a_share.has_value()) << "the first holder was not told its smaller share";
  EXPECT_EQ(a_share->slots, 2u);
  b->Done(1);
  b->Ready(2, /*express=*/true);  // accepted: b holds the grant now
  nlohmann::json st =
      StatusWhen([](nlohmann::json& s) { return s["tenants"][0]["express_dispatches"] == 2; });
  EXPECT_EQ(st["tenants"][0]["express_dispatches"], 2);
  EXPECT_EQ(st["devices"][0]["express_sessions"], nlohmann::json::array({1, 2}));

  // fifo keeps nothing between tenants: another tenant's session joins as well, and the three
  // share the slots (one each, at least).
  auto c = AddWorker(3, 2);
  auto c_grant = ReadyAndGrant(*c, 1);
  ASSERT_TRUE(c_grant.has_value()) << "another tenant's session did not join under fifo";
  EXPECT_EQ(c_grant->slots, 1u);
  EXPECT_EQ(c_grant->epoch, first->epoch);
  for (auto* h : {a.get(), b.get()}) {
    auto share = NextGrant(*h);
    ASSERT_TRUE(share.has_value());
    EXPECT_EQ(share->slots, 1u);
  }
  st = StatusWhen(
      [](nlohmann::json& s) { return s["devices"][0]["express_sessions"].size() == 3; });
  EXPECT_EQ(st["devices"][0]["express_sessions"], nlohmann::json::array({1, 2, 3}));
  // A tenant sees only its own sessions among the holders.
  auto mine = nlohmann::json::parse(sched_->Status(2));
  EXPECT_EQ(mine["devices"][0]["express_sessions"], nlohmann::json::array({3}));
  EXPECT_FALSE(Gone(1, 0).has_value());
  EXPECT_FALSE(Gone(2, 0).has_value());
  EXPECT_FALSE(Gone(3, 0).has_value());
}

TEST_F(ExpressTest, AFifthActiveSessionOfTheTenantEndsTheSharingForAll) {
  // Sharing helps a few sessions; with more runnable sessions than cores the policy's order is
  // what bounds the slowest one's wait (docs/policies.md): at most 4 active sessions share.
  SetUpScheduler();
  std::vector<std::unique_ptr<FakeWorker>> w;
  uint64_t epoch = 0;
  for (uint64_t s = 1; s <= 4; ++s) {
    w.push_back(AddWorker(s, 1));
    auto g = ReadyAndGrant(*w.back(), 1);
    ASSERT_TRUE(g.has_value()) << "session " << s << " did not share the grant";
    epoch = g->epoch;
    ASSERT_TRUE(w.back()->Expect(ctl::Type::kRelease).has_value());
    w.back()->Done(1);
  }
  // All four busy (express starts: within the quiet window), then a fifth session's work.
  for (auto& h : w) h->Ready(2, /*express=*/true);
  auto fifth = AddWorker(5, 1);
  fifth->Ready(1);
  for (size_t i = 0; i < w.size(); ++i) {
    std::optional<ctl::Express> e;
    do {
      e = NextGrant(*w[i]);  // skips the shares re-sent as others joined
    } while (e && e->slots != 0);
    ASSERT_TRUE(e.has_value()) << "holder " << i + 1 << " was not revoked";
  }
  EXPECT_FALSE(fifth->Expect(ctl::Type::kRelease, 200).has_value())
      << "released before every holder gave back";
  for (auto& h : w) {
    h->Done(2);  // the device (4 in flight) has room again
    h->End(epoch);
  }
  EXPECT_TRUE(fifth->Expect(ctl::Type::kRelease).has_value());
  for (uint64_t s = 1; s <= 5; ++s) EXPECT_FALSE(Gone(s, 0).has_value()) << s;
}

TEST_F(ExpressTest, AHolderThatLeavesGivesItsShareBackToTheOthers) {
  SetUpScheduler();
  auto a = AddWorker(1, 1);
  ASSERT_TRUE(ReadyAndGrant(*a, 1).has_value());
  ASSERT_TRUE(a->Expect(ctl::Type::kRelease).has_value());
  auto b = AddWorker(2, 1);
  auto b_grant = ReadyAndGrant(*b, 1);
  ASSERT_TRUE(b_grant.has_value());
  EXPECT_EQ(b_grant->slots, 2u);
  ::close(a->fd);  // a's session ends
  a->fd = -1;
  auto whole = NextGrant(*b);
  ASSERT_TRUE(whole.has_value()) << "the remaining holder kept half the device";
  EXPECT_EQ(whole->slots, 4u);
  EXPECT_EQ(whole->epoch, b_grant->epoch);
}

TEST_F(ExpressTest, ACreditTenantsSecondSessionEndsTheGrantInsteadOfSharingIt) {
  // Credit accounts each express block as its tenant's only pending one (Algorithm 1's turn):
  // two sessions of a tenant never hold express together there.
  SetUpScheduler(/*express=*/true, "credit");
  auto a = AddWorker(1, 1);
  auto grant = ReadyAndGrant(*a, 1);
  ASSERT_TRUE(grant.has_value());
  ASSERT_TRUE(a->Expect(ctl::Type::kRelease).has_value());
  a->Done(1);
  auto b = AddWorker(2, 1);
  b->Ready(1);
  auto revoke = NextGrant(*a);
  ASSERT_TRUE(revoke.has_value());
  EXPECT_EQ(revoke->slots, 0u);
  a->End(grant->epoch);
  ASSERT_TRUE(b->Expect(ctl::Type::kRelease).has_value());
  // b's release came by the policy; b holds nothing: express from it bypasses the scheduler.
  b->Done(1);
  b->Ready(2, /*express=*/true);
  EXPECT_TRUE(b->ClosedWithin(2000));
  EXPECT_EQ(Gone(2), Scheduler::GoneReason::kMalformed);
}

TEST_F(ExpressTest, AConfirmationForAnotherGrantEndsTheWorker) {
  SetUpScheduler();
  auto a = AddWorker(1, 1);
  auto grant = ReadyAndGrant(*a, 1);
  ASSERT_TRUE(grant.has_value());
  a->End(grant->epoch + 7);
  EXPECT_TRUE(a->ClosedWithin(2000));
  EXPECT_EQ(Gone(1), Scheduler::GoneReason::kMalformed);
}

TEST_F(ExpressTest, AHolderThatDiesReleasesTheHeldWork) {
  // credit: one holder, whom another tenant's work revokes (fifo and rr share instead).
  SetUpScheduler(/*express=*/true, "credit");
  auto a = AddWorker(1, 1);
  ASSERT_TRUE(ReadyAndGrant(*a, 1).has_value());
  auto b = AddWorker(2, 2);
  b->Ready(1);
  ASSERT_TRUE(a->Expect(ctl::Type::kExpress).has_value());  // the revoke
  ::close(a->fd);  // dies instead of confirming
  a->fd = -1;
  EXPECT_TRUE(b->Expect(ctl::Type::kRelease).has_value());
}

TEST_F(ExpressTest, TenantsThatTakeTurnsAreNotGranted) {
  // Two tenants alternating within the quiet window stay under the policy: no grant messages
  // (credit: the policy with state between tenants; fifo and rr share the grant instead).
  SetUpScheduler(/*express=*/true, "credit");
  auto a = AddWorker(1, 1);
  auto b = AddWorker(2, 2);
  ASSERT_TRUE(ReadyAndGrant(*b, 100).has_value());  // alone so far: granted
  ASSERT_TRUE(b->Expect(ctl::Type::kRelease).has_value());
  b->Done(100);
  a->Ready(1);  // revokes b's grant
  auto revoke = b->Expect(ctl::Type::kExpress);
  ASSERT_TRUE(revoke.has_value());
  ASSERT_EQ(revoke->As<ctl::Express>()[0].slots, 0u);
  b->End(revoke->As<ctl::Express>()[0].epoch);
  int grants = 0;
  auto serve = [&](FakeWorker& w, uint64_t cmd) {
    for (;;) {
      auto m = w.Next(2000);
      ASSERT_TRUE(m.has_value()) << "no release for command " << cmd;
      if (m->type == ctl::Type::kRelease) break;
      if (m->type == ctl::Type::kExpress) ++grants;
    }
    w.Done(cmd);
  };
  serve(*a, 1);
  for (uint64_t i = 1; i <= 20; ++i) {
    b->Ready(100 + i);
    serve(*b, 100 + i);
    a->Ready(1 + i);
    serve(*a, 1 + i);
  }
  EXPECT_EQ(grants, 0) << "express granted while the other tenant was active";
  EXPECT_FALSE(Gone(1, 0).has_value());
  EXPECT_FALSE(Gone(2, 0).has_value());
}

// ---- Device memory books (control.h, kMemReserve / kMemFree) ----

std::optional<ctl::MemAnswer> Reserve(FakeWorker& w, uint64_t seq, uint64_t bytes,
                                      uint32_t device = 0) {
  ctl::MemReserve r{seq, bytes, device, 0};
  if (!ctl::Send(w.fd, ctl::Type::kMemReserve, &r, sizeof(r), 1).ok()) return std::nullopt;
  return w.ExpectOne<ctl::MemAnswer>(ctl::Type::kMemAnswer);
}

void Free(FakeWorker& w, uint64_t bytes, uint32_t device = 0) {
  ctl::MemFree f{bytes, device, 0};
  ASSERT_TRUE(ctl::Send(w.fd, ctl::Type::kMemFree, &f, sizeof(f), 1).ok());
}

nlohmann::json MemoryRow(const nlohmann::json& st, const std::string& tenant) {
  for (const auto& t : st["tenants"]) {
    if (t["name"] == tenant) return t["memory"][0];
  }
  return {};
}

TEST_F(ExpressTest, TheBrokersMemoryBooksHoldQuotasAcrossWorkersAndCapacityAcrossTenants) {
  SetUpScheduler();
  sched_->SetMemoryCapacity(0, 1000);
  auto a1 = AddWorker(1, 1);
  auto a2 = AddWorker(2, 1);
  auto b = AddWorker(3, 2);
  sched_->SetMemoryQuota(1, 600);
  auto r = Reserve(*a1, 1, 400);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->verdict, static_cast<uint32_t>(ctl::MemVerdict::kGranted));
  EXPECT_EQ(r->used, 400u);
  EXPECT_EQ(r->seq, 1u);
  // The same tenant's other worker: 400 + 300 > 600.
  r = Reserve(*a2, 2, 300);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->verdict, static_cast<uint32_t>(ctl::MemVerdict::kQuota));
  EXPECT_EQ(r->limit, 600u);
  r = Reserve(*a2, 3, 200);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->verdict, static_cast<uint32_t>(ctl::MemVerdict::kGranted));
  // Another tenant (no quota) meets the device's capacity: 600 held, 500 more is too much.
  r = Reserve(*b, 4, 500);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->verdict, static_cast<uint32_t>(ctl::MemVerdict::kCapacity));
  EXPECT_EQ(r->limit, 1000u);
  // Huge sizes cannot wrap the sums.
  r = Reserve(*b, 5, UINT64_MAX);
  ASSERT_TRUE(r.has_value());
  EXPECT_NE(r->verdict, static_cast<uint32_t>(ctl::MemVerdict::kGranted));
  auto st = Status();
  EXPECT_EQ(MemoryRow(st, "t1")["used"], 600);
  EXPECT_EQ(MemoryRow(st, "t1")["peak"], 600);
  EXPECT_EQ(MemoryRow(st, "t1")["quota"], 600);
  EXPECT_EQ(st["devices"][0]["memory_used"], 600);
  // A worker gives back what it holds; what a dropped worker held goes back with it.
  Free(*a1, 100);
  r = Reserve(*b, 6, 500);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->verdict, static_cast<uint32_t>(ctl::MemVerdict::kGranted));
  a1.reset();  // its channel closes: 300 back
  ASSERT_TRUE(Gone(1).has_value());
  st = Status();
  EXPECT_EQ(MemoryRow(st, "t1")["used"], 200);
  EXPECT_EQ(MemoryRow(st, "t1")["peak"], 600);
  EXPECT_EQ(st["devices"][0]["memory_used"], 700);
}

TEST_F(ExpressTest, AWorkerGivingBackMoreThanItHoldsOrAskingForNothingIsDropped) {
  SetUpScheduler();
  auto w = AddWorker(1, 1);
  ASSERT_TRUE(Reserve(*w, 1, 100).has_value());
  Free(*w, 101);
  EXPECT_EQ(Gone(1), Scheduler::GoneReason::kMalformed);
  auto v = AddWorker(2, 1);
  ctl::MemReserve zero{1, 0, 0, 0};
  ASSERT_TRUE(ctl::Send(v->fd, ctl::Type::kMemReserve, &zero, sizeof(zero), 1).ok());
  EXPECT_EQ(Gone(2), Scheduler::GoneReason::kMalformed);
  auto x = AddWorker(3, 1);
  ctl::MemReserve bad_device{1, 10, 7, 0};
  ASSERT_TRUE(ctl::Send(x->fd, ctl::Type::kMemReserve, &bad_device, sizeof(bad_device), 1).ok());
  EXPECT_EQ(Gone(3), Scheduler::GoneReason::kMalformed);
  // Nothing of theirs stays on the books.
  EXPECT_EQ(Status()["devices"][0]["memory_used"], 0);
}

// The pool's control messages (control.h kLeaseAsk..kLeaseLost) with fake workers: a grant, a
// wait behind it, the hand-over once the holder's data is off, and workers that break the rules.
class PoolControlTest : public ExpressTest {
 protected:
  void SetUp() override {
    auto s = Scheduler::Create({"fifo", {}, {}}, {core::DeviceInfo{}, core::DeviceInfo{}}, 4);
    ASSERT_TRUE(s.ok()) << s.status().message();
    sched_ = std::move(*s);
    PoolOptions o;
    o.wait_s = 30;
    ASSERT_TRUE(sched_->EnablePool({1}, o, {"cpu", "cpu"}).ok());
    sched_->Start([this](uint64_t session, pid_t, Scheduler::GoneReason why) {
      std::lock_guard<std::mutex> lock(mu_);
      gone_[session] = why;
    });
  }
  static void Ask(FakeWorker& w, uint64_t seq) {
    ctl::LeaseAsk a{seq};
    ASSERT_TRUE(ctl::Send(w.fd, ctl::Type::kLeaseAsk, &a, sizeof(a), 1).ok());
  }
  static void Contexts(FakeWorker& w, uint64_t n) {
    ctl::PoolContexts c{n};
    ASSERT_TRUE(ctl::Send(w.fd, ctl::Type::kPoolContexts, &c, sizeof(c), 1).ok());
  }
  static std::optional<ctl::LeaseAnswer> Answer(FakeWorker& w, int ms = 2000) {
    return w.ExpectOne<ctl::LeaseAnswer>(ctl::Type::kLeaseAnswer, ms);
  }
};

TEST_F(PoolControlTest, LeaseIsGrantedHandedOverAfterTheDrainAndGuarded) {
  auto a = AddWorker(1, 1);
  auto b = AddWorker(2, 2);
  Ask(*a, 7);
  auto ga = Answer(*a);
  ASSERT_TRUE(ga.has_value());
  EXPECT_EQ(ga->seq, 7u);
  EXPECT_EQ(ga->verdict, static_cast<uint32_t>(ctl::LeaseVerdict::kGranted));
  EXPECT_EQ(ga->device, 1u);
  Contexts(*a, 1);
  // The other tenant waits: no answer while the device is held.
  Ask(*b, 3);
  EXPECT_FALSE(Answer(*b, 300).has_value());
  // The holder's program ends: it is told, and the device goes on only after it answers.
  Contexts(*a, 0);
  auto lost = a->Expect(ctl::Type::kLeaseLost);
  ASSERT_TRUE(lost.has_value());
  auto l = lost->As<ctl::LeaseLost>();
  ASSERT_EQ(l.size(), 1u);
  EXPECT_EQ(l[0].device, 1u);
  EXPECT_FALSE(Answer(*b, 300).has_value()) << "granted before the holder's data was off";
  ctl::Swapped sw;
  sw.epoch = l[0].epoch;
  sw.device = 1;
  sw.out = 1;
  ASSERT_TRUE(ctl::Send(a->fd, ctl::Type::kSwapped, &sw, sizeof(sw), 1).ok());
  auto gb = Answer(*b);
  ASSERT_TRUE(gb.has_value());
  EXPECT_EQ(gb->verdict, static_cast<uint32_t>(ctl::LeaseVerdict::kGranted));
  // Work on the pool device from a tenant that no longer holds it ends that worker.
  a->Ready(1);  // device 0: fine
  ctl::Ready r;
  r.cmd = 2;
  r.work_items = 1;
  r.work_groups = 1;
  r.device = 1;
  ASSERT_TRUE(ctl::Send(a->fd, ctl::Type::kReady, &r, sizeof(r), 1).ok());
  EXPECT_EQ(Gone(1), Scheduler::GoneReason::kMalformed);
  EXPECT_FALSE(Gone(2, 100).has_value());
  // A worker flooding the broker with asks is ended too.
  auto c = AddWorker(3, 3);
  for (uint64_t seq = 1; seq <= 9; ++seq) Ask(*c, seq);
  EXPECT_EQ(Gone(3), Scheduler::GoneReason::kMalformed);
  EXPECT_EQ(nlohmann::json::parse(sched_->LeaseList(std::nullopt))["leases"].size(), 1u);
}

}  // namespace
}  // namespace gmux::daemon
