#include "sim/workloads.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <sstream>

namespace gmux::sim {
namespace {

enum WakeArg : uint64_t { kBegin = 0, kSubmit = 1 };

double NoisyCost(Rng& rng, double cost_s, double cv) {
  if (cv <= 0) return cost_s;
  return cost_s * std::max(0.1, rng.Normal(1.0, cv));
}

// Whether the next task/frame is part of a burst; `left` counts the burst's remaining
// tasks/frames. Draws nothing when bursts are off, so enabling them elsewhere changes no stream.
bool StepBurst(Rng& rng, const InterferenceOptions& o, uint32_t& left) {
  if (o.burst_prob <= 0 || (o.burst_blocks == 0 && o.burst_depth == 0)) return false;
  if (left == 0 && rng.Bernoulli(o.burst_prob)) left = o.burst_len;
  if (left == 0) return false;
  --left;
  return true;
}

Duration Seconds(double s) { return FromSeconds(std::max(0.0, s)); }

uint64_t RoundUp(uint64_t v, uint64_t m) { return (v + m - 1) / m * m; }

// Closed-loop GPGPU tasks: enqueue kernels_per_task launches, wait for all, think, repeat.
class KernelLoop final : public Workload {
 public:
  explicit KernelLoop(KernelLoopOptions o) : o_(std::move(o)) {}

  std::string Describe() const override { return o_.label; }

  void Start(TenantHost& host) override {
    host.WakeAfter(Seconds(host.rng().Uniform(0, o_.interference.start_jitter_s)), kBegin);
  }

  void OnWake(TenantHost& host, uint64_t arg) override {
    if (arg == kBegin) {
      BeginTask(host);
      return;
    }
    Rng& rng = host.rng();
    const bool burst = StepBurst(rng, o_.interference, burst_left_);
    const uint32_t kernels = o_.kernels_per_task + (burst ? o_.interference.burst_blocks : 0);
    submitted_at_ = host.now();
    outstanding_ = kernels;
    if (o_.upload_bytes > 0) {
      BlockRequest upload;
      upload.kind = core::BlockKind::kCopy;
      upload.bytes = o_.upload_bytes;
      upload.tag = kUploadTag;
      host.Submit(upload);
    }
    BlockRequest r;
    r.kind = core::BlockKind::kKernel;
    r.work_items = o_.work_items;
    r.work_groups = (o_.work_items + o_.local_size - 1) / o_.local_size;
    r.splittable = o_.splittable ? core::Splittable::kYes : core::Splittable::kNo;
    for (uint32_t k = 0; k < kernels; ++k) {
      r.cost_s = NoisyCost(rng, o_.kernel_cost_s, o_.interference.cost_cv);
      host.Submit(r);
    }
  }

  void OnBlockDone(TenantHost& host, uint64_t tag) override {
    if (tag == kUploadTag) return;
    if (--outstanding_ > 0) return;
    host.TaskDone(host.now() - submitted_at_);
    ++done_;
    if (Finished()) return;
    host.WakeAfter(Seconds(host.rng().Exponential(o_.interference.think_s)), kBegin);
  }

  bool Finished() const override { return o_.tasks > 0 && done_ >= o_.tasks; }

 private:
  void BeginTask(TenantHost& host) {
    if (host.stopping() || (o_.tasks > 0 && started_ >= o_.tasks)) return;
    ++started_;
    const double cpu_s = o_.cpu_per_task_s + o_.cpu_per_kernel_s * o_.kernels_per_task;
    host.AddCpuTime(Seconds(cpu_s));
    host.WakeAfter(Seconds(cpu_s + host.rng().Exponential(o_.interference.jitter_s)), kSubmit);
  }

  static constexpr uint64_t kUploadTag = 1;

  KernelLoopOptions o_;
  uint64_t started_ = 0;
  uint64_t done_ = 0;
  uint32_t outstanding_ = 0;
  uint32_t burst_left_ = 0;
  TimePoint submitted_at_{};
};

// Frames: CPU preparation, blocks + present enqueued at once, run ahead up to frames_in_flight.
class FrameLoop final : public Workload {
 public:
  explicit FrameLoop(FrameLoopOptions o) : o_(std::move(o)) {}

