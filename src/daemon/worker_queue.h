// WorkerQueue: a worker's side of scheduling. It holds the session's commands until their
// dependencies allow them to run, tells the broker's scheduler which are ready (ctl::Ready),
// runs exactly what the scheduler releases (ctl::Release) on the device executors, and reports
// each dispatch's profiled device time back (ctl::Done).
//
// The state here (staging, the executors, which have no thread of their own, the reports) is
// owned by whichever thread holds own_mu_. A loop thread reads the control channel and keeps the
// timers (express reports, evictions), polling the channel and its mailbox's eventfd. Submit()
// and the backend's completion callbacks run their work on their own thread when nobody holds
// the lock (RunOrPost), else queue it for the holder: a blocking launch costs no wake-up of the
// loop, neither to start (the session thread enqueues it) nor to finish (the completion
// callback answers the client). Completion callbacks make no blocking OpenCL call: restores and
// evictions wait for the loop thread. Rescan() works the same way.
//
// Express dispatch (control.h, docs/policies.md): while the broker has granted this worker a
// device, a ready command starts on the executor at once, without a ctl::Release, when nothing
// of the session waits for a release on that device (so per-device order holds) and fewer than
// the grant's slots are running; otherwise it waits in the worker's backlog until both hold. It
// is reported as an express ctl::Ready. A revoke sends the backlog to the scheduler in order.
//
// Dependencies (the same rules the scheduler applied in-process before): a command is ready when
// each event it depends on is a user event already set, or a command already handed to the
// scheduler on the same device (the tenant's V-channel keeps order), or a command of another
// device already dispatched or done. A held command waits on one blocking event at a time and is
// looked at again only when that event changes, so holding N commands costs O(N) in all.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "daemon/command.h"
#include "daemon/control.h"
#include "daemon/executor.h"
#include "daemon/mailbox.h"
#include "daemon/residency.h"
#include "proto/spin_wait.h"

namespace gmux::daemon {

class WorkerQueue : public CommandSink {
 public:
  // `ctl_fd` is the worker's end of the control channel (not owned). `on_broker_gone` runs on
  // the loop thread when the channel closes or fails (the worker then ends).
  WorkerQueue(int ctl_fd, size_t devices, std::function<void()> on_broker_gone);
  ~WorkerQueue() override;

  void Start();
  // The budget for AwaitRelease's spin (gmuxd's worker_spin_us; 0: none). Before Start().
  void SetReleaseSpin(std::chrono::microseconds budget);
  // After the session thread sent commands to the broker for release: it reads the release
  // itself, spinning for up to the budget (proto/spin_wait.h) until the control channel or
  // the client (`client_fd`, or `client_ring` where its requests come) has something. The
  // loop thread, asleep in poll(), would otherwise be woken for it, which on an idle CPU of a
  // virtual machine costs tens of microseconds of the command's latency (docs/policies.md,
  // "The session thread reads its release").
  void AwaitRelease(int client_fd, proto::ShmRing* client_ring) override;
  // Commands of the session run (or wait) on a device: the backend's threads may need a CPU
  // (the session thread's spin then yields at every look, proto/spin_wait.h). Any thread.
  bool DeviceRunning() const override;
  // Memory the session releases stays charged to it up to this much per device, for this long
  // after the last release (docs/policies.md, "Released memory stays charged for a moment").
  static constexpr uint64_t kKeptChargeMax = uint64_t{64} << 20;
  static constexpr std::chrono::milliseconds kKeptChargeIdle{20};
  // How long memory the session released stays charged to it (kKeptChargeIdle; tests set it
  // longer to see the other ways it goes back). Before Start().
  void SetKeptChargeIdle(std::chrono::milliseconds idle) { kept_idle_ = idle; }
  // Called on the loop thread with each new share of the tenant's limits (before Start()).
  void OnLimits(std::function<void(const ctl::Limits&)> f) { on_limits_ = std::move(f); }
  // Stops the loop once nothing is in flight on the backend (bounded by `timeout`).
  void Stop(std::chrono::milliseconds timeout = std::chrono::seconds(5));
  // The worker is about to end (its client left): the starts and completions express has not
  // reported yet (they wait up to kExpressReportDelay to go in a batch) go to the broker now,
  // so the tenant's last commands are counted and charged. Starts nothing. Any thread.
  void ReportBeforeExit();

