// Buffers and sub-buffers, and the info and destructor callbacks of every memory object.
#include "icd/common.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>

namespace gmux::icd {

std::unique_ptr<_cl_mem> NewMem(cl_context ctx, cl_mem_flags flags, size_t size, void* host_ptr) {
  auto m = std::make_unique<_cl_mem>();
  m->id = Conn().NextId();
  m->context = ctx;
  m->flags = flags;
  m->size = size;
  m->host_ptr = host_ptr;
  return m;
}

void ReuseArenaSlots(cl_context ctx, Connection& c) {
  if (ctx->in_flight.load(std::memory_order_acquire) != 0) return;
  std::vector<std::tuple<uint32_t, uint64_t, size_t>> slots;
  {
    std::lock_guard<std::mutex> lock(ctx->mu);
    slots.swap(ctx->arena_deferred);
  }
  for (const auto& [arena, offset, size] : slots) c.FreeArenaSlot(arena, offset, size);
}

namespace {

cl_mem MakeBuffer(cl_context ctx, cl_mem_flags flags, size_t size, void* host_ptr,
                  std::vector<cl_mem_properties> properties, cl_int* err, bool arena = true) {
  if (!Valid(ctx)) return Fail(err, CL_INVALID_CONTEXT);
  bool needs_ptr = (flags & (CL_MEM_USE_HOST_PTR | CL_MEM_COPY_HOST_PTR)) != 0;
  if (size == 0 || needs_ptr != (host_ptr != nullptr) ||
      ((flags & CL_MEM_USE_HOST_PTR) && (flags & (CL_MEM_COPY_HOST_PTR | CL_MEM_ALLOC_HOST_PTR)))) {
    SetErr(err, size == 0 ? CL_INVALID_BUFFER_SIZE : CL_INVALID_HOST_PTR);
    return nullptr;
  }
  Connection& c = Conn();
  // A buffer on shared memory (docs/protocol.md): not for CL_MEM_USE_HOST_PTR (the
  // application's memory is the buffer's) nor for one the host never touches.
  ShmBuffer storage;
  bool fresh = false;  // a new memfd: nothing of it faulted in yet
  if ((flags & (CL_MEM_USE_HOST_PTR | CL_MEM_HOST_NO_ACCESS)) == 0 && c.UseStorage(size) &&
      !ctx->storage_declined.load(std::memory_order_relaxed)) {
    // A released buffer's memory of this size if one is kept (its old contents are this
    // process's own; OpenCL promises a new buffer no contents), else a new memfd.
    storage = c.TakeStorage(size);
    if (!storage.valid()) {
      storage = Connection::CreateStorage(size);
      fresh = storage.valid();
    }
  }
  // A new large mapping is faulted in by a thread of its own while this one goes on (a
  // released buffer's memory is mostly in place already: what its job did not reach faults in
  // where it is touched).
  std::shared_ptr<Prefaulter::Job> prefault;
  if (fresh && size >= Prefaulter::kMinBytes) {
    prefault = Prefaulter::Get().Start(storage.map, size);
  }
  // A small buffer: a slot of an arena the connection shares with the worker.
  Connection::ArenaSlot slot;
  if (!storage.valid() && (flags & (CL_MEM_USE_HOST_PTR | CL_MEM_HOST_NO_ACCESS)) == 0 &&
      arena && c.UseArena(size) && !ctx->storage_declined.load(std::memory_order_relaxed)) {
    ReuseArenaSlots(ctx, c);
    slot = c.TakeArenaSlot(size);
  }
  uint8_t* place = storage.valid() ? static_cast<uint8_t*>(storage.map) : slot.at;
  uint64_t token = 0;
  ShmBuffer held;
  if (needs_ptr && place != nullptr) {
    CopyBytes(place, host_ptr, size);  // the initial contents, where the worker finds them
  } else if (needs_ptr) {
    token = c.SendBulk(host_ptr, size, &held);
    if (token == 0) return Fail(err, CL_OUT_OF_RESOURCES);
  }
  auto m = NewMem(ctx, flags, size, (flags & CL_MEM_USE_HOST_PTR) ? host_ptr : nullptr);
  m->properties = std::move(properties);
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<wire::Request>().initCreateBuffer();
  r.setId(m->id);
  r.setContext(ctx->id);
  r.setFlags(flags);
  r.setSize(size);
  r.setInitialData(token);
  r.setStorage(place != nullptr);
  r.setStorageArena(slot.arena);
  r.setStorageOffset(slot.offset);
  // A round trip: allocation failures (CL_INVALID_BUFFER_SIZE, out of memory) are reported here.
  // The daemon has copied the initial data once it answers.
  std::optional<proto::Message> reply;
  cl_int e = c.Call(b, place != nullptr ? &reply : nullptr, nullptr,
                    storage.valid() ? storage.fd : slot.pass_fd);
  c.ReleaseShm(held);
  // The worker's answer on the storage offered: used, or declined because the context's devices
  // do not work in place (then no more storage for this context); neither when declined for its
  // memory limit.
  bool used = false, declined = false;
  if (e == CL_SUCCESS && reply) {
    auto root = reply->root<wire::Reply>();
    used = root.isStorage() && root.getStorage();
    declined = root.isStorage() && !root.getStorage();
  }
  if (declined) ctx->storage_declined = true;
  if (slot.arena != 0) {
    if (slot.pass_fd >= 0) {
      ::close(slot.pass_fd);
      if (e == CL_SUCCESS) c.ArenaTaken(slot.arena);
    }
    if (e == CL_INVALID_VALUE && slot.pass_fd >= 0) {
      // The worker could not take the arena (its mappings or address space full): small
      // buffers go without arenas from now on, and this one is made again so.
      // (Disabled when the buffer can be made without: else the request itself was wrong.)
      c.FreeArenaSlot(slot.arena, slot.offset, size, /*last=*/true);
      cl_mem again = MakeBuffer(ctx, flags, size, host_ptr, std::move(m->properties), err,
                                /*arena=*/false);
      if (again != nullptr) c.DisableArenas();
      return again;
    }
    if (used) {
      m->storage = slot.at;
      m->arena = slot.arena;
      m->arena_offset = slot.offset;
    } else {
      // Not put on it (declined, or a failed call): the slot is the last of its size offered
      // again, so that a slot the device cannot use in place is not tried for every buffer.
      c.FreeArenaSlot(slot.arena, slot.offset, size, /*last=*/true);
    }
  }
  if (storage.valid()) {
    if (used) {
      m->storage = static_cast<uint8_t*>(storage.map);
      m->prefault = std::move(prefault);
      // The worker has its own descriptor; this one is kept for reuse where there is room.
      if (c.KeepStorageFd(size)) {
        m->storage_fd = storage.fd;
      } else {
        ::close(storage.fd);
      }
    } else {
      Prefaulter::Get().Stop(prefault);
      ::munmap(storage.map, storage.capacity);
      ::close(storage.fd);
    }
  }
  if (e != CL_SUCCESS) return Fail(err, e);
  RetainContext(ctx);
  SetErr(err, CL_SUCCESS);
  return m.release();
}

}  // namespace

cl_mem CL_API_CALL CreateBuffer(cl_context ctx, cl_mem_flags flags, size_t size, void* host_ptr,
                                cl_int* err) {
  return MakeBuffer(ctx, flags, size, host_ptr, {}, err);
}

cl_mem CL_API_CALL CreateBufferWithProperties(cl_context ctx, const cl_mem_properties* props,
                                              cl_mem_flags flags, size_t size, void* host_ptr,
                                              cl_int* err) {
  std::vector<cl_mem_properties> list;
  if (cl_int e = MemProperties(props, list); e != CL_SUCCESS) return Fail(err, e);
  return MakeBuffer(ctx, flags, size, host_ptr, std::move(list), err);
}

cl_mem CL_API_CALL CreateSubBuffer(cl_mem parent, cl_mem_flags flags, cl_buffer_create_type type,
                                   const void* info, cl_int* err) {
  if (!Valid(parent) || parent->parent != nullptr) return Fail(err, CL_INVALID_MEM_OBJECT);
  if (type != CL_BUFFER_CREATE_TYPE_REGION || info == nullptr) return Fail(err, CL_INVALID_VALUE);
  const auto* region = static_cast<const cl_buffer_region*>(info);
  if (region->size == 0) return Fail(err, CL_INVALID_BUFFER_SIZE);
  if (region->origin > parent->size || region->size > parent->size - region->origin) {
    SetErr(err, CL_INVALID_VALUE);
    return nullptr;
  }
  constexpr cl_mem_flags kAccess = CL_MEM_READ_WRITE | CL_MEM_READ_ONLY | CL_MEM_WRITE_ONLY;
  constexpr cl_mem_flags kHostAccess =
      CL_MEM_HOST_WRITE_ONLY | CL_MEM_HOST_READ_ONLY | CL_MEM_HOST_NO_ACCESS;
  constexpr cl_mem_flags kHostPtr =
      CL_MEM_USE_HOST_PTR | CL_MEM_ALLOC_HOST_PTR | CL_MEM_COPY_HOST_PTR;
  if (flags & kHostPtr) return Fail(err, CL_INVALID_VALUE);
  // Host access the parent denies cannot be given back to a sub-buffer (OpenCL 1.2, 5.2.1).
  const bool host_conflict =
      ((parent->flags & CL_MEM_HOST_WRITE_ONLY) != 0 && (flags & CL_MEM_HOST_READ_ONLY) != 0) ||
      ((parent->flags & CL_MEM_HOST_READ_ONLY) != 0 && (flags & CL_MEM_HOST_WRITE_ONLY) != 0) ||
      ((parent->flags & CL_MEM_HOST_NO_ACCESS) != 0 &&
       (flags & (CL_MEM_HOST_READ_ONLY | CL_MEM_HOST_WRITE_ONLY)) != 0);
  if (host_conflict) return Fail(err, CL_INVALID_VALUE);
  // What the sub-buffer reports (CL_MEM_FLAGS): the flags given, with the access and host
  // access flags not given and the host pointer flags inherited from the parent, as OpenCL
  // requires. The backend gets the flags given, with the parent's access flags when none are.
  cl_mem_flags reported = flags | (parent->flags & kHostPtr);
  if ((flags & kAccess) == 0) reported |= parent->flags & kAccess;
  if ((flags & kHostAccess) == 0) reported |= parent->flags & kHostAccess;
  if ((flags & kAccess) == 0) flags |= parent->flags & kAccess;
  Connection& c = Conn();
  auto m = NewMem(parent->context, reported, region->size,
                    parent->host_ptr ? static_cast<uint8_t*>(parent->host_ptr) + region->origin : nullptr);
  m->parent = parent;
  m->origin = region->origin;
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<wire::Request>().initCreateSubBuffer();
  r.setId(m->id);
  r.setParent(parent->id);
  r.setFlags(flags);
  r.setOrigin(region->origin);
  r.setSize(region->size);
  cl_int e = c.Call(b);
  if (e != CL_SUCCESS) return Fail(err, e);
  parent->refs.fetch_add(1);
  RetainContext(m->context);
  SetErr(err, CL_SUCCESS);
  return m.release();
}

cl_int CL_API_CALL RetainMemObject(cl_mem m) { return Retain(m); }
cl_int CL_API_CALL ReleaseMemObject(cl_mem m) { return Release(m); }

void Destroy(_cl_mem* m) {
  cl_mem parent = m->parent;
  cl_context ctx = m->context;
  for (auto& map : m->maps) {
    if (map.owned) std::free(map.ptr);
  }
  // The worker's buffer keeps its own mapping until the backend is done with it. The memory
  // is kept for the next buffer of its size when no command of the context is in flight (so
  // none can still write it; the worker releases its buffer before it makes the next one on
  // the same memory, in stream order); else, or without room, it goes.
  if (m->arena != 0) {
    // A slot of an arena (mapped for the process's life): reused for the next small buffer
    // when no command of the context is in flight, else once none is.
    if (Connection* c = TryConn(); c != nullptr) {
      if (ctx->in_flight.load(std::memory_order_acquire) == 0) {
        c->FreeArenaSlot(m->arena, m->arena_offset, m->size);
      } else {
        std::lock_guard<std::mutex> lock(ctx->mu);
        ctx->arena_deferred.emplace_back(m->arena, m->arena_offset, m->size);
      }
    }
  } else if (m->storage != nullptr) {
    Prefaulter::Get().Stop(m->prefault);
    Connection* c = m->storage_fd >= 0 ? TryConn() : nullptr;
    if (c != nullptr) c->DropStorageFd();
    const bool kept = c != nullptr && ctx->in_flight.load(std::memory_order_acquire) == 0 &&
                      c->PoolStorage({m->storage_fd, m->storage, m->size, 0});
    if (!kept) {
      ::munmap(m->storage, m->size);
      if (m->storage_fd >= 0) ::close(m->storage_fd);
    }
  }
  // The object is gone for the ICD (its handle is rejected from now on): the destructor
  // callbacks run now, the last registered first (OpenCL 1.2 section 5.4.1).
  for (auto it = m->destructors.rbegin(); it != m->destructors.rend(); ++it) {
    it->first(m, it->second);
  }
  delete m;
  if (parent != nullptr) ReleaseMemObject(parent);
  ReleaseContext(ctx);
}

cl_int CL_API_CALL SetMemObjectDestructorCallback(cl_mem m,
                                                  void(CL_CALLBACK* fn)(cl_mem, void*),
                                                  void* user) {
  if (!Valid(m)) return CL_INVALID_MEM_OBJECT;
  if (fn == nullptr) return CL_INVALID_VALUE;
  std::lock_guard<std::mutex> lock(m->mu);
  m->destructors.emplace_back(fn, user);
  return CL_SUCCESS;
}

cl_int CL_API_CALL GetMemObjectInfo(cl_mem m, cl_mem_info param, size_t size, void* value,
                                    size_t* size_ret) {
  if (!Valid(m)) return CL_INVALID_MEM_OBJECT;
  switch (param) {
    case CL_MEM_TYPE: return Scalar<cl_mem_object_type>(m->type, size, value, size_ret);
    case CL_MEM_FLAGS: return Scalar(m->flags, size, value, size_ret);
    case CL_MEM_SIZE:
      if (m->is_image()) break;  // the backend's allocation
      return Scalar(m->size, size, value, size_ret);
    case CL_MEM_HOST_PTR: return Scalar(m->host_ptr, size, value, size_ret);
    case CL_MEM_MAP_COUNT: {
      std::lock_guard<std::mutex> lock(m->mu);
      return Scalar<cl_uint>(static_cast<cl_uint>(m->maps.size()), size, value, size_ret);
    }
    case CL_MEM_REFERENCE_COUNT: return Scalar(RefCount(m), size, value, size_ret);
    case CL_MEM_CONTEXT: return Scalar(m->context, size, value, size_ret);
    case CL_MEM_ASSOCIATED_MEMOBJECT: return Scalar(m->parent, size, value, size_ret);
    case CL_MEM_OFFSET: return Scalar(m->origin, size, value, size_ret);
    case CL_MEM_USES_SVM_POINTER: return Scalar<cl_bool>(CL_FALSE, size, value, size_ret);
    case CL_MEM_PROPERTIES: return Array(m->properties, size, value, size_ret);
    default: break;
  }
  return RemoteInfoOut(wire::ObjectKind::MEM, m->id, param, size, value, size_ret);
}
// No memory object made through gmux is a pipe (CL_DEVICE_PIPE_SUPPORT is false).
cl_int CL_API_CALL GetPipeInfo(cl_mem, cl_pipe_info, size_t, void*, size_t*) {
  return CL_INVALID_MEM_OBJECT;
}

}  // namespace gmux::icd
