// Buffer transfers (read, write, copy, fill, rectangles), markers, barriers and migrations.
#include "icd/common.h"
#include "proto/image_layout.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <vector>

namespace gmux::icd {

namespace {

// A rectangle of a buffer transfer: origins, region and pitches as the application gave them
// (the daemon checks them against the objects).
void SetRect(wire::Rect::Builder r, const size_t* buffer_origin, const size_t* host_origin,
             const size_t* region, size_t buffer_row, size_t buffer_slice, size_t host_row,
             size_t host_slice) {
  SetTriple(r.initBufferOrigin(3), buffer_origin);
  SetTriple(r.initHostOrigin(3), host_origin);
  SetTriple(r.initRegion(3), region);
  r.setBufferRowPitch(buffer_row);
  r.setBufferSlicePitch(buffer_slice);
  r.setHostRowPitch(host_row);
  r.setHostSlicePitch(host_slice);
}

// A buffer rectangle's arguments as OpenCL checks them at the call (CL_INVALID_VALUE otherwise):
// the region within `m`, the pitches (proto::RectEnd) on both sides.
bool RectFits(cl_mem m, const size_t* bo, const size_t* ho, const size_t* region, size_t brp,
              size_t bsp, size_t hrp, size_t hsp) {
  uint64_t buffer_end = 0, host_end = 0;
  return proto::RectEnd(bo, region, brp, bsp, buffer_end) && buffer_end <= m->size &&
         proto::RectEnd(ho, region, hrp, hsp, host_end);
}

// Whether every page of [p, p+n) is mapped in this process.
bool Mapped(const void* p, size_t n) {
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t from = reinterpret_cast<uintptr_t>(p) & ~(page - 1);
  const uintptr_t to = reinterpret_cast<uintptr_t>(p) + n;
  // In steps of 1,024 pages, so nothing is allocated per call.
  unsigned char vec[1024];
  for (uintptr_t at = from; at < to; at += sizeof(vec) * page) {
    const uintptr_t len = std::min<uintptr_t>(to - at, sizeof(vec) * page);
    if (::mincore(reinterpret_cast<void*>(at), len, vec) != 0) return false;
  }
  return true;
}

// A blocking transfer by remote copy failed with `e`: whether to do it again the copying way.
// The worker may not copy any more (CL_INVALID_OPERATION: remote copy ends for the
// connection), or could not copy memory the application does map (CL_INVALID_VALUE with the
// range mapped: memory the kernel cannot pin, such as a device's); memory the application
// does not map stays an error, which the copying path would turn into a crash.
bool CopyInstead(Connection& c, cl_int e, const void* p, size_t n) {
  if (e == CL_INVALID_OPERATION) {
    c.DisableRemote();
    return true;
  }
  return e == CL_INVALID_VALUE && Mapped(p, n);
}

// Forgets the event a failed first try gave the application (the second try makes another).
void DropEvent(cl_event* event) {
  if (event != nullptr && *event != nullptr) {
    ReleaseEvent(*event);
    *event = nullptr;
  }
}

// A buffer write or read by remote copy (daemon/remote_copy.h), when the connection offers it
// for `size` bytes: true with `*result` when the call is done (or failed for good), false when
// the caller should copy as without it (not offered; a blocking try the worker could not do).
// A write leaves `ptr` to the worker until it ran, so a blocking one waits; a non-blocking one
// leaves it until its event completes, as OpenCL says. A read's answer is a status.
bool TryRemote(cl_command_queue q, cl_mem m, bool write, cl_bool blocking, size_t offset,
               size_t size, void* ptr, cl_uint nwait, const cl_event* waits, cl_event* event,
               cl_int* result) {
  Connection* c = Valid(q) ? TryConn() : nullptr;
  if (c == nullptr || !c->UseRemote(size, write)) return false;
  Enqueuer enq(q, nwait, waits, event, write ? CL_COMMAND_WRITE_BUFFER : CL_COMMAND_READ_BUFFER);
  *result = enq.err();
  if (*result != CL_SUCCESS) return true;
  const auto at = reinterpret_cast<uintptr_t>(ptr);
  if (write) {
    auto w = enq.cmd().initWriteBuffer();
    w.setMem(m->id);
    w.setOffset(offset);
    w.setSize(size);
    w.setRemote(at);
    if (!blocking) {
      *result = enq.Post();
      return true;
    }
  } else {
    auto r = enq.cmd().initReadBuffer();
    r.setMem(m->id);
    r.setOffset(offset);
    r.setSize(size);
    r.setRemote(at);
  }
  const uint64_t seq = enq.Begin(nullptr, 0, blocking);
  if (!blocking) return true;  // a read: CL_SUCCESS
  *result = write ? c->Wait(seq) : enq.WaitCompleted(seq);
  if (write && *result == CL_SUCCESS) enq.MarkComplete();  // WaitCompleted marks a read's
  if (*result == CL_SUCCESS || !CopyInstead(*c, *result, ptr, size)) return true;
  DropEvent(event);
  return false;
}

// A blocking buffer write or read of a buffer on shared memory (docs/protocol.md, "Buffers on
// shared memory"), copied by the caller itself: true with `*result` when done that way. When
// nothing of the (in-order) queue is in flight and nothing is waited for, the copy is all: the
// worker's buffer is that memory, and in-order semantics have nothing to order it after. A read
// behind commands in flight (or a wait list) first waits for them with a marker, as the read
// itself would have waited, then copies; so does a write, as it waits natively (copied out
// instead, it would return before it ran, and the client may touch the buffer in place). With
// an event asked for, the usual path (its event is the transfer's command).
bool TryStorage(cl_command_queue q, cl_mem m, bool write, cl_bool blocking, size_t offset,
                size_t size, void* ptr, cl_uint nwait, const cl_event* waits, cl_event* event,
                cl_int* result) {
  uint8_t* at = InPlace(q, m, offset, blocking, event);
  // Memory the application does not map is an error from the usual path, not a crash here.
  // (A malformed wait list is WaitInPlace's error, as it would be the usual path's.)
  if (at == nullptr || !Mapped(ptr, size)) return false;
  // Held while waiting and copying: another thread may release the application's last
  // reference meanwhile (OpenCL defers the deletion until commands using it are done).
  cl_mem top = TopOf(m);
  top->refs.fetch_add(1);
  *result = WaitInPlace(q, nwait, waits);
  if (*result == CL_SUCCESS && write) {
    CopyBytes(at, ptr, size);
  } else if (*result == CL_SUCCESS) {
    CopyBytes(ptr, at, size);
  }
  Release(top);
  return true;
}

}  // namespace

cl_int CL_API_CALL EnqueueWriteBuffer(cl_command_queue q, cl_mem m, cl_bool blocking,
                                      size_t offset, size_t size, const void* ptr, cl_uint nwait,
                                      const cl_event* waits, cl_event* event) {
  if (cl_int e = CheckMem(q, m); e != CL_SUCCESS) return e;
  if (cl_int e = CheckHostAccess(m, false, true); e != CL_SUCCESS) return e;
  if (ptr == nullptr || size == 0 || offset > m->size || size > m->size - offset) return CL_INVALID_VALUE;
  if (cl_int e; TryStorage(q, m, /*write=*/true, blocking, offset, size, const_cast<void*>(ptr),
                           nwait, waits, event, &e)) {
    return e;
  }
  if (cl_int e; TryRemote(q, m, /*write=*/true, blocking, offset, size, const_cast<void*>(ptr),
                          nwait, waits, event, &e)) {
    return e;
  }
  Enqueuer enq(q, nwait, waits, event, CL_COMMAND_WRITE_BUFFER);
  if (enq.err() != CL_SUCCESS) return enq.err();
  // The data is copied out now, so a blocking write returns as soon as it is sent (PostWrite).
  // Large inline data is announced for its buffer, which the worker may receive it into; no
  // other thread's request may come between it and the command then. Not with a wait list:
  // the write may then run much later, and commands not ordered after it must not see it.
  ShmBuffer held;
  std::optional<Connection::StreamHold> hold;
  if (nwait == 0 && enq.conn().DirectWrite(size)) hold.emplace(&enq.conn());
  uint64_t token = enq.conn().SendBulk(ptr, size, &held, hold ? m->id : 0, offset);
  if (token == 0) return CL_OUT_OF_RESOURCES;
  auto w = enq.cmd().initWriteBuffer();
  w.setMem(m->id);
  w.setOffset(offset);
  w.setSize(size);
  w.setBulk(token);
  return enq.PostWrite(held, blocking, OnSharedMemory(m), hold ? &*hold : nullptr);
}

cl_int CL_API_CALL EnqueueReadBuffer(cl_command_queue q, cl_mem m, cl_bool blocking, size_t offset,
                                     size_t size, void* ptr, cl_uint nwait, const cl_event* waits,
                                     cl_event* event) {
  if (cl_int e = CheckMem(q, m); e != CL_SUCCESS) return e;
  if (cl_int e = CheckHostAccess(m, true, false); e != CL_SUCCESS) return e;
  if (ptr == nullptr || size == 0 || offset > m->size || size > m->size - offset) return CL_INVALID_VALUE;
  if (cl_int e; TryStorage(q, m, /*write=*/false, blocking, offset, size, ptr, nwait, waits,
                           event, &e)) {
    return e;
  }
  if (cl_int e; TryRemote(q, m, /*write=*/false, blocking, offset, size, ptr, nwait, waits,
                          event, &e)) {
    return e;
  }
  Enqueuer enq(q, nwait, waits, event, CL_COMMAND_READ_BUFFER);
  if (enq.err() != CL_SUCCESS) return enq.err();
  auto r = enq.cmd().initReadBuffer();
  r.setMem(m->id);
  r.setOffset(offset);
  r.setSize(size);
  uint64_t seq = enq.BeginRead(r, ptr, size, blocking);
  return blocking ? enq.WaitCompleted(seq) : CL_SUCCESS;
}

cl_int CL_API_CALL EnqueueWriteBufferRect(cl_command_queue q, cl_mem m, cl_bool blocking,
                                          const size_t* bo, const size_t* ho, const size_t* region,
                                          size_t brp, size_t bsp, size_t hrp, size_t hsp,
                                          const void* ptr, cl_uint nwait, const cl_event* waits,
                                          cl_event* event) {
  if (cl_int e = CheckMem(q, m); e != CL_SUCCESS) return e;
  if (cl_int e = CheckHostAccess(m, false, true); e != CL_SUCCESS) return e;
  if (ptr == nullptr || bo == nullptr || ho == nullptr || region == nullptr) return CL_INVALID_VALUE;
  if (!RectFits(m, bo, ho, region, brp, bsp, hrp, hsp)) return CL_INVALID_VALUE;
  Enqueuer enq(q, nwait, waits, event, CL_COMMAND_WRITE_BUFFER_RECT);
  if (enq.err() != CL_SUCCESS) return enq.err();
  size_t host_bytes = HostRectBytes(ho, region, hrp, hsp);
  ShmBuffer held;
  uint64_t token = enq.conn().SendBulk(ptr, host_bytes, &held);
  if (token == 0) return CL_OUT_OF_RESOURCES;
  auto w = enq.cmd().initWriteBuffer();
  w.setMem(m->id);
  w.setBulk(token);
  w.setIsRect(true);
  SetRect(w.initRect(), bo, ho, region, brp, bsp, hrp, hsp);
  return enq.PostWrite(held, blocking, OnSharedMemory(m));
}

cl_int CL_API_CALL EnqueueReadBufferRect(cl_command_queue q, cl_mem m, cl_bool blocking,
                                         const size_t* bo, const size_t* ho, const size_t* region,
                                         size_t brp, size_t bsp, size_t hrp, size_t hsp, void* ptr,
                                         cl_uint nwait, const cl_event* waits, cl_event* event) {
  if (cl_int e = CheckMem(q, m); e != CL_SUCCESS) return e;
  if (cl_int e = CheckHostAccess(m, true, false); e != CL_SUCCESS) return e;
  if (ptr == nullptr || bo == nullptr || ho == nullptr || region == nullptr) return CL_INVALID_VALUE;
  if (!RectFits(m, bo, ho, region, brp, bsp, hrp, hsp)) return CL_INVALID_VALUE;
  // The daemon returns the whole host span [0, end): read it into a staging copy and merge only
  // the rectangle's rows, leaving the application's other bytes untouched. Such reads always
  // block (OpenCL allows a non-blocking call to block).
  size_t host_bytes = HostRectBytes(ho, region, hrp, hsp);
  Enqueuer enq(q, nwait, waits, event, CL_COMMAND_READ_BUFFER_RECT);
  if (enq.err() != CL_SUCCESS) return enq.err();
  auto r = enq.cmd().initReadBuffer();
  r.setMem(m->id);
  r.setIsRect(true);
  SetRect(r.initRect(), bo, ho, region, brp, bsp, hrp, hsp);
  auto* staging = new std::vector<uint8_t>(host_bytes);
  size_t row = hrp == 0 ? region[0] : hrp;
  size_t slice = hsp == 0 ? region[1] * row : hsp;
  std::array<size_t, 3> o{ho[0], ho[1], ho[2]}, g{region[0], region[1], region[2]};
  auto merge = [staging, ptr, o, g, row, slice](cl_int status) {
    if (status == CL_SUCCESS) {
      for (size_t z = 0; z < g[2]; ++z) {
        for (size_t y = 0; y < g[1]; ++y) {
          size_t at = (o[2] + z) * slice + (o[1] + y) * row + o[0];
          std::memcpy(static_cast<uint8_t*>(ptr) + at, staging->data() + at, g[0]);
        }
      }
    }
    delete staging;
  };
  // Always waits: the merge must be done before any later wait on this command returns.
  (void)blocking;
  uint64_t seq = enq.Begin(staging->data(), host_bytes, true);
  cl_int e = enq.WaitCompleted(seq);
  merge(e);
  return e;
}

cl_int CL_API_CALL EnqueueCopyBuffer(cl_command_queue q, cl_mem src, cl_mem dst, size_t so,
                                     size_t dof, size_t size, cl_uint nwait, const cl_event* waits,
                                     cl_event* event) {
  if (cl_int e = CheckMem(q, src); e != CL_SUCCESS) return e;
  if (cl_int e = CheckMem(q, dst); e != CL_SUCCESS) return e;
  if (size == 0 || so > src->size || size > src->size - so || dof > dst->size ||
      size > dst->size - dof) {
    return CL_INVALID_VALUE;
  }
  // Sub-buffers of one buffer (or one and its parent) overlap where their bytes do (OpenCL 1.2,
  // 5.2.3: CL_MEM_COPY_OVERLAP).
  const size_t src_at = so + src->origin, dst_at = dof + dst->origin;  // origin: 0 at the top
  if (TopOf(src) == TopOf(dst) && src_at < dst_at + size && dst_at < src_at + size) {
    return CL_MEM_COPY_OVERLAP;
  }
  Enqueuer enq(q, nwait, waits, event, CL_COMMAND_COPY_BUFFER);
  if (enq.err() != CL_SUCCESS) return enq.err();
  auto c = enq.cmd().initCopyBuffer();
  c.setSrc(src->id);
  c.setDst(dst->id);
  c.setSrcOffset(so);
  c.setDstOffset(dof);
  c.setSize(size);
  return enq.Post();
}

cl_int CL_API_CALL EnqueueCopyBufferRect(cl_command_queue q, cl_mem src, cl_mem dst,
                                         const size_t* so, const size_t* dof, const size_t* region,
                                         size_t srp, size_t ssp, size_t drp, size_t dsp,
                                         cl_uint nwait, const cl_event* waits, cl_event* event) {
  if (cl_int e = CheckMem(q, src); e != CL_SUCCESS) return e;
  if (cl_int e = CheckMem(q, dst); e != CL_SUCCESS) return e;
  if (so == nullptr || dof == nullptr || region == nullptr) return CL_INVALID_VALUE;
  // Both sides are buffer rectangles (the host side's checks are the destination's here).
  // Pitches of 0 take their defaults; the request carries them as given.
  uint64_t src_end = 0, dst_end = 0;
  size_t src_rp = srp, src_sp = ssp, dst_rp = drp, dst_sp = dsp;
  if (!proto::RectEnd(so, region, src_rp, src_sp, src_end) || src_end > src->size ||
      !proto::RectEnd(dof, region, dst_rp, dst_sp, dst_end) || dst_end > dst->size) {
    return CL_INVALID_VALUE;
  }
  if (src == dst) {
    // One buffer: the same pitches (OpenCL 1.2, 5.2.3) and no shared byte.
    if (src_rp != dst_rp || src_sp != dst_sp) return CL_INVALID_VALUE;
    bool apart = false;
    for (int i = 0; i < 3; ++i) {
      apart = apart || so[i] + region[i] <= dof[i] || dof[i] + region[i] <= so[i];
    }
    if (!apart) return CL_MEM_COPY_OVERLAP;
  }
  Enqueuer enq(q, nwait, waits, event, CL_COMMAND_COPY_BUFFER_RECT);
  if (enq.err() != CL_SUCCESS) return enq.err();
  auto c = enq.cmd().initCopyBuffer();
  c.setSrc(src->id);
  c.setDst(dst->id);
  c.setIsRect(true);
  SetRect(c.initRect(), so, dof, region, srp, ssp, drp, dsp);
  return enq.Post();
}

cl_int CL_API_CALL EnqueueFillBuffer(cl_command_queue q, cl_mem m, const void* pattern,
                                     size_t pattern_size, size_t offset, size_t size, cl_uint nwait,
                                     const cl_event* waits, cl_event* event) {
  if (cl_int e = CheckMem(q, m); e != CL_SUCCESS) return e;
  if (pattern == nullptr || pattern_size == 0 || pattern_size > 128 ||
      (pattern_size & (pattern_size - 1)) != 0 || offset % pattern_size != 0 ||
      size % pattern_size != 0 || offset > m->size || size > m->size - offset) {
    return CL_INVALID_VALUE;
  }
  Enqueuer enq(q, nwait, waits, event, CL_COMMAND_FILL_BUFFER);
  if (enq.err() != CL_SUCCESS) return enq.err();
  auto f = enq.cmd().initFillBuffer();
  f.setMem(m->id);
  f.setPattern(kj::arrayPtr(static_cast<const kj::byte*>(pattern), pattern_size));
  f.setOffset(offset);
  f.setSize(size);
  return enq.Post();
}

cl_int Marker(cl_command_queue q, cl_uint nwait, const cl_event* waits, cl_event* event,
              bool barrier, cl_command_type type) {
  Enqueuer enq(q, nwait, waits, event, type);
  if (enq.err() != CL_SUCCESS) return enq.err();
  if (barrier) {
    enq.cmd().setBarrier();
  } else {
    enq.cmd().setMarker();
  }
  return enq.Post();
}

cl_int CL_API_CALL EnqueueMarkerWithWaitList(cl_command_queue q, cl_uint n, const cl_event* w,
                                             cl_event* e) {
  return Marker(q, n, w, e, false, CL_COMMAND_MARKER);
}
cl_int CL_API_CALL EnqueueBarrierWithWaitList(cl_command_queue q, cl_uint n, const cl_event* w,
                                              cl_event* e) {
  return Marker(q, n, w, e, true, CL_COMMAND_BARRIER);
}
cl_int CL_API_CALL EnqueueMarker(cl_command_queue q, cl_event* e) {
  if (e == nullptr) return CL_INVALID_VALUE;
  return Marker(q, 0, nullptr, e, false, CL_COMMAND_MARKER);
}
cl_int CL_API_CALL EnqueueBarrier(cl_command_queue q) {
  return Marker(q, 0, nullptr, nullptr, true, CL_COMMAND_BARRIER);
}
cl_int CL_API_CALL EnqueueWaitForEvents(cl_command_queue q, cl_uint n, const cl_event* w) {
  if (n == 0 || w == nullptr) return CL_INVALID_VALUE;
  return Marker(q, n, w, nullptr, true, CL_COMMAND_BARRIER);
}

cl_int CL_API_CALL EnqueueMigrateMemObjects(cl_command_queue q, cl_uint nmem, const cl_mem* mems,
                                            cl_mem_migration_flags, cl_uint nwait,
                                            const cl_event* waits, cl_event* event) {
  if (nmem == 0 || mems == nullptr) return CL_INVALID_VALUE;
  for (cl_uint i = 0; i < nmem; ++i) {
    if (cl_int e = CheckMem(q, mems[i]); e != CL_SUCCESS) return e;
  }
  // One device per context behind each queue: migration is ordering only.
  Enqueuer enq(q, nwait, waits, event, CL_COMMAND_MIGRATE_MEM_OBJECTS);
  if (enq.err() != CL_SUCCESS) return enq.err();
  enq.cmd().setMarker();
  return enq.Post();
}
}  // namespace gmux::icd
