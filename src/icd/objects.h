// The ICD's OpenCL objects. Each begins with the dispatch pointer, as the ICD loader requires,
// followed by the client-assigned id the daemon knows the object by and the reference count.
// Every object is in the handle registry, with its kind, from construction to destruction
// (common.h's Live): that is how foreign or stale handles are rejected. Objects keep the
// handles their info queries return (context, device, program, ...) retained.
#pragma once

#define CL_TARGET_OPENCL_VERSION 300
#define CL_USE_DEPRECATED_OPENCL_1_0_APIS
#define CL_USE_DEPRECATED_OPENCL_1_1_APIS
#define CL_USE_DEPRECATED_OPENCL_1_2_APIS
#include <CL/cl_icd.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/prefault.h"
#include "icd/connection.h"
#include "proto/event_profile.h"

namespace gmux::icd {

enum class Kind : uint32_t {
  kPlatform = 0x676d7001,
  kDevice,
  kContext,
  kQueue,
  kMem,
  kProgram,
  kKernel,
  kEvent,
  kSampler,
};

const cl_icd_dispatch* DispatchTable();

// The handle registry: every live object by address.
void RegisterHandle(const void* p, Kind k);
void Forget(const void* p);

struct ObjectHeader {
  explicit ObjectHeader(Kind k) : dispatch(DispatchTable()) { RegisterHandle(this, k); }
  ~ObjectHeader() { Forget(this); }
  ObjectHeader(const ObjectHeader&) = delete;
  ObjectHeader& operator=(const ObjectHeader&) = delete;
  const cl_icd_dispatch* dispatch;  // must stay first
  uint64_t id = 0;
  std::atomic<int32_t> refs{1};
};

}  // namespace gmux::icd

struct _cl_platform_id : gmux::icd::ObjectHeader {
  _cl_platform_id() : ObjectHeader(gmux::icd::Kind::kPlatform) {}
};

struct _cl_device_id : gmux::icd::ObjectHeader {
  _cl_device_id() : ObjectHeader(gmux::icd::Kind::kDevice) {}
  uint32_t index = 0;
  cl_device_type type = 0;
};

struct _cl_context : gmux::icd::ObjectHeader {
  _cl_context() : ObjectHeader(gmux::icd::Kind::kContext) {}
  std::vector<cl_device_id> devices;
  std::vector<cl_context_properties> properties;
  std::mutex mu;  // guards destructors
  // The worker said this context's devices do not work on host memory in place: its buffers
  // are not offered shared memory again (memory.cc).
  std::atomic<bool> storage_declined{false};
  // Commands enqueued on this context's queues not known to have completed (the sum of its
  // queues' enqueued - settled; a queue released before it settled leaves its part here until
  // the worker says they completed: SettleWhenDone). At 0 no command can touch this context's
  // buffers: a buffer on shared memory released then may keep its memory for the next one
  // (memory.cc).
  std::atomic<int64_t> in_flight{0};
  // User events of this context created and not set yet (a blocking write waits while there
  // are: Enqueuer::PostWrite).
  std::atomic<int64_t> unset_user_events{0};
  // Slots of small buffers released while commands of this context were in flight (arena,
  // offset, size): reused once none is (memory.cc; under `mu`).
  std::vector<std::tuple<uint32_t, uint64_t, size_t>> arena_deferred;
  // clSetContextDestructorCallback's callbacks, in registration order (run in reverse when the
  // last reference is released).
  std::vector<std::pair<void(CL_CALLBACK*)(cl_context, void*), void*>> destructors;
};

struct _cl_command_queue : gmux::icd::ObjectHeader {
  _cl_command_queue() : ObjectHeader(gmux::icd::Kind::kQueue) {}
  cl_context context = nullptr;
  cl_device_id device = nullptr;
  cl_command_queue_properties properties = 0;
  // clCreateCommandQueueWithProperties' list as given (CL_QUEUE_PROPERTIES_ARRAY; empty when
  // made otherwise or with none).
  std::vector<cl_queue_properties> properties_array;
  // Commands enqueued so far (counted as they enter the stream, so a lower number went
  // before), and how many of the first of them are known to have completed (clFinish, a
  // marker waited for): when the two are equal nothing of this queue is in flight, and a
  // blocking transfer of a buffer on shared memory is a copy by the caller (transfer.cc).
  std::atomic<uint64_t> enqueued{0};
  std::atomic<uint64_t> settled{0};
  // On a queue with CL_QUEUE_PROFILING_ENABLE: the event of the last command enqueued with one
  // (null once that event is destroyed), for clFinish to bring its times (queue.cc, Finish).
  std::mutex last_mu;
  cl_event last_event = nullptr;  // under last_mu
};

struct Mapping {
  void* ptr = nullptr;
  size_t offset = 0;
  size_t size = 0;
  cl_map_flags flags = 0;
  bool owned = false;  // allocated by the ICD (freed at unmap)
  // Into a buffer on shared memory itself: nothing to copy either way.
  bool in_place = false;
  // A large buffer mapping lives in a pooled shared buffer: the daemon reads the buffer into it
  // and unmap sends it back from there, so the data is not copied on the client.
  gmux::icd::ShmBuffer shm;
  // Images: the mapped region and the host layout of `ptr`.
  size_t origin[3] = {0, 0, 0};
  size_t region[3] = {0, 0, 0};
  size_t row_pitch = 0;
  size_t slice_pitch = 0;
};

