// KernelSim: the discrete-event engine that drives a core::Policy with simulated tenants
// submitting command blocks to simulated devices.
//
// Model
//   - Each tenant runs one Workload (sim/workloads.h), a state machine that submits command
//     blocks through its TenantHost, sleeps (CPU work, think time), and is told when each of its
//     blocks has finished on the device.
//   - `devices` identical devices share one policy. A device runs one dispatch at a time, without
//     preemption, and holds up to `inflight` dispatches committed to it (the daemon's
//     inflight_per_device: a hardware queue that runs them in order); a dispatch of a block's range [b, e) takes cost_s × (e − b) / work_items of the
//     block (the whole cost_s for copies and markers) plus the fixed dispatch overhead. A copy
//     also takes bytes / device.bus_bytes_per_s (when the bandwidth is given).
//   - The driver calls Policy::Pick() whenever a device has room in its queue after any event, and Tick() at the
//     policy's NextTimer(). Every Dispatch is checked against the Policy contract (the tenant's
//     oldest unfinished block, contiguous ascending ranges, `last` exactly on the final chunk); a
//     violation ends the run with kInternal naming the rule, so the engine doubles as a
//     conformance checker for policies.
//   - Measured per tenant: device time (the share), completed blocks ("commands"), dispatches,
//     completed tasks/frames with their latencies, all also per window of `window` for VMCG's λ.
//
// Determinism: events are ordered by (time, insertion sequence); every random draw comes from
// sim::Rng streams forked from the seed per tenant, so a (seed, policy, tenants) triple yields the
// same result byte for byte. Single-threaded; a KernelSim runs once.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/time.h"
#include "core/metrics.h"
#include "core/model.h"
#include "core/policy.h"
#include "sim/rng.h"

namespace gmux::sim {

class KernelSim;

// One command block as a workload asks for it; the engine assigns the BlockId.
struct BlockRequest {
  core::BlockKind kind = core::BlockKind::kKernel;
  uint64_t work_items = 0;   // kernels: global size; 0 for copies and markers
  uint64_t work_groups = 0;  // kernels: work_items / local size
  uint64_t bytes = 0;        // copies
  core::Splittable splittable = core::Splittable::kNo;
  double cost_s = 0;         // device seconds for the whole block (>= 0); copies add bytes/bandwidth
  uint64_t tag = 0;          // the workload's own label, handed back in OnBlockDone()
};

// The engine as one tenant's workload sees it. Owned by the engine; valid during callbacks.
class TenantHost {
 public:
  TimePoint now() const;
  // Queues a block on this tenant's V-channel (Policy::Submit) at now().
  void Submit(const BlockRequest& request);
  // Calls Workload::OnWake(arg) after `d` (>= 0).
  void WakeAfter(Duration d, uint64_t arg);
  // Adds CPU time the tenant spent (submission, frame preparation) and reports the cumulative
  // total to the policy (Policy::ReportCpuTime), which VMCG's time slices are computed from.
  void AddCpuTime(Duration d);
  // Records one finished task or frame that took `latency` (completion time, seconds in JSON).
  void TaskDone(Duration latency);
  // This tenant's random stream.
  Rng& rng();
  // True once the run's duration has elapsed: workloads should not start new work.
  bool stopping() const;

 private:
  friend class KernelSim;
  TenantHost(KernelSim* sim, uint32_t index) : sim_(sim), index_(index) {}
  KernelSim* sim_;
  uint32_t index_;
};

// A tenant's behaviour. Implementations live in sim/workloads.h.
class Workload {
 public:
  virtual ~Workload() = default;
  // Short description for tables ("matmul n=9000", "frames teapot").
  virtual std::string Describe() const = 0;
  // The run starts (time 0): schedule the first work.
  virtual void Start(TenantHost& host) = 0;
  // A WakeAfter() fired.
  virtual void OnWake(TenantHost& host, uint64_t arg) = 0;
  // One of this workload's blocks finished (its last chunk completed).
  virtual void OnBlockDone(TenantHost& host, uint64_t tag) = 0;
  // True when the workload has nothing more to do (bounded task counts); runs without a
  // duration end when every workload is finished.
  virtual bool Finished() const = 0;
};

// Options of one simulation run.
struct KernelSimOptions {
  // Simulated time to run; zero means "until every workload is Finished()" (bounded by
  // max_duration, past which the run is an error).
  Duration duration{0};
  Duration max_duration = std::chrono::seconds(3600);
  // λ window (VMCG's interval [t1, t2]); 1 s by default.
  Duration window = std::chrono::seconds(1);
  uint64_t seed = 1;
  // Identical devices sharing the one policy.
  uint32_t devices = 1;
  // Dispatches committed to one device at a time (>= 1); they run one after another.
  uint32_t inflight = 1;
  // Fixed cost added to every dispatch (kernel launch latency); makes splitting cost something.
  Duration dispatch_overhead{0};
  // Given to the policy through PolicySpec by the caller; the engine uses bus_bytes_per_s for
  // the duration of copies.
  core::DeviceInfo device;
  // Keep each tenant's task latencies (completion statistics are computed either way).
  bool record_completions = true;
  // Safety net against a policy or workload that never lets time advance.
  uint64_t max_events = 2'000'000'000ULL;

