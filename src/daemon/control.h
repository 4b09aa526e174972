// The control channel between gmuxd (the broker) and one worker process.
//
// A SOCK_SEQPACKET socketpair: each datagram is one message, a Header followed by `count`
// fixed-size records of the header's type (so a batch of releases or completions costs one
// system call and one wake-up). The broker trusts nothing a worker sends: a worker runs tenant
// code (kernels on a CPU device run in its address space), so every record is checked against
// what the broker itself handed that worker, and a worker that sends anything malformed is
// killed. Records are plain structs of fixed-width fields; both ends are the same build.
//
//   worker -> broker   kWorkerUp    the backend is open; the worker waits for kAssign
//                      kReady       commands whose dependencies allow them to run (for the policy)
//                      kDone        a released dispatch finished, with its profiled device time
//                      kStatsQuery  the client asked for Stats (answered with kStatsReply)
//   broker -> worker   kAssign      the session (with the client's socket as SCM_RIGHTS)
//                      kRelease     run this command, or this chunk of it, now
//                      kStatsReply  the scheduler's JSON as this tenant may see it
//                      kLimits      the session's new share of its tenant's limits (one record)
//                      kExpress     express dispatch on a device granted (slots > 0) or revoked
//   worker -> broker   kExpressEnd  a revoke taken: no express Ready follows for that grant
//   worker -> broker   kMemReserve  device memory for an allocation, against the tenant's quota
//                                   and the device's managed capacity (answered by kMemAnswer)
//   broker -> worker   kMemAnswer   granted or why not
//   worker -> broker   kMemFree     memory of a released object given back
//   broker -> worker   kEvict       move the session's allocations on a device out of it
//   worker -> broker   kSwapped     allocations moved out (the answer to kEvict) or back in
//                                   (before the worker's next command there ran)
//   worker -> broker   kLeaseAsk    the tenant needs its lease on a pool device (a context on the
//                                   pool, or a command after its lease was reclaimed)
//   broker -> worker   kLeaseAnswer the device lent (or why none), for one kLeaseAsk
//   worker -> broker   kPoolContexts the session's live contexts on the pool (its new count)
//   broker -> worker   kLeaseLost   the tenant's lease on a device ended (reclaimed when idle,
//                                   released): move the session's data off it and forget it;
//                                   answered by kSwapped (out) with the epoch
//
// Device memory (docs/operations.md, "Device memory"): the broker keeps the books, per tenant
// and device and per worker, so a quota holds across all of a tenant's sessions; a worker's
// reservations go back when it dies. A worker may only give back what it holds.
//
// Express dispatch (docs/policies.md): while a worker's tenant has had a device to itself, the
// broker lets the worker start commands at once (up to `slots` in flight) and report them as
// kReady records marked `express`, instead of waiting a kRelease for each. When another tenant
// wants the device the broker revokes, holds the newcomer's work until kExpressEnd, and from then
// on any express record from that worker is a protocol violation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace gmux::daemon::ctl {

enum class Type : uint32_t {
  kWorkerUp = 1,
  kAssign = 2,
  kReady = 3,
  kRelease = 4,
  kDone = 5,
  kStatsQuery = 6,
  kStatsReply = 7,
  kLimits = 8,
  kExpress = 9,
  kExpressEnd = 10,
  kMemReserve = 11,
  kMemAnswer = 12,
  kMemFree = 13,
  kEvict = 14,
  kSwapped = 15,
  kLeaseAsk = 16,
  kLeaseAnswer = 17,
  kPoolContexts = 18,
  kLeaseLost = 19,
  kLast = kLeaseLost,  // the highest type (Receive rejects anything above)
};

struct Header {
  uint32_t type = 0;
  uint32_t count = 0;  // records that follow (kStatsReply: bytes of text)
};

// The largest datagram either side sends or accepts.
inline constexpr size_t kMaxMessageBytes = 64 * 1024;

