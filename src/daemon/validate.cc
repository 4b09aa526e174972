#include "daemon/validate.h"

#include <cassert>
#include <limits>

namespace gmux::daemon {

namespace {

ClStatus Fail(cl_int code, std::string message) { return ClStatus{code, std::move(message)}; }

std::string Num(uint64_t v) { return std::to_string(v); }

// "[i]" for messages about one dimension.
std::string Dim(uint32_t i) { return "[" + std::to_string(i) + "]"; }

// The largest value of the device's size_t: what a work-item id or size must fit.
uint64_t DeviceSizeMax(uint32_t address_bits) {
  assert(address_bits >= 1 && address_bits <= 64);
  const uint64_t host_max = std::numeric_limits<size_t>::max();
  const uint64_t dev_max =
      address_bits >= 64 ? std::numeric_limits<uint64_t>::max() : (uint64_t{1} << address_bits) - 1;
  return dev_max < host_max ? dev_max : host_max;
}

// The global sizes and offsets (section 5.8: CL_INVALID_GLOBAL_WORK_SIZE, CL_INVALID_GLOBAL_OFFSET).
ClStatus CheckGlobal(const DeviceLimits& device, uint32_t work_dim, const size_t* offset,
                     const size_t* global) {
  if (global == nullptr) return Fail(CL_INVALID_GLOBAL_WORK_SIZE, "global_work_size is NULL");
  const uint64_t size_max = DeviceSizeMax(device.address_bits);
  uint64_t items = 1;
  for (uint32_t i = 0; i < work_dim; ++i) {
    const uint64_t g = global[i];
    if (g == 0) return Fail(CL_INVALID_GLOBAL_WORK_SIZE, "global_work_size" + Dim(i) + " is 0");
    if (g > size_max) {
      return Fail(CL_INVALID_GLOBAL_WORK_SIZE,
                  "global_work_size" + Dim(i) + " = " + Num(g) + " exceeds the device's size_t (" +
                      Num(device.address_bits) + " address bits)");
    }
    // "greater than the sizeof(size_t) for the device": offset + size must itself be a value of
    // the device's size_t, so that no work-item id or end of range wraps.
    const uint64_t off = offset == nullptr ? 0 : offset[i];
    uint64_t end = 0;
    if (__builtin_add_overflow(off, g, &end) || end > size_max) {
      return Fail(CL_INVALID_GLOBAL_OFFSET,
                  "global_work_offset" + Dim(i) + " + global_work_size" + Dim(i) + " = " +
                      Num(off) + " + " + Num(g) + " exceeds the device's size_t (" +
                      Num(device.address_bits) + " address bits)");
    }
    // The scheduler counts a launch's work-items in uint64.
    if (__builtin_mul_overflow(items, g, &items)) {
      return Fail(CL_INVALID_GLOBAL_WORK_SIZE,
                  "the product of the global work sizes overflows 64 bits");
    }
  }
  return ClStatus::Ok();
}

// An explicit local size (section 5.8: CL_INVALID_WORK_ITEM_SIZE, CL_INVALID_WORK_GROUP_SIZE).
ClStatus CheckLocal(const DeviceLimits& device, const KernelLimits& kernel, uint32_t work_dim,
                    const size_t* global, const size_t* local) {
  // A zero local size makes "global divisible by local" meaningless; the rule it breaks is the
  // work-group size's (the ICD reports the same code for it).
  for (uint32_t i = 0; i < work_dim; ++i) {
    if (local[i] == 0) return Fail(CL_INVALID_WORK_GROUP_SIZE, "local_work_size" + Dim(i) + " is 0");
  }
  for (uint32_t i = 0; i < work_dim; ++i) {
    if (local[i] > device.max_work_item_sizes[i]) {
      return Fail(CL_INVALID_WORK_ITEM_SIZE,
                  "local_work_size" + Dim(i) + " = " + Num(local[i]) +
                      " exceeds CL_DEVICE_MAX_WORK_ITEM_SIZES" + Dim(i) + " = " +
                      Num(device.max_work_item_sizes[i]));
    }
  }
  // Cannot overflow after CheckGlobal (each local size divides its global size), but this check
  // does not rely on the order of the two.
  uint64_t group = 1;
  bool overflow = false;
  for (uint32_t i = 0; i < work_dim; ++i) overflow |= __builtin_mul_overflow(group, local[i], &group);
  if (overflow || group > device.max_work_group_size) {
    return Fail(CL_INVALID_WORK_GROUP_SIZE,
                "work-group of " + (overflow ? std::string("more than 2^64") : Num(group)) +
                    " work-items exceeds CL_DEVICE_MAX_WORK_GROUP_SIZE = " +
                    Num(device.max_work_group_size));
  }
  if (kernel.work_group_size != 0 && group > kernel.work_group_size) {
    return Fail(CL_INVALID_WORK_GROUP_SIZE, "work-group of " + Num(group) +
                                                " work-items exceeds CL_KERNEL_WORK_GROUP_SIZE = " +
                                                Num(kernel.work_group_size));
  }
  for (uint32_t i = 0; i < work_dim; ++i) {
    if (global[i] % local[i] != 0) {
      return Fail(CL_INVALID_WORK_GROUP_SIZE,
                  "global_work_size" + Dim(i) + " = " + Num(global[i]) +
                      " is not a multiple of local_work_size" + Dim(i) + " = " + Num(local[i]));
    }
  }
  return ClStatus::Ok();
}

// reqd_work_group_size (section 5.8; section 6.7.2, "Optional Attribute Qualifiers").
ClStatus CheckRequiredSize(const KernelLimits& kernel, uint32_t work_dim, const size_t* local) {
  const auto& reqd = kernel.compile_work_group_size;
  if (reqd[0] == 0 && reqd[1] == 0 && reqd[2] == 0) return ClStatus::Ok();
  const std::string want =
      "reqd_work_group_size(" + Num(reqd[0]) + ", " + Num(reqd[1]) + ", " + Num(reqd[2]) + ")";
  if (local == nullptr) {
    return Fail(CL_INVALID_WORK_GROUP_SIZE,
                "local_work_size is NULL but the kernel declares " + want);
  }
  for (uint32_t i = 0; i < 3; ++i) {
    const size_t l = i < work_dim ? local[i] : 1;
    if (l != reqd[i]) {
      return Fail(CL_INVALID_WORK_GROUP_SIZE, "local_work_size" + Dim(i) + " = " + Num(l) +
                                                  " differs from the kernel's " + want);
    }
  }
  return ClStatus::Ok();
}

}  // namespace

ClStatus ValidateNDRange(const DeviceLimits& device, const KernelLimits& kernel,
                         uint32_t work_dim, const size_t* global_work_offset,
                         const size_t* global_work_size, const size_t* local_work_size) {
  if (work_dim < 1 || work_dim > 3 || work_dim > device.max_work_item_dims) {
    return Fail(CL_INVALID_WORK_DIMENSION,
                "work_dim = " + Num(work_dim) + " is outside 1.." +
                    Num(device.max_work_item_dims < 3 ? device.max_work_item_dims : 3));
  }
  if (ClStatus s = CheckGlobal(device, work_dim, global_work_offset, global_work_size); !s.ok()) {
    return s;
  }
  if (local_work_size != nullptr) {
    if (ClStatus s = CheckLocal(device, kernel, work_dim, global_work_size, local_work_size);
        !s.ok()) {
      return s;
    }
  }
  return CheckRequiredSize(kernel, work_dim, local_work_size);
}

ClStatus ValidateLocalArgSize(size_t arg_size) {
  // Only size 0 fails here; a size too large for the device fails at launch (ValidateLocalMemory),
  // as with conformant drivers.
  if (arg_size == 0) return Fail(CL_INVALID_ARG_SIZE, "__local argument of size 0");
  return ClStatus::Ok();
}

ClStatus ValidateLocalMemory(const DeviceLimits& device, const KernelLimits& kernel,
                             std::span<const size_t> local_arg_sizes) {
  uint64_t args = 0;
  bool overflow = false;
  for (size_t s : local_arg_sizes) overflow |= __builtin_add_overflow(args, s, &args);
  uint64_t total = 0;
  overflow |= __builtin_add_overflow(args, kernel.local_mem_size, &total);
  if (overflow || total > device.local_mem_size) {
    return Fail(CL_OUT_OF_RESOURCES,
                "local memory of " + (overflow ? std::string("more than 2^64") : Num(total)) +
                    " bytes (__local arguments " +
                    (overflow ? std::string("and kernel") : Num(args) + " + kernel " +
                                                                Num(kernel.local_mem_size)) +
                    ") exceeds CL_DEVICE_LOCAL_MEM_SIZE = " + Num(device.local_mem_size) +
                    " bytes");
  }
  return ClStatus::Ok();
}

ClStatus ValidateBufferSize(const DeviceLimits& device, uint64_t size_bytes) {
  if (size_bytes == 0) return Fail(CL_INVALID_BUFFER_SIZE, "buffer size is 0");
  if (size_bytes > device.max_mem_alloc_size) {
    return Fail(CL_INVALID_BUFFER_SIZE, "buffer size " + Num(size_bytes) +
                                            " exceeds CL_DEVICE_MAX_MEM_ALLOC_SIZE = " +
                                            Num(device.max_mem_alloc_size));
  }
  return ClStatus::Ok();
}

ClStatus ValidateBufferRegion(uint64_t buffer_size, uint64_t offset, uint64_t size) {
  if (size == 0) return Fail(CL_INVALID_VALUE, "region size is 0");
  uint64_t end = 0;
  if (__builtin_add_overflow(offset, size, &end) || end > buffer_size) {
    return Fail(CL_INVALID_VALUE, "region offset " + Num(offset) + " + size " + Num(size) +
                                      " is outside the buffer of " + Num(buffer_size) + " bytes");
  }
  return ClStatus::Ok();
}

ClStatus ValidateCopyBuffer(uint64_t src_buffer_size, uint64_t src_offset,
                            uint64_t dst_buffer_size, uint64_t dst_offset, uint64_t size,
                            CopyBuffers buffers) {
  if (ClStatus s = ValidateBufferRegion(src_buffer_size, src_offset, size); !s.ok()) {
    s.message = "source: " + s.message;
    return s;
  }
  if (ClStatus s = ValidateBufferRegion(dst_buffer_size, dst_offset, size); !s.ok()) {
    s.message = "destination: " + s.message;
    return s;
  }
  // Both ends are known not to overflow.
  if (buffers == CopyBuffers::kSameBuffer && src_offset < dst_offset + size &&
      dst_offset < src_offset + size) {
    return Fail(CL_MEM_COPY_OVERLAP, "source [" + Num(src_offset) + ", " + Num(src_offset + size) +
                                         ") and destination [" + Num(dst_offset) + ", " +
                                         Num(dst_offset + size) + ") overlap");
  }
  return ClStatus::Ok();
}

uint32_t ArgValueSize(std::string_view type_name) {
  struct Scalar {
    std::string_view name;
    uint32_t size;
  };
  // Kernel arguments cannot be bool, size_t, ptrdiff_t, intptr_t or uintptr_t (OpenCL 1.2,
  // 6.9.k), so those are not here.
  static constexpr Scalar kScalars[] = {
      {"char", 1},  {"uchar", 1}, {"short", 2}, {"ushort", 2}, {"int", 4},   {"uint", 4},
      {"long", 8},  {"ulong", 8}, {"half", 2},  {"float", 4},  {"double", 8}};
  std::string_view base = type_name;
  uint32_t lanes = 1;
  struct Width {
    std::string_view suffix;
    uint32_t lanes;
  };
  for (const Width& w : {Width{"16", 16}, Width{"8", 8}, Width{"4", 4}, Width{"3", 3},
                         Width{"2", 2}}) {
    if (base.size() > w.suffix.size() && base.ends_with(w.suffix)) {
      base.remove_suffix(w.suffix.size());
      lanes = w.lanes;
      break;
    }
  }
  // A 3-component vector is the size of a 4-component one (OpenCL 1.2, 6.1.5), but PoCL takes
  // its packed size too: left to the backend.
  if (lanes == 3) return 0;
  for (const Scalar& s : kScalars) {
    if (s.name == base) return s.size * lanes;
  }
  return 0;
}

}  // namespace gmux::daemon
