// RestoredVariants: the variants of one restorable program (kernel_scan.h, "Restoring"), one per
// launch shape, so that launches of kernels that use get_group_id, get_num_groups,
// get_global_size, get_global_offset or get_global_linear_id can run in chunks too.
//
// A shape's first launch runs whole and asks for its variant, which a thread of this object
// builds in the background (so no launch waits for a compiler); launches of that shape after the
// build may split, each chunk running the variant's kernel of the same name with the same
// arguments. A failed build marks the shape whole for good. At most kMaxVariants shapes per
// program are kept (the least recently used goes; chunks already enqueued hold their kernel).
// A program's builder thread runs only while it has shapes to build, and at most
// kMaxBuilders of them run in a process at once (a shape asked for while that many build is
// asked for again at its next launch), so a tenant with many programs cannot make its worker
// start a thread per program. Thread-safe; the destructor waits for a build in progress.
#pragma once

#include <CL/cl_icd.h>

#include <array>
#include <cstdint>
#include <deque>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "daemon/cl_ref.h"

namespace gmux::daemon {

struct LaunchShape {
  uint32_t dim = 1;
  std::array<size_t, 3> global{1, 1, 1};
  std::array<size_t, 3> offset{0, 0, 0};
  auto operator<=>(const LaunchShape&) const = default;
};

class RestoredVariants {
 public:
  static constexpr size_t kMaxVariants = 8;
  static constexpr int kMaxBuilders = 2;

  // `program` is the app's built program (its context and devices are the variants'); `source`
  // and `options` are what it was built from.
  RestoredVariants(const cl_icd_dispatch& cl, Ref<cl_program> program, std::string source,
                   std::string options);
  ~RestoredVariants();
  RestoredVariants(const RestoredVariants&) = delete;
  RestoredVariants& operator=(const RestoredVariants&) = delete;

  struct Kernel {
    Ref<cl_kernel> kernel;
    std::shared_ptr<std::mutex> mu;  // guards its arguments while a chunk is enqueued
    size_t work_group_size = 0;      // CL_KERNEL_WORK_GROUP_SIZE on the device asked for
  };
  // The kernel `name` of the shape's variant on `device`, or nullopt while it is not built (the
  // first call for a shape starts its build) or when it cannot be.
  std::optional<Kernel> Find(const std::string& name, const LaunchShape& shape,
                             cl_device_id device);

  // For status and tests: variants built and builds that failed.
  uint64_t built() const;
  uint64_t failed() const;

 private:
  struct Variant {
    enum class State { kQueued, kBuilt, kFailed } state = State::kQueued;
    Ref<cl_program> program;
    std::map<std::pair<std::string, cl_device_id>, Kernel> kernels;
  };
  void BuildLoop();

  const cl_icd_dispatch& cl_;
  Ref<cl_program> app_program_;
  const std::string source_;
  const std::string options_;

  mutable std::mutex mu_;
  std::map<LaunchShape, Variant> variants_;
  std::list<LaunchShape> lru_;        // most recently used first
  std::deque<LaunchShape> to_build_;  // queued shapes, oldest first
  uint64_t built_ = 0, failed_ = 0;
  bool stop_ = false;
  bool building_ = false;  // builder_ runs (it clears this, under mu_, as it ends)
  std::thread builder_;
};

}  // namespace gmux::daemon
