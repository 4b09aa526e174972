#include "daemon/ledger.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

#include <spdlog/spdlog.h>

namespace gmux::daemon {
namespace {

double WallNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

Status SqlError(sqlite3* db, const std::string& what) {
  return Unavailable("ledger: " + what + ": " + (db ? sqlite3_errmsg(db) : "out of memory"));
}

Status Exec(sqlite3* db, const char* sql) {
  char* err = nullptr;
  if (sqlite3_exec(db, sql, nullptr, nullptr, &err) != SQLITE_OK) {
    std::string message = err ? err : sqlite3_errmsg(db);
    sqlite3_free(err);
    return Unavailable("ledger: " + message);
  }
  return Status::Ok();
}

// A prepared statement, finalized when it goes.
class Stmt {
 public:
  Stmt(sqlite3* db, const char* sql) { rc_ = sqlite3_prepare_v2(db, sql, -1, &s_, nullptr); }
  ~Stmt() { sqlite3_finalize(s_); }
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;
  bool ok() const { return rc_ == SQLITE_OK; }
  sqlite3_stmt* get() const { return s_; }

 private:
  sqlite3_stmt* s_ = nullptr;
  int rc_ = SQLITE_ERROR;
};

// Migrations: kSteps[v] takes a file of schema version v to v + 1. A schema change adds a step;
// steps are never edited once released (files in the field are at every earlier version).
constexpr const char* kSteps[] = {
    // 0 -> 1: the first schema.
    "CREATE TABLE usage ("
    "  id INTEGER PRIMARY KEY,"
    "  start REAL NOT NULL,"          // Unix seconds
    "  end REAL NOT NULL,"
    "  tenant TEXT NOT NULL,"
    "  device INTEGER NOT NULL,"      // gmuxd's device index
    "  device_name TEXT NOT NULL,"
    "  device_s REAL NOT NULL,"
    "  commands INTEGER NOT NULL,"
    "  bytes INTEGER NOT NULL,"
    "  memory_byte_s REAL NOT NULL,"
    "  lease_s REAL NOT NULL,"
    "  run INTEGER NOT NULL);"
    "CREATE INDEX usage_end ON usage(end);"
    "CREATE INDEX usage_tenant_end ON usage(tenant, end);"
    "CREATE TABLE runs ("
    "  id INTEGER PRIMARY KEY,"
    "  started REAL NOT NULL,"
    "  stopped REAL,"                 // the last booking (a killed run's last sign of life)
    "  pid INTEGER NOT NULL,"
    "  host TEXT NOT NULL);",
};
static_assert(std::size(kSteps) == kLedgerSchemaVersion);

int UserVersion(sqlite3* db) {
  Stmt st(db, "PRAGMA user_version");
  if (!st.ok() || sqlite3_step(st.get()) != SQLITE_ROW) return -1;
  return sqlite3_column_int(st.get(), 0);
}

Status Migrate(sqlite3* db, const std::string& path) {
  int version = UserVersion(db);
  if (version < 0) return SqlError(db, "cannot read the schema version of " + path);
  if (version > kLedgerSchemaVersion) {
    return FailedPrecondition("ledger " + path + " has schema version " +
                              std::to_string(version) + "; this gmux knows versions up to " +
                              std::to_string(kLedgerSchemaVersion) +
                              " (written by a newer gmux: use it, or another file)");
  }
  for (; version < kLedgerSchemaVersion; ++version) {
    GMUX_RETURN_IF_ERROR(Exec(db, "BEGIN IMMEDIATE"));
    Status s = Exec(db, kSteps[version]);
    if (s.ok()) {
      const std::string pragma = "PRAGMA user_version = " + std::to_string(version + 1);
      s = Exec(db, pragma.c_str());
    }
    if (s.ok()) s = Exec(db, "COMMIT");
    if (!s.ok()) {
      Exec(db, "ROLLBACK").IgnoreError();
      return FailedPrecondition("ledger " + path + ": migrating schema version " +
                                std::to_string(version) + " to " + std::to_string(version + 1) +
                                " failed: " + s.message());
    }
  }
  return Status::Ok();
}

Result<std::vector<LedgerEntry>> RunQuery(sqlite3* db, const LedgerQuery& q) {
  const char* sums =
      "SELECT MIN(start), MAX(end), tenant, device, MAX(device_name), SUM(device_s),"
      " SUM(commands), SUM(bytes), SUM(memory_byte_s), SUM(lease_s), COUNT(*) FROM usage"
      " WHERE end > ?1 AND (?2 <= 0 OR start < ?2) AND (?3 IS NULL OR tenant = ?3)"
      " GROUP BY tenant, device ORDER BY tenant, device";
  const char* rows =
      "SELECT start, end, tenant, device, device_name, device_s, commands, bytes,"
      " memory_byte_s, lease_s, 1 FROM usage"
      " WHERE end > ?1 AND (?2 <= 0 OR start < ?2) AND (?3 IS NULL OR tenant = ?3)"
      " ORDER BY end DESC, tenant, device LIMIT ?4";
  Stmt st(db, q.rows ? rows : sums);
  if (!st.ok()) return SqlError(db, "query");
  sqlite3_bind_double(st.get(), 1, q.since);
  sqlite3_bind_double(st.get(), 2, q.until);
  if (q.tenant) {
    sqlite3_bind_text(st.get(), 3, q.tenant->c_str(), static_cast<int>(q.tenant->size()),
                      SQLITE_TRANSIENT);
  } else {
    sqlite3_bind_null(st.get(), 3);
  }
  if (q.rows) {
    sqlite3_bind_int64(st.get(), 4, static_cast<sqlite3_int64>(
                                        std::min<uint64_t>(q.max_rows, INT64_MAX)));
  }
  std::vector<LedgerEntry> out;
  int rc;
  auto text = [&](int col) {
    const unsigned char* t = sqlite3_column_text(st.get(), col);
    return t ? std::string(reinterpret_cast<const char*>(t)) : std::string();
  };
  while ((rc = sqlite3_step(st.get())) == SQLITE_ROW) {
    LedgerEntry e;
    e.start = sqlite3_column_double(st.get(), 0);
    e.end = sqlite3_column_double(st.get(), 1);
    e.tenant = text(2);
    e.device = static_cast<uint32_t>(sqlite3_column_int64(st.get(), 3));
    e.device_name = text(4);
    e.device_s = sqlite3_column_double(st.get(), 5);
    e.commands = static_cast<uint64_t>(sqlite3_column_int64(st.get(), 6));
    e.bytes = static_cast<uint64_t>(sqlite3_column_int64(st.get(), 7));
    e.memory_byte_s = sqlite3_column_double(st.get(), 8);
    e.lease_s = sqlite3_column_double(st.get(), 9);
    e.rows = static_cast<uint64_t>(sqlite3_column_int64(st.get(), 10));
    out.push_back(std::move(e));
  }
  if (rc != SQLITE_DONE) return SqlError(db, "query");
  if (q.rows) std::reverse(out.begin(), out.end());  // oldest first
  return out;
}

}  // namespace

nlohmann::json LedgerEntryJson(const LedgerEntry& e) {
  return {{"tenant", e.tenant},     {"device", e.device},     {"device_name", e.device_name},
          {"start", e.start},       {"end", e.end},           {"device_s", e.device_s},
          {"commands", e.commands}, {"bytes", e.bytes},       {"memory_byte_s", e.memory_byte_s},
          {"lease_s", e.lease_s},   {"intervals", e.rows}};
}

Result<std::unique_ptr<Ledger>> Ledger::Open(const std::string& path, double interval_s,
                                             std::vector<std::string> device_names) {
  if (path.empty()) return InvalidArgument("ledger: no file given");
  if (!(interval_s > 0)) return InvalidArgument("ledger: the interval must be > 0");
  // The books are gmuxd's: a file someone else made (in a shared directory, say) could carry
  // triggers that rewrite them, or be read by others. Refused, as is a symlink.
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) {
    if (S_ISLNK(st.st_mode)) return FailedPrecondition("ledger: " + path + " is a symlink");
    if (!S_ISREG(st.st_mode)) return FailedPrecondition("ledger: " + path + " is not a file");
    if (st.st_uid != ::geteuid()) {
      return FailedPrecondition("ledger: " + path + " belongs to uid " +
                                std::to_string(st.st_uid) + ", not to gmuxd's user");
    }
    if ((st.st_mode & 022) != 0) {
      return FailedPrecondition("ledger: " + path + " is writable by others (chmod 640 it)");
    }
  }
  auto l = std::unique_ptr<Ledger>(new Ledger());
  l->path_ = path;
  l->interval_s_ = interval_s;
  l->device_names_ = std::move(device_names);
  // Every tenant's usage is in the file: readable by gmuxd's user (and group) only.
  const mode_t old_mask = ::umask(027);
  const int rc = sqlite3_open_v2(path.c_str(), &l->db_,
                                 SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                                 nullptr);
  ::umask(old_mask);
  if (rc != SQLITE_OK) {
    return Unavailable("ledger: cannot open " + path + ": " +
                       (l->db_ ? sqlite3_errmsg(l->db_) : "out of memory"));
  }
  sqlite3_busy_timeout(l->db_, 5000);
  // WAL: a committed interval is in the WAL file before COMMIT returns, so SIGKILL keeps it;
  // readers (gmux usage) never block the writer.
  {
    Stmt wal(l->db_, "PRAGMA journal_mode=WAL");
    if (!wal.ok() || sqlite3_step(wal.get()) != SQLITE_ROW) {
      return Unavailable("ledger: " + path + " is not a usable SQLite file: " +
                         sqlite3_errmsg(l->db_));
    }
  }
  GMUX_RETURN_IF_ERROR(Exec(l->db_, "PRAGMA synchronous=NORMAL"));
  GMUX_RETURN_IF_ERROR(Migrate(l->db_, path));
  {
    // gmux's schema has no triggers or views: anything of the kind was put there by someone else.
    Stmt extra(l->db_, "SELECT name FROM sqlite_master WHERE type IN ('trigger', 'view')");
    if (extra.ok() && sqlite3_step(extra.get()) == SQLITE_ROW) {
      return FailedPrecondition("ledger: " + path + " has a trigger or view gmux did not make");
    }
  }
  return l;
}