  std::string Describe() const override { return o_.label; }

  void Start(TenantHost& host) override {
    host.WakeAfter(Seconds(host.rng().Uniform(0, o_.interference.start_jitter_s)), kBegin);
  }

  void OnWake(TenantHost& host, uint64_t arg) override {
    if (arg == kBegin) {
      BeginFrame(host);
      return;
    }
    Rng& rng = host.rng();
    const bool burst = StepBurst(rng, o_.interference, burst_left_);
    const uint32_t blocks = o_.blocks_per_frame + (burst ? o_.interference.burst_blocks : 0);
    BlockRequest r;
    r.kind = core::BlockKind::kKernel;
    r.work_items = o_.block_items;
    r.work_groups = std::max<uint64_t>(1, o_.block_items / 64);
    r.splittable = core::Splittable::kNo;
    r.tag = kDraw;
    for (uint32_t k = 0; k < blocks; ++k) {
      r.cost_s = NoisyCost(rng, o_.block_cost_s, o_.interference.cost_cv);
      host.Submit(r);
    }
    BlockRequest present;
    present.kind = core::BlockKind::kMarker;
    present.cost_s = o_.present_cost_s;
    present.tag = kPresent;
    host.Submit(present);
    ++in_flight_;
    limit_ = o_.frames_in_flight + (burst ? o_.interference.burst_depth : 0);
    if (in_flight_ < limit_) {
      Next(host);
    } else {
      waiting_ = true;
    }
  }

  void OnBlockDone(TenantHost& host, uint64_t tag) override {
    if (tag != kPresent) return;
    --in_flight_;
    ++done_;
    host.TaskDone(host.now() - frame_start_.front());
    frame_start_.pop_front();
    if (waiting_ && in_flight_ < limit_) {
      waiting_ = false;
      Next(host);
    }
  }

  bool Finished() const override { return o_.frames > 0 && done_ >= o_.frames; }

 private:
  static constexpr uint64_t kDraw = 0;
  static constexpr uint64_t kPresent = 1;

  void Next(TenantHost& host) {
    if (o_.interference.think_s > 0) {
      host.WakeAfter(Seconds(host.rng().Exponential(o_.interference.think_s)), kBegin);
    } else {
      BeginFrame(host);
    }
  }

  void BeginFrame(TenantHost& host) {
    if (host.stopping() || (o_.frames > 0 && started_ >= o_.frames)) return;
    ++started_;
    const double cpu_s = o_.cpu_per_frame_s + o_.cpu_per_block_s * (o_.blocks_per_frame + 1);
    host.AddCpuTime(Seconds(cpu_s));
    frame_start_.push_back(host.now());
    host.WakeAfter(Seconds(cpu_s + host.rng().Exponential(o_.interference.jitter_s)), kSubmit);
  }

