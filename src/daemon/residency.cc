#include "daemon/residency.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <new>

#include "proto/image_layout.h"

namespace gmux::daemon {
namespace {

bool OnDevice(const Residency::Allocation& a, uint32_t device) {
  return std::find(a.devices.begin(), a.devices.end(), device) != a.devices.end();
}

bool TopLevel(const Residency::Allocation& a) {
  return a.kind == Residency::Kind::kBuffer || a.kind == Residency::Kind::kImage;
}

// The bytes of an image read whole with tight pitches, and its full region.
uint64_t ImageBytes(const Residency::Allocation& a, size_t region[3]) {
  proto::ImageFullRegion(a.desc.image_type, a.desc.image_width, a.desc.image_height,
                         a.desc.image_depth, a.desc.image_array_size, region);
  const size_t element = proto::ImageElementBytes(a.format.image_channel_order,
                                                  a.format.image_channel_data_type);
  uint64_t bytes = 0;
  if (!proto::ImageHostBytes(a.desc.image_type, region, element, 0, 0, bytes)) return 0;
  return bytes;
}

}  // namespace

cl_mem CreateOnStorage(const cl_icd_dispatch& cl, cl_context ctx, cl_mem_flags flags, size_t size,
                       const std::shared_ptr<uint8_t>& storage, cl_int* err) {
  cl_mem m = cl.clCreateBuffer(ctx, flags | CL_MEM_USE_HOST_PTR, size, storage.get(), err);
  if (m == nullptr) return nullptr;
  auto* keep = new std::shared_ptr<uint8_t>(storage);
  cl_int e = cl.clSetMemObjectDestructorCallback(
      m, [](cl_mem, void* p) { delete static_cast<std::shared_ptr<uint8_t>*>(p); }, keep);
  if (e != CL_SUCCESS) {
    // Without the callback the mapping could go before the backend's last use of it.
    delete keep;
    cl.clReleaseMemObject(m);
    *err = e;
    return nullptr;
  }
  return m;
}

bool SharesHostMemory(const cl_icd_dispatch& cl, cl_context ctx, cl_device_id device,
                      size_t offset, size_t size) {
  cl_bool unified = CL_FALSE;
  if (cl.clGetDeviceInfo(device, CL_DEVICE_HOST_UNIFIED_MEMORY, sizeof(unified), &unified,
                         nullptr) != CL_SUCCESS ||
      unified != CL_TRUE || size == 0) {
    return false;
  }
  const size_t kPage = size;
  const size_t mapped = offset + size + 4096;
  void* page = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (page == MAP_FAILED) return false;
  auto* bytes = static_cast<uint8_t*>(page) + offset;
  bool shares = false;
  cl_int err = CL_SUCCESS;
  cl_mem m = cl.clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_USE_HOST_PTR, kPage, bytes, &err);
  cl_command_queue q = m != nullptr ? cl.clCreateCommandQueue(ctx, device, 0, &err) : nullptr;
  if (q != nullptr) {
    const cl_uchar pattern = 0x5a;
    std::vector<uint8_t> seen(kPage, 0);
    if (cl.clEnqueueFillBuffer(q, m, &pattern, 1, 0, kPage, 0, nullptr, nullptr) == CL_SUCCESS &&
        cl.clFinish(q) == CL_SUCCESS &&
        std::all_of(bytes, bytes + kPage, [](uint8_t b) { return b == 0x5a; })) {
      std::memset(bytes, 0xa5, kPage);
      shares = cl.clEnqueueReadBuffer(q, m, CL_TRUE, 0, kPage, seen.data(), 0, nullptr,
                                      nullptr) == CL_SUCCESS &&
               std::all_of(seen.begin(), seen.end(), [](uint8_t b) { return b == 0xa5; });
    }
    cl.clReleaseCommandQueue(q);
  }
  if (m != nullptr) cl.clReleaseMemObject(m);
  ::munmap(page, mapped);
  return shares;
}

Residency::Residency(const cl_icd_dispatch& cl, std::vector<cl_device_id> devices)
    : cl_(cl), devices_(std::move(devices)),
      evicted_(new std::atomic<bool>[devices_.size() == 0 ? 1 : devices_.size()]) {
  for (size_t d = 0; d < std::max<size_t>(devices_.size(), 1); ++d) evicted_[d] = false;
}

Residency::~Residency() { Clear(); }