Ledger::~Ledger() {
  Stop();
  if (db_ != nullptr) sqlite3_close_v2(db_);
}

Status Ledger::Start(Source source) {
  std::lock_guard<std::mutex> lock(mu_);
  if (thread_.joinable()) return Status::Ok();
  source_ = std::move(source);
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  Stmt st(db_, "INSERT INTO runs(started, stopped, pid, host) VALUES (?1, ?1, ?2, ?3)");
  if (!st.ok()) return SqlError(db_, "recording the run");
  last_book_ = WallNow();
  last_alive_ = last_book_;
  sqlite3_bind_double(st.get(), 1, last_book_);
  sqlite3_bind_int64(st.get(), 2, ::getpid());
  sqlite3_bind_text(st.get(), 3, host, -1, SQLITE_TRANSIENT);
  if (sqlite3_step(st.get()) != SQLITE_DONE) return SqlError(db_, "recording the run");
  run_id_ = sqlite3_last_insert_rowid(db_);
  stop_ = false;
  thread_ = std::thread([this] { Loop(); });
  return Status::Ok();
}

void Ledger::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  auto next = std::chrono::steady_clock::now();
  for (;;) {
    next += std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::chrono::duration<double>(interval_s_));
    if (cv_.wait_until(lock, next, [this] { return stop_; })) return;
    lock.unlock();
    Status s = BookNow();
    lock.lock();
    if (!s.ok() && s.message() != last_error_) {
      // Logged once per distinct failure (a full disk would otherwise log every interval);
      // the counters keep growing, so the next successful booking includes what was missed.
      spdlog::warn("{}", s.message());
    }
    if (!s.ok()) last_error_ = s.message();
  }
}

