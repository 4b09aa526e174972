#include "daemon/splitter.h"

#include <algorithm>

namespace gmux::daemon {

namespace {

// The largest divisor of n that is <= cap (1 when none larger).
size_t LargestDivisorUpTo(size_t n, size_t cap) {
  for (size_t d = std::min(n, cap); d > 1; --d) {
    if (n % d == 0) return d;
  }
  return 1;
}

}  // namespace

std::optional<SplitPlan> PlanSplit(const cl_icd_dispatch& cl, cl_kernel kernel,
                                   cl_device_id device, uint32_t dim,
                                   const std::array<size_t, 3>& global,
                                   const std::array<size_t, 3>* local) {
  if (dim < 1 || dim > 3) return std::nullopt;
  SplitPlan plan;
  plan.dim = dim;
  if (local != nullptr) {
    plan.local = *local;
  } else {
    size_t compiled[3] = {0, 0, 0};
    if (cl.clGetKernelWorkGroupInfo(kernel, device, CL_KERNEL_COMPILE_WORK_GROUP_SIZE,
                                    sizeof(compiled), compiled, nullptr) == CL_SUCCESS &&
        compiled[0] != 0) {
      for (uint32_t i = 0; i < 3; ++i) plan.local[i] = compiled[i] == 0 ? 1 : compiled[i];
    } else {
      size_t limit = 0;
      if (cl.clGetKernelWorkGroupInfo(kernel, device, CL_KERNEL_WORK_GROUP_SIZE, sizeof(limit),
                                      &limit, nullptr) != CL_SUCCESS ||
          limit == 0) {
        return std::nullopt;
      }
      plan.local = {LargestDivisorUpTo(global[0], std::min<size_t>(limit, 1024)), 1, 1};
      // Tiny work-groups would make every chunk (and so the split launch) much slower.
      if (plan.local[0] < std::min<size_t>(global[0], 16)) return std::nullopt;
    }
  }
  for (uint32_t i = 0; i < dim; ++i) {
    if (plan.local[i] == 0 || global[i] % plan.local[i] != 0) return std::nullopt;
  }
  const uint32_t last = dim - 1;
  plan.row_items = 1;
  for (uint32_t i = 0; i < last; ++i) plan.row_items *= global[i];
  const uint64_t slabs = global[last] / plan.local[last];
  // Quantisation: the fewest slabs per granule that leave at most kMaxGranules granules.
  uint64_t per = 1;
  while (per < slabs && (slabs % per != 0 || slabs / per > kMaxGranules)) ++per;
  plan.granules = slabs / per;
  if (plan.granules < 2) return std::nullopt;
  return plan;
}

void ChunkGeometry(const SplitPlan& plan, const std::array<size_t, 3>& offset,
                   const std::array<size_t, 3>& global, const core::WorkRange& range,
                   std::array<size_t, 3>& chunk_offset, std::array<size_t, 3>& chunk_global) {
  const uint32_t last = plan.dim - 1;
  chunk_offset = offset;
  chunk_global = global;
  chunk_offset[last] = offset[last] + static_cast<size_t>(range.begin / plan.row_items);
  chunk_global[last] = static_cast<size_t>(range.size() / plan.row_items);
}

cl_int EnqueueChunk(const cl_icd_dispatch& cl, cl_command_queue queue, cl_kernel kernel,
                    uint32_t dim, const std::array<size_t, 3>& offset,
                    const std::array<size_t, 3>& global, const SplitPlan& plan,
                    const core::WorkRange& range, cl_uint num_waits, const cl_event* waits,
                    cl_event* out) {
  std::array<size_t, 3> off{}, gs{};
  ChunkGeometry(plan, offset, global, range, off, gs);
  return cl.clEnqueueNDRangeKernel(queue, kernel, dim, off.data(), gs.data(), plan.local.data(),
                                   num_waits, waits, out);
}

}  // namespace gmux::daemon
