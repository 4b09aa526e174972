// The usage ledger against a real SQLite file, fed by a counter source the test controls.
#include "daemon/ledger.h"

#include <gtest/gtest.h>
#include <sqlite3.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <mutex>

namespace gmux::daemon {
namespace {

class LedgerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/gmux-ledger-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    path_ = dir_ + "/usage.db";
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  // The counters the source returns (cumulative), changed by the test between bookings.
  void Set(const std::string& tenant, uint32_t device, double device_s, uint64_t commands,
           uint64_t bytes = 0, double memory = 0, double lease = 0) {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& r : rows_) {
      if (r.tenant == tenant && r.device == device) {
        r.counters = {device_s, commands, bytes, memory, lease};
        return;
      }
    }
    rows_.push_back({tenant, device, {device_s, commands, bytes, memory, lease}});
  }
  Ledger::Source Source() {
    return [this]() -> std::optional<std::vector<Scheduler::UsageRow>> {
      std::lock_guard<std::mutex> lock(mu_);
      if (fail_) return std::nullopt;
      return rows_;
    };
  }
  double Sum(const std::string& tenant) {
    LedgerQuery q;
    q.tenant = tenant;
    auto e = Ledger::Query(path_, q);
    EXPECT_TRUE(e.ok()) << e.status().message();
    double s = 0;
    for (const auto& x : *e) s += x.device_s;
    return s;
  }

  std::string dir_, path_;
  std::mutex mu_;
  std::vector<Scheduler::UsageRow> rows_;
  bool fail_ = false;
};

TEST_F(LedgerTest, BooksDifferencesPerIntervalAndSkipsIdleOnes) {
  auto l = Ledger::Open(path_, 3600, {"cpu0", "cpu1"});
  ASSERT_TRUE(l.ok()) << l.status().message();
  ASSERT_TRUE((*l)->Start(Source()).ok());
  Set("a", 0, 1.5, 10, 4096);
  Set("b", 1, 0.25, 3, 0, 1e6, 2.0);
  ASSERT_TRUE((*l)->BookNow().ok());
  Set("a", 0, 4.0, 30, 8192);  // b idle in the second interval: no row for it
  ASSERT_TRUE((*l)->BookNow().ok());
  ASSERT_TRUE((*l)->BookNow().ok());  // nobody used anything: no rows at all
  LedgerQuery rows;
  rows.rows = true;
  auto all = Ledger::Query(path_, rows);
  ASSERT_TRUE(all.ok()) << all.status().message();
  ASSERT_EQ(all->size(), 3u);
  EXPECT_EQ((*all)[0].tenant == "a" ? (*all)[0].device_name : (*all)[1].device_name, "cpu0");
  const LedgerEntry& second = (*all)[2];
  EXPECT_EQ(second.tenant, "a");
  EXPECT_DOUBLE_EQ(second.device_s, 2.5);
  EXPECT_EQ(second.commands, 20u);
  EXPECT_EQ(second.bytes, 4096u);
  EXPECT_LE((*all)[0].end, second.start + 1e-9);
  // Sums per tenant and device.
  auto sums = Ledger::Query(path_, LedgerQuery{});
  ASSERT_TRUE(sums.ok());
  ASSERT_EQ(sums->size(), 2u);
  EXPECT_EQ((*sums)[0].tenant, "a");
  EXPECT_DOUBLE_EQ((*sums)[0].device_s, 4.0);
  EXPECT_EQ((*sums)[0].commands, 30u);
  EXPECT_EQ((*sums)[0].bytes, 8192u);
  EXPECT_EQ((*sums)[0].rows, 2u);
  EXPECT_EQ((*sums)[1].tenant, "b");
  EXPECT_DOUBLE_EQ((*sums)[1].memory_byte_s, 1e6);
  EXPECT_DOUBLE_EQ((*sums)[1].lease_s, 2.0);
  EXPECT_EQ((*sums)[1].device, 1u);
  (*l)->Stop();
}

TEST_F(LedgerTest, AFailedTakeIsBookedWithTheNextAndStopBooksTheRest) {
  auto l = Ledger::Open(path_, 3600, {"cpu0"});
  ASSERT_TRUE(l.ok());
  ASSERT_TRUE((*l)->Start(Source()).ok());
  Set("a", 0, 1.0, 1);
  ASSERT_TRUE((*l)->BookNow().ok());
  Set("a", 0, 2.0, 2);
  fail_ = true;
  EXPECT_FALSE((*l)->BookNow().ok());
  fail_ = false;
  Set("a", 0, 3.0, 3);
  (*l)->Stop();  // books 1.0 -> 3.0
  EXPECT_DOUBLE_EQ(Sum("a"), 3.0);
  EXPECT_EQ((*l)->intervals_booked(), 2u);
}

TEST_F(LedgerTest, TheThreadBooksEveryInterval) {
  auto l = Ledger::Open(path_, 0.05, {"cpu0"});
  ASSERT_TRUE(l.ok());
  Set("a", 0, 0.5, 5);
  ASSERT_TRUE((*l)->Start(Source()).ok());
  for (int i = 0; i < 400 && Sum("a") < 0.5; ++i) ::usleep(10000);
  EXPECT_DOUBLE_EQ(Sum("a"), 0.5);
  Set("a", 0, 0.75, 6);
  for (int i = 0; i < 400 && Sum("a") < 0.75; ++i) ::usleep(10000);
  EXPECT_DOUBLE_EQ(Sum("a"), 0.75);
  (*l)->Stop();
}