Status Ledger::BookNow() {
  // One booking at a time (the thread's, Stop()'s, a test's); the source is called outside mu_
  // because it waits for the scheduler thread.
  std::lock_guard<std::mutex> one(booking_mu_);
  Source source;
  {
    std::lock_guard<std::mutex> lock(mu_);
    source = source_;
  }
  if (!source) return FailedPrecondition("ledger: not started");
  std::optional<std::vector<Scheduler::UsageRow>> rows = source();
  if (!rows) return Unavailable("ledger: the scheduler did not answer; booked next time");
  const double now = WallNow();
  std::lock_guard<std::mutex> lock(mu_);
  GMUX_RETURN_IF_ERROR(Exec(db_, "BEGIN IMMEDIATE"));
  auto fail = [&](const std::string& what) {
    Status s = SqlError(db_, what);
    Exec(db_, "ROLLBACK").IgnoreError();
    return s;
  };
  Stmt ins(db_,
           "INSERT INTO usage(start, end, tenant, device, device_name, device_s, commands,"
           " bytes, memory_byte_s, lease_s, run) VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11)");
  if (!ins.ok()) return fail("booking");
  auto next = previous_;
  size_t booked_rows = 0;
  for (const Scheduler::UsageRow& r : *rows) {
    Scheduler::UsageCounters& prev = next[{r.tenant, r.device}];
    const Scheduler::UsageCounters& cur = r.counters;
    // Counters only grow within a run; a smaller value would be a bug, booked as nothing.
    const double device_s = std::max(0.0, cur.device_s - prev.device_s);
    const uint64_t commands = cur.commands > prev.commands ? cur.commands - prev.commands : 0;
    const uint64_t bytes = cur.bytes > prev.bytes ? cur.bytes - prev.bytes : 0;
    const double memory = std::max(0.0, cur.memory_byte_s - prev.memory_byte_s);
    const double lease = std::max(0.0, cur.lease_s - prev.lease_s);
    prev = cur;
    if (device_s == 0 && commands == 0 && bytes == 0 && memory == 0 && lease == 0) continue;
    const std::string name =
        r.device < device_names_.size() ? device_names_[r.device] : std::string();
    sqlite3_stmt* s = ins.get();
    sqlite3_reset(s);
    sqlite3_bind_double(s, 1, last_book_);
    sqlite3_bind_double(s, 2, now);
    sqlite3_bind_text(s, 3, r.tenant.c_str(), static_cast<int>(r.tenant.size()), SQLITE_TRANSIENT);
    sqlite3_bind_int64(s, 4, r.device);
    sqlite3_bind_text(s, 5, name.c_str(), static_cast<int>(name.size()), SQLITE_TRANSIENT);
    sqlite3_bind_double(s, 6, device_s);
    sqlite3_bind_int64(s, 7, static_cast<sqlite3_int64>(commands));
    sqlite3_bind_int64(s, 8, static_cast<sqlite3_int64>(bytes));
    sqlite3_bind_double(s, 9, memory);
    sqlite3_bind_double(s, 10, lease);
    sqlite3_bind_int64(s, 11, run_id_);
    if (sqlite3_step(s) != SQLITE_DONE) return fail("booking");
    ++booked_rows;
  }
  if (booked_rows == 0 && now - last_alive_ < 60) {
    // Idle: nothing to write (the run's sign of life is refreshed once a minute).
    Exec(db_, "ROLLBACK").IgnoreError();
    previous_ = std::move(next);
    last_book_ = now;
    return Status::Ok();
  }
  Stmt run(db_, "UPDATE runs SET stopped = ?1 WHERE id = ?2");
  if (!run.ok()) return fail("booking");
  sqlite3_bind_double(run.get(), 1, now);
  sqlite3_bind_int64(run.get(), 2, run_id_);
  if (sqlite3_step(run.get()) != SQLITE_DONE) return fail("booking");
  if (Exec(db_, "COMMIT").ok() == false) return fail("commit");
  // Only a committed interval moves the baseline: a failed one is booked with the next.
  previous_ = std::move(next);
  last_book_ = now;
  last_alive_ = now;
  ++booked_;
  last_error_.clear();
  return Status::Ok();
}

