// Where a blocking call's time goes: timestamps of its stages in the ICD and the worker, for
// the latency figures of docs/performance.md ("A blocking launch, stage by stage"). A build
// option (cmake -DGMUX_STAGE_TRACE=ON); without it GMUX_STAGE() compiles to nothing.
//
// With it, each process records (stage, CLOCK_MONOTONIC ns) pairs in memory, up to 2^21 of
// them, and writes them when it ends to $GMUX_STAGE_TRACE_DIR/<pid>.stages, one "stage ns" per
// line (nothing is recorded without the variable). The clock is the host's, so the files of
// the client and its worker line up; scripts/stage-trace.py pairs them into per-stage
// percentiles. The stages, in the order a blocking launch + clFinish passes them:
//   0  the ICD begins a call that waits for its reply (icd/connection.cc, Connection::Call)
//   1  the worker has a request decoded (daemon/session.cc, Session::Serve)
//   2  the worker hands the batch before a blocking request to its queue (Session::Serve)
//   3  the executor starts putting commands on the backend (daemon/executor.cc, Executor::Run)
//   4  the backend has them, flushed (Executor::Run)
//   5  the backend's completion callback runs (Executor::OnEvent)
//   6  the worker has written a reply (daemon/session.cc, SessionCore::Send)
//   7  the ICD has the reply (Connection::Call)
#pragma once

#ifdef GMUX_STAGE_TRACE

#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace gmux::stage_trace {

struct Record {
  uint32_t stage;
  uint64_t ns;
};

inline constexpr uint32_t kMaxRecords = 1u << 21;

struct Log {
  bool on = std::getenv("GMUX_STAGE_TRACE_DIR") != nullptr;
  std::atomic<uint32_t> n{0};
  Record* records = on ? new Record[kMaxRecords] : nullptr;

  void Add(uint32_t stage) {
    if (!on) return;
    timespec ts;
    ::clock_gettime(CLOCK_MONOTONIC, &ts);
    const uint32_t i = n.fetch_add(1, std::memory_order_relaxed);
    if (i < kMaxRecords) {
      records[i] = {stage, static_cast<uint64_t>(ts.tv_sec) * 1000000000ull +
                               static_cast<uint64_t>(ts.tv_nsec)};
    }
  }
  // Writes what was recorded (once; later calls write nothing).
  void Write() {
    if (!on) return;
    on = false;
    const char* dir = std::getenv("GMUX_STAGE_TRACE_DIR");
    if (dir == nullptr) return;
    const std::string path = std::string(dir) + "/" + std::to_string(::getpid()) + ".stages";
    FILE* f = std::fopen(path.c_str(), "w");
    if (f == nullptr) return;
    uint32_t count = n.load();
    if (count > kMaxRecords) count = kMaxRecords;
    for (uint32_t i = 0; i < count; ++i) {
      std::fprintf(f, "%u %llu\n", records[i].stage,
                   static_cast<unsigned long long>(records[i].ns));
    }
    std::fclose(f);
  }
  ~Log() { Write(); }
};

inline Log& TheLog() {
  static Log log;
  return log;
}

}  // namespace gmux::stage_trace

#define GMUX_STAGE(n) ::gmux::stage_trace::TheLog().Add(n)
#define GMUX_STAGE_WRITE() ::gmux::stage_trace::TheLog().Write()

#else

#define GMUX_STAGE(n) ((void)0)
#define GMUX_STAGE_WRITE() ((void)0)

#endif
