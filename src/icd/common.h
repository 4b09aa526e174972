// What the files of libgmux-icd share: the entry points (declared from the dispatch list), the
// handle registry, the generic object lifecycle, info-query helpers, the connection accessor and
// the Enqueuer that builds every enqueued command.
//
// The invariants every file keeps:
// - No exception leaves an entry point: dispatch.cc wraps each one and turns an exception into
//   an OpenCL error code (the ICD never terminates its host program).
// - A handle is used only after Valid()/Is() found it in the registry; objects are registered
//   from construction to destruction, so released or foreign handles are never dereferenced.
// - A creator owns its new object (std::unique_ptr) until the daemon has accepted it, then
//   retains what the object refers to (its context, program, parent) and releases it in the
//   type's Destroy, which the generic Release calls at the last reference.
// - Info the ICD knows is answered locally, one line per parameter; the rest is asked of the
//   daemon (device info once, cached). Values are checked here where the asynchronous
//   backend's error would arrive too late (at the next clFinish).
// - Enqueues and releases are posted without waiting; blocking calls and creators wait.
//
// Each API family lives in its own file: platform.cc (platform, devices), context.cc, queue.cc,
// memory.cc (buffers), image.cc (images and their transfers), sampler.cc, event.cc,
// transfer.cc (buffer transfers, markers, barriers), map.cc, program.cc, kernel.cc and
// dispatch.cc (the table and the exported symbols). The OpenCL 2.x/3.0 entry points live with
// their family; those of SVM, pipes and device-side enqueue are not offered (platform.cc).
#pragma once

#include <capnp/message.h>

#include <algorithm>
#include <memory>
#include <cstring>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "common/bulk_copy.h"
#include "icd/connection.h"
#include "icd/objects.h"

