// Validation of OpenCL requests against the limits of a device and a kernel, as pure functions.
//
// The daemon answers some requests itself and splits others into chunks, so it must reject what
// a conformant OpenCL 1.2 driver would reject, with the same error code, before any backend call.
// Every function here takes plain numbers (the device's and kernel's limits, queried once by the
// caller, and the request's sizes) and returns a ClStatus: CL_SUCCESS, or the code the OpenCL 1.2
// specification names for the first rule the request breaks plus a message a person can act on.
// All arithmetic on request sizes is overflow-checked: a request may hold any 64-bit values.
//
// Pure functions; any thread. Nothing is allocated unless a request is rejected (the message).
#pragma once

#include <CL/cl.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace gmux::daemon {

// The outcome of one check: code is CL_SUCCESS, or the OpenCL error code for the first rule the
// request breaks, with message naming the offending values.
struct [[nodiscard]] ClStatus {
  cl_int code = CL_SUCCESS;
  std::string message;

  static ClStatus Ok() { return ClStatus{}; }
  bool ok() const { return code == CL_SUCCESS; }
};

// What a device allows (OpenCL 1.2 section 4.2, clGetDeviceInfo, table 4.3). Fill every field
// from the device: a zero limit rejects everything it bounds.
struct DeviceLimits {
  uint32_t max_work_item_dims = 3;                 // CL_DEVICE_MAX_WORK_ITEM_DIMENSIONS (>= 3)
  std::array<size_t, 3> max_work_item_sizes{};     // CL_DEVICE_MAX_WORK_ITEM_SIZES
  size_t max_work_group_size = 0;                  // CL_DEVICE_MAX_WORK_GROUP_SIZE
  uint64_t local_mem_size = 0;                     // CL_DEVICE_LOCAL_MEM_SIZE, bytes
  uint32_t address_bits = 64;                      // CL_DEVICE_ADDRESS_BITS: 32 or 64
  uint64_t max_mem_alloc_size = 0;                 // CL_DEVICE_MAX_MEM_ALLOC_SIZE, bytes
  uint64_t global_mem_size = 0;                    // CL_DEVICE_GLOBAL_MEM_SIZE, bytes
};

// What a kernel allows on one device (OpenCL 1.2 section 5.7.3, clGetKernelWorkGroupInfo).
struct KernelLimits {
  // CL_KERNEL_WORK_GROUP_SIZE; 0: unknown, only the device's limit applies.
  size_t work_group_size = 0;
  // CL_KERNEL_COMPILE_WORK_GROUP_SIZE: reqd_work_group_size(X, Y, Z), or {0, 0, 0} when the
  // kernel does not declare one.
  std::array<size_t, 3> compile_work_group_size{};
  // Bytes of local memory the kernel needs apart from its __local pointer arguments: its
  // __local variables and the implementation's own use. The specification's
  // CL_KERNEL_LOCAL_MEM_SIZE also counts the __local arguments already set by clSetKernelArg,
  // so query it before any is set (or subtract them).
  uint64_t local_mem_size = 0;
};

// clEnqueueNDRangeKernel's launch rules (OpenCL 1.2 section 5.8, "Executing Kernels"), for the
// pointers exactly as the application passed them: global_work_offset and local_work_size may
// be nullptr; each non-null pointer holds work_dim values. Returns
//   CL_INVALID_WORK_DIMENSION   work_dim outside 1..min(3, max_work_item_dims);
//   CL_INVALID_GLOBAL_WORK_SIZE global_work_size is nullptr, a global size is 0 or larger than
//                               the device's size_t (2^address_bits - 1), or the product of the
//                               global sizes (the launch's work-items) overflows uint64;
//   CL_INVALID_GLOBAL_OFFSET    offset + global size is larger than the device's size_t;
//   CL_INVALID_WORK_ITEM_SIZE   a local size exceeds max_work_item_sizes of its dimension;
//   CL_INVALID_WORK_GROUP_SIZE  a local size is 0, the product of the local sizes exceeds the
//                               device's or the kernel's work-group size, a local size does not
//                               divide its global size, or the kernel declares
//                               reqd_work_group_size and local_work_size is nullptr or differs
//                               from it (dimensions past work_dim count as 1).
// Preconditions: address_bits in 1..64.
ClStatus ValidateNDRange(const DeviceLimits& device, const KernelLimits& kernel,
                         uint32_t work_dim, const size_t* global_work_offset,
                         const size_t* global_work_size, const size_t* local_work_size);

// Local memory. A conformant driver rejects a __local argument of size 0 when it is set
// (clSetKernelArg, OpenCL 1.2 section 5.7.2: CL_INVALID_ARG_SIZE) but one that is too large
// only when the kernel is launched (CL_OUT_OF_RESOURCES, section 5.8): the limit is on the sum
// over all arguments and the kernel's own use, which is known only then. gmux does the same, so
// the application sees the error at the call where its driver would report it.

// clSetKernelArg for a __local pointer argument (arg_value nullptr): CL_INVALID_ARG_SIZE when
// arg_size is 0, whatever the device.
ClStatus ValidateLocalArgSize(size_t arg_size);

// At launch: the kernel's local_mem_size plus the sizes of its __local arguments (bytes, as set
// by clSetKernelArg) must fit the device's local_mem_size; CL_OUT_OF_RESOURCES naming the sizes
// otherwise (also when the sum overflows).
ClStatus ValidateLocalMemory(const DeviceLimits& device, const KernelLimits& kernel,
                             std::span<const size_t> local_arg_sizes);

// clCreateBuffer (OpenCL 1.2 section 5.2.1): CL_INVALID_BUFFER_SIZE when size_bytes is 0 or
// larger than the device's max_mem_alloc_size.
ClStatus ValidateBufferSize(const DeviceLimits& device, uint64_t size_bytes);

// A region [offset, offset + size) of a buffer of buffer_size bytes, as read, written, mapped or
// copied (OpenCL 1.2 sections 5.2.2-5.2.4) or made a sub-buffer (5.2.1): CL_INVALID_VALUE when
// size is 0 or the region is out of bounds (also when offset + size overflows).
ClStatus ValidateBufferRegion(uint64_t buffer_size, uint64_t offset, uint64_t size);

// Whether the source and destination of a copy are one buffer (or sub-buffers of one buffer,
// with offsets then relative to that buffer).
enum class CopyBuffers { kDistinct, kSameBuffer };

// clEnqueueCopyBuffer (OpenCL 1.2 section 5.2.2): both regions as ValidateBufferRegion
// (CL_INVALID_VALUE), then CL_MEM_COPY_OVERLAP when `buffers` is kSameBuffer and the regions
// overlap.
ClStatus ValidateCopyBuffer(uint64_t src_buffer_size, uint64_t src_offset,
                            uint64_t dst_buffer_size, uint64_t dst_offset, uint64_t size,
                            CopyBuffers buffers);

// The size a kernel argument passed by value must be given (clSetKernelArg's arg_size), from its
// CL_KERNEL_ARG_TYPE_NAME: OpenCL C's scalar types and their 2-, 4-, 8- and 16-component
// vectors. 0 for any other type (a 3-component vector, which OpenCL sizes as 4 components but
// PoCL also takes packed; a struct, a typedef, an image, a sampler, a pipe): unknown here, left
// to the backend when the kernel is launched.
uint32_t ArgValueSize(std::string_view type_name);

}  // namespace gmux::daemon