TEST_F(LedgerTest, QueriesFilterByTimeAndTenant) {
  auto l = Ledger::Open(path_, 3600, {"cpu0"});
  ASSERT_TRUE(l.ok());
  ASSERT_TRUE((*l)->Start(Source()).ok());
  Set("a", 0, 1.0, 1);
  Set("b", 0, 2.0, 1);
  ASSERT_TRUE((*l)->BookNow().ok());
  (*l)->Stop();
  LedgerQuery future;
  future.since = 4e9;  // year 2096: nothing ends after it
  auto none = Ledger::Query(path_, future);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
  LedgerQuery past;
  past.until = 1;  // nothing started before 1970-01-01 00:00:01
  EXPECT_TRUE(Ledger::Query(path_, past)->empty());
  EXPECT_DOUBLE_EQ(Sum("b"), 2.0);
  EXPECT_DOUBLE_EQ(Sum("nobody"), 0.0);
}

TEST_F(LedgerTest, ReopeningKeepsTheBooksAndRecordsRuns) {
  for (int run = 1; run <= 2; ++run) {
    auto l = Ledger::Open(path_, 3600, {"cpu0"});
    ASSERT_TRUE(l.ok()) << l.status().message();
    rows_.clear();
    ASSERT_TRUE((*l)->Start(Source()).ok());
    Set("a", 0, 1.0, 1);  // each run's counters start at zero
    (*l)->Stop();
  }
  EXPECT_DOUBLE_EQ(Sum("a"), 2.0);
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path_.c_str(), &db), SQLITE_OK);
  sqlite3_stmt* st = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(db, "SELECT COUNT(*) FROM runs", -1, &st, nullptr), SQLITE_OK);
  ASSERT_EQ(sqlite3_step(st), SQLITE_ROW);
  EXPECT_EQ(sqlite3_column_int(st, 0), 2);
  sqlite3_finalize(st);
  sqlite3_close(db);
}

TEST_F(LedgerTest, RefusesFilesItCannotUse) {
  // A file from a newer gmux (a schema version above ours) is left alone.
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path_.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "PRAGMA user_version = 99", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(db);
  auto newer = Ledger::Open(path_, 10, {});
  ASSERT_FALSE(newer.ok());
  EXPECT_NE(newer.status().message().find("schema version 99"), std::string::npos);
  EXPECT_FALSE(Ledger::Query(path_, LedgerQuery{}).ok());
  // Not SQLite at all.
  const std::string text = dir_ + "/notes.txt";
  std::ofstream(text) << "these are not the books you are looking for\n";
  auto garbage = Ledger::Open(text, 10, {});
  ASSERT_FALSE(garbage.ok());
  EXPECT_NE(garbage.status().message().find(text), std::string::npos);
  // A directory that does not exist.
  auto missing = Ledger::Open(dir_ + "/no/such/dir/usage.db", 10, {});
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("cannot open"), std::string::npos);
  // A file someone else could have prepared: a symlink, writable by others, another owner's,
  // or carrying a trigger that would rewrite the books.
  const std::string real = dir_ + "/real.db";
  ASSERT_TRUE(Ledger::Open(real, 10, {}).ok());
  const std::string link = dir_ + "/link.db";
  ASSERT_EQ(::symlink(real.c_str(), link.c_str()), 0);
  auto linked = Ledger::Open(link, 10, {});
  ASSERT_FALSE(linked.ok());
  EXPECT_NE(linked.status().message().find("symlink"), std::string::npos);
  ASSERT_EQ(::chmod(real.c_str(), 0666), 0);
  EXPECT_FALSE(Ledger::Open(real, 10, {}).ok());
  ASSERT_EQ(::chmod(real.c_str(), 0640), 0);
  {
    sqlite3* t = nullptr;
    ASSERT_EQ(sqlite3_open(real.c_str(), &t), SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(t, "CREATE TRIGGER forge AFTER INSERT ON usage BEGIN "
                              "UPDATE usage SET device_s = 0 WHERE id = NEW.id; END",
                           nullptr, nullptr, nullptr),
              SQLITE_OK);
    sqlite3_close(t);
  }
  auto forged = Ledger::Open(real, 10, {});
  ASSERT_FALSE(forged.ok());
  EXPECT_NE(forged.status().message().find("trigger"), std::string::npos);
  if (::geteuid() == 0) {
    const std::string theirs = dir_ + "/theirs.db";
    ASSERT_TRUE(Ledger::Open(theirs, 10, {}).ok());
    ASSERT_EQ(::chown(theirs.c_str(), 65534, 65534), 0);
    auto other = Ledger::Open(theirs, 10, {});
    ASSERT_FALSE(other.ok());
    EXPECT_NE(other.status().message().find("uid 65534"), std::string::npos);
  }
  // A bad interval.
  EXPECT_FALSE(Ledger::Open(dir_ + "/x.db", 0, {}).ok());
}

}  // namespace
}  // namespace gmux::daemon