void Residency::Clear() {
  std::list<std::shared_ptr<Allocation>> gone;
  {
    std::lock_guard<std::mutex> lock(mu_);
    candidates_.clear();
    gone.swap(all_);
  }
  // Released in reverse creation order (dependents first), outside the lock.
  while (!gone.empty()) gone.pop_back();
}

std::shared_ptr<Residency::Allocation> Residency::AddLocked(Allocation a) {
  auto p = std::make_shared<Allocation>(std::move(a));
  p->resident = true;
  p->self = all_.insert(all_.end(), p);
  return p;
}

void Residency::ReleasedLocked(Allocation* a) {
  if (a != nullptr && !a->candidate) {
    a->candidate = true;
    candidates_.push_back(a);
  }
  Collect();
  if (!candidates_.empty()) collect_pending_ = true;
}

void Residency::CollectIfPending() {
  if (!collect_pending_.load(std::memory_order_relaxed)) return;
  std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
  if (!lock.owns_lock()) return;
  Collect();
  collect_pending_ = !candidates_.empty();
}

void Residency::Collect() {
  // A dependent going can make what it lay in collectable (it held its parent's Allocation):
  // passes until nothing more goes (at most the depth of dependents, two).
  for (bool progress = true; progress;) {
    progress = false;
    for (size_t i = 0; i < candidates_.size();) {
      Allocation* a = candidates_[i];
      // Only the registry holds it, and only it holds the object: nobody can use it any more.
      if (a->self->use_count() != 1 || a->mem.use_count() != 1) {
        ++i;
        continue;
      }
      candidates_[i] = candidates_.back();
      candidates_.pop_back();
      all_.erase(a->self);
      progress = true;
    }
  }
}

bool Residency::Evicted(uint32_t device) const {
  return device < devices_.size() && evicted_[device].load(std::memory_order_acquire);
}

uint64_t Residency::BytesOn(uint32_t device) const {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t bytes = 0;
  for (const auto& a : all_) {
    if (TopLevel(*a) && OnDevice(*a, device)) bytes += a->bytes;
  }
  return bytes;
}

Residency::Totals Residency::totals() const {
  std::lock_guard<std::mutex> lock(mu_);
  return totals_;
}

cl_int Residency::SaveAndRelease(Allocation& a, uint32_t device) {
  cl_int result = CL_SUCCESS;
  if (a.storage) {
    // The contents stay in the shared memory: only the backend object goes.
    a.store.reset();
    a.store_bytes = a.bytes;
  } else if (TopLevel(a)) {
    size_t region[3] = {0, 0, 0};
    const uint64_t bytes = a.kind == Kind::kBuffer ? a.bytes : ImageBytes(a, region);
    a.store.reset();
    a.store_bytes = 0;
    if (bytes != 0) {
      cl_int err = CL_SUCCESS;
      cl_command_queue q = cl_.clCreateCommandQueue(a.context->h, devices_[device], 0, &err);
      if (q == nullptr) {
        result = err;
      } else {
        a.store.reset(new (std::nothrow) uint8_t[bytes]);
        if (!a.store) {
          result = CL_OUT_OF_HOST_MEMORY;
        } else if (a.kind == Kind::kBuffer) {
          result = cl_.clEnqueueReadBuffer(q, a.mem->h, CL_TRUE, 0, bytes, a.store.get(), 0,
                                           nullptr, nullptr);
        } else {
          const size_t origin[3] = {0, 0, 0};
          result = cl_.clEnqueueReadImage(q, a.mem->h, CL_TRUE, origin, region, 0, 0,
                                          a.store.get(), 0, nullptr, nullptr);
        }
        cl_.clReleaseCommandQueue(q);
      }
      if (result != CL_SUCCESS) {
        // Contents that cannot be saved are not thrown away: the allocation stays.
        a.store.reset();
        return result;
      }
      a.store_bytes = bytes;
    }
  }
  cl_.clReleaseMemObject(a.mem->h);
  a.mem->h = nullptr;
  a.resident = false;
  return CL_SUCCESS;
}