struct WorkerUp {
  uint32_t pid = 0;
  uint32_t devices = 0;
};

// Per-tenant limits a worker enforces for its session (docs/operations.md, [limits]).
struct Limits {
  uint64_t max_queued_commands = 0;
  uint64_t max_events = 0;
  uint64_t max_objects = 0;
  uint64_t max_bulk_bytes = 0;
  // Not divided among sessions (the broker's books are shared): for the tenant's view of the
  // device (CL_DEVICE_GLOBAL_MEM_SIZE, CL_DEVICE_MAX_MEM_ALLOC_SIZE). 0: none.
  uint64_t memory_quota = 0;     // per device, the tenant's
  uint64_t memory_capacity = 0;  // per device, managed by gmuxd (0: the backend's)
};

struct Assign {
  uint64_t session = 0;
  uint32_t tenant = 0;
  uint32_t tcp = 0;
  uint32_t max_payload_bytes = 0;
  uint32_t peer_pid = 0;  // a Unix client's pid (SO_PEERCRED, gmuxd's pid namespace), else 0
  Limits limits;
  // Resource limits the worker sets on itself (hard and soft) before it serves the session;
  // 0: left as they are.
  uint64_t rlimit_data = 0;
  uint64_t rlimit_nofile = 0;
  char tenant_name[128] = {};
  // Devices lent whole from the pool (bit i: backend device i); the tenant sees them as one
  // device, the lowest of them (docs/operations.md, "Device pool").
  uint64_t pool_mask = 0;
  // The client's probe (wire::Hello): the worker copies straight from and to the client's
  // memory only when it can read `probe_cookie` at `probe` in the process `peer_pid`.
  uint64_t probe = 0;
  uint64_t probe_cookie = 0;
  uint32_t data_frames = 0;  // 1: the client reads a read's data as data frames (proto/frame.h)
  // µs the session thread stays awake for the next request after answering a blocking call
  // (gmuxd's worker_spin_us; proto/spin_wait.h).
  uint32_t spin_us = 0;
};

struct Ready {
  uint64_t cmd = 0;  // the worker's id of the command (increasing per worker)
  uint64_t work_items = 0;
  uint64_t work_groups = 0;
  uint64_t bytes = 0;
  uint32_t device = 0;
  uint8_t kind = 0;        // core::BlockKind
  uint8_t splittable = 0;  // core::Splittable
  uint8_t express = 0;     // 1: already started under an express grant (runs whole)
  uint8_t reserved = 0;
  // express: when the worker started it (steady clock, ns since its epoch; the same clock in
  // every process of the host). Its report may come later (they go in batches); the broker
  // counts the dispatch's wall time from here, bounded by the grant.
  uint64_t started_ns = 0;
};

struct Express {
  uint32_t device = 0;
  uint32_t slots = 0;  // commands the worker may have in flight on it; 0: revoked
  uint64_t epoch = 0;  // increasing per device
};

struct ExpressEnd {
  uint32_t device = 0;
  uint32_t reserved = 0;
  uint64_t epoch = 0;  // the revoked grant's
};

struct Release {
  uint64_t cmd = 0;
  uint64_t begin = 0;
  uint64_t end = 0;
  uint32_t last = 1;
  uint32_t whole = 1;
};

struct Done {
  uint64_t cmd = 0;
  uint64_t begin = 0;
  uint64_t end = 0;
  uint64_t device_ns = 0;
  int32_t status = 0;
  uint32_t last = 1;
};

struct MemReserve {
  uint64_t seq = 0;
  uint64_t bytes = 0;
  uint32_t device = 0;
  uint32_t reserved = 0;
};

enum class MemVerdict : uint32_t { kGranted = 0, kQuota = 1, kCapacity = 2 };

