// Ledger: gmuxd's usage books in SQLite (`[daemon] ledger`, a file path; off when empty).
//
// Every `interval_s` (10 s by default) a thread of its own takes the scheduler's cumulative
// per-tenant, per-device counters (Scheduler::Usage: device time, commands, transfer bytes,
// memory byte-seconds, lease time), subtracts the previous take, and commits one row per tenant
// and device that used anything in the interval, all rows of an interval in one transaction.
// Nothing is counted on the dispatch path for it: the scheduler keeps the counters anyway.
//
// Durability: the database is in WAL mode with synchronous=NORMAL, so a committed interval
// survives gmuxd being killed (SIGKILL, a crash: the WAL is in the kernel's page cache) and a
// power loss loses at most the last few commits. A kill loses the interval in progress only;
// a stop (SIGTERM) books it first. Rows carry wall-clock times (Unix seconds), so the books of
// several runs of gmuxd line up.
//
// Schema (versioned with PRAGMA user_version; Open() migrates an older file step by step in one
// transaction each, and refuses a file from a newer gmux):
//   usage(id, start, end, tenant, device, device_name, device_s, commands, bytes,
//         memory_byte_s, lease_s)        -- one row per tenant x device x interval
//   runs(id, started, stopped, pid, host) -- each gmuxd run that wrote to the file
// Queries (Query) sum rows over a time range and an optional tenant, per tenant and device, or
// return the rows themselves; they run on a connection of their own, never blocking the writer.
#pragma once

#include <sqlite3.h>

#include <nlohmann/json.hpp>

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/status.h"
#include "daemon/scheduler.h"

namespace gmux::daemon {

inline constexpr int kLedgerSchemaVersion = 1;

// One booked amount: a row of the usage table, or a sum of rows.
struct LedgerEntry {
  double start = 0, end = 0;  // Unix seconds (sums: the first row's start, the last row's end)
  std::string tenant;
  uint32_t device = 0;
  std::string device_name;
  double device_s = 0;
  uint64_t commands = 0;
  uint64_t bytes = 0;
  double memory_byte_s = 0;
  double lease_s = 0;
  uint64_t rows = 1;  // sums: how many rows were added up
};

// An entry as `gmux usage --json` shows it (gmuxd's answer and a file read directly alike).
nlohmann::json LedgerEntryJson(const LedgerEntry& e);

struct LedgerQuery {
  double since = 0;                  // rows that end after this (Unix seconds); 0: all
  double until = 0;                  // rows that start before this; 0: no bound
  std::optional<std::string> tenant;
  bool rows = false;                 // the rows themselves instead of sums per tenant x device
  uint64_t max_rows = 100000;        // rows: at most this many (the newest)
};

class Ledger {
 public:
  // Where the cumulative counters come from (Scheduler::Usage in gmuxd).
  using Source = std::function<std::optional<std::vector<Scheduler::UsageRow>>()>;

  // Opens (creating or migrating) the database at `path`; starts nothing.
  static Result<std::unique_ptr<Ledger>> Open(const std::string& path, double interval_s,
                                              std::vector<std::string> device_names);
  ~Ledger();

  // Starts the booking thread. A run row is written at once.
  Status Start(Source source);
  // Books the interval in progress and stops the thread (idempotent).
  void Stop();
  // Books now (the interval so far), as the thread does at each tick; tests and Stop().
  Status BookNow();

  // Opens `path` read-only and answers `q` (gmux usage reads the file directly with this when
  // it has no daemon to ask).
  static Result<std::vector<LedgerEntry>> Query(const std::string& path, const LedgerQuery& q);
  const std::string& path() const { return path_; }
  uint64_t intervals_booked() const;
  std::string last_error() const;

 private:
  Ledger() = default;
  void Loop();

  std::string path_;
  double interval_s_ = 10;
  std::vector<std::string> device_names_;
  sqlite3* db_ = nullptr;  // the writer's connection (the booking thread, or Stop/BookNow)
  Source source_;
  int64_t run_id_ = 0;
  double last_book_ = 0;  // Unix seconds: the end of the last booked interval
  double last_alive_ = 0;  // Unix seconds: the runs row's last update
  std::map<std::pair<std::string, uint32_t>, Scheduler::UsageCounters> previous_;
  std::mutex booking_mu_;  // one booking at a time
  mutable std::mutex mu_;  // guards everything above once the thread runs, and the fields below
  std::condition_variable cv_;
  bool stop_ = false;
  uint64_t booked_ = 0;
  std::string last_error_;
  std::thread thread_;
};

}  // namespace gmux::daemon
