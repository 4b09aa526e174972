// Residency: a worker's device allocations, and moving them out of the device and back
// (DymGPU's slot swaps on the real runtime; docs/policies.md, SlotAllocator, "On the real
// runtime").
//
// Every buffer and image the session creates is registered here with what it takes to make it
// again: its context, flags and size (or image format and description), and for a sub-buffer or
// an image on a buffer, the allocation it lies in. Evict(d) moves the session's allocations on
// device d out: each top-level allocation's contents are read into host memory of this worker
// process, then every backend object (dependents first) is released, so the device's memory is
// really given back. Restore(d) makes them again, in creation order, from the saved contents.
//
// The application's objects never change: a session's Ref<cl_mem> is the same Held object
// before and after, and only the backend handle inside it is replaced. Commands capture the Ref
// and set kernel arguments and buffers from it when they run, so they are rebound by
// construction. Eviction happens only while nothing of the session is on the device (the
// worker's executors are idle), so no running command holds a handle that goes away.
//
// Threads. The session thread creates and releases objects and reads handles for calls made
// outside commands (info queries, sub-buffers); the worker's loop thread evicts, restores and
// runs commands. `Lock()` guards every handle change and the registry; the session thread holds
// it around each backend call that takes a mem handle (never while waiting on the loop thread),
// and UseLocked() restores an allocation it needs at once. The loop thread checks Evicted(d), an
// atomic, before running commands, so the hot path takes no lock.
//
// The host copies live in this process's anonymous memory: a worker that dies, or a session
// that ends, leaves no backing store behind.
#pragma once

#include <CL/cl.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <vector>

#include "daemon/cl_ref.h"

namespace gmux::daemon {

// A buffer whose storage is `storage` (`size` bytes, CL_MEM_USE_HOST_PTR), which stays mapped
// until the backend destroys the buffer (a destructor callback holds it), whoever holds the
// handle last. Null with `*err` on failure.
cl_mem CreateOnStorage(const cl_icd_dispatch& cl, cl_context ctx, cl_mem_flags flags, size_t size,
                       const std::shared_ptr<uint8_t>& storage, cl_int* err);

// Whether `device` (in `ctx`) works on buffers made on host memory in place and coherently: it
// says it has host-unified memory, and a page given as CL_MEM_USE_HOST_PTR is filled by the
// device where the host sees it without a map, and what the host writes there is what the
// device reads. Then the client may copy to and from such a buffer itself (docs/protocol.md,
// "Buffers on shared memory"). A discrete GPU answers no. With `offset`, the buffer probed is
// `size` bytes that far into a page (a small buffer's arena slot; a driver may work in place on
// page-aligned memory only).
bool SharesHostMemory(const cl_icd_dispatch& cl, cl_context ctx, cl_device_id device,
                      size_t offset = 0, size_t size = 4096);

class Residency {
 public:
  enum class Kind { kBuffer, kImage, kSubBuffer, kImageOnBuffer };

  // One backend allocation of the session, and its recipe.
  struct Allocation {
    Kind kind = Kind::kBuffer;
    Ref<cl_mem> mem;               // the session's object; mem->h is null while evicted
    Ref<cl_context> context;
    std::vector<uint32_t> devices;  // the context's device indices
    cl_mem_flags flags = 0;         // without host-pointer flags
    uint64_t bytes = 0;             // device bytes it holds (0 for dependents)
    // Images (both kinds): format and description (pitches 0, buffer null: set at restore).
    cl_image_format format{};
    cl_image_desc desc{};
    // Dependents: what they lie in, and a sub-buffer's region.
    std::shared_ptr<Allocation> parent;
    cl_buffer_region region{};
    // A buffer whose storage is the client's shared memory (CreateOnStorage): its contents
    // stay there while evicted, so eviction and restore copy nothing.
    std::shared_ptr<uint8_t> storage;
    // Saved contents while evicted (top-level allocations).
    std::unique_ptr<uint8_t[]> store;
    uint64_t store_bytes = 0;
    bool resident = true;
    // The registry's own entry, and whether it waits to be collected.
    std::list<std::shared_ptr<Allocation>>::iterator self{};
    bool candidate = false;
  };

  // What one Evict() or Restore() did.
  struct Moved {
    uint64_t objects = 0;  // top-level allocations moved
    uint64_t bytes = 0;    // their bytes
    std::chrono::nanoseconds time{0};
    cl_int error = CL_SUCCESS;  // the first failure (the rest still moved)
  };

  Residency(const cl_icd_dispatch& cl, std::vector<cl_device_id> devices);
  ~Residency();
  Residency(const Residency&) = delete;
  Residency& operator=(const Residency&) = delete;

  std::unique_lock<std::mutex> Lock() { return std::unique_lock<std::mutex>(mu_); }

  // Registers a new, resident allocation (Lock() held). Top-level allocations' `bytes` are what
  // eviction saves; a dependent's parent must be registered. The registry keeps it until
  // nothing but the registry refers to it or its object (the application released it and no
  // command holds it), then releases it (Collect).
  std::shared_ptr<Allocation> AddLocked(Allocation a);
  // The session released `a`'s object (its own reference is gone): collect what is unused now
  // (Lock() held), and again on the loop thread after commands that held it completed
  // (CollectIfPending). Only released allocations and what they lie in are looked at.
  void ReleasedLocked(Allocation* a);
  void CollectIfPending();
  // Drops every allocation (the session ends; commands still holding objects keep them).
  void Clear();

  // Makes `a` (and what it lies in) resident if it is not (Lock() held). CL_SUCCESS or the
  // backend's error. A restore on a device whose data is evicted is told to the on-demand
  // callback (still under the lock), once per such device, so the broker can count the data as
  // on the device again.
  cl_int UseLocked(const std::shared_ptr<Allocation>& a);
  using OnDemand = std::function<void(uint32_t device, const struct Moved& moved)>;
  void SetOnDemand(OnDemand f);

  // Loop thread: moves every allocation on device `device` out of it / back in.
  Moved Evict(uint32_t device);
  Moved Restore(uint32_t device);
  bool Evicted(uint32_t device) const;

  // Totals over the session's life.
  struct Totals {
    uint64_t evictions = 0, restores = 0;
    uint64_t bytes_out = 0, bytes_in = 0;
    std::chrono::nanoseconds time_out{0}, time_in{0};
  };
  Totals totals() const;

  // Live top-level bytes on `device`, resident or not.
  uint64_t BytesOn(uint32_t device) const;

 private:
  // Lock held.
  cl_int SaveAndRelease(Allocation& a, uint32_t device);
  cl_int Make(Allocation& a);
  void Collect();  // drops the candidates nothing else refers to any more

  const cl_icd_dispatch& cl_;
  const std::vector<cl_device_id> devices_;
  mutable std::mutex mu_;
  std::list<std::shared_ptr<Allocation>> all_;  // in creation order
  std::vector<Allocation*> candidates_;         // released, maybe still used by commands
  std::unique_ptr<std::atomic<bool>[]> evicted_;   // per device: something there is evicted
  std::atomic<bool> collect_pending_{false};
  Totals totals_;
  OnDemand on_demand_;
};

}  // namespace gmux::daemon
