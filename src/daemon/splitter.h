// Splitter: how one NDRange launch of a splittable kernel (kernel_scan.h) runs as chunks.
//
// Geometry. A launch is cut along its last dimension L: a chunk is a range of whole work-groups
// of L, so every chunk covers full extents of the other dimensions and starts and ends on
// work-group boundaries. The scheduler's policy sees the launch as one block of
// work_items = product of the global sizes, divided into `granules` equal granules (its
// work_groups); a policy range [b, e) of work-items, on granule boundaries (policy.h), is run as
//   global_offset[L] = offset[L] + b / row_items,  global_size[L] = (e - b) / row_items
// with row_items the work-items of one index of L, and every other size and offset unchanged.
// Every chunk passes the same local size: the app's, or, when the app gave none, the kernel's
// compile-time size (reqd_work_group_size) or one chosen here (the largest divisor of the first
// dimension's global size up to min(kernel work-group limit, 1024), 1 in the others).
//
// Quantisation. PoCL compiles a specialised work-group function per launch shape, so chunk
// sizes that change every round could keep the compiler busy. A granule is therefore a whole
// number of work-group slabs chosen so a launch has at most kMaxGranules granules: every chunk
// is a multiple of the granule, so one launch shape yields at most kMaxGranules chunk shapes
// (docs/performance.md has the measured cost of a new shape). The granule count is the largest
// divisor of the launch's slab count (work-groups along L) that is at most kMaxGranules, found by
// at most kMaxGranules trial divisions: the policy needs equal granules (model.h: work_items /
// work_groups is the local size it rounds chunks to), so a slab count with no divisor in
// 2..kMaxGranules (a large prime, say) is not split and the launch runs whole. Choosing a local
// size tries at most kMaxChosenLocal divisors. Planning therefore costs the same for any launch.
// Pure functions apart from the OpenCL calls they make; any thread.
#pragma once

#include <array>
#include <cstdint>
#include <optional>

#include "core/model.h"
#include "daemon/cl_ref.h"

namespace gmux::daemon {

inline constexpr uint64_t kMaxGranules = 32;
// The largest local size chosen here when neither the app nor the kernel gives one.
inline constexpr size_t kMaxChosenLocal = 1024;

struct SplitPlan {
  uint32_t dim = 1;
  std::array<size_t, 3> local{1, 1, 1};  // passed with every chunk
  uint64_t row_items = 1;                // work-items per index of the last dimension
  uint64_t granules = 1;                 // the block's work_groups for the policy
};

// Chooses the chunk geometry of a launch, or nullopt when it cannot be split (a local size
// that does not divide the global size, a chosen local size too small to be worth it, a single
// granule). `local` is the app's local size (nullptr: none given).
std::optional<SplitPlan> PlanSplit(const cl_icd_dispatch& cl, cl_kernel kernel,
                                   cl_device_id device, uint32_t dim,
                                   const std::array<size_t, 3>& global,
                                   const std::array<size_t, 3>* local);

// The local size chosen when neither the app nor the kernel gives one: the largest divisor of
// global0 (the first dimension's global size) up to min(kernel_work_group_size, kMaxChosenLocal),
// 1 in the other dimensions. nullopt when kernel_work_group_size is 0 (unknown) or the divisor
// is below min(global0, 16): tiny work-groups would make every chunk much slower.
std::optional<size_t> ChooseSplitLocalSize(size_t global0, size_t kernel_work_group_size);

// The pure part of PlanSplit: the plan for a launch of `dim` dimensions whose chunks all pass
// `local` (entries past dim are ignored). nullopt when dim is outside 1..3, a local size is 0 or
// does not divide its global size, the launch's work-items overflow uint64, or the slab count
// has no divisor in 2..kMaxGranules. Bounded cost whatever the sizes.
std::optional<SplitPlan> PlanSplitGeometry(uint32_t dim, const std::array<size_t, 3>& global,
                                           const std::array<size_t, 3>& local);

// The offsets and sizes of the chunk `range` (work-items of the whole launch, on granule
// boundaries or the launch's end).
void ChunkGeometry(const SplitPlan& plan, const std::array<size_t, 3>& offset,
                   const std::array<size_t, 3>& global, const core::WorkRange& range,
                   std::array<size_t, 3>& chunk_offset, std::array<size_t, 3>& chunk_global);

// Enqueues the chunk `range` of the launch (arguments already set on `kernel`).
cl_int EnqueueChunk(const cl_icd_dispatch& cl, cl_command_queue queue, cl_kernel kernel,
                    uint32_t dim, const std::array<size_t, 3>& offset,
                    const std::array<size_t, 3>& global, const SplitPlan& plan,
                    const core::WorkRange& range, cl_uint num_waits, const cl_event* waits,
                    cl_event* out);

}  // namespace gmux::daemon
