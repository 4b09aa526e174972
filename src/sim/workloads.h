// Workload models for KernelSim: what a simulated tenant submits, and when.
//
// Two families, both closed-loop (a tenant waits for its own work before it submits more):
//   - KernelLoop: GPGPU tasks (Kang & Yu's experiments). A task is an optional upload (a copy of
//     upload_bytes) and `kernels_per_task` kernel launches enqueued at once, then the tenant waits
//     for the last one (clFinish), thinks, and repeats. A task's completion time runs from its
//     submission to the end of its last kernel, so it includes the queueing behind other
//     tenants' work and its own upload (Kang & Yu exclude the transfer; with the presets the
//     upload is under 2 % of the kernel time, so it is kept rather than modelled away). Presets with cost models calibrated below: matrix multiply (∝ n³), Sobel filter
//     (∝ pixels), binomial option pricing (∝ samples).
//   - FrameLoop: graphics-like frames (VMCG's teapot and gears). A frame is CPU preparation, then
//     `blocks_per_frame` command blocks and a present marker enqueued at once; the application
//     may run ahead by `frames_in_flight` frames (swap-chain throttling) before it waits.
//
// Interference, the sources the papers blame for FIFO's unfairness, is part of every workload and
// drawn from the tenant's own seeded Rng stream:
//   - jitter_s:      exponential extra CPU-side delay before each submission (a descheduled vCPU,
//                    guest driver work), so arrivals interleave irregularly;
//   - burst_prob / burst_len / burst_blocks / burst_depth: with probability burst_prob, a
//                    task/frame starts a burst: it and the next burst_len − 1 tasks/frames each
//                    carry burst_blocks extra blocks enqueued at once (a heavy scene, batched
//                    uploads), and a frame workload may run burst_depth more frames ahead (a
//                    driver queueing deeper). A burst deepens the tenant's queue for a while,
//                    which FIFO rewards with a larger share; burst_len sets the time scale
//                    (tasks/frames) of that imbalance;
//   - cost_cv:       per-block device-cost noise, cost × max(0.1, Normal(1, cost_cv));
//   - think_s:       exponential think time between tasks/frames; start_jitter_s: uniform start
//                    delay in [0, start_jitter_s).
// Every workload reports the CPU time it spends (preparation plus per-block submission cost) to
// the policy through TenantHost::AddCpuTime, so VMCG's CPU-time-based time slices have data.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "sim/kernel_sim.h"

namespace gmux::sim {

// Calibration constants of the kernel cost models (device seconds on the simulated reference
// GPU, chosen to be of the order of the Radeon RX 570 Kang & Yu used, running plain OpenCL
// kernels; they set the time scale only: every result of interest is a ratio).
//   matrix multiply n×n: 2n³ flops at an effective 250 GFLOP/s  →  8e-12 s per n³
//                        (9k×9k ≈ 5.8 s, 14k×14k ≈ 22 s alone on the device)
inline constexpr double kMatmulSecondsPerN3 = 8e-12;
//   Sobel 3×3 filter: ~2 Gpixel/s including memory traffic   →  0.5 ns per pixel
//                        (2560² ≈ 3.3 ms, 8192² ≈ 34 ms)
inline constexpr double kSobelSecondsPerPixel = 0.5e-9;
//   binomial option pricing (1024-step lattice per option)     →  0.2 µs per sample
//                        (5 M samples ≈ 1 s, 20 M ≈ 4 s)
inline constexpr double kBinomialSecondsPerSample = 0.2e-6;

// Interference knobs shared by both families (see the file comment). Defaults: none.
struct InterferenceOptions {
  double jitter_s = 0;        // mean of the exponential submission delay
  double burst_prob = 0;      // per task/frame outside a burst, in [0, 1]
  uint32_t burst_len = 1;     // tasks/frames a burst lasts (>= 1)
  uint32_t burst_blocks = 0;  // extra blocks per task/frame during a burst
  uint32_t burst_depth = 0;   // frames only: extra frames in flight during a burst
  double cost_cv = 0;         // coefficient of variation of per-block cost
  double think_s = 0;         // mean exponential think time between tasks/frames
  double start_jitter_s = 0;  // uniform start delay bound
  Status Validate() const;
};

struct KernelLoopOptions {
  std::string label = "kernel";   // for Describe()
  uint64_t work_items = 65536;    // per kernel launch (a whole number of work-groups)
  uint64_t local_size = 256;      // work-items per work-group
  double kernel_cost_s = 1e-3;    // device seconds per launch (before noise)
  bool splittable = true;         // may a policy split it into chunks
  uint64_t upload_bytes = 0;      // host→device copy before each task's kernels (0: none)
  uint32_t kernels_per_task = 1;
  uint64_t tasks = 0;             // 0: unlimited (run by duration)
  double cpu_per_task_s = 0;      // CPU time to prepare a task (host-side setup)
  double cpu_per_kernel_s = 10e-6;  // CPU time to enqueue one launch
  InterferenceOptions interference;
  Status Validate() const;
};

// Presets (calibrated as above). Each leaves tasks/interference at their defaults. Global sizes are
// padded to whole work-groups as an OpenCL host program must (matmul and Sobel: each dimension to
// a multiple of 16 for 16×16 work-groups; binomial: samples to a multiple of 256). Uploads: matmul
// the two float input matrices (8·n² bytes), Sobel one RGBA8 image (4 bytes per pixel), binomial
// 16 bytes per sample.
KernelLoopOptions MatmulKernel(uint64_t n);
KernelLoopOptions SobelKernel(uint64_t width, uint64_t height);
KernelLoopOptions BinomialKernel(uint64_t samples);

struct FrameLoopOptions {
  std::string label = "frames";
  uint32_t blocks_per_frame = 4;
  double block_cost_s = 0.3e-3;   // device seconds per block (before noise)
  uint64_t block_items = 4096;    // work-items per block (draw calls are not split)
  double present_cost_s = 20e-6;  // device seconds of the present/marker block
  double cpu_per_frame_s = 0.5e-3;
  double cpu_per_block_s = 5e-6;
  uint32_t frames_in_flight = 2;  // run-ahead limit before the application waits on present
  uint64_t frames = 0;            // 0: unlimited
  InterferenceOptions interference;
  Status Validate() const;
};

// Builds workloads. Errors: invalid options (kInvalidArgument naming the field).
Result<std::unique_ptr<Workload>> MakeKernelLoop(const KernelLoopOptions& options);
Result<std::unique_ptr<Workload>> MakeFrameLoop(const FrameLoopOptions& options);

}  // namespace gmux::sim
