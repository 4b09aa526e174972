#include "daemon/splitter.h"

#include <algorithm>

namespace gmux::daemon {

namespace {

// The largest divisor of n that is <= cap (1 when none larger). At most cap trial divisions.
uint64_t LargestDivisorUpTo(uint64_t n, uint64_t cap) {
  for (uint64_t d = std::min(n, cap); d > 1; --d) {
    if (n % d == 0) return d;
  }
  return 1;
}

}  // namespace

std::optional<size_t> ChooseSplitLocalSize(size_t global0, size_t kernel_work_group_size) {
  if (kernel_work_group_size == 0) return std::nullopt;
  const size_t local = static_cast<size_t>(
      LargestDivisorUpTo(global0, std::min(kernel_work_group_size, kMaxChosenLocal)));
  // Tiny work-groups would make every chunk (and so the split launch) much slower.
  if (local < std::min<size_t>(global0, 16)) return std::nullopt;
  return local;
}

std::optional<SplitPlan> PlanSplitGeometry(uint32_t dim, const std::array<size_t, 3>& global,
                                           const std::array<size_t, 3>& local) {
  if (dim < 1 || dim > 3) return std::nullopt;
  SplitPlan plan;
  plan.dim = dim;
  plan.local = local;
  for (uint32_t i = 0; i < dim; ++i) {
    if (local[i] == 0 || global[i] % local[i] != 0) return std::nullopt;
  }
  const uint32_t last = dim - 1;
  // Policy ranges count work-items in uint64: the whole launch must fit.
  uint64_t row_items = 1, items = 0;
  for (uint32_t i = 0; i < last; ++i) {
    if (__builtin_mul_overflow(row_items, global[i], &row_items)) return std::nullopt;
  }
  if (__builtin_mul_overflow(row_items, global[last], &items)) return std::nullopt;
  plan.row_items = row_items;
  const uint64_t slabs = global[last] / local[last];
  if (slabs == 0) return std::nullopt;
  // Quantisation: the fewest slabs per granule that leave at most kMaxGranules equal granules,
  // i.e. the largest divisor of slabs up to kMaxGranules.
  plan.granules = LargestDivisorUpTo(slabs, kMaxGranules);
  if (plan.granules < 2) return std::nullopt;
  return plan;
}

std::optional<SplitPlan> PlanSplit(const cl_icd_dispatch& cl, cl_kernel kernel,
                                   cl_device_id device, uint32_t dim,
                                   const std::array<size_t, 3>& global,
                                   const std::array<size_t, 3>* local) {
  if (dim < 1 || dim > 3) return std::nullopt;
  std::array<size_t, 3> chunk_local{1, 1, 1};
  if (local != nullptr) {
    chunk_local = *local;
  } else {
    size_t compiled[3] = {0, 0, 0};
    if (cl.clGetKernelWorkGroupInfo(kernel, device, CL_KERNEL_COMPILE_WORK_GROUP_SIZE,
                                    sizeof(compiled), compiled, nullptr) == CL_SUCCESS &&
        compiled[0] != 0) {
      for (uint32_t i = 0; i < 3; ++i) chunk_local[i] = compiled[i] == 0 ? 1 : compiled[i];
    } else {
      size_t limit = 0;
      if (cl.clGetKernelWorkGroupInfo(kernel, device, CL_KERNEL_WORK_GROUP_SIZE, sizeof(limit),
                                      &limit, nullptr) != CL_SUCCESS) {
        return std::nullopt;
      }
      std::optional<size_t> chosen = ChooseSplitLocalSize(global[0], limit);
      if (!chosen) return std::nullopt;
      chunk_local = {*chosen, 1, 1};
    }
  }
  return PlanSplitGeometry(dim, global, chunk_local);
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
