// Contexts.
#include "icd/common.h"

namespace gmux::icd {

namespace {

using Notify = void(CL_CALLBACK*)(const char*, const void*, size_t, void*);

cl_context MakeContext(const cl_context_properties* props, std::vector<cl_device_id> devs,
                       Notify notify, void* user, cl_int* err) {
  if (notify == nullptr && user != nullptr) return Fail(err, CL_INVALID_VALUE);
  std::vector<cl_context_properties> kept;
  if (props != nullptr) {
    for (const cl_context_properties* p = props; *p != 0; p += 2) {
      for (size_t i = 0; i < kept.size(); i += 2) {
        if (kept[i] == p[0]) return Fail(err, CL_INVALID_PROPERTY);  // given twice
      }
      if (p[0] == CL_CONTEXT_PLATFORM) {
        if (reinterpret_cast<cl_platform_id>(p[1]) != Platform()) {
          return Fail(err, CL_INVALID_PLATFORM);
        }
      } else if (p[0] != CL_CONTEXT_INTEROP_USER_SYNC) {
        return Fail(err, CL_INVALID_PROPERTY);
      }
      kept.push_back(p[0]);
      kept.push_back(p[1]);
    }
    kept.push_back(0);
  }
  Connection& c = Conn();
  auto ctx = std::make_unique<_cl_context>();
  ctx->id = c.NextId();
  ctx->devices = std::move(devs);
  ctx->properties = std::move(kept);
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<wire::Request>().initCreateContext();
  r.setId(ctx->id);
  auto l = r.initDevices(static_cast<unsigned>(ctx->devices.size()));
  for (unsigned i = 0; i < ctx->devices.size(); ++i) l.set(i, ctx->devices[i]->index);
  if (cl_int e = c.Call(b); e != CL_SUCCESS) return Fail(err, e);
  SetErr(err, CL_SUCCESS);
  return ctx.release();
}

}  // namespace

cl_context CL_API_CALL CreateContext(const cl_context_properties* props, cl_uint n,
                                     const cl_device_id* devices, Notify notify, void* user,
                                     cl_int* err) {
  if (n == 0 || devices == nullptr) return Fail(err, CL_INVALID_VALUE);
  std::vector<cl_device_id> devs;
  for (cl_uint i = 0; i < n; ++i) {
    if (!Is(devices[i], Kind::kDevice) || !KnownDevice(devices[i])) {
      return Fail(err, CL_INVALID_DEVICE);
    }
    devs.push_back(devices[i]);
  }
  return MakeContext(props, std::move(devs), notify, user, err);
}

cl_context CL_API_CALL CreateContextFromType(const cl_context_properties* props,
                                             cl_device_type type, Notify notify, void* user,
                                             cl_int* err) {
  cl_uint n = 0;
  if (cl_int e = GetDeviceIDs(Platform(), type, 0, nullptr, &n); e != CL_SUCCESS) {
    return Fail(err, e);
  }
  std::vector<cl_device_id> devs(n);
  GetDeviceIDs(Platform(), type, n, devs.data(), nullptr);
  return MakeContext(props, std::move(devs), notify, user, err);
}

cl_int CL_API_CALL RetainContext(cl_context c) { return Retain(c); }
cl_int CL_API_CALL ReleaseContext(cl_context c) { return Release(c); }

void Destroy(_cl_context* c) {
  // Its small buffers' arena slots still held back: given back when no command is in flight
  // (a released queue's commands have completed by now: SettleWhenDone holds the context).
  if (Connection* conn = TryConn(); conn != nullptr) ReuseArenaSlots(c, *conn);
  // The context is gone for the ICD (its handle is rejected from now on): its destructor
  // callbacks run now, the last registered first (OpenCL 3.0, 4.4).
  for (auto it = c->destructors.rbegin(); it != c->destructors.rend(); ++it) {
    it->first(c, it->second);
  }
  delete c;
}

cl_int CL_API_CALL SetContextDestructorCallback(cl_context c,
                                                void(CL_CALLBACK* fn)(cl_context, void*),
                                                void* user) {
  if (!Valid(c)) return CL_INVALID_CONTEXT;
  if (fn == nullptr) return CL_INVALID_VALUE;
  std::lock_guard<std::mutex> lock(c->mu);
  c->destructors.emplace_back(fn, user);
  return CL_SUCCESS;
}

cl_int CL_API_CALL GetContextInfo(cl_context c, cl_context_info param, size_t size, void* value,
                                  size_t* size_ret) {
  if (!Valid(c)) return CL_INVALID_CONTEXT;
  switch (param) {
    case CL_CONTEXT_REFERENCE_COUNT: return Scalar(RefCount(c), size, value, size_ret);
    case CL_CONTEXT_NUM_DEVICES:
      return Scalar(static_cast<cl_uint>(c->devices.size()), size, value, size_ret);
    case CL_CONTEXT_DEVICES: return Array(c->devices, size, value, size_ret);
    case CL_CONTEXT_PROPERTIES: return Array(c->properties, size, value, size_ret);
    default: return CL_INVALID_VALUE;
  }
}

}  // namespace gmux::icd
