// FrameController: vGASA's per-tenant frame-rate agent (Zhang et al., Sections 2-3).
//
// The agent sits at a tenant's frame boundary. After the frame's CPU work it decides how long to
// sleep before Present, so that the frame rate follows a reference r (frames per second):
//
//   Eq. (1)  T_sleep = 1/F - T_cpu - T_gpu        (seconds here; the paper writes 1000/F in ms)
//   Eq. (3)  G_c(z) = k_p + k_i z/(z-1)           the PI controller
//   Eq. (5)  u = -ln F,  y = ln(frame time)        the transformed domain, where the plant is
//                                                  G'_p(z) = 1, i.e. y = u when T_cpu and T_gpu
//                                                  are known exactly
//   Eq. (6)  T_c(z) = ((k_p+k_i)z - k_p) / ((k_p+k_i+1)z - (k_p+1))
//   Eq. (7)  pole z = (k_p+1) / (k_p+k_i+1)
//   Eq. (8)  stable iff |pole| < 1
//
// How the loop is closed (a decision; the paper gives the transfer functions, not the update
// rule; docs/policies.md explains the choice):
//   - Feed-forward: the reference itself is the operating point, u_ff = -ln r, so Eq. (1) alone
//     gives the reference frame time when the CPU time is measured and the GPU time predicted
//     exactly (Algorithm 1: "the sleep time is calculated according to both the reference and
//     equation 1").
//   - What Eq. (1) does not see (agent overhead, prediction error, contention that the history
//     did not show) is a disturbance d in y = u + d. The agent estimates it from the last frame,
//     d^ = y_{k-1} - u_{k-1}, and solves the PI of Eq. (3) through the model G'_p = 1 for this
//     frame:  e_k = y_r - (u_k + d^),  u_k = y_r + k_p e_k + k_i (S_{k-1} + e_k),  which gives
//     e_k = -(d^ + k_i S_{k-1}) / (1 + k_p + k_i). The integral S accumulates the measured error
//     y_r - y once the frame is seen. Against a constant disturbance the error therefore decays
//     exactly as pole^k with the pole of Eq. (7); with k_i = 0 a residual d / (1 + k_p) remains,
//     the steady-state error of T_c(1) = k_p/(k_p+1) that the paper notes for P control.
//   - Anti-windup: when Eq. (1) comes out negative (the frame is already later than 1/F) the
//     agent does not sleep; the frame still updates d^ (whose fixed point under saturation is
//     finite because the command only cancels the fraction (k_p+k_i)/(1+k_p+k_i) of it), but
//     its error is integrated only when it points back out of saturation (the frame came out
//     faster than the reference). The same holds, mirrored, when F sits at min_fps.
//   - T_gpu of the coming frame is predicted as the mean Present execution time (submission to
//     GPU completion) of the last `gpu_history_frames` frames (Section 3.2: "we can use the
//     historical execution time of Present to predict the GPU time of the upcoming frame").
//
// Invariants: sleep >= 0; the command F stays in [min_fps, max_fps]; with an uncapped reference
// the agent never sleeps and its PI state is left untouched.
//
// Pure and single-threaded: the caller (the simulator, or the daemon's frame agent) passes every
// measurement and time in. One instance per tenant.
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

#include "common/status.h"
#include "common/time.h"

namespace gmux::core {

// A reference meaning "no frame-rate control": the agent never sleeps.
inline constexpr double kUncappedFps = std::numeric_limits<double>::infinity();

// Eq. (7): the pole of the closed loop of Eq. (6), (k_p + 1) / (k_p + k_i + 1).
// Precondition: k_p + k_i + 1 != 0.
double ClosedLoopPole(double kp, double ki);

// Eq. (6) has a pole only when k_i != 0; with k_i = 0 numerator and denominator share the factor
// (z - 1) and T_c(z) = k_p / (k_p + 1), "always stable without any poles".
bool ClosedLoopHasPole(double ki);

// Eq. (1): the sleep that makes a frame last 1/fps, given its CPU time and (predicted) GPU time;
// zero when the frame is already longer than that. Precondition: fps > 0.
Duration SleepTime(double fps, Duration cpu_time, Duration gpu_time);

struct FrameControllerOptions {
  // Eq. (3) gains. The defaults give the pole 0.6875 of Eq. (7), the fastest of the paper's
  // Fig. 8c configurations; see docs/reproductions.md for the sweep that chose them.
  double kp = 0.1;
  double ki = 0.5;
  // Frames of Present history the GPU-time prediction averages over. >= 1.
  int gpu_history_frames = 4;
  // Bounds of the control input F (frames per second); they keep u = -ln F finite.
  double min_fps = 1.0;
  double max_fps = 1000.0;