namespace gmux::icd {

namespace wire = proto::wire;

// ---- the entry points ----
// Declared with the OpenCL headers' own prototypes (cl_icd.h's cl_api_* types), so a
// definition whose signature differs from the standard's is a different function and the
// library fails to link.
// (The OpenCL 1.0/1.1 entry points are declared deprecated; gmux still offers them.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#define GMUX_API(slot, fn) std::remove_pointer_t<cl_api_##slot> fn;
#define GMUX_NONE(slot)
#include "icd/dispatch_slots.inc"
#undef GMUX_API
#undef GMUX_NONE
#pragma GCC diagnostic pop

// The one platform.
_cl_platform_id* Platform();

// ---- the connection ----

// Thrown by Conn() when no daemon can be reached; the dispatch wrapper turns it into
// CL_DEVICE_NOT_AVAILABLE for the call.
struct NoDaemon {};

// The process's connection, or nullptr while no daemon can be reached. Once made it lives as
// long as the process, so every live object was made over it.
inline Connection* TryConn() { return Connection::Get(); }
// The connection, for calls that need one (throws NoDaemon where there is none).
inline Connection& Conn() {
  Connection* c = Connection::Get();
  if (c == nullptr) throw NoDaemon{};
  return *c;
}

// ---- handles ----

// Whether `p` is a live object of kind `k` made by this ICD. Every object registers itself
// when constructed and leaves the registry when destroyed, so a stale, foreign or garbage
// handle is rejected without being dereferenced.
bool Live(const void* p, Kind k);

template <typename T>
bool Is(const T* o, Kind k) {
  return Live(o, k);
}

template <typename T>
struct Traits;
#define GMUX_TRAITS(type, k, invalid_code, wire_kind)                  \
  template <>                                                          \
  struct Traits<type> {                                                \
    static constexpr Kind kind = Kind::k;                              \
    static constexpr cl_int invalid = invalid_code;                    \
    static constexpr wire::ObjectKind wire = wire::ObjectKind::wire_kind; \
  };
GMUX_TRAITS(_cl_context, kContext, CL_INVALID_CONTEXT, CONTEXT)
GMUX_TRAITS(_cl_command_queue, kQueue, CL_INVALID_COMMAND_QUEUE, QUEUE)
GMUX_TRAITS(_cl_mem, kMem, CL_INVALID_MEM_OBJECT, MEM)
GMUX_TRAITS(_cl_sampler, kSampler, CL_INVALID_SAMPLER, SAMPLER)
GMUX_TRAITS(_cl_program, kProgram, CL_INVALID_PROGRAM, PROGRAM)
GMUX_TRAITS(_cl_kernel, kKernel, CL_INVALID_KERNEL, KERNEL)
GMUX_TRAITS(_cl_event, kEvent, CL_INVALID_EVENT, EVENT)
#undef GMUX_TRAITS

template <typename T>
bool Valid(const T* o) {
  return Live(o, Traits<T>::kind);
}

// Tells the daemon an object is gone (posted, not waited for).
void PostRelease(wire::ObjectKind kind, uint64_t id);

// Frees an object whose last reference went and releases what it held (each in its family's
// file).
void Destroy(_cl_context* o);
void Destroy(_cl_command_queue* o);
void Destroy(_cl_mem* o);
// A context's small buffers released while its commands were in flight give their arena slots
// back once none is: then no command can still touch them (memory.cc, Destroy).
void ReuseArenaSlots(cl_context ctx, Connection& c);
void Destroy(_cl_sampler* o);
void Destroy(_cl_program* o);
void Destroy(_cl_kernel* o);
void Destroy(_cl_event* o);

template <typename T>
cl_int Retain(T* o) {
  if (!Valid(o)) return Traits<T>::invalid;
  o->refs.fetch_add(1);
  return CL_SUCCESS;
}

// A queue released with commands not known to have completed: sends them (the release's
// implicit flush, OpenCL 1.2 5.1) with a request for the worker to say when they have
// completed, and then settles them in the context's count of commands in flight (the context's
// buffers' shared memory is reused only at 0; without this, never again).
void SettleWhenDone(cl_command_queue q);

// At the last release the handle is dead at once (rejected from then on), the daemon is told,
// and the object is destroyed.
template <typename T>
cl_int Release(T* o) {
  if (!Valid(o)) return Traits<T>::invalid;
  if (o->refs.fetch_sub(1) == 1) {
    Forget(o);
    if constexpr (std::is_same_v<T, _cl_command_queue>) SettleWhenDone(o);
    PostRelease(Traits<T>::wire, o->id);
    Destroy(o);
  }
  return CL_SUCCESS;
}

template <typename T>
cl_uint RefCount(const T* o) {
  return static_cast<cl_uint>(o->refs.load());
}

// ---- results ----

inline void SetErr(cl_int* errcode_ret, cl_int e) {
  if (errcode_ret != nullptr) *errcode_ret = e;
}

// Returns nullptr with *errcode_ret = e: `return Fail(err, CL_INVALID_VALUE);` in creators.
inline std::nullptr_t Fail(cl_int* errcode_ret, cl_int e) {
  SetErr(errcode_ret, e);
  return nullptr;
}

// Copies an info value out as clGet*Info requires (CL_INVALID_VALUE when `size` is too small).
inline cl_int CopyOut(const void* src, size_t n, size_t size, void* value, size_t* size_ret) {
  if (value != nullptr) {
    if (size < n) return CL_INVALID_VALUE;
    if (n > 0) std::memcpy(value, src, n);
  }
  if (size_ret != nullptr) *size_ret = n;
  return CL_SUCCESS;
}

template <typename T>
cl_int Scalar(T v, size_t size, void* value, size_t* size_ret) {
  return CopyOut(&v, sizeof(T), size, value, size_ret);
}

template <typename T>
cl_int Array(const std::vector<T>& v, size_t size, void* value, size_t* size_ret) {
  return CopyOut(v.data(), v.size() * sizeof(T), size, value, size_ret);
}

inline cl_int String(const std::string& s, size_t size, void* value, size_t* size_ret) {
  return CopyOut(s.c_str(), s.size() + 1, size, value, size_ret);
}

// Asks the daemon for an info value of an object (`device`: for per-device queries).
cl_int RemoteInfo(wire::ObjectKind kind, uint64_t id, cl_uint param, std::vector<uint8_t>& out,
                  const _cl_device_id* device = nullptr, cl_uint arg_index = 0);
cl_int RemoteInfoOut(wire::ObjectKind kind, uint64_t id, cl_uint param, size_t size, void* value,
                     size_t* size_ret, const _cl_device_id* device = nullptr,
                     cl_uint arg_index = 0);

// ---- devices ----

// Makes the device objects from the daemon's hello (once).
void EnsureDevices();
bool KnownDevice(cl_device_id d);
// A device's info value, cached (device info does not change), as the application sees it.
cl_int DeviceInfo(cl_device_id d, cl_device_info param, std::vector<uint8_t>& out);
template <typename T>
T DeviceScalar(cl_device_id d, cl_device_info param, T fallback) {
  std::vector<uint8_t> v;
  if (DeviceInfo(d, param, v) != CL_SUCCESS || v.size() != sizeof(T)) return fallback;
  T t;
  std::memcpy(&t, v.data(), sizeof(T));
  return t;
}
// Whether the backend platform implements OpenCL 3.0 (so gmux reports 3.0 and offers its
// entry points); otherwise gmux reports 1.2.
bool Backend30();

// ---- events and enqueues ----

cl_event NewEvent(cl_context ctx, cl_command_queue q, cl_command_type type, uint64_t id);

// Builds the common part of an Enqueue; the caller fills the command and calls Post or Begin.
class Enqueuer {
 public:
  Enqueuer(cl_command_queue q, cl_uint nwait, const cl_event* waits, cl_event* event_out,
           cl_command_type type);