  FrameLoopOptions o_;
  uint64_t started_ = 0;
  uint64_t done_ = 0;
  uint32_t in_flight_ = 0;
  uint32_t limit_ = 1;  // run-ahead limit in force (frames_in_flight, deeper in a burst)
  bool waiting_ = false;
  uint32_t burst_left_ = 0;
  std::deque<TimePoint> frame_start_;
};

Status Field(bool ok, const std::string& owner, const std::string& what) {
  if (ok) return Status::Ok();
  return InvalidArgument(owner + ": " + what);
}

}  // namespace

Status InterferenceOptions::Validate() const {
  GMUX_RETURN_IF_ERROR(Field(jitter_s >= 0, "interference", "jitter_s must be >= 0"));
  GMUX_RETURN_IF_ERROR(
      Field(burst_prob >= 0 && burst_prob <= 1, "interference", "burst_prob must be in [0, 1]"));
  GMUX_RETURN_IF_ERROR(Field(burst_len >= 1, "interference", "burst_len must be >= 1"));
  GMUX_RETURN_IF_ERROR(Field(cost_cv >= 0, "interference", "cost_cv must be >= 0"));
  GMUX_RETURN_IF_ERROR(Field(think_s >= 0, "interference", "think_s must be >= 0"));
  GMUX_RETURN_IF_ERROR(Field(start_jitter_s >= 0, "interference", "start_jitter_s must be >= 0"));
  return Status::Ok();
}

Status KernelLoopOptions::Validate() const {
  GMUX_RETURN_IF_ERROR(Field(work_items > 0, label, "work_items must be > 0"));
  GMUX_RETURN_IF_ERROR(Field(local_size > 0, label, "local_size must be > 0"));
  GMUX_RETURN_IF_ERROR(Field(kernel_cost_s >= 0, label, "kernel cost must be >= 0"));
  GMUX_RETURN_IF_ERROR(Field(kernels_per_task > 0, label, "kernels_per_task must be > 0"));
  GMUX_RETURN_IF_ERROR(Field(cpu_per_task_s >= 0 && cpu_per_kernel_s >= 0, label,
                             "CPU times must be >= 0"));
  return interference.Validate();
}

Status FrameLoopOptions::Validate() const {
  GMUX_RETURN_IF_ERROR(Field(blocks_per_frame > 0, label, "blocks_per_frame must be > 0"));
  GMUX_RETURN_IF_ERROR(Field(block_cost_s >= 0 && present_cost_s >= 0, label,
                             "costs must be >= 0"));
  GMUX_RETURN_IF_ERROR(Field(block_items > 0, label, "block_items must be > 0"));
  GMUX_RETURN_IF_ERROR(Field(cpu_per_frame_s >= 0 && cpu_per_block_s >= 0, label,
                             "CPU times must be >= 0"));
  GMUX_RETURN_IF_ERROR(Field(frames_in_flight > 0, label, "frames_in_flight must be > 0"));
  return interference.Validate();
}

KernelLoopOptions MatmulKernel(uint64_t n) {
  KernelLoopOptions o;
  std::ostringstream label;
  label << "matmul n=" << n;
  o.label = label.str();
  const uint64_t padded = RoundUp(n, 16);
  o.work_items = padded * padded;  // one work-item per output element, 16×16 work-groups
  o.local_size = 256;
  o.upload_bytes = 8 * n * n;
  const double dn = static_cast<double>(n);
  o.kernel_cost_s = kMatmulSecondsPerN3 * dn * dn * dn;
  return o;
}

KernelLoopOptions SobelKernel(uint64_t width, uint64_t height) {
  KernelLoopOptions o;
  std::ostringstream label;
  label << "sobel " << width << "x" << height;
  o.label = label.str();
  o.work_items = RoundUp(width, 16) * RoundUp(height, 16);  // one work-item per pixel
  o.local_size = 256;
  o.upload_bytes = 4 * width * height;
  o.kernel_cost_s = kSobelSecondsPerPixel * static_cast<double>(width * height);
  return o;
}

KernelLoopOptions BinomialKernel(uint64_t samples) {
  KernelLoopOptions o;
  std::ostringstream label;
  label << "binomial samples=" << samples;
  o.label = label.str();
  o.work_items = RoundUp(samples, 256);  // one work-item per option sample
  o.local_size = 256;
  o.upload_bytes = 16 * samples;
  o.kernel_cost_s = kBinomialSecondsPerSample * static_cast<double>(samples);
  return o;
}

Result<std::unique_ptr<Workload>> MakeKernelLoop(const KernelLoopOptions& options) {
  GMUX_RETURN_IF_ERROR(options.Validate());
  return std::unique_ptr<Workload>(std::make_unique<KernelLoop>(options));
}

Result<std::unique_ptr<Workload>> MakeFrameLoop(const FrameLoopOptions& options) {
  GMUX_RETURN_IF_ERROR(options.Validate());
  return std::unique_ptr<Workload>(std::make_unique<FrameLoop>(options));
}

}  // namespace gmux::sim
