#include "core/frame_controller.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <sstream>

namespace gmux::core {
namespace {

constexpr int kMaxGpuHistoryFrames = 1024;

}  // namespace

double ClosedLoopPole(double kp, double ki) {
  assert(kp + ki + 1 != 0);
  return (kp + 1) / (kp + ki + 1);  // Eq. (7)
}

bool ClosedLoopHasPole(double ki) { return ki != 0; }

Duration SleepTime(double fps, Duration cpu_time, Duration gpu_time) {
  assert(fps > 0);
  if (std::isinf(fps)) return Duration(0);
  // Eq. (1) in seconds: 1/F - T_cpu - T_gpu.
  Duration period = FromSeconds(1.0 / fps);
  Duration sleep = period - cpu_time - gpu_time;
  return sleep > Duration(0) ? sleep : Duration(0);
}

Status FrameControllerOptions::Validate() const {
  if (!std::isfinite(kp) || !std::isfinite(ki)) {
    return InvalidArgument("frame controller: kp and ki must be finite numbers");
  }
  if (kp + ki + 1 == 0) {
    return InvalidArgument("frame controller: kp + ki + 1 = 0 leaves the pole of Eq. (7) undefined");
  }
  if (ClosedLoopHasPole(ki)) {
    double pole = ClosedLoopPole(kp, ki);
    if (!(std::abs(pole) < 1)) {
      std::ostringstream m;
      m << "frame controller: kp = " << kp << ", ki = " << ki << " put the closed-loop pole "
        << "(kp+1)/(kp+ki+1) = " << pole << " outside the unit circle; Eq. (8) requires "
        << "|pole| < 1 (e.g. kp = 0.1 with 0 < ki)";
      return InvalidArgument(m.str());
    }
  } else if (!(kp > -1)) {
    return InvalidArgument("frame controller: with ki = 0 the gain kp must be > -1 (T_c = kp/(kp+1))");
  }
  if (gpu_history_frames < 1 || gpu_history_frames > kMaxGpuHistoryFrames) {
    return InvalidArgument("frame controller: gpu_history_frames must be in [1, 1024]");
  }
  if (!(min_fps > 0) || !std::isfinite(max_fps) || !(min_fps < max_fps)) {
    return InvalidArgument("frame controller: need 0 < min_fps < max_fps < infinity");
  }
  return Status::Ok();
}

Result<FrameController> FrameController::Create(const FrameControllerOptions& options) {
  GMUX_RETURN_IF_ERROR(options.Validate());
  return FrameController(options);
}

FrameController::FrameController(const FrameControllerOptions& options)
    : options_(options), gpu_history_(static_cast<size_t>(options.gpu_history_frames), 0.0) {}

Duration FrameController::PredictedGpuTime() const {
  if (gpu_count_ == 0) return Duration(0);
  double sum = 0;
  for (size_t i = 0; i < gpu_count_; ++i) sum += gpu_history_[i];
  return FromSeconds(sum / static_cast<double>(gpu_count_));
}

FrameDecision FrameController::Decide(Duration cpu_time) {
  FrameDecision d;
  pending_ = false;
  if (std::isinf(reference_fps_)) {
    d.command_fps = kUncappedFps;
    return d;
  }
  assert(reference_fps_ > 0);
  const double kp = options_.kp;
  const double ki = options_.ki;
  // Eq. (5): the reference and the command in the transformed domain.
  const double y_r = -std::log(reference_fps_);
  // The PI of Eq. (3) solved through G'_p = 1 with the estimated disturbance (see the header).
  const double e = -(disturbance_ + ki * integral_) / (1 + kp + ki);
  double u = y_r - disturbance_ - e;
  // Saturation direction: -1 when the command asks for more speed than the frame can give
  // (Eq. (1) negative, or F at max_fps), +1 when F is held at min_fps.
  int saturation = 0;
  const double u_min = -std::log(options_.max_fps);
  const double u_max = -std::log(options_.min_fps);
  if (u < u_min) {
    u = u_min;
    saturation = -1;
  } else if (u > u_max) {
    u = u_max;
    saturation = +1;
  }
  const double fps = std::exp(-u);
  Duration gpu = PredictedGpuTime();
  // Eq. (1).
  Duration raw = FromSeconds(1.0 / fps) - cpu_time - gpu;
  if (raw <= Duration(0)) saturation = -1;
  d.sleep = raw > Duration(0) ? raw : Duration(0);
  d.command_fps = fps;
  d.controlled = true;
  d.saturated = saturation != 0;
  pending_ = true;
  pending_saturation_ = saturation;
  pending_u_ = u;
  pending_yr_ = y_r;
  return d;
}

void FrameController::Observe(const FrameSample& sample) {
  double gpu_s = std::max(0.0, ToSeconds(sample.gpu_time));
  gpu_history_[gpu_next_] = gpu_s;
  gpu_next_ = (gpu_next_ + 1) % gpu_history_.size();
  gpu_count_ = std::min(gpu_count_ + 1, gpu_history_.size());
  ++frames_;

  if (have_last_end_) {
    assert(sample.present_end >= last_end_);
    Duration period = sample.present_end - last_end_;
    if (period > Duration(0)) {
      last_fps_ = 1.0 / ToSeconds(period);
      // The frame just measured was shaped by the pending decision.
      if (pending_) {
        const double y = std::log(ToSeconds(period));  // Eq. (5): y = ln(frame time)
        const double e = pending_yr_ - y;
        disturbance_ = y - pending_u_;
        // Conditional integration (anti-windup): a saturated frame only integrates an error that
        // leads back out of saturation.
        if (pending_saturation_ == 0 || (pending_saturation_ < 0 && e > 0) ||
            (pending_saturation_ > 0 && e < 0)) {
          integral_ += e;
        }
      }
    }
  }
  pending_ = false;
  have_last_end_ = true;
  last_end_ = sample.present_end;
}

}  // namespace gmux::core
