// Owning references to backend OpenCL objects, released through the object's own ICD dispatch
// table (every ICD object begins with a pointer to it), so the daemon never calls the loader.
//
// Ref<T> is a shared_ptr to one backend reference: copies share it and the backend object is
// released when the last copy goes. LiveBackendObjects() counts references held, for leak
// checks. Thread-safe.
#pragma once

#include <CL/cl_icd.h>

#include <atomic>
#include <cstdint>
#include <memory>

namespace gmux::daemon {

// The dispatch table of any ICD object.
template <typename T>
inline const cl_icd_dispatch& Dispatch(T object) {
  return **reinterpret_cast<cl_icd_dispatch* const*>(object);
}

std::atomic<int64_t>& LiveBackendCounter();
inline int64_t LiveBackendObjects() { return LiveBackendCounter().load(); }

inline void ReleaseBackend(cl_context o) { Dispatch(o).clReleaseContext(o); }
inline void ReleaseBackend(cl_command_queue o) { Dispatch(o).clReleaseCommandQueue(o); }
inline void ReleaseBackend(cl_mem o) { Dispatch(o).clReleaseMemObject(o); }
inline void ReleaseBackend(cl_program o) { Dispatch(o).clReleaseProgram(o); }
inline void ReleaseBackend(cl_kernel o) { Dispatch(o).clReleaseKernel(o); }
inline void ReleaseBackend(cl_event o) { Dispatch(o).clReleaseEvent(o); }
inline void ReleaseBackend(cl_sampler o) { Dispatch(o).clReleaseSampler(o); }

template <typename T>
struct Held {
  explicit Held(T handle) : h(handle) { LiveBackendCounter().fetch_add(1); }
  ~Held() {
    if (h != nullptr) ReleaseBackend(h);  // null: moved out of the device (residency.h)
    LiveBackendCounter().fetch_sub(1);
  }
  Held(const Held&) = delete;
  Held& operator=(const Held&) = delete;
  T h;
};

template <typename T>
using Ref = std::shared_ptr<Held<T>>;

// Takes over one reference the caller owns (from a create call or a retain).
template <typename T>
Ref<T> Adopt(T handle) {
  return std::make_shared<Held<T>>(handle);
}

}  // namespace gmux::daemon