  // kInvalidArgument for non-finite or out-of-range values, and for gains whose closed loop is
  // unstable by Eq. (8) (|pole| >= 1 when k_i != 0, or k_p + k_i + 1 = 0). With k_i = 0 the
  // gain k_p must keep k_p/(k_p+1) finite and the loop of Eq. (6) static (k_p > -1).
  Status Validate() const;
};

// What the agent decided at a frame's sleep point.
struct FrameDecision {
  Duration sleep{0};           // sleep before Present; >= 0
  double command_fps = 0;      // F, the control input (kUncappedFps when not controlled)
  bool controlled = false;     // a finite reference was in force
  bool saturated = false;      // Eq. (1) was negative or F hit a bound (see anti-windup)
};

// What the agent measured when Present returned.
struct FrameSample {
  TimePoint present_end{};     // end of this frame (Present returned)
  Duration gpu_time{0};        // Present execution time: submission to GPU completion
};

class FrameController {
 public:
  // kInvalidArgument when `options` fail Validate().
  static Result<FrameController> Create(const FrameControllerOptions& options);

  const FrameControllerOptions& options() const { return options_; }
  // Eq. (7) for this controller's gains.
  double pole() const { return ClosedLoopPole(options_.kp, options_.ki); }

  // Sets the reference r in frames per second; kUncappedFps disables control.
  // Precondition: fps > 0 (or kUncappedFps).
  void SetReference(double fps) { reference_fps_ = fps; }
  double reference_fps() const { return reference_fps_; }

  // Called at the sleep point of a frame, after its CPU work. `cpu_time` is the frame's measured
  // CPU time. Returns the sleep before Present (Eq. 1 with the PI's command F).
  FrameDecision Decide(Duration cpu_time);

  // Called when Present returns. Updates the frame rate, the GPU-time history and, for a
  // controlled frame, the disturbance estimate and (subject to the anti-windup rule) the
  // integral. Precondition: present_end is not earlier than the previous sample's.
  void Observe(const FrameSample& sample);

  // Predicted GPU time of the coming frame (0 before any sample).
  Duration PredictedGpuTime() const;
  // Frame rate of the last complete frame (1 / Present-to-Present time); 0 before two samples.
  double last_fps() const { return last_fps_; }
  uint64_t frames() const { return frames_; }
  // The PI state, for tests and monitoring.
  double integral() const { return integral_; }
  double disturbance() const { return disturbance_; }

 private:
  explicit FrameController(const FrameControllerOptions& options);

  FrameControllerOptions options_;
  double reference_fps_ = kUncappedFps;

  // PI state in the transformed domain (Eq. 5), natural logs of seconds.
  double integral_ = 0;      // S: sum of measured errors y_r - y
  double disturbance_ = 0;   // d^: y - u of the last controlled frame

  // The decision waiting for its frame to end.
  bool pending_ = false;
  int pending_saturation_ = 0;  // -1: asked for more speed than possible, +1: F at min_fps
  double pending_u_ = 0;
  double pending_yr_ = 0;

  // Ring buffer of recent Present execution times (seconds).
  std::vector<double> gpu_history_;
  size_t gpu_next_ = 0;
  size_t gpu_count_ = 0;

  bool have_last_end_ = false;
  TimePoint last_end_{};
  double last_fps_ = 0;
  uint64_t frames_ = 0;
};

}  // namespace gmux::core
