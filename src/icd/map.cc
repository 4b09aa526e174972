// Mapping buffers, and unmapping every memory object.
#include "icd/common.h"

namespace gmux::icd {

void* CL_API_CALL EnqueueMapBuffer(cl_command_queue q, cl_mem m, cl_bool blocking,
                                   cl_map_flags flags, size_t offset, size_t size, cl_uint nwait,
                                   const cl_event* waits, cl_event* event, cl_int* err) {
  if (cl_int e = CheckMem(q, m); e != CL_SUCCESS) return Fail(err, e);
  if (m->is_image()) return Fail(err, CL_INVALID_MEM_OBJECT);
  if (size == 0 || offset > m->size || size > m->size - offset) return Fail(err, CL_INVALID_VALUE);
  if (cl_int e = CheckMapAccess(m, flags); e != CL_SUCCESS) return Fail(err, e);
  Mapping map;
  map.offset = offset;
  map.size = size;
  map.flags = flags;
  const bool invalidate = (flags & CL_MAP_WRITE_INVALIDATE_REGION) != 0;
  Connection& conn = Conn();
  // A buffer on shared memory: a blocking map is a pointer into it, once nothing in flight or
  // waited for can still touch it (docs/protocol.md, "Buffers on shared memory").
  if (uint8_t* at = InPlace(q, m, offset, blocking, event);
      at != nullptr && m->host_ptr == nullptr) {
    cl_mem top = TopOf(m);
    top->refs.fetch_add(1);  // another thread may release the last reference while it waits
    cl_int e = WaitInPlace(q, nwait, waits);
    Release(top);
    if (e != CL_SUCCESS) return Fail(err, e);
    map.ptr = at;
    map.in_place = true;
    std::lock_guard<std::mutex> lock(m->mu);
    m->maps.push_back(map);
    SetErr(err, CL_SUCCESS);
    return at;
  }
  if (m->host_ptr != nullptr) {
    map.ptr = static_cast<uint8_t*>(m->host_ptr) + offset;
  } else if ((blocking || invalidate) && conn.UseShm(size) &&
             (map.shm = conn.AcquireShm(size)).valid()) {
    // Only when nothing can still be written into the buffer after this call returns (the read
    // is waited for, or there is none), so unmap may hand it straight back to the pool. The
    // buffer holds only this client's earlier data until the read overwrites it.
    map.ptr = map.shm.map;
  } else {
    map.ptr = std::aligned_alloc(64, (size + 63) / 64 * 64);
    map.owned = true;
    if (map.ptr == nullptr) return Fail(err, CL_OUT_OF_HOST_MEMORY);
  }
  cl_int e;
  if ((flags & CL_MAP_WRITE_INVALIDATE_REGION) != 0) {
    e = Marker(q, nwait, waits, event, false, CL_COMMAND_MAP_BUFFER);
  } else {
    Enqueuer enq(q, nwait, waits, event, CL_COMMAND_MAP_BUFFER);
    e = enq.err();
    if (e == CL_SUCCESS) {
      auto r = enq.cmd().initReadBuffer();
      r.setMem(m->id);
      r.setOffset(offset);
      r.setSize(size);
      uint64_t seq;
      if (map.shm.valid()) {
        r.setShm(true);  // the device writes straight into the mapping
        seq = enq.Begin(nullptr, size, blocking, map.shm, /*keep_shm=*/true);
      } else {
        seq = enq.BeginRead(r, map.ptr, size, blocking);
      }
      if (blocking) e = enq.WaitCompleted(seq);
    }
  }
  if (e != CL_SUCCESS) {
    if (map.shm.valid()) conn.ReleaseShm(map.shm);
    if (map.owned) std::free(map.ptr);
    SetErr(err, e);
    return nullptr;
  }
  {
    std::lock_guard<std::mutex> lock(m->mu);
    m->maps.push_back(map);
  }
  SetErr(err, CL_SUCCESS);
  return map.ptr;
}

cl_int CL_API_CALL EnqueueUnmapMemObject(cl_command_queue q, cl_mem m, void* ptr, cl_uint nwait,
                                         const cl_event* waits, cl_event* event) {
  if (cl_int e = CheckMem(q, m); e != CL_SUCCESS) return e;
  Mapping map;
  {
    std::lock_guard<std::mutex> lock(m->mu);
    auto it = std::find_if(m->maps.begin(), m->maps.end(), [&](const Mapping& x) { return x.ptr == ptr; });
    if (it == m->maps.end()) return CL_INVALID_VALUE;
    map = *it;
    m->maps.erase(it);
  }
  cl_int e;
  bool handed_over = false;  // map.shm now belongs to a pending write
  if (map.in_place) {
    // What the application wrote is in the buffer already: only an event or a wait list
    // needs a command.
    if (nwait == 0 && waits == nullptr && event == nullptr) return CL_SUCCESS;
    return Marker(q, nwait, waits, event, false, CL_COMMAND_UNMAP_MEM_OBJECT);
  }
  if ((map.flags & (CL_MAP_WRITE | CL_MAP_WRITE_INVALIDATE_REGION)) != 0) {
    Enqueuer enq(q, nwait, waits, event, CL_COMMAND_UNMAP_MEM_OBJECT);
    e = enq.err();
    if (e == CL_SUCCESS && m->is_image()) {
      bool host = m->host_ptr != nullptr;
      bool layered = m->type == CL_MEM_OBJECT_IMAGE3D || m->type == CL_MEM_OBJECT_IMAGE2D_ARRAY ||
                     m->type == CL_MEM_OBJECT_IMAGE1D_ARRAY;
      e = PostWriteImage(enq, m, map.origin, map.region,
                         host && m->type != CL_MEM_OBJECT_IMAGE1D_ARRAY ? map.row_pitch : 0,
                         host && layered ? map.slice_pitch : 0, map.ptr, map.size,
                         /*blocking=*/false);
    } else if (e == CL_SUCCESS) {
      ShmBuffer held;
      uint64_t token;
      if (map.shm.valid()) {
        // Sent from where the application wrote it; the buffer goes back to the pool once the
        // write has run.
        token = enq.conn().SendShm(map.shm, map.size);
        if (token != 0) held = map.shm;
      } else {
        token = enq.conn().SendBulk(map.ptr, map.size, &held);
      }
      if (token == 0) {
        e = CL_OUT_OF_RESOURCES;
      } else {
        auto w = enq.cmd().initWriteBuffer();
        w.setMem(m->id);
        w.setOffset(map.offset);
        w.setSize(map.size);
        w.setBulk(token);
        e = enq.PostWrite(held, /*blocking=*/false, false);
        handed_over = map.shm.valid();  // released by the write's answer
      }
    }
  } else {
    e = Marker(q, nwait, waits, event, false, CL_COMMAND_UNMAP_MEM_OBJECT);
  }
  if (map.shm.valid() && !handed_over) Conn().ReleaseShm(map.shm);
  if (map.owned) std::free(map.ptr);  // the data was copied into the request
  return e;
}
}  // namespace gmux::icd