struct _cl_mem : gmux::icd::ObjectHeader {
  _cl_mem() : ObjectHeader(gmux::icd::Kind::kMem) {}
  cl_context context = nullptr;
  cl_mem_flags flags = 0;
  size_t size = 0;
  void* host_ptr = nullptr;
  cl_mem parent = nullptr;
  size_t origin = 0;
  // A buffer on shared memory (docs/protocol.md, "Buffers on shared memory"): this process's
  // mapping of the memfd that is the worker's buffer itself (top-level buffers; null otherwise).
  uint8_t* storage = nullptr;
  // The memfd behind `storage`, kept open while the connection has room for it
  // (Connection::KeepStorageFd), so that the memory can be reused when the buffer goes.
  int storage_fd = -1;
  // A small buffer's `storage` is a slot of one of the connection's arenas (number, offset;
  // Connection::ArenaSlot) rather than a memfd of its own.
  uint32_t arena = 0;
  uint64_t arena_offset = 0;
  // Faulting `storage` in ahead of the application (a new large one; common/prefault.h): stopped
  // before `storage` is unmapped or pooled.
  std::shared_ptr<gmux::Prefaulter::Job> prefault;
  std::mutex mu;  // guards maps and destructors
  std::vector<Mapping> maps;
  // clSetMemObjectDestructorCallback's callbacks, in registration order (run in reverse when
  // the last reference is released).
  std::vector<std::pair<void(CL_CALLBACK*)(cl_mem, void*), void*>> destructors;
  // Images (type != CL_MEM_OBJECT_BUFFER): format, description (pitches of host_ptr for
  // CL_MEM_USE_HOST_PTR) and the bytes of one pixel.
  cl_mem_object_type type = CL_MEM_OBJECT_BUFFER;
  cl_image_format format{};
  cl_image_desc desc{};
  size_t element_bytes = 0;
  // cl*WithProperties' list as given (CL_MEM_PROPERTIES; empty when made otherwise or with none).
  std::vector<cl_mem_properties> properties;
  bool is_image() const { return type != CL_MEM_OBJECT_BUFFER; }
};

struct _cl_sampler : gmux::icd::ObjectHeader {
  _cl_sampler() : ObjectHeader(gmux::icd::Kind::kSampler) {}
  cl_context context = nullptr;
  cl_bool normalized_coords = CL_FALSE;
  cl_addressing_mode addressing = CL_ADDRESS_CLAMP;
  cl_filter_mode filter = CL_FILTER_NEAREST;
  // clCreateSamplerWithProperties' list as given (CL_SAMPLER_PROPERTIES).
  std::vector<cl_sampler_properties> properties;
};

struct _cl_program : gmux::icd::ObjectHeader {
  _cl_program() : ObjectHeader(gmux::icd::Kind::kProgram) {}
  cl_context context = nullptr;
  std::vector<cl_device_id> devices;
  std::string source;
};

struct KernelArgSlot {
  enum Type { kUnset, kValue, kMem, kNullMem, kLocal, kSampler } type = kUnset;
  std::vector<uint8_t> bytes;
  uint64_t mem = 0;  // kMem: the mem id; kSampler: the sampler id
  size_t local = 0;
};

struct _cl_kernel : gmux::icd::ObjectHeader {
  _cl_kernel() : ObjectHeader(gmux::icd::Kind::kKernel) {}
  cl_program program = nullptr;
  std::string name;
  std::mutex mu;  // guards args
  std::vector<KernelArgSlot> args;
  // Each argument's address qualifier (CL_KERNEL_ARG_ADDRESS_*; 0 where the backend did not
  // say), which tells a buffer argument from a value of pointer size.
  std::vector<cl_uint> arg_qualifiers;
  // Per argument: the arg_size a by-value argument must be given (0: unknown; KernelReply).
  std::vector<uint32_t> arg_value_sizes;
  // clGetKernelWorkGroupInfo answers that cannot change for this kernel on a device (guarded by
  // mu): programs often ask before every launch, and each answer would cost a round trip.
  std::vector<std::pair<std::pair<const void*, cl_uint>, std::vector<uint8_t>>> wg_info;
  // What bounds a launch's local size on a device (guarded by mu; made at the first launch
  // there): the kernel's largest work-group, its reqd_work_group_size (0s: none) and the
  // device's largest work-item sizes (0: not known).
  struct LaunchLimits {
    cl_device_id device = nullptr;
    size_t kernel_max = 0;
    size_t reqd[3] = {0, 0, 0};
    size_t item_max[3] = {0, 0, 0};
  };
  std::vector<LaunchLimits> launch_limits;
};

struct _cl_event : gmux::icd::ObjectHeader {
  _cl_event() : ObjectHeader(gmux::icd::Kind::kEvent) {}
  cl_context context = nullptr;
  cl_command_queue queue = nullptr;  // null for user events
  cl_command_type type = 0;
  // Its command's place in its queue's count of enqueued commands (0: none): once the event is
  // known complete on an in-order queue, so are the commands before it (Settle).
  uint64_t number = 0;
  // A blocking call's event once the call returned, or one clWaitForEvents waited for without
  // error: complete, as natively, without asking the worker (whose record completes just after
  // its answer left).
  std::atomic<bool> known_complete{false};
  std::atomic<bool> user_set{false};  // a user event whose status was set
  // Its command's profiling times once the worker gave them, all at once (proto/event_profile.h):
  // they never change after. `profile_state`: 0 not asked, 1 being stored, 2 `profile` is valid.
  std::atomic<uint8_t> profile_state{0};
  gmux::proto::EventProfile profile;
};
