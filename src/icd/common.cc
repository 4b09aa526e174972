// The handle registry, remote info queries and the Enqueuer (common.h).
#include "icd/common.h"

#include <functional>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>

namespace gmux::icd {

// ---- handles ----

namespace {

// Looked up by every call (shared), changed only when objects are made or destroyed.
struct Registry {
  std::shared_mutex mu;
  std::unordered_map<const void*, Kind> live;
};

// Never destroyed: objects (the platform among them) may be made and released from static
// constructors and destructors in any order.
Registry& Handles() {
  static auto* r = new Registry();
  return *r;
}

}  // namespace

void RegisterHandle(const void* p, Kind k) {
  Registry& r = Handles();
  std::unique_lock<std::shared_mutex> lock(r.mu);
  r.live[p] = k;
}

void Forget(const void* p) {
  Registry& r = Handles();
  std::unique_lock<std::shared_mutex> lock(r.mu);
  r.live.erase(p);
}

bool Live(const void* p, Kind k) {
  if (p == nullptr) return false;
  Registry& r = Handles();
  std::shared_lock<std::shared_mutex> lock(r.mu);
  auto it = r.live.find(p);
  return it != r.live.end() && it->second == k;
}

void PostRelease(wire::ObjectKind kind, uint64_t id) {
  Connection* c = TryConn();
  if (c == nullptr) return;
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<wire::Request>().initRelease();
  r.setKind(kind);
  r.setId(id);
  (void)c->Post(b);
  // A context's release is where a program lets its device go (the pool's lease ends with the
  // tenant's last context): the daemon hears of it now, not with the program's next call.
  if (kind == wire::ObjectKind::CONTEXT) (void)c->Flush();
}

// ---- remote info ----

cl_int RemoteInfo(wire::ObjectKind kind, uint64_t id, cl_uint param, std::vector<uint8_t>& out,
                  const _cl_device_id* device, cl_uint arg_index) {
  Connection* c = TryConn();
  if (c == nullptr) return CL_DEVICE_NOT_AVAILABLE;
  capnp::MallocMessageBuilder b;
  auto gi = b.initRoot<wire::Request>().initGetInfo();
  gi.setKind(kind);
  gi.setId(id);
  gi.setParam(param);
  gi.setArgIndex(arg_index);
  if (device != nullptr) {
    gi.setHasDevice(true);
    gi.setDevice(device->index);
  }
  std::optional<proto::Message> reply;
  cl_int err = c->Call(b, &reply);
  if (err != CL_SUCCESS) return err;
  out.clear();
  // A success must carry the value; anything else breaks the protocol.
  if (!reply || !reply->root<wire::Reply>().isInfo()) return CL_OUT_OF_RESOURCES;
  auto info = reply->root<wire::Reply>().getInfo();  // read once: each read counts in full
  out.assign(info.begin(), info.end());
  return CL_SUCCESS;
}

cl_int RemoteInfoOut(wire::ObjectKind kind, uint64_t id, cl_uint param, size_t size, void* value,
                     size_t* size_ret, const _cl_device_id* device, cl_uint arg_index) {
  std::vector<uint8_t> v;
  cl_int err = RemoteInfo(kind, id, param, v, device, arg_index);
  if (err != CL_SUCCESS) return err;
  return CopyOut(v.data(), v.size(), size, value, size_ret);
}

// ---- enqueues ----

Enqueuer::Enqueuer(cl_command_queue q, cl_uint nwait, const cl_event* waits, cl_event* event_out,
                   cl_command_type type)
    : q_(q), event_out_(event_out), type_(type), nwait_(nwait) {
  if (!Valid(q)) {
    err_ = CL_INVALID_COMMAND_QUEUE;
    return;
  }
  if ((nwait == 0) != (waits == nullptr)) {
    err_ = CL_INVALID_EVENT_WAIT_LIST;
    return;
  }
  if (Connection::Forked()) {
    err_ = CL_DEVICE_NOT_AVAILABLE;  // the connection is the parent's
    return;
  }
  c_ = &Conn();
  e_ = b_.initRoot<wire::Request>().initEnqueue();
  e_.setQueue(q->id);
  id_ = c_->NextId();
  e_.setEvent(id_);
  e_.setKeepEvent(event_out != nullptr);
  auto l = e_.initWaitList(nwait);
  for (cl_uint i = 0; i < nwait; ++i) {
    if (!Valid(waits[i]) || waits[i]->context != q->context) {
      err_ = CL_INVALID_EVENT_WAIT_LIST;
      return;
    }
    l.set(i, waits[i]->id);
  }
}

cl_int Enqueuer::Post() {
  cl_int e = c_->Post(b_, Order());
  if (e == CL_SUCCESS) MakeEvent();
  return e;
}

uint64_t Enqueuer::Begin(void* dst, size_t size, bool blocking, ShmBuffer shm, bool keep_shm) {
  std::function<void(cl_int)> none;
  if (!blocking) none = [](cl_int) {};
  uint64_t seq = c_->Begin(b_, dst, size, std::move(none), shm, keep_shm, {}, Order());
  MakeEvent();
  return seq;
}

cl_int Enqueuer::PostWrite(ShmBuffer held, cl_bool blocking, bool in_place,
                           Connection::StreamHold* hold) {
  // Natively the call waits for its wait list and for the commands before it, which a user event
  // not set yet may hold up: returning early, the worker would order every later command after
  // it, the one that sets the event included.
  if (blocking && (event_out_ != nullptr || in_place || nwait_ != 0 ||
                   q_->context->unset_user_events.load(std::memory_order_acquire) != 0)) {
    const uint64_t seq = c_->Begin(b_, nullptr, 0, {}, {}, false, held, Order());
    if (hold != nullptr) hold->Release();
    MakeEvent();
    return WaitCompleted(seq);
  }
  if (blocking) e_.setToldComplete(true);
  cl_int result = CL_SUCCESS;
  if (!held.valid()) {
    result = Post();
  } else {
    // Nobody waits for the reply.
    c_->Begin(b_, nullptr, 0, [](cl_int) {}, {}, false, held, Order());
    MakeEvent();
  }
  if (hold != nullptr) hold->Release();
  return result;
}

uint64_t Enqueuer::BeginRead(wire::ReadBuffer::Builder r, void* dst, size_t size, bool blocking) {
  if (c_->UseShm(size)) {
    ShmBuffer buf = c_->AcquireShm(size);
    if (buf.valid()) {
      r.setShm(true);
      return Begin(dst, size, blocking, buf);
    }
  }
  return Begin(dst, size, blocking);
}

void Enqueuer::MakeEvent() {
  if (event_out_ != nullptr) {
    *event_out_ = NewEvent(q_->context, q_, type_, id_);
    (*event_out_)->number = number_;
    if ((q_->properties & CL_QUEUE_PROFILING_ENABLE) != 0) {
      std::lock_guard<std::mutex> lock(q_->last_mu);
      q_->last_event = *event_out_;
    }
  }
}

cl_int Enqueuer::WaitCompleted(uint64_t seq) {
  const cl_int e = c_->Wait(seq);
  if (e == CL_SUCCESS) {
    SettleUpTo(q_, number_);
    MarkComplete();
  }
  return e;
}

void Enqueuer::MarkComplete() {
  if (event_out_ != nullptr && *event_out_ != nullptr) {
    (*event_out_)->known_complete.store(true, std::memory_order_release);
  }
}

void Settle(cl_command_queue q, uint64_t upto) {
  uint64_t was = q->settled.load(std::memory_order_relaxed);
  while (was < upto) {
    if (q->settled.compare_exchange_weak(was, upto, std::memory_order_acq_rel)) {
      q->context->in_flight.fetch_sub(static_cast<int64_t>(upto - was),
                                      std::memory_order_acq_rel);
      return;
    }
  }
}

void SettleUpTo(cl_command_queue q, uint64_t number) {
  if (q == nullptr || number == 0) return;
  if ((q->properties & CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE) == 0) Settle(q, number);
}

bool OnSharedMemory(cl_mem m) {
  if (m->is_image()) return m->desc.buffer != nullptr && OnSharedMemory(m->desc.buffer);
  const cl_mem top = TopOf(m);
  return top->storage != nullptr;
}

uint8_t* InPlace(cl_command_queue q, cl_mem m, size_t offset, cl_bool blocking,
                 const cl_event* event_out) {
  cl_mem top = TopOf(m);
  if (top->storage == nullptr || !blocking || event_out != nullptr || !Valid(q) ||
      (q->properties & CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE) != 0) {
    return nullptr;
  }
  Connection* c = TryConn();
  if (c == nullptr || c->Lost()) return nullptr;
  return top->storage + (m->parent != nullptr ? m->origin : 0) + offset;
}

cl_int WaitInPlace(cl_command_queue q, cl_uint nwait, const cl_event* waits) {
  if (nwait == 0 && waits == nullptr && Settled(q)) return CL_SUCCESS;
  Enqueuer enq(q, nwait, waits, nullptr, CL_COMMAND_MARKER);
  if (enq.err() != CL_SUCCESS) return enq.err();
  enq.cmd().setMarker();
  const uint64_t seq = enq.Begin(nullptr, 0, /*blocking=*/true);
  cl_int e = enq.conn().Wait(seq);
  // The marker entered the stream after every command numbered below it.
  if (e == CL_SUCCESS) Settle(q, enq.number());
  return e;
}

cl_int MemProperties(const cl_mem_properties* props, std::vector<cl_mem_properties>& out) {
  out.clear();
  if (props == nullptr) return CL_SUCCESS;
  if (*props != 0) return CL_INVALID_PROPERTY;
  out.push_back(0);
  return CL_SUCCESS;
}

cl_int CheckMem(cl_command_queue q, cl_mem m) {
  if (!Valid(m)) return CL_INVALID_MEM_OBJECT;
  if (Valid(q) && m->context != q->context) return CL_INVALID_CONTEXT;
  return CL_SUCCESS;
}

cl_int CheckHostAccess(cl_mem m, bool read, bool write) {
  if ((m->flags & CL_MEM_HOST_NO_ACCESS) != 0 && (read || write)) return CL_INVALID_OPERATION;
  if (read && (m->flags & CL_MEM_HOST_WRITE_ONLY) != 0) return CL_INVALID_OPERATION;
  if (write && (m->flags & CL_MEM_HOST_READ_ONLY) != 0) return CL_INVALID_OPERATION;
  return CL_SUCCESS;
}

cl_int CheckMapAccess(cl_mem m, cl_map_flags flags) {
  return CheckHostAccess(m, (flags & CL_MAP_READ) != 0,
                         (flags & (CL_MAP_WRITE | CL_MAP_WRITE_INVALIDATE_REGION)) != 0);
}

void SetTriple(capnp::List<uint64_t>::Builder l, const size_t v[3]) {
  for (unsigned i = 0; i < 3; ++i) l.set(i, v[i]);
}

size_t HostRectBytes(const size_t origin[3], const size_t region[3], size_t row, size_t slice) {
  if (row == 0) row = region[0];
  if (slice == 0) slice = region[1] * row;
  return (origin[2] + region[2] - 1) * slice + (origin[1] + region[1] - 1) * row + origin[0] +
         region[0];
}

}  // namespace gmux::icd