  void Submit(std::vector<std::shared_ptr<Command>> cmds) override;
  void Rescan(std::shared_ptr<EventRecord> ev) override;
  uint64_t Outstanding() const override { return outstanding_.load(); }
  bool WaitUntil(const std::function<bool()>& room) override;
  std::string Status() override;
  MemoryAnswer ReserveMemory(uint32_t device, uint64_t bytes) override;
  void ReleaseMemory(uint32_t device, uint64_t bytes) override;
  void AttachResidency(std::shared_ptr<Residency> residency) override;
  // The device pool (control.h kLeaseAsk..kLeaseLost): the pool's devices (bit i: device i) and
  // what moving the session's queues between them takes. Before Start().
  void SetPool(uint64_t mask, const cl_icd_dispatch* cl, std::vector<cl_device_id> devices);
  LeaseAnswer AcquireLease(uint32_t fallback, int client_fd) override;
  void PoolContexts(uint64_t count) override;
  void AddPoolQueue(const Ref<cl_command_queue>& queue, const Ref<cl_context>& context,
                    cl_command_queue_properties properties, uint32_t device) override;
  uint32_t PoolDevice(uint32_t fallback) const override;

 private:
  void Loop();
  // Runs `t`, after everything queued before it, on this thread if no other runs the queue's
  // work now; else queues it for the one that does. `device_callback`: on a backend's completion
  // callback thread.
  void RunOrPost(Mailbox::Task t, bool device_callback);
  void OnControl(const ctl::Message& m);
  void Accept(std::shared_ptr<Command> c);
  // Sends `c` to the scheduler if nothing blocks it, else parks it on the first blocking event.
  void TryRelease(const std::shared_ptr<Command>& c);
  // `ev` changed (no longer held, dispatched, set or done): look at the commands parked on it.
  void Notify(EventRecord* ev);
  const EventRecord* Blocker(const Command& c) const;
  void OnComplete(uint32_t device, const std::vector<core::Completion>& done);
  // Starts the commands express let through, then reports what became ready and what finished
  // to the broker (in that order). Called by the loop at the end of each round.
  // `force_report`: express starts too, however recent (a revoke's answer follows).
  void FlushReady(bool force_report = false);
  // Sends ready_out_ and done_out_ (express's unreported starts and completions ahead of them
  // with `with_express`: a command's start before its end). Under own_mu_.
  void SendReports(bool with_express);
  void OnExpress(const ctl::Express& e);
  // Everything the broker sent so far (without waiting), each through OnControl. Under own_mu_.
  void ReadControl();
  static ctl::Ready ReadyOf(const Command& c);
  // Reports `c` ready to the broker's scheduler and waits for its release.
  void ToScheduler(const std::shared_ptr<Command>& c);
  void StartExpress(const std::shared_ptr<Command>& c);
  void DrainBacklog(uint32_t device);
  // Runs `jobs` on device `device`'s executor, bringing the session's allocations back first if
  // they were moved out (and telling the broker, kSwapped).
  void RunJobs(uint32_t device, std::vector<Job>& jobs);  // leaves `jobs` empty
  // Carries out the broker's kEvict requests once nothing of the session is on a device.
  void EvictWhenIdle();
  bool OnPool(uint32_t device) const { return device < 64 && (pool_mask_ >> device & 1) != 0; }
  // Loop thread: the broker's answer to a lease ask; asking for the lease again for commands
  // that wait for it; moving the pool's queues to `device`.
  void OnLeaseAnswer(const ctl::LeaseAnswer& a);
  void AskLease();
  void MovePoolQueues(uint32_t device);

  const int ctl_fd_;
  std::function<void()> on_broker_gone_;
  std::function<void(const ctl::Limits&)> on_limits_;
  Mailbox mailbox_;
  std::thread thread_;
  // Held by the thread running the queue's work (the loop thread, or RunOrPost's caller); guards
  // the state below it marked "Loop-thread state", loop_timed_ and loop_needed_.
  std::mutex own_mu_;
  bool loop_timed_ = false;    // the loop thread sleeps with a timeout (its timers are armed)
  bool loop_needed_ = false;   // work left for the loop thread (blocking calls)
  std::atomic<int> inline_runners_{0};  // threads in RunOrPost
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> outstanding_{0};
  // Commands in parked_ (written on the loop thread), and the wait for room (WaitForRoom).
  std::atomic<uint64_t> parked_count_{0};
  std::atomic<int> room_waiters_{0};
  std::mutex room_mu_;
  std::condition_variable room_cv_;