  cl_int err() const { return err_; }
  wire::Enqueue::Builder& cmd() { return e_; }
  Connection& conn() { return *c_; }
  // This command's place in its queue's count of enqueued commands (Settle), once sent.
  uint64_t number() const { return number_; }

  // Sends the command without waiting.
  cl_int Post();
  // Sends the command with a seq whose reply (read data) lands in dst.
  uint64_t Begin(void* dst, size_t size, bool blocking, ShmBuffer shm = {},
                 bool keep_shm = false);
  // Sends a write, whose data (`held`: a shared buffer, returned to the pool once the worker
  // answers that the command ran) was sent before. A blocking write returns once its data is
  // sent, marked toldComplete: the worker runs every later command of the session after it, on
  // any queue, as natively after a blocking call. It waits for the command to have run when
  // the application asked for an event (whose status must then be complete), `in_place`
  // (the buffer is on shared memory, which the client reads and writes itself), with a wait
  // list, or while a user event of the context is not set.
  // `hold` (the write's data announced for its buffer) is released once the command is sent.
  cl_int PostWrite(ShmBuffer held, cl_bool blocking, bool in_place,
                   Connection::StreamHold* hold = nullptr);
  // A plain read of `size` bytes into dst, through shared memory when that pays.
  uint64_t BeginRead(wire::ReadBuffer::Builder r, void* dst, size_t size, bool blocking);
  // Waits for the reply to `seq`, sent by Begin for a command answered once it completed (a
  // read): on an in-order queue, every command before it has completed too (Settle).
  cl_int WaitCompleted(uint64_t seq);
  // The command is known to have completed: so is its event (_cl_event::known_complete).
  void MarkComplete();

