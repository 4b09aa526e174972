// SlotsSim: a device shared by vGPU tenants whose memory windows live in DymGPU slots.
//
// The device switches among tenants with pending work round robin with a fixed quantum (16 ms,
// gVirt's, Section II-A): the ring is the tenants' creation order; at the end of a quantum, or
// when the running tenant's frame is done, the next tenant in the ring with pending work runs
// (the same tenant again when it is the only one). Each switch to a different tenant asks the
// core::SlotAllocator for the slots to copy in; the copies take `slot_copy` each and delay the
// quantum (a context switch copies the GTT before the vGPU runs). Re-placement copies are
// counted but do not stall the device (the memory allocator runs beside the scheduler).
// With `batch` > 0 (gmux's swap batching, not in the paper) a tenant switched in with copies
// keeps the device for batch × their copy time: its next frames run ahead of the ring, and the
// device waits through its think gaps (up to the copy time) when the next tenant in the ring
// would need copies.
//
// Tenants are closed loops of frames: CPU think time, exponential with mean `think`, then a GPU
// burst uniform in [0.5, 1.5] × `burst`. A tenant's utilisation level (low / medium / high) is
// nothing but these two means. Each tenant draws from its own Rng stream forked from the seed,
// so the same tenant sees the same sequence of frames under every policy.
//
// Single-threaded and deterministic: same options, same result, byte for byte.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/time.h"
#include "core/slot_allocator.h"

namespace gmux::sim {

struct SlotsTenantSpec {
  std::string name;
  std::string level;                            // a label, e.g. "low"
  int32_t slots = 6;                            // S_i
  Duration burst = std::chrono::milliseconds(4);    // mean GPU time per frame; > 0
  Duration think = std::chrono::milliseconds(40);   // mean CPU time between frames; >= 0
  // A round of commands instead (both non-empty, same length): command k's mean GPU time and
  // the mean think after it, repeated; burst and think are then unused.
  std::vector<Duration> round_bursts, round_thinks;
};

struct SlotsSimOptions {
  core::SlotAllocatorOptions allocator;
  std::vector<SlotsTenantSpec> tenants;                // created at t = 0 in this order
  Duration quantum = std::chrono::milliseconds(16);    // gVirt's time slice
  Duration slot_copy = std::chrono::microseconds(250); // device time lost per slot copied in
  // Swap batching, as gmuxd's [daemon] swap_batch: a tenant switched in with copies keeps the
  // device for batch × the copy time, waiting through its think gaps up to the copy time when
  // another tenant with work would need copies. 0: none (the paper's model).
  double batch = 0;
  Duration duration = std::chrono::seconds(120);
  Duration window = std::chrono::seconds(1);           // λ windows and series sampling
  uint64_t seed = 1;

  // kInvalidArgument naming the first bad field (tenant index included).
  Status Validate() const;
};

struct SlotsTenantResult {
  std::string name;
  std::string level;
  int32_t slots = 0;
  std::optional<int32_t> final_start;  // nullopt when idle at the end
  double busy_s = 0;        // device time used by its frames
  double share = 0;         // busy_s / Σ busy_s over tenants
  double utilization = 0;   // busy_s / duration
  int64_t frames = 0;       // GPU bursts completed
  int64_t switch_ins = 0;
  int64_t copies = 0;       // slots copied in on its switch-ins
  int64_t moves = 0;        // times a re-placement moved it
  std::vector<double> busy_per_window;  // utilisation in each window
};

struct SlotsSimResult {
  core::SlotCounters counters;
  std::vector<SlotsTenantResult> tenants;
  double lambda = 0;            // VMCG λ on device-time shares per window, equal weights
  double jain = 1;              // Jain's index on the run's device-time shares, equal weights
  double device_busy = 0;       // fraction of the run the device ran frames
  double copy_time_s = 0;       // device time spent copying slots in
  int64_t batches = 0;          // swap batches started (options.batch > 0)
  int32_t shared_slots = 0;     // at the end of the run
  std::vector<double> window_end_s;       // time of each sample
  std::vector<int64_t> cumulative_copies; // switch + move copies up to each sample
};

// Runs one simulation. Errors: options.Validate(), and allocator errors (a tenant bigger than M).
Result<SlotsSimResult> RunSlotsSim(const SlotsSimOptions& options);

}  // namespace gmux::sim