struct MemAnswer {
  uint64_t seq = 0;
  uint64_t bytes = 0;    // as asked
  uint32_t verdict = 0;  // MemVerdict
  uint32_t device = 0;   // as asked
  uint64_t used = 0;     // the tenant's use on the device after the answer
  uint64_t limit = 0;    // the limit that refused (kQuota, kCapacity), else the quota
};

struct MemFree {
  uint64_t bytes = 0;
  uint32_t device = 0;
  uint32_t reserved = 0;
};

struct Evict {
  uint32_t device = 0;
  uint32_t reserved = 0;
  uint64_t epoch = 0;  // increasing per worker; the answer names it
};

struct Swapped {
  uint64_t epoch = 0;    // the kEvict answered (out); 0 for a restore (in)
  uint64_t objects = 0;  // allocations moved
  uint64_t bytes = 0;    // their bytes
  uint64_t ns = 0;       // time spent moving them
  uint32_t device = 0;
  uint8_t out = 0;       // 1: to host memory (evicted), 0: back to the device (restored)
  uint8_t ok = 1;        // 0: something could not be moved (it stayed where it was)
  uint8_t on_demand = 0; // 1 (in only): brought back outside a command (an info query, a
                         // sub-buffer), while the broker counts the tenant's data as off the device
  uint8_t reserved = 0;
};

// The device pool (docs/operations.md, "Device pool").
struct LeaseAsk {
  uint64_t seq = 0;
};
enum class LeaseVerdict : uint32_t {
  kGranted = 0,
  kTimedOut = 1,    // no device became free within [pool] wait_s
  kHookFailed = 2,  // the attach hook failed or ran past its timeout
  kNoPool = 3,      // gmuxd has no exclusive devices
  kGone = 4,        // the pool refused (the daemon is stopping)
};
struct LeaseAnswer {
  uint64_t seq = 0;
  uint32_t verdict = 0;  // LeaseVerdict
  uint32_t device = 0;   // kGranted: the backend device index lent to the tenant
};
struct PoolContexts {
  uint64_t count = 0;
};
struct LeaseLost {
  uint32_t device = 0;
  uint32_t reserved = 0;
  uint64_t epoch = 0;  // answered by kSwapped (out) with this epoch, like kEvict
};

struct StatsQuery {
  uint64_t seq = 0;
};

// Sends `count` records of `record_bytes` each, in as many datagrams as needed (`pass_fd` >= 0
// goes with the first). Blocking unless the socket is non-blocking; kUnavailable when the peer
// is gone, kResourceExhausted when a non-blocking socket is full.
// With `dont_wait` a full socket ends the call early: `sent` (when given) tells how many records
// went out, so the caller can keep the rest.
Status Send(int fd, Type type, const void* records, size_t record_bytes, size_t count,
            int pass_fd = -1, bool dont_wait = false, size_t* sent = nullptr);

template <typename T>
Status SendRecords(int fd, Type type, const std::vector<T>& records) {
  if (records.empty()) return Status::Ok();
  return Send(fd, type, records.data(), sizeof(T), records.size());
}

// One received message.
struct Message {
  Type type{};
  std::vector<uint8_t> body;  // the records
  int fd = -1;                // a descriptor passed with it (the receiver owns it)

  // The records as T, or empty when the body is not a whole number of them.
  template <typename T>
  std::vector<T> As() const {
    std::vector<T> out;
    if (body.size() % sizeof(T) != 0) return out;
    out.resize(body.size() / sizeof(T));
    if (!body.empty()) __builtin_memcpy(out.data(), body.data(), body.size());
    return out;
  }
};

// Receives one message. kUnavailable when the peer closed, kDataLoss for a malformed one,
// kResourceExhausted (non-blocking socket, nothing to read: not an error).
Result<Message> Receive(int fd, bool dont_wait = false);

// A connected SOCK_SEQPACKET pair with close-on-exec set; [0] for the broker, [1] the worker.
Status Pair(int fds[2]);

}  // namespace gmux::daemon::ctl