  // Loop-thread state.
  std::vector<std::unique_ptr<Executor>> executors_;
  uint64_t next_cmd_ = 1;
  std::unordered_map<EventRecord*, std::vector<std::shared_ptr<Command>>> parked_;
  std::unordered_map<uint64_t, std::shared_ptr<Command>> ready_;  // sent, not fully released
  std::vector<Job> spare_jobs_;  // FlushReady's second vector (its capacity kept)
  std::vector<ctl::Ready> ready_out_;
  std::vector<ctl::Done> done_out_;  // completions to report at the end of the loop's round
  // Set when ordinary Ready records went to the broker, cleared by the next release: whether
  // AwaitRelease has anything to wait for. Its spin, made by SetReleaseSpin.
  std::atomic<bool> release_awaited_{false};
  std::unique_ptr<proto::SpinWait> release_spin_;
  // Under a grant the broker hears of express work in batches: starts and completions not
  // reported yet, and when the oldest of them happened. Express commands still running (their
  // completion is deferred only while the device's grant holds).
  std::vector<ctl::Ready> express_unreported_;
  std::vector<ctl::Done> express_done_;
  std::chrono::steady_clock::time_point express_oldest_{};
  std::unordered_set<uint64_t> express_running_;
  // Per device: the express grant's slots (0: none), commands reported ready and waiting for a
  // release, commands started and not finished, and express starts not yet handed to the
  // executor.
  std::vector<uint32_t> slots_;
  std::vector<uint64_t> waiting_;
  std::vector<uint64_t> running_;
  std::vector<std::vector<Job>> express_jobs_;
  // Per device, under a grant: ready commands waiting for a running one to finish (in order).
  std::vector<std::deque<std::shared_ptr<Command>>> backlog_;
  std::atomic<bool> broker_gone_{false};  // read by the session thread too (on-demand restores)
  // The session's allocations (residency.h) and the evictions asked for and not yet done.
  std::shared_ptr<Residency> residency_;
  std::vector<ctl::Evict> evict_pending_;

  // Memory answers from the broker, by reservation sequence; the sequences still waited for
  // (an answer for one nobody waits for any more is given back at once).
  std::mutex mem_mu_;
  std::condition_variable mem_cv_;
  uint64_t next_mem_ = 1;
  std::unordered_set<uint64_t> mem_waiting_;
  std::unordered_map<uint64_t, ctl::MemAnswer> mem_answers_;
  // Memory the session released that stays charged to it in the broker's books, per device:
  // the next reservations take it without asking (docs/policies.md, "Released memory stays
  // charged for a moment"). Beyond kKeptChargeMax it goes back at once; all of it goes back
  // kept_idle_ after the last release, at an eviction or lease loss, and before the
  // worker ends. Under mem_mu_, as are the kMemReserve/kMemFree sends (their order is the
  // broker's).
  std::chrono::milliseconds kept_idle_ = kKeptChargeIdle;
  std::vector<uint64_t> kept_charge_;
  bool kept_armed_ = false;  // something is kept; the loop's timer runs
  std::chrono::steady_clock::time_point kept_since_{};
  // Gives the kept charge back (all of it, or only once kept_idle_ has passed). Returns the
  // milliseconds until it would be due (-1: nothing kept).
  int ReturnKeptCharge(bool now);
  void SendFreeLocked(uint32_t device, uint64_t bytes);  // under mem_mu_

  // The pool. The device lent now (kNoDevice: none; the loop thread writes it, the session
  // thread reads it), commands waiting for a lease (loop thread), the loop thread's own ask.
  static constexpr uint32_t kNoDevice = UINT32_MAX;
  static constexpr uint32_t kLeaseLostMark = 1;  // in evict_pending_'s `reserved`: a kLeaseLost
  uint64_t pool_mask_ = 0;
  const cl_icd_dispatch* cl_ = nullptr;
  std::vector<cl_device_id> devices_;
  std::atomic<uint32_t> pool_device_{kNoDevice};
  std::vector<std::shared_ptr<Command>> lease_wait_;
  uint64_t loop_ask_ = 0;
  struct PoolQueue {
    std::weak_ptr<Held<cl_command_queue>> queue;
    std::weak_ptr<Held<cl_context>> context;
    cl_command_queue_properties properties = 0;
    uint32_t device = 0;
  };
  std::mutex pool_mu_;  // guards pool_queues_, lease_answers_, lease_waiting_, retired_
  std::condition_variable lease_cv_;
  std::vector<PoolQueue> pool_queues_;
  std::vector<Ref<cl_command_queue>> retired_;  // queues moved off (released with the session)
  std::unordered_set<uint64_t> lease_waiting_;
  std::unordered_map<uint64_t, ctl::LeaseAnswer> lease_answers_;
  std::atomic<uint64_t> next_lease_{1};

  // Stats answers from the broker, by query sequence.
  std::mutex stats_mu_;  // guards stats_
  std::condition_variable stats_cv_;
  std::unordered_map<uint64_t, std::string> stats_;
  std::atomic<uint64_t> next_stats_{1};
};

}  // namespace gmux::daemon
