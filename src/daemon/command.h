// Commands and event records: what a session hands the scheduler, and how completion flows back.
//
// An EventRecord is the daemon's view of one client event id (a command's event or a user
// event). Shared by the session table, the commands that depend on it and the executor. Its
// status and backend event are guarded by mu_; `staged` and `dispatched` belong to the
// scheduler thread alone.
//
// A Command is one command block of a tenant: the closure that enqueues it on the backend queue
// (run, on the executor thread) and the closure that delivers its results (finished, on the
// executor thread, called in the device's dispatch order, before waiters of its event run).
// A splittable kernel launch also carries run_chunk, which enqueues one chunk of it: the policy
// may dispatch it as several chunks (ranges of its flattened work-items on work-group
// boundaries, see Command::run_chunk), and the client still sees one event.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/model.h"
#include "daemon/cl_ref.h"

namespace gmux::proto {
class ShmRing;
}  // namespace gmux::proto

namespace gmux::daemon {

class EventRecord {
 public:
  using Waiter = std::function<void(cl_int status)>;

  EventRecord(uint64_t client_id, bool user, uint32_t device)
      : client_id_(client_id), user_(user), device_(device),
        status_(user ? CL_SUBMITTED : CL_QUEUED) {}

  uint64_t client_id() const { return client_id_; }
  bool user() const { return user_; }
  uint32_t device() const { return device_; }

  // CL_QUEUED, CL_SUBMITTED, CL_RUNNING, CL_COMPLETE or a negative error.
  cl_int status() const {
    std::lock_guard<std::mutex> lock(mu_);
    return status_;
  }
  bool done() const { return status() <= CL_COMPLETE; }

  void SetBackend(Ref<cl_event> ev) {
    std::lock_guard<std::mutex> lock(mu_);
    backend_ = std::move(ev);
    if (status_ == CL_QUEUED) status_ = CL_SUBMITTED;
  }
  Ref<cl_event> backend() const {
    std::lock_guard<std::mutex> lock(mu_);
    return backend_;
  }
  // A split launch: the backend event of its first chunk (its QUEUED, SUBMITTED and START times
  // are the launch's); backend() is then the last chunk's (END, COMPLETE).
  void SetFirstBackend(Ref<cl_event> ev) {
    std::lock_guard<std::mutex> lock(mu_);
    first_backend_ = std::move(ev);
    if (status_ == CL_QUEUED) status_ = CL_SUBMITTED;
  }
  // The backend event that answers the profiling query `param` for this (possibly split)
  // command: the first chunk's for QUEUED/SUBMITTED/START, the last one's otherwise.
  Ref<cl_event> ProfilingEvent(cl_profiling_info param) const {
    std::lock_guard<std::mutex> lock(mu_);
    if (first_backend_ && param != CL_PROFILING_COMMAND_END &&
        param != CL_PROFILING_COMMAND_COMPLETE) {
      return first_backend_;
    }
    return backend_;
  }

  // Sets the final status (CL_COMPLETE or negative) once and runs the waiters outside the lock.
  void Complete(cl_int status);

  // Runs `w` when the event completes (now, on this thread, if it already has).
  void AddWaiter(Waiter w);

  // Its command ran to completion and its results are being delivered: its profiling times are
  // final although the record completes only after the delivery (whose answer a client may act
  // on first).
  std::atomic<bool> ran{false};
  // Its command failed before it reached the backend (no backend event to wait for), and the
  // record completes only when the executor delivers it: the failure, for commands after it
  // in the same round that wait for it (negative; CL_SUCCESS until then).
  std::atomic<cl_int> failed_early{CL_SUCCESS};
  cl_int StatusForWaiters() const {
    const cl_int early = failed_early.load();
    return early < 0 ? early : status();
  }

  // Scheduler-thread-only state.
  bool staged = false;      // waiting in a tenant's staging list
  bool dispatched = false;  // handed to its device's executor

 private:
  const uint64_t client_id_;
  const bool user_;
  const uint32_t device_;
  mutable std::mutex mu_;
  cl_int status_;  // user events start as CL_SUBMITTED, commands as CL_QUEUED
  Ref<cl_event> backend_;
  Ref<cl_event> first_backend_;  // split launches only
  std::vector<Waiter> waiters_;
};

struct SessionCore;      // session.h
class Residency;         // residency.h
struct RemoteTransfer;   // remote_copy.h

struct Command {
  std::shared_ptr<SessionCore> session;  // closed sessions' commands are skipped, not run
  TenantId tenant = 0;
  uint32_t device = 0;
  core::CommandBlock block;
  Ref<cl_command_queue> queue;
  std::shared_ptr<EventRecord> event;
  std::vector<std::shared_ptr<EventRecord>> deps;        // the wait list (backend + user events)
  std::vector<std::shared_ptr<EventRecord>> order_deps;  // ordering only (queue order, barriers)
  // Blocking writes of other queues the client returned from before they ran (toldComplete):
  // waited for like deps, but their failure does not fail this command.
  std::vector<std::shared_ptr<EventRecord>> after;
  // Enqueues on the backend. `waits` holds the backend events of deps and of `after`.
  std::function<cl_int(cl_command_queue q, const std::vector<cl_event>& waits, cl_event* out)> run;
  // Delivers results after the backend event completed (status CL_COMPLETE or negative).
  std::function<void(cl_int status)> finished;
  // Splittable kernels only (block.splittable == kYes): enqueues the work-items `range` of the
  // launch (a range of the flattened NDRange on work-group boundaries of the split dimension).
  std::function<cl_int(cl_command_queue q, const std::vector<cl_event>& waits,
                       const core::WorkRange& range, cl_event* out)>
      run_chunk;