cl_int Residency::Make(Allocation& a) {
  if (a.resident) return CL_SUCCESS;
  cl_int err = CL_SUCCESS;
  cl_mem m = nullptr;
  switch (a.kind) {
    case Kind::kBuffer:
      if (a.storage) {
        m = CreateOnStorage(cl_, a.context->h, a.flags, a.bytes, a.storage, &err);
        break;
      }
      m = cl_.clCreateBuffer(a.context->h, a.flags | (a.store ? CL_MEM_COPY_HOST_PTR : 0),
                             a.bytes, a.store.get(), &err);
      break;
    case Kind::kImage:
      m = cl_.clCreateImage(a.context->h, a.flags | (a.store ? CL_MEM_COPY_HOST_PTR : 0),
                            &a.format, &a.desc, a.store.get(), &err);
      break;
    case Kind::kSubBuffer:
      if (err = Make(*a.parent); err != CL_SUCCESS) return err;
      m = cl_.clCreateSubBuffer(a.parent->mem->h, a.flags, CL_BUFFER_CREATE_TYPE_REGION,
                                &a.region, &err);
      break;
    case Kind::kImageOnBuffer: {
      if (err = Make(*a.parent); err != CL_SUCCESS) return err;
      cl_image_desc desc = a.desc;
      desc.buffer = a.parent->mem->h;
      m = cl_.clCreateImage(a.context->h, a.flags, &a.format, &desc, nullptr, &err);
      break;
    }
  }
  if (m == nullptr) return err != CL_SUCCESS ? err : CL_MEM_OBJECT_ALLOCATION_FAILURE;
  a.mem->h = m;
  a.resident = true;
  a.store.reset();
  a.store_bytes = 0;
  return CL_SUCCESS;
}

cl_int Residency::UseLocked(const std::shared_ptr<Allocation>& a) {
  if (!a || a->resident) return CL_SUCCESS;
  const auto t0 = std::chrono::steady_clock::now();
  const uint64_t bytes = a->store_bytes;
  cl_int err = Make(*a);
  if (err == CL_SUCCESS && bytes != 0) {
    const auto took = std::chrono::steady_clock::now() - t0;
    ++totals_.restores;
    totals_.bytes_in += bytes;
    totals_.time_in += took;
    if (on_demand_) {
      for (uint32_t d = 0; d < devices_.size(); ++d) {
        if (!Evicted(d) || !OnDevice(*a, d)) continue;
        Moved m;
        m.objects = 1;
        m.bytes = bytes;
        m.time = std::chrono::duration_cast<std::chrono::nanoseconds>(took);
        on_demand_(d, m);
      }
    }
  }
  return err;
}

void Residency::SetOnDemand(OnDemand f) {
  std::lock_guard<std::mutex> lock(mu_);
  on_demand_ = std::move(f);
}

Residency::Moved Residency::Evict(uint32_t device) {
  Moved moved;
  if (device >= devices_.size()) return moved;
  const auto t0 = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(mu_);
  Collect();
  // Newest first: dependents are released before what they lie in.
  for (auto it = all_.rbegin(); it != all_.rend(); ++it) {
    Allocation& a = **it;
    if (!a.resident || !OnDevice(a, device)) continue;
    cl_int err = SaveAndRelease(a, device);
    if (err != CL_SUCCESS) {
      if (moved.error == CL_SUCCESS) moved.error = err;
      continue;
    }
    if (TopLevel(a)) {
      ++moved.objects;
      moved.bytes += a.store_bytes;
    }
    for (uint32_t d : a.devices) {
      if (d < devices_.size()) evicted_[d].store(true, std::memory_order_release);
    }
  }
  moved.time = std::chrono::steady_clock::now() - t0;
  if (moved.objects != 0) {
    ++totals_.evictions;
    totals_.bytes_out += moved.bytes;
    totals_.time_out += moved.time;
  }
  return moved;
}

Residency::Moved Residency::Restore(uint32_t device) {
  Moved moved;
  if (device >= devices_.size()) return moved;
  const auto t0 = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(mu_);
  bool left = false;
  for (const auto& p : all_) {  // creation order: what a dependent lies in comes first
    Allocation& a = *p;
    if (a.resident || !OnDevice(a, device)) continue;
    const uint64_t bytes = a.store_bytes;
    cl_int err = Make(a);
    if (err != CL_SUCCESS) {
      if (moved.error == CL_SUCCESS) moved.error = err;
      left = true;
      continue;
    }
    if (TopLevel(a)) {
      ++moved.objects;
      moved.bytes += bytes;
    }
  }
  if (!left) evicted_[device].store(false, std::memory_order_release);
  moved.time = std::chrono::steady_clock::now() - t0;
  if (moved.objects != 0) {
    ++totals_.restores;
    totals_.bytes_in += moved.bytes;
    totals_.time_in += moved.time;
  }
  return moved;
}

}  // namespace gmux::daemon
