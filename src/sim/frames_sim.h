// FrameSim: game-like frame-loop tenants sharing one simulated GPU, under vGASA's frame-rate
// control (core::FrameController per tenant, core::SlaPolicy as the central controller).
//
// A tenant runs an endless frame loop, as the games of the paper do (Section 2.1, Algorithm 1):
//   1. CPU work: T_cpu (game logic, issuing draw calls), measured by the agent;
//   2. the agent's own per-frame work (flush, scheduling; `agent_overhead_ms`), which Eq. (1)
//      does not see, then the sleep the agent decides (Eq. 1 with the PI's command);
//   3. Present: the frame's GPU work is submitted to the device and Present returns when it has
//      been rendered. The agent measures that Present execution time and predicts the next
//      frame's GPU time from it (Section 3.2). The next frame starts when Present returns.
// A frame's latency is its Present-to-Present time.
//
// Costs: each tenant has a base CPU and GPU time per frame; scene changes are step changes of
// both at given times; every frame draws multiplicative noise N(1, jitter), clamped at 0.1.
//
// The device: one GPU. `kShared` divides it equally among the frames in flight (time slicing,
// processor sharing: the default of a GPU that switches contexts), `kFifo` runs whole frames
// one after another in submission order (first come, first served).
//
// Central controller: every `control_period_s` it measures each tenant's FPS and GPU usage over
// the period, runs SlaPolicy::Update and hands the references to the agents. Before
// `control_start_s` every agent runs uncapped. Policy kNone means no agent at all (no overhead).
//
// Deterministic: the same options and seed give the same result bit for bit.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "core/frame_controller.h"
#include "core/sla_policy.h"

namespace gmux::sim {

// From `at_s` on, the tenant's base costs are these.
struct SceneChange {
  double at_s = 0;
  double cpu_ms = 0;
  double gpu_ms = 0;
};

struct FrameWorkload {
  std::string name;
  double weight = 1.0;   // configured weight (for the GPU-share fairness metrics)
  double cpu_ms = 5;     // base CPU time per frame, > 0
  double gpu_ms = 5;     // base GPU time per frame on an idle device, > 0
  double cpu_jitter = 0; // relative standard deviation of the per-frame noise, in [0, 1]
  double gpu_jitter = 0;
  std::vector<SceneChange> scenes;  // sorted by at_s
};

enum class DeviceSharing { kShared, kFifo };

struct FrameSimOptions {
  std::vector<FrameWorkload> tenants;
  double duration_s = 60;
  double control_period_s = 1.0;
  double control_start_s = 0;     // agents run uncapped before this
  double warmup_s = 0;            // statistics ignore what happens before this
  double agent_overhead_ms = 0;   // per-frame agent cost not seen by Eq. (1)
  double series_window_s = 1.0;   // window of the FPS / usage time series and of lambda
  double first_frame_spread_ms = 10;  // tenants start at random offsets in [0, this)
  DeviceSharing sharing = DeviceSharing::kShared;
  core::FrameControllerOptions controller;
  core::SlaPolicyOptions policy;
  uint64_t seed = 1;
  bool record_frames = false;     // keep every frame's end time and FPS (for the sweep)

  Status Validate() const;
};

struct FramePoint {
  double end_s = 0;   // when Present returned
  double fps = 0;     // 1 / Present-to-Present time
};

struct FrameTenantResult {
  std::string name;
  double weight = 1;
  uint64_t frames = 0;            // frames presented after warm-up
  double mean_fps = 0;            // frames / measured time
  double gpu_usage = 0;           // fraction of the device's time this tenant used
  double gpu_share = 0;           // fraction of all tenants' GPU time
  double frames_over_34ms = 0;    // fraction of frames with latency > 34 ms
  double frames_over_60ms = 0;    // fraction of frames with latency > 60 ms
  double final_reference_fps = core::kUncappedFps;
  std::vector<double> fps_per_window;    // one value per series window (whole run)
  std::vector<double> usage_per_window;  // this tenant's GPU usage per window, fraction
  std::vector<FramePoint> frame_trace;   // when record_frames
  // The reference set at each control tick (time, FPS; kUncappedFps when uncapped).
  std::vector<FramePoint> references;
};

struct FrameRunResult {
  std::vector<FrameTenantResult> tenants;
  double gpu_usage = 0;      // fraction of time the device was busy (after warm-up)
  double lambda = 0;         // VMCG's lambda on GPU time per window vs weights, mean
  double jain = 1;           // Jain's index on GPU share / weight
  double fps_jain = 1;       // Jain's index on mean FPS (1 when every tenant runs at one rate)
  std::vector<double> usage_per_window;  // device busy fraction per window
  double window_s = 1;
  uint64_t events = 0;
};

// Runs one policy over the tenants. kInvalidArgument when options fail Validate().
Result<FrameRunResult> RunFrameSim(const FrameSimOptions& options);

}  // namespace gmux::sim