  // A transfer by remote copy (remote_copy.h), or a read the device does in pieces
  // (Session::StreamedRead): its device time runs from the first map's or piece's START, and a
  // failed copy or piece fails the command even though the last backend event completed.
  std::shared_ptr<RemoteTransfer> remote;

  // The marker of a write received in place (Session::DirectTarget): counted down here by the
  // executor before its completion is counted, so that while a session's outstanding commands
  // are no more than this count, every one of them is such a marker.
  std::shared_ptr<std::atomic<uint64_t>> in_place_markers;

  // Executor-thread state of a launch being run in chunks.
  Ref<cl_event> last_chunk;             // each chunk waits for the previous one
  cl_int chunk_status = CL_SUCCESS;     // first failure among its chunks
};

// Where a session hands its commands: the worker's WorkerQueue (worker_queue.h). Thread-safe.
class CommandSink {
 public:
  virtual ~CommandSink() = default;
  // Commands in decode order (one hand-over per batch).
  virtual void Submit(std::vector<std::shared_ptr<Command>> cmds) = 0;
  // The user event `ev` was set: commands held behind it may now run.
  virtual void Rescan(std::shared_ptr<EventRecord> ev) = 0;
  // Called by the session thread after a batch was submitted, before it waits for the next
  // request on `client_fd` (or in `client_ring` when the client's requests come through one):
  // a sink that waits for someone's go-ahead may wait for it here, awake, for a short while
  // (none by default).
  virtual void AwaitRelease(int /*client_fd*/, proto::ShmRing* /*client_ring*/) {}
  // Commands run (or wait) on a device, whose threads may need a CPU. Any thread.
  virtual bool DeviceRunning() const { return false; }
  // Commands submitted and not yet completed.
  virtual uint64_t Outstanding() const = 0;
  // Blocks until `room()` holds, checked again as commands finish (and every few ms, for what
  // a finished command frees after its completion is counted), as a device's full command ring
  // blocks its driver: true once it holds, false as soon as it cannot come (the worker stops,
  // or every outstanding command, if any, is held behind an event no running command will
  // set: the client would have to set it, and it waits for us).
  virtual bool WaitUntil(const std::function<bool()>& room) = 0;
  // Until fewer than `limit` commands are outstanding.
  bool WaitForRoom(uint64_t limit) {
    return WaitUntil([this, limit] { return Outstanding() < limit; });
  }
  // The scheduler's JSON as this session's tenant may see it ("{}" when unavailable).
  virtual std::string Status() = 0;

  // Device memory against the tenant's quota and the device's managed capacity (control.h):
  // reserves `bytes` on device `device` before an allocation, gives them back after its release.
  // The default (no broker: in-process tests) grants everything.
  struct MemoryAnswer {
    bool granted = true;
    bool over_quota = false;  // else over the device's capacity (or no answer)
    uint64_t used = 0;        // the tenant's use on the device
    uint64_t limit = 0;       // the limit that refused
  };
  virtual MemoryAnswer ReserveMemory(uint32_t device, uint64_t bytes) {
    (void)device;
    (void)bytes;
    return {};
  }
  virtual void ReleaseMemory(uint32_t device, uint64_t bytes) {
    (void)device;
    (void)bytes;
  }
  // The session's allocations, for the worker to move off a device when the broker says so
  // (residency.h). The default (in-process tests) never moves them.
  virtual void AttachResidency(std::shared_ptr<Residency> residency) { (void)residency; }
  // The device pool (docs/operations.md, "Device pool"). The tenant's lease on a pool device:
  // the backend device lent (blocking until the broker answers; the pool's queue may make it
  // wait), or the verdict's message on refusal. The default (no broker) lends the lowest pool
  // device at once.
  struct LeaseAnswer {
    bool granted = true;
    uint32_t device = 0;
    std::string why;
  };
  // `client_fd`: the client's socket, watched while waiting (a client that went away stops it).
  virtual LeaseAnswer AcquireLease(uint32_t fallback, int client_fd) {
    (void)client_fd;
    return {true, fallback, {}};
  }
  // The session's live contexts on the pool (its tenant's lease ends when all are gone).
  virtual void PoolContexts(uint64_t count) { (void)count; }
  // A queue on the pool: moved to the tenant's device when a later lease lends another one.
  virtual void AddPoolQueue(const Ref<cl_command_queue>& queue, const Ref<cl_context>& context,
                            cl_command_queue_properties properties, uint32_t device) {
    (void)queue;
    (void)context;
    (void)properties;
    (void)device;
  }
  // The backend device the tenant's pool lease lends now (`fallback` when it holds none).
  virtual uint32_t PoolDevice(uint32_t fallback) const { return fallback; }
};

}  // namespace gmux::daemon