 private:
  void MakeEvent();
  // Where this command is counted as it enters the stream: its queue and its context.
  StreamOrder Order() { return {&q_->enqueued, &number_, &q_->context->in_flight}; }
  cl_command_queue q_;
  cl_event* event_out_;
  cl_command_type type_;
  cl_uint nwait_;
  cl_int err_ = CL_SUCCESS;
  Connection* c_ = nullptr;
  capnp::MallocMessageBuilder b_;
  wire::Enqueue::Builder e_{nullptr};
  uint64_t id_ = 0;
  uint64_t number_ = 0;
};

// The first `upto` commands enqueued on `q` are known to have completed.
void Settle(cl_command_queue q, uint64_t upto);
// Command `number` of `q` (Enqueuer::number; 0: none) is known to have completed: on an
// in-order queue, so is every command before it.
void SettleUpTo(cl_command_queue q, uint64_t number);
// Whether every command enqueued on `q` is known to have completed.
inline bool Settled(cl_command_queue q) {
  return q->settled.load(std::memory_order_acquire) == q->enqueued.load(std::memory_order_acquire);
}

// Buffers on shared memory (docs/protocol.md): where byte `offset` of `m` (a buffer or a
// sub-buffer) lies in this process when the client may touch it itself, or null: the buffer is
// not on shared memory, the call is not blocking, an event is asked for (it must be the
// transfer's command), the queue is out of order, or the connection is lost or the parent's.
uint8_t* InPlace(cl_command_queue q, cl_mem m, size_t offset, cl_bool blocking,
                 const cl_event* event_out);
// The buffer `m` lies in: its parent for a sub-buffer, else itself.
inline cl_mem TopOf(cl_mem m) { return m->parent != nullptr ? m->parent : m; }
// Whether `m` (a buffer, a sub-buffer, an image from a buffer) lies on shared memory the client
// touches in place.
bool OnSharedMemory(cl_mem m);
// Waits until nothing enqueued on the in-order `q` before now, nor the wait list, can still
// touch a buffer: at once when nothing is in flight and nothing is waited for, otherwise for a
// marker the worker answers once it completed (whose Enqueuer checks the wait list:
// CL_INVALID_EVENT_WAIT_LIST as for any enqueue).
cl_int WaitInPlace(cl_command_queue q, cl_uint nwait, const cl_event* waits);

// A marker (or barrier) command: completes when its wait list (or, with none, everything
// enqueued before it) has. `type` is what its event reports.
cl_int Marker(cl_command_queue q, cl_uint nwait, const cl_event* waits, cl_event* event,
              bool barrier, cl_command_type type);

// A memory object of this connection, owned by the caller until the daemon has accepted it.
std::unique_ptr<_cl_mem> NewMem(cl_context ctx, cl_mem_flags flags, size_t size, void* host_ptr);

// cl*WithProperties' list of memory properties, kept as given for CL_MEM_PROPERTIES (empty for
// NULL). OpenCL 3.0 defines none, so any key is CL_INVALID_PROPERTY.
cl_int MemProperties(const cl_mem_properties* props, std::vector<cl_mem_properties>& out);

cl_int CheckMem(cl_command_queue q, cl_mem m);
// The host access an object was created with (CL_MEM_HOST_*, a sub-buffer's inherited from its
// parent): reading or writing it from the host otherwise is CL_INVALID_OPERATION (OpenCL 1.2,
// 5.2.2, 5.3.3, 5.4.2). Checked here, since the transfers are asynchronous and the backend
// object is created without these flags (the worker moves the data for the host).
cl_int CheckHostAccess(cl_mem m, bool read, bool write);
cl_int CheckMapAccess(cl_mem m, cl_map_flags flags);
void SetTriple(capnp::List<uint64_t>::Builder l, const size_t v[3]);
// Writes an image region from host memory `src` (`bytes` long, in the given host layout);
// `blocking` as for Enqueuer::PostWrite.
cl_int PostWriteImage(Enqueuer& enq, cl_mem m, const size_t origin[3], const size_t region[3],
                      size_t row_pitch, size_t slice_pitch, const void* src, size_t bytes,
                      cl_bool blocking);
// Bytes a host rectangle spans (the daemon re-checks everything).
size_t HostRectBytes(const size_t origin[3], const size_t region[3], size_t row, size_t slice);

}  // namespace gmux::icd