void Ledger::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!thread_.joinable()) return;
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  Status s = BookNow();
  if (!s.ok()) spdlog::warn("{}", s.message());
}

Result<std::vector<LedgerEntry>> Ledger::Query(const std::string& path, const LedgerQuery& q) {
  // Read-only. A WAL file normally needs its -shm file (or a writable directory) even to read;
  // after a clean stop both are gone, and a reader in gmuxd's group may not create them: then
  // the file is read as immutable (no writer runs, or its last commit is already in the file).
  Status first = Status::Ok();
  for (const bool immutable : {false, true}) {
    sqlite3* db = nullptr;
    const std::string uri = "file:" + path + (immutable ? "?immutable=1" : "?mode=ro");
    const int rc = sqlite3_open_v2(uri.c_str(), &db, SQLITE_OPEN_READONLY | SQLITE_OPEN_URI,
                                   nullptr);
    if (rc != SQLITE_OK) {
      Status s = Unavailable("ledger: cannot open " + path + ": " +
                             (db ? sqlite3_errmsg(db) : "out of memory"));
      sqlite3_close_v2(db);
      if (first.ok()) first = s;
      continue;
    }
    sqlite3_busy_timeout(db, 5000);
    const int version = UserVersion(db);
    Result<std::vector<LedgerEntry>> out = Status::Ok();
    if (version < 0) {
      out = Unavailable("ledger: cannot read " + path + ": " + sqlite3_errmsg(db));
    } else if (version != kLedgerSchemaVersion) {
      out = FailedPrecondition(
          "ledger " + path + " has schema version " + std::to_string(version) +
          (version == 0 ? " (not a gmux ledger, or never written)"
                        : ", this gmux reads version " + std::to_string(kLedgerSchemaVersion)));
    } else {
      out = RunQuery(db, q);
    }
    sqlite3_close_v2(db);
    if (out.ok() || version >= 0) return out;  // a real answer, or a real schema mismatch
    if (first.ok()) first = out.status();
  }
  return first;
}

uint64_t Ledger::intervals_booked() const {
  std::lock_guard<std::mutex> lock(mu_);
  return booked_;
}

std::string Ledger::last_error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_error_;
}

}  // namespace gmux::daemon
