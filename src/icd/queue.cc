// Command queues, flush and finish.
#include "icd/common.h"

namespace gmux::icd {

namespace {

cl_command_queue MakeQueue(cl_context ctx, cl_device_id dev, cl_command_queue_properties props,
                           std::vector<cl_queue_properties> array, cl_int* err) {
  if (!Valid(ctx)) return Fail(err, CL_INVALID_CONTEXT);
  if (!Is(dev, Kind::kDevice) ||
      std::find(ctx->devices.begin(), ctx->devices.end(), dev) == ctx->devices.end()) {
    return Fail(err, CL_INVALID_DEVICE);
  }
  constexpr cl_command_queue_properties kKnown =
      CL_QUEUE_PROFILING_ENABLE | CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE | CL_QUEUE_ON_DEVICE |
      CL_QUEUE_ON_DEVICE_DEFAULT;
  if ((props & ~kKnown) != 0) return Fail(err, CL_INVALID_VALUE);
  // A default device queue needs CL_QUEUE_ON_DEVICE, which needs out-of-order execution.
  if (((props & CL_QUEUE_ON_DEVICE_DEFAULT) != 0 && (props & CL_QUEUE_ON_DEVICE) == 0) ||
      ((props & CL_QUEUE_ON_DEVICE) != 0 && (props & CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE) == 0)) {
    return Fail(err, CL_INVALID_VALUE);
  }
  // Device-side enqueue runs kernels gmux cannot schedule: no device offers it through gmux
  // (CL_DEVICE_DEVICE_ENQUEUE_CAPABILITIES is 0).
  if ((props & CL_QUEUE_ON_DEVICE) != 0) return Fail(err, CL_INVALID_QUEUE_PROPERTIES);
  if ((props & CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE) != 0) {
    auto caps = DeviceScalar<cl_command_queue_properties>(dev, CL_DEVICE_QUEUE_PROPERTIES, 0);
    if ((caps & CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE) == 0) {
      return Fail(err, CL_INVALID_QUEUE_PROPERTIES);
    }
  }
  Connection& c = Conn();
  auto q = std::make_unique<_cl_command_queue>();
  q->id = c.NextId();
  q->context = ctx;
  q->device = dev;
  q->properties = props;
  q->properties_array = std::move(array);
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<wire::Request>().initCreateQueue();
  r.setId(q->id);
  r.setContext(ctx->id);
  r.setDevice(dev->index);
  r.setProperties(props);
  if (cl_int e = c.Call(b); e != CL_SUCCESS) return Fail(err, e);
  RetainContext(ctx);
  SetErr(err, CL_SUCCESS);
  return q.release();
}

}  // namespace

cl_command_queue CL_API_CALL CreateCommandQueue(cl_context ctx, cl_device_id dev,
                                                cl_command_queue_properties props, cl_int* err) {
  return MakeQueue(ctx, dev, props, {}, err);
}

cl_command_queue CL_API_CALL CreateCommandQueueWithProperties(cl_context ctx, cl_device_id dev,
                                                              const cl_queue_properties* props,
                                                              cl_int* err) {
  cl_command_queue_properties p = 0;
  std::vector<cl_queue_properties> array;
  bool has_size = false;
  if (props != nullptr) {
    for (const cl_queue_properties* it = props; *it != 0; it += 2) {
      for (size_t i = 0; i < array.size(); i += 2) {
        if (array[i] == it[0]) return Fail(err, CL_INVALID_VALUE);  // given twice
      }
      if (it[0] == CL_QUEUE_PROPERTIES) {
        p = static_cast<cl_command_queue_properties>(it[1]);
      } else if (it[0] == CL_QUEUE_SIZE) {
        has_size = true;
      } else {
        return Fail(err, CL_INVALID_VALUE);
      }
      array.push_back(it[0]);
      array.push_back(it[1]);
    }
    array.push_back(0);
  }
  // CL_QUEUE_SIZE is for device queues only.
  if (has_size && (p & CL_QUEUE_ON_DEVICE) == 0) return Fail(err, CL_INVALID_VALUE);
  return MakeQueue(ctx, dev, p, std::move(array), err);
}

cl_int CL_API_CALL RetainCommandQueue(cl_command_queue q) { return Retain(q); }
// Releasing a queue implies a flush; its commands still run on the daemon.
cl_int CL_API_CALL ReleaseCommandQueue(cl_command_queue q) { return Release(q); }

void SettleWhenDone(cl_command_queue q) {
  const uint64_t enqueued = q->enqueued.load(std::memory_order_acquire);
  const uint64_t settled = q->settled.load(std::memory_order_acquire);
  Connection* c = TryConn();
  if (settled >= enqueued || c == nullptr || c->Lost()) return;
  // The context outlives the queue until the answer (which the reader thread delivers).
  cl_context ctx = q->context;
  Retain(ctx);
  capnp::MallocMessageBuilder b;
  b.initRoot<wire::Request>().setFinish(q->id);
  c->Begin(b, nullptr, 0, [ctx, c, left = enqueued - settled](cl_int status) {
    if (status == CL_SUCCESS) {
      ctx->in_flight.fetch_sub(static_cast<int64_t>(left), std::memory_order_acq_rel);
      ReuseArenaSlots(ctx, *c);
    }
    ReleaseContext(ctx);
  });
}

void Destroy(_cl_command_queue* q) {
  cl_context ctx = q->context;
  delete q;
  ReleaseContext(ctx);
}

cl_int CL_API_CALL GetCommandQueueInfo(cl_command_queue q, cl_command_queue_info param, size_t size,
                                       void* value, size_t* size_ret) {
  if (!Valid(q)) return CL_INVALID_COMMAND_QUEUE;
  switch (param) {
    case CL_QUEUE_CONTEXT: return Scalar(q->context, size, value, size_ret);
    case CL_QUEUE_DEVICE: return Scalar(q->device, size, value, size_ret);
    case CL_QUEUE_REFERENCE_COUNT: return Scalar(RefCount(q), size, value, size_ret);
    case CL_QUEUE_PROPERTIES: return Scalar(q->properties, size, value, size_ret);
    case CL_QUEUE_PROPERTIES_ARRAY: return Array(q->properties_array, size, value, size_ret);
    // A host queue: it has no size, and there is no default device queue.
    case CL_QUEUE_SIZE: return CL_INVALID_COMMAND_QUEUE;
    case CL_QUEUE_DEVICE_DEFAULT: return Scalar<cl_command_queue>(nullptr, size, value, size_ret);
    default: return CL_INVALID_VALUE;
  }
}

cl_int CL_API_CALL Flush(cl_command_queue q) {
  if (!Valid(q)) return CL_INVALID_COMMAND_QUEUE;
  return Conn().Flush();
}

namespace {

// For Finish: the event of `q`'s last command, retained, when `q` is in order with profiling, the
// worker sends times with a wait, and that command's times are not here yet; else null.
cl_event LastUntimedEvent(cl_command_queue q, Connection& c) {
  if ((q->properties & CL_QUEUE_PROFILING_ENABLE) == 0 ||
      (q->properties & CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE) != 0 || !c.profiled_waits()) {
    return nullptr;
  }
  std::lock_guard<std::mutex> lock(q->last_mu);
  cl_event e = q->last_event;
  if (e == nullptr || e->number != q->enqueued.load(std::memory_order_acquire) ||
      e->profile_state.load(std::memory_order_acquire) != 0) {
    return nullptr;
  }
  // Retained only while the application still holds it: at 0 its destruction is under way
  // (and waits for last_mu to forget it).
  int32_t refs = e->refs.load();
  while (refs > 0 && !e->refs.compare_exchange_weak(refs, refs + 1)) {
  }
  return refs > 0 ? e : nullptr;
}

}  // namespace

cl_int CL_API_CALL Finish(cl_command_queue q) {
  if (!Valid(q)) return CL_INVALID_COMMAND_QUEUE;
  Connection& c = Conn();
  // Every command of the queue is known to have completed (a finish, a blocking read, a wait
  // answered since the last enqueue): their answers, errors included, are all in, so there is
  // nothing to ask the worker (docs/policies.md, "An idle clFinish stays in the client"). What
  // is batched leaves now, as it would with the finish.
  if (Settled(q) && !c.Lost()) {
    const cl_int sent = c.Flush();
    const cl_int async = c.TakeAsyncError();
    return sent != CL_SUCCESS ? sent : async;
  }
  // The last command of an in-order profiling queue has an event whose times are not here (a
  // kernel timed with clFinish, then clGetEventProfilingInfo): waiting for that command is the
  // finish, and its answer brings the times, so the queries that follow ask nothing
  // (docs/policies.md, "Profiling times asked once per event"). A failed command: the finish
  // below, whose answer is what it always was.
  if (cl_event last = LastUntimedEvent(q, c); last != nullptr) {
    const cl_int waited = WaitForEvents(1, &last);
    Release(last);
    if (waited == CL_SUCCESS) return c.TakeAsyncError();
  }
  const uint64_t enqueued = q->enqueued.load(std::memory_order_acquire);
  capnp::MallocMessageBuilder b;
  b.initRoot<wire::Request>().setFinish(q->id);
  cl_int e = c.Call(b);
  if (e == CL_SUCCESS) Settle(q, enqueued);
  cl_int async = c.TakeAsyncError();
  return e != CL_SUCCESS ? e : async;
}

}  // namespace gmux::icd