  Status Validate() const;
};

struct TenantResult {
  std::string name;
  double weight = 1;
  std::string workload;
  double device_time_s = 0;
  double share = 0;             // device_time_s / Σ device_time_s
  uint64_t submitted = 0;       // blocks submitted
  uint64_t commands = 0;        // blocks completed
  uint64_t dispatches = 0;      // dispatches (chunks count one each)
  uint64_t work_items = 0;      // work-items completed
  uint64_t tasks = 0;           // tasks / frames completed
  double cpu_time_s = 0;
  std::vector<double> completions_s;  // task latencies (when record_completions)
  core::CompletionStats completion;   // over every task, recorded or not
};

struct SimResult {
  std::vector<TenantResult> tenants;
  double end_s = 0;        // simulated time the run ended
  double makespan_s = 0;   // time of the last block completion
  double busy_s = 0;       // Σ device busy time over all devices
  uint64_t events = 0;     // events processed
  Duration window{0};
  // [window][tenant]: device seconds, completed blocks, completed tasks.
  std::vector<std::vector<double>> device_time_windows;
  std::vector<std::vector<double>> block_windows;
  std::vector<std::vector<double>> task_windows;
};

class KernelSim {
 public:
  // `policy` must be fresh (no tenants) and outlive Run().
  KernelSim(KernelSimOptions options, core::Policy& policy);
  ~KernelSim();
  KernelSim(const KernelSim&) = delete;
  KernelSim& operator=(const KernelSim&) = delete;

  // Adds a tenant (ids are assigned 0, 1, ... in call order). Errors: weight <= 0, null workload.
  Status AddTenant(const std::string& name, double weight, std::unique_ptr<Workload> workload);

  // Runs the simulation once. Errors: invalid options, a Policy contract violation (kInternal),
  // a deadlock (pending work, idle devices and no event left), max_duration or max_events hit.
  Result<SimResult> Run();

 private:
  friend class TenantHost;

  enum class EventKind : uint8_t { kWake, kDeviceDone, kPolicyTimer, kStop };
  struct Event {
    TimePoint at;
    uint64_t seq;
    EventKind kind;
    uint32_t index;  // tenant (kWake) or device (kDeviceDone)
    uint64_t arg;
  };
  struct BlockState {
    uint32_t tenant = 0;
    uint64_t work_items = 0;
    uint64_t next_offset = 0;      // first work-item not yet dispatched
    uint64_t completed_items = 0;
    double cost_s = 0;
    uint64_t tag = 0;
    bool fully_dispatched = false;
    bool done = false;
  };
  struct TenantState {
    std::string name;
    double weight = 1;
    std::unique_ptr<Workload> workload;
    std::unique_ptr<TenantHost> host;
    Rng rng{0};
    std::deque<BlockId> undispatched;  // submitted blocks not fully dispatched, in order
    Duration cpu{0};
    TenantResult result;
    std::vector<double> latencies;
  };
  struct DeviceState {
    std::deque<core::Dispatch> queue;  // committed dispatches; the front one runs
    TimePoint started{};               // when the front one started
    bool busy() const { return !queue.empty(); }
  };

  void Push(TimePoint at, EventKind kind, uint32_t index, uint64_t arg);
  Event PopEvent();
  BlockState* FindBlock(BlockId id);
  void SubmitBlock(uint32_t tenant, const BlockRequest& request);
  Status DispatchIdle();
  Status CheckDispatch(const core::Dispatch& d, BlockState** block) const;
  Status FinishDispatch(uint32_t device);
  void StartHead(uint32_t device);
  void ArmPolicyTimer();
  bool AllFinished() const;
  bool AnyPending() const;
  SimResult Collect();

  KernelSimOptions options_;
  core::Policy& policy_;
  std::vector<TenantState> tenants_;
  std::vector<DeviceState> devices_;
  std::vector<Event> heap_;  // binary min-heap on (at, seq)
  uint64_t seq_ = 0;
  TimePoint now_{};
  bool stopping_ = false;
  bool ran_ = false;
  std::optional<TimePoint> policy_timer_;  // earliest armed policy timer
  std::deque<BlockState> blocks_;          // blocks_[id - base_id_]
  BlockId base_id_ = 1;
  BlockId next_id_ = 1;
  uint64_t live_blocks_ = 0;               // submitted and not done
  TimePoint last_completion_{};
  Duration busy_{0};
  std::unique_ptr<core::WindowedThroughput> device_time_;
  std::unique_ptr<core::WindowedThroughput> blocks_done_;
  std::unique_ptr<core::WindowedThroughput> tasks_done_;
};

}  // namespace gmux::sim
