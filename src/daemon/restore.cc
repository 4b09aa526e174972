#include "daemon/restore.h"

#include <algorithm>
#include <atomic>

#include "daemon/kernel_scan.h"

namespace gmux::daemon {

namespace {
// Builder threads running in this process.
std::atomic<int> g_builders{0};

bool TakeBuilderSlot() {
  int n = g_builders.load();
  while (n < RestoredVariants::kMaxBuilders) {
    if (g_builders.compare_exchange_weak(n, n + 1)) return true;
  }
  return false;
}
}  // namespace

RestoredVariants::RestoredVariants(const cl_icd_dispatch& cl, Ref<cl_program> program,
                                   std::string source, std::string options)
    : cl_(cl), app_program_(std::move(program)), source_(std::move(source)),
      options_(std::move(options)) {}

RestoredVariants::~RestoredVariants() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    to_build_.clear();
  }
  if (builder_.joinable()) builder_.join();
}

uint64_t RestoredVariants::built() const {
  std::lock_guard<std::mutex> lock(mu_);
  return built_;
}

uint64_t RestoredVariants::failed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failed_;
}

std::optional<RestoredVariants::Kernel> RestoredVariants::Find(const std::string& name,
                                                               const LaunchShape& shape,
                                                               cl_device_id device) {
  std::unique_lock<std::mutex> lock(mu_);
  auto it = variants_.find(shape);
  if (it == variants_.end()) {
    if (stop_) return std::nullopt;
    if (variants_.size() >= kMaxVariants) {
      // The least recently used shape that is not waiting for the builder goes.
      for (auto l = lru_.rbegin(); l != lru_.rend(); ++l) {
        auto v = variants_.find(*l);
        if (v != variants_.end() && v->second.state != Variant::State::kQueued) {
          variants_.erase(v);
          lru_.erase(std::next(l).base());
          break;
        }
      }
      if (variants_.size() >= kMaxVariants) return std::nullopt;
    }
    if (!building_) {
      // A builder that ended is joined (it no longer needs mu_); a new one needs a free slot.
      if (!TakeBuilderSlot()) return std::nullopt;
      if (builder_.joinable()) builder_.join();
      building_ = true;
      builder_ = std::thread([this] { BuildLoop(); });
    }
    variants_.emplace(shape, Variant{});
    lru_.push_front(shape);
    to_build_.push_back(shape);
    return std::nullopt;
  }
  lru_.remove(shape);
  lru_.push_front(shape);
  Variant& v = it->second;
  if (v.state != Variant::State::kBuilt) return std::nullopt;
  auto key = std::make_pair(name, device);
  if (auto k = v.kernels.find(key); k != v.kernels.end()) return k->second;
  cl_int err = CL_SUCCESS;
  cl_kernel k = cl_.clCreateKernel(v.program->h, name.c_str(), &err);
  if (k == nullptr) return std::nullopt;
  Kernel out{Adopt(k), std::make_shared<std::mutex>(), 0};
  cl_.clGetKernelWorkGroupInfo(k, device, CL_KERNEL_WORK_GROUP_SIZE,
                               sizeof(out.work_group_size), &out.work_group_size, nullptr);
  v.kernels.emplace(key, out);
  return out;
}

void RestoredVariants::BuildLoop() {
  cl_context ctx = nullptr;
  cl_.clGetProgramInfo(app_program_->h, CL_PROGRAM_CONTEXT, sizeof(ctx), &ctx, nullptr);
  cl_uint ndev = 0;
  cl_.clGetProgramInfo(app_program_->h, CL_PROGRAM_NUM_DEVICES, sizeof(ndev), &ndev, nullptr);
  std::vector<cl_device_id> devices(ndev);
  if (ndev > 0) {
    cl_.clGetProgramInfo(app_program_->h, CL_PROGRAM_DEVICES, sizeof(cl_device_id) * ndev,
                         devices.data(), nullptr);
  }
  const std::string source = RestoringSource(source_);
  for (;;) {
    LaunchShape shape;
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (stop_ || to_build_.empty()) {
        building_ = false;
        g_builders.fetch_sub(1);
        return;
      }
      shape = to_build_.front();
      to_build_.pop_front();
    }
    // Outside the lock: launches of other shapes go on meanwhile.
    Ref<cl_program> program;
    bool ok = false;
    if (ctx != nullptr && !devices.empty()) {
      const char* text = source.c_str();
      cl_int err = CL_SUCCESS;
      cl_program p = cl_.clCreateProgramWithSource(ctx, 1, &text, nullptr, &err);
      if (p != nullptr) {
        program = Adopt(p);
        const std::string options =
            options_ + RestoringOptions(shape.dim, shape.global, shape.offset);
        ok = cl_.clBuildProgram(p, static_cast<cl_uint>(devices.size()), devices.data(),
                                options.c_str(), nullptr, nullptr) == CL_SUCCESS;
      }
    }
    std::lock_guard<std::mutex> lock(mu_);
    auto it = variants_.find(shape);
    if (it == variants_.end()) continue;  // evicted meanwhile
    if (ok) {
      it->second.state = Variant::State::kBuilt;
      it->second.program = std::move(program);
      ++built_;
    } else {
      it->second.state = Variant::State::kFailed;
      ++failed_;
    }
  }
}

}  // namespace gmux::daemon
