// Events: waiting, info, callbacks, user events.
#include "icd/common.h"

namespace gmux::icd {

namespace {

// An event of a queue with CL_QUEUE_PROFILING_ENABLE.
bool Profiled(cl_event e) {
  return e->queue != nullptr && (e->queue->properties & CL_QUEUE_PROFILING_ENABLE) != 0;
}

// Keeps a completed command's profiling times in its event; the first to store them wins (the
// values are the same whoever asked).
void KeepProfile(cl_event e, const proto::EventProfile& p) {
  uint8_t none = 0;
  if (e->profile_state.compare_exchange_strong(none, 1, std::memory_order_acq_rel)) {
    e->profile = p;
    e->profile_state.store(2, std::memory_order_release);
  }
}

}  // namespace

cl_event NewEvent(cl_context ctx, cl_command_queue q, cl_command_type type, uint64_t id) {
  auto* e = new _cl_event();
  e->id = id;
  e->context = ctx;
  e->queue = q;
  e->type = type;
  RetainContext(ctx);
  if (q != nullptr) RetainCommandQueue(q);
  return e;
}

cl_int CL_API_CALL RetainEvent(cl_event e) { return Retain(e); }
cl_int CL_API_CALL ReleaseEvent(cl_event e) { return Release(e); }

void Destroy(_cl_event* e) {
  cl_context ctx = e->context;
  cl_command_queue q = e->queue;
  if (q != nullptr) {
    // The event holds its queue until after this, so the queue is there to be told.
    std::lock_guard<std::mutex> lock(q->last_mu);
    if (q->last_event == e) q->last_event = nullptr;
  }
  delete e;
  if (q != nullptr) ReleaseCommandQueue(q);
  ReleaseContext(ctx);
}

cl_int CL_API_CALL WaitForEvents(cl_uint n, const cl_event* events) {
  if (n == 0 || events == nullptr) return CL_INVALID_VALUE;
  bool all_complete = true;
  for (cl_uint i = 0; i < n; ++i) {
    if (!Valid(events[i])) return CL_INVALID_EVENT;
    if (events[i]->context != events[0]->context) return CL_INVALID_CONTEXT;
    all_complete = all_complete && events[i]->known_complete.load(std::memory_order_acquire);
  }
  // Every one completed without error as far as the ICD knows already (a blocking call's
  // event, or one waited for before): nothing to ask, and no request is built.
  Connection& c = Conn();
  if (all_complete && !c.Lost()) return CL_SUCCESS;
  // Timing code reads a command's profiling times right after waiting for it: an event of a
  // profiling queue whose times are not here yet has them sent with the wait's answer.
  bool profiled = false;
  for (cl_uint i = 0; c.profiled_waits() && !profiled && i < n; ++i) {
    profiled = Profiled(events[i]) &&
               events[i]->profile_state.load(std::memory_order_acquire) == 0;
  }
  capnp::MallocMessageBuilder b;
  auto l = profiled ? b.initRoot<wire::Request>().initWaitEventsProfiled(n)
                    : b.initRoot<wire::Request>().initWaitEvents(n);
  for (cl_uint i = 0; i < n; ++i) l.set(i, events[i]->id);
  std::optional<proto::Message> reply;
  const cl_int e = c.Call(b, profiled ? &reply : nullptr);
  for (cl_uint i = 0; e == CL_SUCCESS && i < n; ++i) {
    SettleUpTo(events[i]->queue, events[i]->number);
    // Waited for without error: complete, for later waits and status queries too.
    events[i]->known_complete.store(true, std::memory_order_release);
  }
  if (e == CL_SUCCESS && reply && reply->root<wire::Reply>().isInfo()) {
    auto info = reply->root<wire::Reply>().getInfo();
    constexpr size_t kEach = proto::EventProfile::kWireBytes;
    for (cl_uint i = 0; info.size() == n * kEach && i < n; ++i) {
      auto p = proto::EventProfile::Decode(info.begin() + i * kEach, kEach);
      if (p && p->available != 0 && Profiled(events[i])) KeepProfile(events[i], *p);
    }
  }
  return e;
}

cl_int CL_API_CALL GetEventInfo(cl_event e, cl_event_info param, size_t size, void* value,
                                size_t* size_ret) {
  if (!Valid(e)) return CL_INVALID_EVENT;
  switch (param) {
    case CL_EVENT_COMMAND_QUEUE: return Scalar(e->queue, size, value, size_ret);
    case CL_EVENT_CONTEXT: return Scalar(e->context, size, value, size_ret);
    case CL_EVENT_COMMAND_TYPE: return Scalar(e->type, size, value, size_ret);
    case CL_EVENT_REFERENCE_COUNT: return Scalar(RefCount(e), size, value, size_ret);
    case CL_EVENT_COMMAND_EXECUTION_STATUS:
      if (e->known_complete.load(std::memory_order_acquire)) {
        return Scalar<cl_int>(CL_COMPLETE, size, value, size_ret);
      }
      return RemoteInfoOut(wire::ObjectKind::EVENT, e->id, param, size, value, size_ret);
    default: return CL_INVALID_VALUE;
  }
}

cl_int CL_API_CALL GetEventProfilingInfo(cl_event e, cl_profiling_info param, size_t size,
                                         void* value, size_t* size_ret) {
  if (!Valid(e)) return CL_INVALID_EVENT;
  if (!Profiled(e)) return CL_PROFILING_INFO_NOT_AVAILABLE;
  if (e->profile_state.load(std::memory_order_acquire) == 2) {
    if (e->profile.Has(param)) {
      return Scalar<cl_ulong>(e->profile.Get(param), size, value, size_ret);
    }
  } else if (proto::EventProfile::Covers(param)) {
    // The first query takes every value; later ones, of this value or another, stay here.
    std::vector<uint8_t> v;
    const cl_int err = RemoteInfo(wire::ObjectKind::EVENT, e->id, proto::kProfilingAllParam, v);
    if (err == CL_PROFILING_INFO_NOT_AVAILABLE) return err;  // not complete yet
    if (err == CL_SUCCESS) {
      if (auto all = proto::EventProfile::Decode(v.data(), v.size())) {
        KeepProfile(e, *all);
        if (all->Has(param)) return Scalar<cl_ulong>(all->Get(param), size, value, size_ret);
      }
    }
  }
  // Not given all at once (a value the backend lacks, an invalid parameter): asked alone, so the
  // answer is the backend's own.
  return RemoteInfoOut(wire::ObjectKind::EVENT, e->id, param, size, value, size_ret);
}

cl_int CL_API_CALL SetEventCallback(cl_event e, cl_int type,
                                    void(CL_CALLBACK* fn)(cl_event, cl_int, void*), void* user) {
  if (!Valid(e)) return CL_INVALID_EVENT;
  if (fn == nullptr || (type != CL_COMPLETE && type != CL_SUBMITTED && type != CL_RUNNING)) {
    return CL_INVALID_VALUE;
  }
  // Every callback fires when the command completes (reaching COMPLETE implies the earlier
  // states); the event stays retained until then.
  RetainEvent(e);
  capnp::MallocMessageBuilder b;
  b.initRoot<wire::Request>().initWaitEvents(1).set(0, e->id);
  Conn().Begin(b, nullptr, 0, [e, fn, user, type](cl_int status) {
    fn(e, status == CL_SUCCESS ? type : status, user);
    ReleaseEvent(e);
  });
  return CL_SUCCESS;
}

cl_event CL_API_CALL CreateUserEvent(cl_context ctx, cl_int* err) {
  if (!Valid(ctx)) return Fail(err, CL_INVALID_CONTEXT);
  Connection& c = Conn();
  cl_event e = NewEvent(ctx, nullptr, CL_COMMAND_USER, c.NextId());
  ctx->unset_user_events.fetch_add(1, std::memory_order_acq_rel);
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<wire::Request>().initCreateUserEvent();
  r.setId(e->id);
  r.setContext(ctx->id);
  c.Post(b);
  SetErr(err, CL_SUCCESS);
  return e;
}

cl_int CL_API_CALL SetUserEventStatus(cl_event e, cl_int status) {
  if (!Valid(e) || e->type != CL_COMMAND_USER) return CL_INVALID_EVENT;
  if (status > CL_COMPLETE) return CL_INVALID_VALUE;
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<wire::Request>().initSetUserEventStatus();
  r.setId(e->id);
  r.setStatus(status);
  const cl_int result = Conn().Call(b);
  if (result == CL_SUCCESS && !e->user_set.exchange(true)) {
    e->context->unset_user_events.fetch_sub(1, std::memory_order_acq_rel);
  }
  return result;
}
}  // namespace gmux::icd
