// The OpenCL API as libgmux-icd implements it: every call the dispatch table routes here is
// either answered from the client's own objects or forwarded to gmuxd. Enqueues and object
// releases are sent without waiting; only blocking calls and queries wait for a reply.
#include <unistd.h>

#include <capnp/message.h>
#include <kj/exception.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <new>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <unordered_set>
#include <vector>

#include "icd/api.h"
#include "icd/connection.h"
#include "icd/includes.h"
#include "icd/objects.h"
#include "proto/image_layout.h"

namespace gmux::icd {

namespace wire = proto::wire;

namespace {

_cl_platform_id g_platform;
std::mutex g_mu;  // guards g_devices, g_device_info, g_mems, g_samplers
// Never destroyed: the devices live as long as the process (an application may still call in
// from its own exit handlers), and they stay reachable for leak checkers.
std::vector<_cl_device_id*>& g_devices = *new std::vector<_cl_device_id*>();
bool g_devices_ready = false;
std::map<std::pair<uint32_t, cl_uint>, std::vector<uint8_t>> g_device_info;
std::unordered_set<const void*> g_mems;  // live mem handles, to recognise buffer kernel args
std::unordered_set<const void*> g_samplers;  // live sampler handles, for sampler kernel args

template <typename T>
bool Is(T* o, Kind k) {
  return o != nullptr && o->kind == k;
}

void SetErr(cl_int* errcode_ret, cl_int e) {
  if (errcode_ret != nullptr) *errcode_ret = e;
}

cl_int CopyOut(const void* src, size_t n, size_t size, void* value, size_t* size_ret) {
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

cl_int String(const std::string& s, size_t size, void* value, size_t* size_ret) {
  return CopyOut(s.c_str(), s.size() + 1, size, value, size_ret);
}

Connection* Conn() { return Connection::Get(); }

// Asks the daemon for an info value.
cl_int RemoteInfo(wire::ObjectKind kind, uint64_t id, cl_uint param, std::vector<uint8_t>& out,
                  const _cl_device_id* device = nullptr, cl_uint arg_index = 0) {
  Connection* c = Conn();
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
  if (reply) {
    auto r = reply->root<wire::Reply>();
    if (r.isInfo()) {
      auto info = r.getInfo();  // read once: each read counts against the traversal limit
      out.assign(info.begin(), info.end());
    }
  }
  return CL_SUCCESS;
}

cl_int RemoteInfoOut(wire::ObjectKind kind, uint64_t id, cl_uint param, size_t size, void* value,
                     size_t* size_ret, const _cl_device_id* device = nullptr,
                     cl_uint arg_index = 0) {
  std::vector<uint8_t> v;
  cl_int err = RemoteInfo(kind, id, param, v, device, arg_index);
  if (err != CL_SUCCESS) return err;
  return CopyOut(v.data(), v.size(), size, value, size_ret);
}

void PostRelease(wire::ObjectKind kind, uint64_t id) {
  Connection* c = Conn();
  if (c == nullptr) return;
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<wire::Request>().initRelease();
  r.setKind(kind);
  r.setId(id);
  (void)c->Post(b);
}

void EnsureDevices() {
  Connection* c = Conn();
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_devices_ready || c == nullptr) return;
  for (const auto& d : c->devices()) {
    auto* dev = new _cl_device_id();
    dev->index = d.index;
    dev->type = d.type;
    dev->id = d.index;
    g_devices.push_back(dev);
  }
  g_devices_ready = true;
}

bool KnownDevice(cl_device_id d) {
  std::lock_guard<std::mutex> lock(g_mu);
  return std::find(g_devices.begin(), g_devices.end(), d) != g_devices.end();
}

}  // namespace

// ---- platform and devices ----

cl_int CL_API_CALL GetPlatformIDs(cl_uint num_entries, cl_platform_id* platforms,
                                  cl_uint* num_platforms) {
  if ((num_entries == 0 && platforms != nullptr) || (platforms == nullptr && num_platforms == nullptr)) {
    return CL_INVALID_VALUE;
  }
  if (platforms != nullptr) platforms[0] = &g_platform;
  if (num_platforms != nullptr) *num_platforms = 1;
  return CL_SUCCESS;
}

cl_int CL_API_CALL GetPlatformInfo(cl_platform_id platform, cl_platform_info param, size_t size,
                                   void* value, size_t* size_ret) {
  if (platform != nullptr && platform != &g_platform) return CL_INVALID_PLATFORM;
  switch (param) {
    case CL_PLATFORM_PROFILE: return String("FULL_PROFILE", size, value, size_ret);
    case CL_PLATFORM_VERSION: return String("OpenCL 1.2 gmux 0.1", size, value, size_ret);
    case CL_PLATFORM_NAME: return String("gmux", size, value, size_ret);
    case CL_PLATFORM_VENDOR: return String("gmux", size, value, size_ret);
    case CL_PLATFORM_EXTENSIONS: return String("cl_khr_icd", size, value, size_ret);
    case CL_PLATFORM_ICD_SUFFIX_KHR: return String("gmux", size, value, size_ret);
    default: return CL_INVALID_VALUE;
  }
}

cl_int CL_API_CALL GetDeviceIDs(cl_platform_id platform, cl_device_type type, cl_uint num_entries,
                                cl_device_id* devices, cl_uint* num_devices) {
  if (platform != nullptr && platform != &g_platform) return CL_INVALID_PLATFORM;
  if ((num_entries == 0 && devices != nullptr) || (devices == nullptr && num_devices == nullptr)) {
    return CL_INVALID_VALUE;
  }
  EnsureDevices();
  std::vector<cl_device_id> match;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    for (auto* d : g_devices) {
      bool ok = type == CL_DEVICE_TYPE_ALL || (d->type & type) != 0 ||
                (type == CL_DEVICE_TYPE_DEFAULT && d == g_devices.front());
      if (ok) match.push_back(d);
    }
  }
  if (match.empty()) return CL_DEVICE_NOT_FOUND;
  if (devices != nullptr) {
    for (cl_uint i = 0; i < num_entries && i < match.size(); ++i) devices[i] = match[i];
  }
  if (num_devices != nullptr) *num_devices = static_cast<cl_uint>(match.size());
  return CL_SUCCESS;
}

cl_int CL_API_CALL GetDeviceInfo(cl_device_id device, cl_device_info param, size_t size,
                                 void* value, size_t* size_ret) {
  if (!Is(device, Kind::kDevice)) return CL_INVALID_DEVICE;
  switch (param) {
    case CL_DEVICE_PLATFORM: return Scalar<cl_platform_id>(&g_platform, size, value, size_ret);
    case CL_DEVICE_PARENT_DEVICE: return Scalar<cl_device_id>(nullptr, size, value, size_ret);
    case CL_DEVICE_REFERENCE_COUNT: return Scalar<cl_uint>(1, size, value, size_ret);
    default: break;
  }
  std::vector<uint8_t> v;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = g_device_info.find({device->index, param});
    if (it != g_device_info.end()) v = it->second;
  }
  if (v.empty()) {
    cl_int err = RemoteInfo(wire::ObjectKind::DEVICE, device->index, param, v);
    if (err != CL_SUCCESS) return err;
    if (param == CL_DEVICE_EXECUTION_CAPABILITIES &&
        v.size() == sizeof(cl_device_exec_capabilities)) {
      // A native kernel is a function of the application's address space, which the worker
      // process cannot call: the device does not offer native kernels through gmux.
      cl_device_exec_capabilities caps;
      std::memcpy(&caps, v.data(), sizeof(caps));
      caps &= ~static_cast<cl_device_exec_capabilities>(CL_EXEC_NATIVE_KERNEL);
      std::memcpy(v.data(), &caps, sizeof(caps));
    }
    if (param == CL_DEVICE_VERSION && v.size() > 11) {
      // The ICD implements the OpenCL 1.2 API; say so, keeping the backend's own description.
      std::string s(reinterpret_cast<const char*>(v.data()));
      size_t sp = s.find(' ', 7);
      s = "OpenCL 1.2" + (sp == std::string::npos ? std::string() : s.substr(sp));
      v.assign(s.begin(), s.end());
      v.push_back(0);
    }
    std::lock_guard<std::mutex> lock(g_mu);
    g_device_info[{device->index, param}] = v;
  }
  return CopyOut(v.data(), v.size(), size, value, size_ret);
}

cl_int CL_API_CALL RetainDevice(cl_device_id d) { return Is(d, Kind::kDevice) ? CL_SUCCESS : CL_INVALID_DEVICE; }
cl_int CL_API_CALL ReleaseDevice(cl_device_id d) { return Is(d, Kind::kDevice) ? CL_SUCCESS : CL_INVALID_DEVICE; }

// ---- contexts ----

namespace {

cl_context MakeContext(const cl_context_properties* props, std::vector<cl_device_id> devs,
                       cl_int* err) {
  std::vector<cl_context_properties> kept;
  if (props != nullptr) {
    for (const cl_context_properties* p = props; *p != 0; p += 2) {
      if (p[0] == CL_CONTEXT_PLATFORM) {
        if (reinterpret_cast<cl_platform_id>(p[1]) != &g_platform) {
          SetErr(err, CL_INVALID_PLATFORM);
          return nullptr;
        }
      } else if (p[0] != CL_CONTEXT_INTEROP_USER_SYNC) {
        SetErr(err, CL_INVALID_PROPERTY);
        return nullptr;
      }
      kept.push_back(p[0]);
      kept.push_back(p[1]);
    }
    kept.push_back(0);
  }
  Connection* c = Conn();
  if (c == nullptr) {
    SetErr(err, CL_DEVICE_NOT_AVAILABLE);
    return nullptr;
  }
  auto* ctx = new _cl_context();
  ctx->id = c->NextId();
  ctx->devices = std::move(devs);
  ctx->properties = std::move(kept);
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<wire::Request>().initCreateContext();
  r.setId(ctx->id);
  auto l = r.initDevices(static_cast<unsigned>(ctx->devices.size()));
  for (unsigned i = 0; i < ctx->devices.size(); ++i) l.set(i, ctx->devices[i]->index);
  cl_int e = c->Call(b);
  if (e != CL_SUCCESS) {
    delete ctx;
    SetErr(err, e);
    return nullptr;
  }
  SetErr(err, CL_SUCCESS);
  return ctx;
}

}  // namespace

cl_context CL_API_CALL CreateContext(const cl_context_properties* props, cl_uint n,
                                     const cl_device_id* devices,
                                     void(CL_CALLBACK*)(const char*, const void*, size_t, void*),
                                     void*, cl_int* err) {
  if (n == 0 || devices == nullptr) {
    SetErr(err, CL_INVALID_VALUE);
    return nullptr;
  }
  std::vector<cl_device_id> devs;
  for (cl_uint i = 0; i < n; ++i) {
    if (!Is(devices[i], Kind::kDevice) || !KnownDevice(devices[i])) {
      SetErr(err, CL_INVALID_DEVICE);
      return nullptr;
    }
    devs.push_back(devices[i]);
  }
  return MakeContext(props, std::move(devs), err);
}

cl_context CL_API_CALL CreateContextFromType(const cl_context_properties* props,
                                             cl_device_type type,
                                             void(CL_CALLBACK*)(const char*, const void*, size_t, void*),
                                             void*, cl_int* err) {
  cl_uint n = 0;
  cl_int e = GetDeviceIDs(&g_platform, type, 0, nullptr, &n);
  if (e != CL_SUCCESS) {
    SetErr(err, e);
    return nullptr;
  }
  std::vector<cl_device_id> devs(n);
  GetDeviceIDs(&g_platform, type, n, devs.data(), nullptr);
  return MakeContext(props, std::move(devs), err);
}

cl_int CL_API_CALL RetainContext(cl_context c) {
  if (!Is(c, Kind::kContext)) return CL_INVALID_CONTEXT;
  c->refs.fetch_add(1);
  return CL_SUCCESS;
}

cl_int CL_API_CALL ReleaseContext(cl_context c) {
  if (!Is(c, Kind::kContext)) return CL_INVALID_CONTEXT;
  if (c->refs.fetch_sub(1) == 1) {
    PostRelease(wire::ObjectKind::CONTEXT, c->id);
    c->kind = Kind::kDead;
    delete c;
  }
  return CL_SUCCESS;
}

cl_int CL_API_CALL GetContextInfo(cl_context c, cl_context_info param, size_t size, void* value,
                                  size_t* size_ret) {
  if (!Is(c, Kind::kContext)) return CL_INVALID_CONTEXT;
  switch (param) {
    case CL_CONTEXT_REFERENCE_COUNT: return Scalar<cl_uint>(static_cast<cl_uint>(c->refs.load()), size, value, size_ret);
    case CL_CONTEXT_NUM_DEVICES: return Scalar<cl_uint>(static_cast<cl_uint>(c->devices.size()), size, value, size_ret);
    case CL_CONTEXT_DEVICES:
      return CopyOut(c->devices.data(), c->devices.size() * sizeof(cl_device_id), size, value, size_ret);
    case CL_CONTEXT_PROPERTIES:
      return CopyOut(c->properties.data(), c->properties.size() * sizeof(cl_context_properties), size,
                     value, size_ret);
    default: return CL_INVALID_VALUE;
  }
}

// ---- command queues ----

cl_command_queue CL_API_CALL CreateCommandQueue(cl_context ctx, cl_device_id dev,
                                                cl_command_queue_properties props, cl_int* err) {
  if (!Is(ctx, Kind::kContext)) {
    SetErr(err, CL_INVALID_CONTEXT);
    return nullptr;
  }
  if (!Is(dev, Kind::kDevice) ||
      std::find(ctx->devices.begin(), ctx->devices.end(), dev) == ctx->devices.end()) {
    SetErr(err, CL_INVALID_DEVICE);
    return nullptr;
  }
  if (props & ~static_cast<cl_command_queue_properties>(CL_QUEUE_PROFILING_ENABLE |
                                                        CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE)) {
    SetErr(err, CL_INVALID_VALUE);
    return nullptr;
  }
  Connection* c = Conn();
  auto* q = new _cl_command_queue();
  q->id = c->NextId();
  q->context = ctx;
  q->device = dev;
  q->properties = props;
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<wire::Request>().initCreateQueue();
  r.setId(q->id);
  r.setContext(ctx->id);
  r.setDevice(dev->index);
  r.setProperties(props);
  cl_int e = c->Call(b);
  if (e != CL_SUCCESS) {
    delete q;
    SetErr(err, e);
    return nullptr;
  }
  RetainContext(ctx);
  SetErr(err, CL_SUCCESS);
  return q;
}

cl_command_queue CL_API_CALL CreateCommandQueueWithProperties(cl_context ctx, cl_device_id dev,
                                                              const cl_queue_properties* props,
                                                              cl_int* err) {
  cl_command_queue_properties p = 0;
  if (props != nullptr) {
    for (const cl_queue_properties* it = props; *it != 0; it += 2) {
      if (it[0] != CL_QUEUE_PROPERTIES) {
        SetErr(err, CL_INVALID_VALUE);
        return nullptr;
      }
      p = static_cast<cl_command_queue_properties>(it[1]);
    }
  }
  return CreateCommandQueue(ctx, dev, p, err);
}

cl_int CL_API_CALL RetainCommandQueue(cl_command_queue q) {
  if (!Is(q, Kind::kQueue)) return CL_INVALID_COMMAND_QUEUE;
  q->refs.fetch_add(1);
  return CL_SUCCESS;
}

cl_int CL_API_CALL Finish(cl_command_queue q);

cl_int CL_API_CALL ReleaseCommandQueue(cl_command_queue q) {
  if (!Is(q, Kind::kQueue)) return CL_INVALID_COMMAND_QUEUE;
  if (q->refs.fetch_sub(1) == 1) {
    // Releasing a queue implies a flush; its commands still run on the daemon.
    PostRelease(wire::ObjectKind::QUEUE, q->id);
    cl_context ctx = q->context;
    q->kind = Kind::kDead;
    delete q;
    ReleaseContext(ctx);
  }
  return CL_SUCCESS;
}

cl_int CL_API_CALL GetCommandQueueInfo(cl_command_queue q, cl_command_queue_info param, size_t size,
                                       void* value, size_t* size_ret) {
  if (!Is(q, Kind::kQueue)) return CL_INVALID_COMMAND_QUEUE;
  switch (param) {
    case CL_QUEUE_CONTEXT: return Scalar(q->context, size, value, size_ret);
    case CL_QUEUE_DEVICE: return Scalar(q->device, size, value, size_ret);
    case CL_QUEUE_REFERENCE_COUNT: return Scalar<cl_uint>(static_cast<cl_uint>(q->refs.load()), size, value, size_ret);
    case CL_QUEUE_PROPERTIES: return Scalar(q->properties, size, value, size_ret);
    default: return CL_INVALID_VALUE;
  }
}

cl_int CL_API_CALL Flush(cl_command_queue q) {
  if (!Is(q, Kind::kQueue)) return CL_INVALID_COMMAND_QUEUE;
  return Conn()->Flush();
}

cl_int CL_API_CALL Finish(cl_command_queue q) {
  if (!Is(q, Kind::kQueue)) return CL_INVALID_COMMAND_QUEUE;
  Connection* c = Conn();
  capnp::MallocMessageBuilder b;
  b.initRoot<wire::Request>().setFinish(q->id);
  cl_int e = c->Call(b);
  cl_int async = c->TakeAsyncError();
  return e != CL_SUCCESS ? e : async;
}

// ---- memory objects ----

namespace {

cl_mem NewMem(cl_context ctx, cl_mem_flags flags, size_t size, void* host_ptr) {
  auto* m = new _cl_mem();
  m->id = Conn()->NextId();
  m->context = ctx;
  m->flags = flags;
  m->size = size;
  m->host_ptr = host_ptr;
  std::lock_guard<std::mutex> lock(g_mu);
  g_mems.insert(m);
  return m;
}

bool IsMem(const void* p) {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_mems.count(p) != 0;
}

}  // namespace

cl_mem CL_API_CALL CreateBuffer(cl_context ctx, cl_mem_flags flags, size_t size, void* host_ptr,
                                cl_int* err) {
  if (!Is(ctx, Kind::kContext)) {
    SetErr(err, CL_INVALID_CONTEXT);
    return nullptr;
  }
  bool needs_ptr = (flags & (CL_MEM_USE_HOST_PTR | CL_MEM_COPY_HOST_PTR)) != 0;
  if (size == 0 || needs_ptr != (host_ptr != nullptr) ||
      ((flags & CL_MEM_USE_HOST_PTR) && (flags & (CL_MEM_COPY_HOST_PTR | CL_MEM_ALLOC_HOST_PTR)))) {
    SetErr(err, size == 0 ? CL_INVALID_BUFFER_SIZE : CL_INVALID_HOST_PTR);
    return nullptr;
  }
  Connection* c = Conn();
  uint64_t token = 0;
  ShmBuffer held;
  if (needs_ptr) {
    token = c->SendBulk(host_ptr, size, &held);
    if (token == 0) {
      SetErr(err, CL_OUT_OF_RESOURCES);
      return nullptr;
    }
  }
  cl_mem m = NewMem(ctx, flags, size, (flags & CL_MEM_USE_HOST_PTR) ? host_ptr : nullptr);
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<wire::Request>().initCreateBuffer();
  r.setId(m->id);
  r.setContext(ctx->id);
  r.setFlags(flags);
  r.setSize(size);
  r.setInitialData(token);
  // A round trip: allocation failures (CL_INVALID_BUFFER_SIZE, out of memory) are reported here.
  // The daemon has copied the initial data once it answers.
  cl_int e = c->Call(b);
  c->ReleaseShm(held);
  if (e != CL_SUCCESS) {
    {
      std::lock_guard<std::mutex> lock(g_mu);
      g_mems.erase(m);
    }
    delete m;
    SetErr(err, e);
    return nullptr;
  }
  RetainContext(ctx);
  SetErr(err, CL_SUCCESS);
  return m;
}

cl_mem CL_API_CALL CreateSubBuffer(cl_mem parent, cl_mem_flags flags, cl_buffer_create_type type,
                                   const void* info, cl_int* err) {
  if (!Is(parent, Kind::kMem) || parent->parent != nullptr) {
    SetErr(err, CL_INVALID_MEM_OBJECT);
    return nullptr;
  }
  if (type != CL_BUFFER_CREATE_TYPE_REGION || info == nullptr) {
    SetErr(err, CL_INVALID_VALUE);
    return nullptr;
  }
  const auto* region = static_cast<const cl_buffer_region*>(info);
  if (region->size == 0) {
    SetErr(err, CL_INVALID_BUFFER_SIZE);
    return nullptr;
  }
  if (region->origin > parent->size || region->size > parent->size - region->origin) {
    SetErr(err, CL_INVALID_VALUE);
    return nullptr;
  }
  constexpr cl_mem_flags kAccess = CL_MEM_READ_WRITE | CL_MEM_READ_ONLY | CL_MEM_WRITE_ONLY;
  constexpr cl_mem_flags kHostAccess =
      CL_MEM_HOST_WRITE_ONLY | CL_MEM_HOST_READ_ONLY | CL_MEM_HOST_NO_ACCESS;
  constexpr cl_mem_flags kHostPtr =
      CL_MEM_USE_HOST_PTR | CL_MEM_ALLOC_HOST_PTR | CL_MEM_COPY_HOST_PTR;
  if (flags & kHostPtr) {
    SetErr(err, CL_INVALID_VALUE);
    return nullptr;
  }
  // Host access the parent denies cannot be given back to a sub-buffer (OpenCL 1.2, 5.2.1).
  const bool host_conflict =
      ((parent->flags & CL_MEM_HOST_WRITE_ONLY) != 0 && (flags & CL_MEM_HOST_READ_ONLY) != 0) ||
      ((parent->flags & CL_MEM_HOST_READ_ONLY) != 0 && (flags & CL_MEM_HOST_WRITE_ONLY) != 0) ||
      ((parent->flags & CL_MEM_HOST_NO_ACCESS) != 0 &&
       (flags & (CL_MEM_HOST_READ_ONLY | CL_MEM_HOST_WRITE_ONLY)) != 0);
  if (host_conflict) {
    SetErr(err, CL_INVALID_VALUE);
    return nullptr;
  }
  // What the sub-buffer reports (CL_MEM_FLAGS): the flags given, with the access and host
  // access flags not given and the host pointer flags inherited from the parent, as OpenCL
  // requires. The backend gets the flags given, with the parent's access flags when none are.
  cl_mem_flags reported = flags | (parent->flags & kHostPtr);
  if ((flags & kAccess) == 0) reported |= parent->flags & kAccess;
  if ((flags & kHostAccess) == 0) reported |= parent->flags & kHostAccess;
  if ((flags & kAccess) == 0) flags |= parent->flags & kAccess;
  Connection* c = Conn();
  cl_mem m = NewMem(parent->context, reported, region->size,
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
  cl_int e = c->Call(b);
  if (e != CL_SUCCESS) {
    {
      std::lock_guard<std::mutex> lock(g_mu);
      g_mems.erase(m);
    }
    delete m;
    SetErr(err, e);
    return nullptr;
  }
  parent->refs.fetch_add(1);
  RetainContext(m->context);
  SetErr(err, CL_SUCCESS);
  return m;
}

cl_int CL_API_CALL RetainMemObject(cl_mem m) {
  if (!Is(m, Kind::kMem)) return CL_INVALID_MEM_OBJECT;
  m->refs.fetch_add(1);
  return CL_SUCCESS;
}

cl_int CL_API_CALL ReleaseMemObject(cl_mem m) {
  if (!Is(m, Kind::kMem)) return CL_INVALID_MEM_OBJECT;
  if (m->refs.fetch_sub(1) == 1) {
    PostRelease(wire::ObjectKind::MEM, m->id);
    {
      std::lock_guard<std::mutex> lock(g_mu);
      g_mems.erase(m);
    }
    cl_mem parent = m->parent;
    cl_context ctx = m->context;
    for (auto& map : m->maps) {
      if (map.owned) std::free(map.ptr);
    }
    m->kind = Kind::kDead;
    // The object is gone for the ICD (its handle is rejected from now on): the destructor
    // callbacks run now, the last registered first (OpenCL 1.2 section 5.4.1).
    for (auto it = m->destructors.rbegin(); it != m->destructors.rend(); ++it) {
      it->first(m, it->second);
    }
    delete m;
    if (parent != nullptr) ReleaseMemObject(parent);
    ReleaseContext(ctx);
  }
  return CL_SUCCESS;
}

cl_int CL_API_CALL SetMemObjectDestructorCallback(cl_mem m,
                                                  void(CL_CALLBACK* fn)(cl_mem, void*),
                                                  void* user) {
  if (!Is(m, Kind::kMem)) return CL_INVALID_MEM_OBJECT;
  if (fn == nullptr) return CL_INVALID_VALUE;
  std::lock_guard<std::mutex> lock(m->mu);
  m->destructors.emplace_back(fn, user);
  return CL_SUCCESS;
}

cl_int CL_API_CALL GetMemObjectInfo(cl_mem m, cl_mem_info param, size_t size, void* value,
                                    size_t* size_ret) {
  if (!Is(m, Kind::kMem)) return CL_INVALID_MEM_OBJECT;
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
    case CL_MEM_REFERENCE_COUNT: return Scalar<cl_uint>(static_cast<cl_uint>(m->refs.load()), size, value, size_ret);
    case CL_MEM_CONTEXT: return Scalar(m->context, size, value, size_ret);
    case CL_MEM_ASSOCIATED_MEMOBJECT: return Scalar(m->parent, size, value, size_ret);
    case CL_MEM_OFFSET: return Scalar(m->origin, size, value, size_ret);
    default: break;
  }
  return RemoteInfoOut(wire::ObjectKind::MEM, m->id, param, size, value, size_ret);
}

cl_int CL_API_CALL GetSupportedImageFormats(cl_context ctx, cl_mem_flags flags,
                                            cl_mem_object_type type, cl_uint num_entries,
                                            cl_image_format* formats, cl_uint* num) {
  if (!Is(ctx, Kind::kContext)) return CL_INVALID_CONTEXT;
  if (num_entries == 0 && formats != nullptr) return CL_INVALID_VALUE;
  Connection* c = Conn();
  if (c == nullptr) return CL_DEVICE_NOT_AVAILABLE;
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<wire::Request>().initImageFormats();
  r.setContext(ctx->id);
  r.setFlags(flags);
  r.setImageType(type);
  std::optional<proto::Message> reply;
  cl_int err = c->Call(b, &reply);
  if (err != CL_SUCCESS) return err;
  std::vector<cl_image_format> all;
  if (reply) {
    auto rep = reply->root<wire::Reply>();
    if (rep.isInfo()) {
      auto info = rep.getInfo();
      all.resize(info.size() / sizeof(cl_image_format));
      std::memcpy(all.data(), info.begin(), all.size() * sizeof(cl_image_format));
    }
  }
  if (formats != nullptr) {
    for (size_t i = 0; i < all.size() && i < num_entries; ++i) formats[i] = all[i];
  }
  if (num != nullptr) *num = static_cast<cl_uint>(all.size());
  return CL_SUCCESS;
}

cl_mem CL_API_CALL CreateImage(cl_context ctx, cl_mem_flags flags, const cl_image_format* format,
                               const cl_image_desc* desc, void* host_ptr, cl_int* err) {
  if (!Is(ctx, Kind::kContext)) {
    SetErr(err, CL_INVALID_CONTEXT);
    return nullptr;
  }
  if (format == nullptr) {
    SetErr(err, CL_INVALID_IMAGE_FORMAT_DESCRIPTOR);
    return nullptr;
  }
  if (desc == nullptr) {
    SetErr(err, CL_INVALID_IMAGE_DESCRIPTOR);
    return nullptr;
  }
  size_t element = proto::ImageElementBytes(format->image_channel_order,
                                            format->image_channel_data_type);
  if (element == 0) {
    SetErr(err, CL_INVALID_IMAGE_FORMAT_DESCRIPTOR);
    return nullptr;
  }
  bool needs_ptr = (flags & (CL_MEM_USE_HOST_PTR | CL_MEM_COPY_HOST_PTR)) != 0;
  if (needs_ptr != (host_ptr != nullptr)) {
    SetErr(err, CL_INVALID_HOST_PTR);
    return nullptr;
  }
  if (desc->buffer != nullptr && (!Is(desc->buffer, Kind::kMem) || desc->buffer->is_image())) {
    SetErr(err, CL_INVALID_IMAGE_DESCRIPTOR);
    return nullptr;
  }
  cl_image_desc d = *desc;
  size_t region[3];
  proto::ImageFullRegion(static_cast<uint32_t>(d.image_type), d.image_width, d.image_height,
                         d.image_depth, d.image_array_size, region);
  uint64_t host_bytes = 0;
  if (needs_ptr) {
    if (!proto::ImageHostBytes(static_cast<uint32_t>(d.image_type), region, element,
                               d.image_row_pitch, d.image_slice_pitch, host_bytes)) {
      SetErr(err, CL_INVALID_IMAGE_SIZE);
      return nullptr;
    }
    // Keep the host layout with its defaults filled in (maps of USE_HOST_PTR images use it).
    if (d.image_row_pitch == 0) d.image_row_pitch = region[0] * element;
    if (d.image_slice_pitch == 0 && (d.image_type == CL_MEM_OBJECT_IMAGE3D ||
                                     d.image_type == CL_MEM_OBJECT_IMAGE2D_ARRAY)) {
      d.image_slice_pitch = d.image_row_pitch * d.image_height;
    } else if (d.image_slice_pitch == 0 && d.image_type == CL_MEM_OBJECT_IMAGE1D_ARRAY) {
      d.image_slice_pitch = d.image_row_pitch;
    }
  } else if (d.image_row_pitch != 0 || d.image_slice_pitch != 0) {
    SetErr(err, CL_INVALID_IMAGE_DESCRIPTOR);
    return nullptr;
  }
  Connection* c = Conn();
  if (c == nullptr) {
    SetErr(err, CL_DEVICE_NOT_AVAILABLE);
    return nullptr;
  }
  uint64_t token = 0;
  ShmBuffer held;
  if (needs_ptr) {
    token = c->SendBulk(host_ptr, host_bytes, &held);
    if (token == 0) {
      SetErr(err, CL_OUT_OF_RESOURCES);
      return nullptr;
    }
  }
  cl_mem m = NewMem(ctx, flags, 0, (flags & CL_MEM_USE_HOST_PTR) ? host_ptr : nullptr);
  m->type = d.image_type;
  m->format = *format;
  m->desc = d;
  m->element_bytes = element;
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<wire::Request>().initCreateImage();
  r.setId(m->id);
  r.setContext(ctx->id);
  r.setFlags(flags);
  r.setChannelOrder(format->image_channel_order);
  r.setChannelDataType(format->image_channel_data_type);
  auto wd = r.initDesc();
  wd.setType(d.image_type);
  wd.setWidth(d.image_width);
  wd.setHeight(d.image_height);
  wd.setDepth(d.image_depth);
  wd.setArraySize(d.image_array_size);
  wd.setRowPitch(needs_ptr ? desc->image_row_pitch : 0);
  wd.setSlicePitch(needs_ptr ? desc->image_slice_pitch : 0);
  wd.setBuffer(desc->buffer != nullptr ? desc->buffer->id : 0);
  r.setInitialData(token);
  cl_int e = c->Call(b);
  c->ReleaseShm(held);
  if (e != CL_SUCCESS) {
    {
      std::lock_guard<std::mutex> lock(g_mu);
      g_mems.erase(m);
    }
    delete m;
    SetErr(err, e);
    return nullptr;
  }
  if (desc->buffer != nullptr) {
    m->parent = desc->buffer;  // kept alive as long as the image, like a sub-buffer's parent
    desc->buffer->refs.fetch_add(1);
  }
  RetainContext(ctx);
  SetErr(err, CL_SUCCESS);
  return m;
}

cl_mem CL_API_CALL CreateImage2D(cl_context ctx, cl_mem_flags flags, const cl_image_format* format,
                                 size_t width, size_t height, size_t row_pitch, void* host_ptr,
                                 cl_int* err) {
  cl_image_desc d{};
  d.image_type = CL_MEM_OBJECT_IMAGE2D;
  d.image_width = width;
  d.image_height = height;
  d.image_row_pitch = row_pitch;
  return CreateImage(ctx, flags, format, &d, host_ptr, err);
}

cl_mem CL_API_CALL CreateImage3D(cl_context ctx, cl_mem_flags flags, const cl_image_format* format,
                                 size_t width, size_t height, size_t depth, size_t row_pitch,
                                 size_t slice_pitch, void* host_ptr, cl_int* err) {
  cl_image_desc d{};
  d.image_type = CL_MEM_OBJECT_IMAGE3D;
  d.image_width = width;
  d.image_height = height;
  d.image_depth = depth;
  d.image_row_pitch = row_pitch;
  d.image_slice_pitch = slice_pitch;
  return CreateImage(ctx, flags, format, &d, host_ptr, err);
}

cl_int CL_API_CALL GetImageInfo(cl_mem m, cl_image_info param, size_t size, void* value,
                                size_t* size_ret) {
  if (!Is(m, Kind::kMem) || !m->is_image()) return CL_INVALID_MEM_OBJECT;
  switch (param) {
    case CL_IMAGE_FORMAT: return Scalar(m->format, size, value, size_ret);
    case CL_IMAGE_ELEMENT_SIZE: return Scalar(m->element_bytes, size, value, size_ret);
    case CL_IMAGE_BUFFER:
      return Scalar<cl_mem>(m->desc.buffer != nullptr ? m->parent : nullptr, size, value, size_ret);
    default:
      return RemoteInfoOut(wire::ObjectKind::MEM, m->id, param, size, value, size_ret);
  }
}

// ---- samplers ----

cl_sampler CL_API_CALL CreateSampler(cl_context ctx, cl_bool normalized, cl_addressing_mode addressing,
                                     cl_filter_mode filter, cl_int* err) {
  if (!Is(ctx, Kind::kContext)) {
    SetErr(err, CL_INVALID_CONTEXT);
    return nullptr;
  }
  Connection* c = Conn();
  if (c == nullptr) {
    SetErr(err, CL_DEVICE_NOT_AVAILABLE);
    return nullptr;
  }
  auto* smp = new _cl_sampler();
  smp->id = c->NextId();
  smp->context = ctx;
  smp->normalized_coords = normalized;
  smp->addressing = addressing;
  smp->filter = filter;
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<wire::Request>().initCreateSampler();
  r.setId(smp->id);
  r.setContext(ctx->id);
  r.setNormalizedCoords(normalized != CL_FALSE);
  r.setAddressingMode(addressing);
  r.setFilterMode(filter);
  // A round trip: invalid modes (and devices without images) are reported here.
  cl_int e = c->Call(b);
  if (e != CL_SUCCESS) {
    delete smp;
    SetErr(err, e);
    return nullptr;
  }
  {
    std::lock_guard<std::mutex> lock(g_mu);
    g_samplers.insert(smp);
  }
  RetainContext(ctx);
  SetErr(err, CL_SUCCESS);
  return smp;
}

cl_int CL_API_CALL RetainSampler(cl_sampler s) {
  if (!Is(s, Kind::kSampler)) return CL_INVALID_SAMPLER;
  s->refs.fetch_add(1);
  return CL_SUCCESS;
}

cl_int CL_API_CALL ReleaseSampler(cl_sampler s) {
  if (!Is(s, Kind::kSampler)) return CL_INVALID_SAMPLER;
  if (s->refs.fetch_sub(1) == 1) {
    PostRelease(wire::ObjectKind::SAMPLER, s->id);
    {
      std::lock_guard<std::mutex> lock(g_mu);
      g_samplers.erase(s);
    }
    cl_context ctx = s->context;
    s->kind = Kind::kDead;
    delete s;
    ReleaseContext(ctx);
  }
  return CL_SUCCESS;
}

cl_int CL_API_CALL GetSamplerInfo(cl_sampler s, cl_sampler_info param, size_t size, void* value,
                                  size_t* size_ret) {
  if (!Is(s, Kind::kSampler)) return CL_INVALID_SAMPLER;
  switch (param) {
    case CL_SAMPLER_REFERENCE_COUNT:
      return Scalar<cl_uint>(static_cast<cl_uint>(s->refs.load()), size, value, size_ret);
    case CL_SAMPLER_CONTEXT: return Scalar(s->context, size, value, size_ret);
    case CL_SAMPLER_NORMALIZED_COORDS: return Scalar(s->normalized_coords, size, value, size_ret);
    case CL_SAMPLER_ADDRESSING_MODE: return Scalar(s->addressing, size, value, size_ret);
    case CL_SAMPLER_FILTER_MODE: return Scalar(s->filter, size, value, size_ret);
    default: return CL_INVALID_VALUE;
  }
}

namespace {

bool IsSampler(const void* p) {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_samplers.count(p) != 0;
}

}  // namespace

// ---- events ----

namespace {

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

}  // namespace

cl_int CL_API_CALL RetainEvent(cl_event e) {
  if (!Is(e, Kind::kEvent)) return CL_INVALID_EVENT;
  e->refs.fetch_add(1);
  return CL_SUCCESS;
}

cl_int CL_API_CALL ReleaseEvent(cl_event e) {
  if (!Is(e, Kind::kEvent)) return CL_INVALID_EVENT;
  if (e->refs.fetch_sub(1) == 1) {
    PostRelease(wire::ObjectKind::EVENT, e->id);
    cl_context ctx = e->context;
    cl_command_queue q = e->queue;
    e->kind = Kind::kDead;
    delete e;
    if (q != nullptr) ReleaseCommandQueue(q);
    ReleaseContext(ctx);
  }
  return CL_SUCCESS;
}

cl_int CL_API_CALL WaitForEvents(cl_uint n, const cl_event* events) {
  if (n == 0 || events == nullptr) return CL_INVALID_VALUE;
  capnp::MallocMessageBuilder b;
  auto l = b.initRoot<wire::Request>().initWaitEvents(n);
  for (cl_uint i = 0; i < n; ++i) {
    if (!Is(events[i], Kind::kEvent)) return CL_INVALID_EVENT;
    if (events[i]->context != events[0]->context) return CL_INVALID_CONTEXT;
    l.set(i, events[i]->id);
  }
  return Conn()->Call(b);
}

cl_int CL_API_CALL GetEventInfo(cl_event e, cl_event_info param, size_t size, void* value,
                                size_t* size_ret) {
  if (!Is(e, Kind::kEvent)) return CL_INVALID_EVENT;
  switch (param) {
    case CL_EVENT_COMMAND_QUEUE: return Scalar(e->queue, size, value, size_ret);
    case CL_EVENT_CONTEXT: return Scalar(e->context, size, value, size_ret);
    case CL_EVENT_COMMAND_TYPE: return Scalar(e->type, size, value, size_ret);
    case CL_EVENT_REFERENCE_COUNT: return Scalar<cl_uint>(static_cast<cl_uint>(e->refs.load()), size, value, size_ret);
    case CL_EVENT_COMMAND_EXECUTION_STATUS:
      return RemoteInfoOut(wire::ObjectKind::EVENT, e->id, param, size, value, size_ret);
    default: return CL_INVALID_VALUE;
  }
}

cl_int CL_API_CALL GetEventProfilingInfo(cl_event e, cl_profiling_info param, size_t size,
                                         void* value, size_t* size_ret) {
  if (!Is(e, Kind::kEvent)) return CL_INVALID_EVENT;
  if (e->queue == nullptr || (e->queue->properties & CL_QUEUE_PROFILING_ENABLE) == 0) {
    return CL_PROFILING_INFO_NOT_AVAILABLE;
  }
  return RemoteInfoOut(wire::ObjectKind::EVENT, e->id, param, size, value, size_ret);
}

cl_int CL_API_CALL SetEventCallback(cl_event e, cl_int type,
                                    void(CL_CALLBACK* fn)(cl_event, cl_int, void*), void* user) {
  if (!Is(e, Kind::kEvent)) return CL_INVALID_EVENT;
  if (fn == nullptr || (type != CL_COMPLETE && type != CL_SUBMITTED && type != CL_RUNNING)) {
    return CL_INVALID_VALUE;
  }
  // Every callback fires when the command completes (reaching COMPLETE implies the earlier
  // states); the event stays retained until then.
  RetainEvent(e);
  capnp::MallocMessageBuilder b;
  b.initRoot<wire::Request>().initWaitEvents(1).set(0, e->id);
  Conn()->Begin(b, nullptr, 0, [e, fn, user, type](cl_int status) {
    fn(e, status == CL_SUCCESS ? type : status, user);
    ReleaseEvent(e);
  });
  return CL_SUCCESS;
}

cl_event CL_API_CALL CreateUserEvent(cl_context ctx, cl_int* err) {
  if (!Is(ctx, Kind::kContext)) {
    SetErr(err, CL_INVALID_CONTEXT);
    return nullptr;
  }
  Connection* c = Conn();
  cl_event e = NewEvent(ctx, nullptr, CL_COMMAND_USER, c->NextId());
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<wire::Request>().initCreateUserEvent();
  r.setId(e->id);
  r.setContext(ctx->id);
  c->Post(b);
  SetErr(err, CL_SUCCESS);
  return e;
}

cl_int CL_API_CALL SetUserEventStatus(cl_event e, cl_int status) {
  if (!Is(e, Kind::kEvent) || e->type != CL_COMMAND_USER) return CL_INVALID_EVENT;
  if (status > CL_COMPLETE) return CL_INVALID_VALUE;
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<wire::Request>().initSetUserEventStatus();
  r.setId(e->id);
  r.setStatus(status);
  return Conn()->Call(b);
}

// ---- enqueue helpers ----

namespace {

// Builds the common part of an Enqueue; the caller fills the command and calls Submit.
class Enqueuer {
 public:
  Enqueuer(cl_command_queue q, cl_uint nwait, const cl_event* waits, cl_event* event_out,
           cl_command_type type)
      : q_(q), event_out_(event_out), type_(type) {
    if (!Is(q, Kind::kQueue)) {
      err_ = CL_INVALID_COMMAND_QUEUE;
      return;
    }
    if ((nwait == 0) != (waits == nullptr)) {
      err_ = CL_INVALID_EVENT_WAIT_LIST;
      return;
    }
    c_ = Conn();
    e_ = b_.initRoot<wire::Request>().initEnqueue();
    e_.setQueue(q->id);
    id_ = c_->NextId();
    e_.setEvent(id_);
    e_.setKeepEvent(event_out != nullptr);
    auto l = e_.initWaitList(nwait);
    for (cl_uint i = 0; i < nwait; ++i) {
      if (!Is(waits[i], Kind::kEvent) || waits[i]->context != q->context) {
        err_ = CL_INVALID_EVENT_WAIT_LIST;
        return;
      }
      l.set(i, waits[i]->id);
    }
  }

  cl_int err() const { return err_; }
  wire::Enqueue::Builder& cmd() { return e_; }
  Connection* conn() { return c_; }

  // Sends the command without waiting.
  cl_int Post() {
    cl_int e = c_->Post(b_);
    if (e == CL_SUCCESS) MakeEvent();
    return e;
  }
  // Sends the command with a seq whose reply (read data) lands in dst.
  uint64_t Begin(void* dst, size_t size, bool blocking, ShmBuffer shm = {},
                 bool keep_shm = false) {
    std::function<void(cl_int)> none;
    if (!blocking) none = [](cl_int) {};
    uint64_t seq = c_->Begin(b_, dst, size, std::move(none), shm, keep_shm);
    MakeEvent();
    return seq;
  }

  // Sends a command that consumes bulk data: with a shared buffer it asks for an answer (when
  // the command has run) and returns the buffer to the pool then; otherwise Post().
  cl_int PostReleasing(ShmBuffer held) {
    if (!held.valid()) return Post();
    Connection* c = c_;
    c_->Begin(b_, nullptr, 0, [c, held](cl_int) { c->ReleaseShm(held); });
    MakeEvent();
    return CL_SUCCESS;
  }

  // A plain read of `size` bytes into dst, through shared memory when that pays.
  uint64_t BeginRead(wire::ReadBuffer::Builder r, void* dst, size_t size, bool blocking) {
    if (c_->UseShm(size)) {
      ShmBuffer buf = c_->AcquireShm(size);
      if (buf.valid()) {
        r.setShm(true);
        return Begin(dst, size, blocking, buf);
      }
    }
    return Begin(dst, size, blocking);
  }

 private:
  void MakeEvent() {
    if (event_out_ != nullptr) *event_out_ = NewEvent(q_->context, q_, type_, id_);
  }
  cl_command_queue q_;
  cl_event* event_out_;
  cl_command_type type_;
  cl_int err_ = CL_SUCCESS;
  Connection* c_ = nullptr;
  capnp::MallocMessageBuilder b_;
  wire::Enqueue::Builder e_{nullptr};
  uint64_t id_ = 0;
};

cl_int CheckMem(cl_command_queue q, cl_mem m) {
  if (!Is(m, Kind::kMem)) return CL_INVALID_MEM_OBJECT;
  if (Is(q, Kind::kQueue) && m->context != q->context) return CL_INVALID_CONTEXT;
  return CL_SUCCESS;
}

// The host access an object was created with (CL_MEM_HOST_*, a sub-buffer's inherited from its
// parent): reading or writing it from the host otherwise is CL_INVALID_OPERATION (OpenCL 1.2,
// 5.2.2, 5.3.3, 5.4.2). Checked here, since the transfers are asynchronous and the backend
// object is created without these flags (the worker moves the data for the host).
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

// Bytes a host rectangle spans (the daemon re-checks everything).
size_t HostRectBytes(const size_t origin[3], const size_t region[3], size_t row, size_t slice) {
  if (row == 0) row = region[0];
  if (slice == 0) slice = region[1] * row;
  return (origin[2] + region[2] - 1) * slice + (origin[1] + region[1] - 1) * row + origin[0] +
         region[0];
}

}  // namespace

cl_int CL_API_CALL EnqueueWriteBuffer(cl_command_queue q, cl_mem m, cl_bool, size_t offset,
                                      size_t size, const void* ptr, cl_uint nwait,
                                      const cl_event* waits, cl_event* event) {
  if (cl_int e = CheckMem(q, m); e != CL_SUCCESS) return e;
  if (cl_int e = CheckHostAccess(m, false, true); e != CL_SUCCESS) return e;
  if (ptr == nullptr || size == 0 || offset > m->size || size > m->size - offset) return CL_INVALID_VALUE;
  Enqueuer enq(q, nwait, waits, event, CL_COMMAND_WRITE_BUFFER);
  if (enq.err() != CL_SUCCESS) return enq.err();
  // The data is copied out now, so a blocking write returns as soon as it is sent.
  ShmBuffer held;
  uint64_t token = enq.conn()->SendBulk(ptr, size, &held);
  if (token == 0) return CL_OUT_OF_RESOURCES;
  auto w = enq.cmd().initWriteBuffer();
  w.setMem(m->id);
  w.setOffset(offset);
  w.setSize(size);
  w.setBulk(token);
  return enq.PostReleasing(held);
}

cl_int CL_API_CALL EnqueueReadBuffer(cl_command_queue q, cl_mem m, cl_bool blocking, size_t offset,
                                     size_t size, void* ptr, cl_uint nwait, const cl_event* waits,
                                     cl_event* event) {
  if (cl_int e = CheckMem(q, m); e != CL_SUCCESS) return e;
  if (cl_int e = CheckHostAccess(m, true, false); e != CL_SUCCESS) return e;
  if (ptr == nullptr || size == 0 || offset > m->size || size > m->size - offset) return CL_INVALID_VALUE;
  Enqueuer enq(q, nwait, waits, event, CL_COMMAND_READ_BUFFER);
  if (enq.err() != CL_SUCCESS) return enq.err();
  auto r = enq.cmd().initReadBuffer();
  r.setMem(m->id);
  r.setOffset(offset);
  r.setSize(size);
  uint64_t seq = enq.BeginRead(r, ptr, size, blocking);
  return blocking ? enq.conn()->Wait(seq) : CL_SUCCESS;
}

cl_int CL_API_CALL EnqueueWriteBufferRect(cl_command_queue q, cl_mem m, cl_bool,
                                          const size_t* bo, const size_t* ho, const size_t* region,
                                          size_t brp, size_t bsp, size_t hrp, size_t hsp,
                                          const void* ptr, cl_uint nwait, const cl_event* waits,
                                          cl_event* event) {
  if (cl_int e = CheckMem(q, m); e != CL_SUCCESS) return e;
  if (cl_int e = CheckHostAccess(m, false, true); e != CL_SUCCESS) return e;
  if (ptr == nullptr || bo == nullptr || ho == nullptr || region == nullptr) return CL_INVALID_VALUE;
  if (region[0] == 0 || region[1] == 0 || region[2] == 0) return CL_INVALID_VALUE;
  Enqueuer enq(q, nwait, waits, event, CL_COMMAND_WRITE_BUFFER_RECT);
  if (enq.err() != CL_SUCCESS) return enq.err();
  size_t host_bytes = HostRectBytes(ho, region, hrp, hsp);
  ShmBuffer held;
  uint64_t token = enq.conn()->SendBulk(ptr, host_bytes, &held);
  if (token == 0) return CL_OUT_OF_RESOURCES;
  auto w = enq.cmd().initWriteBuffer();
  w.setMem(m->id);
  w.setBulk(token);
  w.setIsRect(true);
  auto r = w.initRect();
  SetTriple(r.initBufferOrigin(3), bo);
  SetTriple(r.initHostOrigin(3), ho);
  SetTriple(r.initRegion(3), region);
  r.setBufferRowPitch(brp);
  r.setBufferSlicePitch(bsp);
  r.setHostRowPitch(hrp);
  r.setHostSlicePitch(hsp);
  return enq.PostReleasing(held);
}

cl_int CL_API_CALL EnqueueReadBufferRect(cl_command_queue q, cl_mem m, cl_bool blocking,
                                         const size_t* bo, const size_t* ho, const size_t* region,
                                         size_t brp, size_t bsp, size_t hrp, size_t hsp, void* ptr,
                                         cl_uint nwait, const cl_event* waits, cl_event* event) {
  if (cl_int e = CheckMem(q, m); e != CL_SUCCESS) return e;
  if (cl_int e = CheckHostAccess(m, true, false); e != CL_SUCCESS) return e;
  if (ptr == nullptr || bo == nullptr || ho == nullptr || region == nullptr) return CL_INVALID_VALUE;
  if (region[0] == 0 || region[1] == 0 || region[2] == 0) return CL_INVALID_VALUE;
  // The daemon returns the whole host span [0, end): read it into a staging copy and merge only
  // the rectangle's rows, leaving the application's other bytes untouched. Such reads always
  // block (OpenCL allows a non-blocking call to block).
  size_t host_bytes = HostRectBytes(ho, region, hrp, hsp);
  Enqueuer enq(q, nwait, waits, event, CL_COMMAND_READ_BUFFER_RECT);
  if (enq.err() != CL_SUCCESS) return enq.err();
  auto r = enq.cmd().initReadBuffer();
  r.setMem(m->id);
  r.setIsRect(true);
  auto rc = r.initRect();
  SetTriple(rc.initBufferOrigin(3), bo);
  SetTriple(rc.initHostOrigin(3), ho);
  SetTriple(rc.initRegion(3), region);
  rc.setBufferRowPitch(brp);
  rc.setBufferSlicePitch(bsp);
  rc.setHostRowPitch(hrp);
  rc.setHostSlicePitch(hsp);
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
  cl_int e = enq.conn()->Wait(seq);
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
  if (src == dst && ((so <= dof && dof < so + size) || (dof <= so && so < dof + size))) {
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
  Enqueuer enq(q, nwait, waits, event, CL_COMMAND_COPY_BUFFER_RECT);
  if (enq.err() != CL_SUCCESS) return enq.err();
  auto c = enq.cmd().initCopyBuffer();
  c.setSrc(src->id);
  c.setDst(dst->id);
  c.setIsRect(true);
  auto r = c.initRect();
  SetTriple(r.initBufferOrigin(3), so);
  SetTriple(r.initHostOrigin(3), dof);
  SetTriple(r.initRegion(3), region);
  r.setBufferRowPitch(srp);
  r.setBufferSlicePitch(ssp);
  r.setHostRowPitch(drp);
  r.setHostSlicePitch(dsp);
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

namespace {

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

}  // namespace

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

// ---- images ----

namespace {

cl_int CheckImage(cl_command_queue q, cl_mem m) {
  if (cl_int e = CheckMem(q, m); e != CL_SUCCESS) return e;
  return m->is_image() ? CL_SUCCESS : CL_INVALID_MEM_OBJECT;
}

bool ValidTriple(const size_t* v) { return v != nullptr; }

// Host bytes of `region` of image m laid out with the given pitches (0 when invalid).
uint64_t ImageBytes(cl_mem m, const size_t region[3], size_t row_pitch, size_t slice_pitch) {
  uint64_t n = 0;
  if (!proto::ImageHostBytes(static_cast<uint32_t>(m->type), region, m->element_bytes, row_pitch,
                             slice_pitch, n)) {
    return 0;
  }
  return n;
}

// Reads `region` at `origin` into dst laid out with the given pitches (`bytes` host bytes). A
// tightly packed layout is read straight into dst (and may stay asynchronous); a layout with
// gaps is read into a staging copy whose region rows are then merged, so the application's bytes
// between rows stay untouched; such reads block (OpenCL allows a non-blocking call to block).
cl_int ReadImageInto(Enqueuer& enq, cl_mem m, const size_t origin[3], const size_t region[3],
                     size_t row_pitch, size_t slice_pitch, void* dst, size_t bytes, bool blocking) {
  auto r = enq.cmd().initReadImage();
  r.setMem(m->id);
  SetTriple(r.initOrigin(3), origin);
  SetTriple(r.initRegion(3), region);
  r.setRowPitch(row_pitch);
  r.setSlicePitch(slice_pitch);
  const bool array1d = m->type == CL_MEM_OBJECT_IMAGE1D_ARRAY;
  const size_t row_bytes = region[0] * m->element_bytes;
  const size_t rows = array1d ? 1 : region[1], slices = array1d ? region[1] : region[2];
  const size_t rp = row_pitch != 0 ? row_pitch : row_bytes;
  const size_t sp = slice_pitch != 0 ? slice_pitch : rp * rows;
  const bool dense = rp == row_bytes && (slices == 1 || sp == rp * rows);
  if (!dense) {
    std::vector<uint8_t> staging(bytes);
    uint64_t seq = enq.Begin(staging.data(), bytes, true);
    cl_int e = enq.conn()->Wait(seq);
    if (e == CL_SUCCESS) {
      for (size_t z = 0; z < slices; ++z) {
        for (size_t y = 0; y < rows; ++y) {
          size_t at = z * sp + y * rp;
          std::memcpy(static_cast<uint8_t*>(dst) + at, staging.data() + at, row_bytes);
        }
      }
    }
    return e;
  }
  uint64_t seq = 0;
  ShmBuffer buf;
  if (enq.conn()->UseShm(bytes)) buf = enq.conn()->AcquireShm(bytes);
  if (buf.valid()) r.setShm(true);
  seq = enq.Begin(dst, bytes, blocking, buf);
  return blocking ? enq.conn()->Wait(seq) : CL_SUCCESS;
}

// Sends a WriteImage of `bytes` host bytes from src.
cl_int PostWriteImage(Enqueuer& enq, cl_mem m, const size_t origin[3], const size_t region[3],
                      size_t row_pitch, size_t slice_pitch, const void* src, size_t bytes) {
  ShmBuffer held;
  uint64_t token = enq.conn()->SendBulk(src, bytes, &held);
  if (token == 0) return CL_OUT_OF_RESOURCES;
  auto w = enq.cmd().initWriteImage();
  w.setMem(m->id);
  SetTriple(w.initOrigin(3), origin);
  SetTriple(w.initRegion(3), region);
  w.setRowPitch(row_pitch);
  w.setSlicePitch(slice_pitch);
  w.setBulk(token);
  return enq.PostReleasing(held);
}

}  // namespace

cl_int CL_API_CALL EnqueueReadImage(cl_command_queue q, cl_mem m, cl_bool blocking,
                                    const size_t* origin, const size_t* region, size_t row_pitch,
                                    size_t slice_pitch, void* ptr, cl_uint nwait,
                                    const cl_event* waits, cl_event* event) {
  if (cl_int e = CheckImage(q, m); e != CL_SUCCESS) return e;
  if (cl_int e = CheckHostAccess(m, true, false); e != CL_SUCCESS) return e;
  if (ptr == nullptr || !ValidTriple(origin) || !ValidTriple(region)) return CL_INVALID_VALUE;
  uint64_t bytes = ImageBytes(m, region, row_pitch, slice_pitch);
  if (bytes == 0) return CL_INVALID_VALUE;
  Enqueuer enq(q, nwait, waits, event, CL_COMMAND_READ_IMAGE);
  if (enq.err() != CL_SUCCESS) return enq.err();
  return ReadImageInto(enq, m, origin, region, row_pitch, slice_pitch, ptr, bytes, blocking);
}

cl_int CL_API_CALL EnqueueWriteImage(cl_command_queue q, cl_mem m, cl_bool, const size_t* origin,
                                     const size_t* region, size_t row_pitch, size_t slice_pitch,
                                     const void* ptr, cl_uint nwait, const cl_event* waits,
                                     cl_event* event) {
  if (cl_int e = CheckImage(q, m); e != CL_SUCCESS) return e;
  if (cl_int e = CheckHostAccess(m, false, true); e != CL_SUCCESS) return e;
  if (ptr == nullptr || !ValidTriple(origin) || !ValidTriple(region)) return CL_INVALID_VALUE;
  uint64_t bytes = ImageBytes(m, region, row_pitch, slice_pitch);
  if (bytes == 0) return CL_INVALID_VALUE;
  Enqueuer enq(q, nwait, waits, event, CL_COMMAND_WRITE_IMAGE);
  if (enq.err() != CL_SUCCESS) return enq.err();
  // The data is copied out now, so a blocking write returns as soon as it is sent.
  return PostWriteImage(enq, m, origin, region, row_pitch, slice_pitch, ptr, bytes);
}

cl_int CL_API_CALL EnqueueCopyImage(cl_command_queue q, cl_mem src, cl_mem dst,
                                    const size_t* src_origin, const size_t* dst_origin,
                                    const size_t* region, cl_uint nwait, const cl_event* waits,
                                    cl_event* event) {
  if (cl_int e = CheckImage(q, src); e != CL_SUCCESS) return e;
  if (cl_int e = CheckImage(q, dst); e != CL_SUCCESS) return e;
  if (!ValidTriple(src_origin) || !ValidTriple(dst_origin) || !ValidTriple(region)) return CL_INVALID_VALUE;
  Enqueuer enq(q, nwait, waits, event, CL_COMMAND_COPY_IMAGE);
  if (enq.err() != CL_SUCCESS) return enq.err();
  auto c = enq.cmd().initCopyImage();
  c.setSrc(src->id);
  c.setDst(dst->id);
  SetTriple(c.initSrcOrigin(3), src_origin);
  SetTriple(c.initDstOrigin(3), dst_origin);
  SetTriple(c.initRegion(3), region);
  return enq.Post();
}

cl_int CL_API_CALL EnqueueFillImage(cl_command_queue q, cl_mem m, const void* color,
                                    const size_t* origin, const size_t* region, cl_uint nwait,
                                    const cl_event* waits, cl_event* event) {
  if (cl_int e = CheckImage(q, m); e != CL_SUCCESS) return e;
  if (color == nullptr || !ValidTriple(origin) || !ValidTriple(region)) return CL_INVALID_VALUE;
  Enqueuer enq(q, nwait, waits, event, CL_COMMAND_FILL_IMAGE);
  if (enq.err() != CL_SUCCESS) return enq.err();
  auto f = enq.cmd().initFillImage();
  f.setMem(m->id);
  // float4, int4 or uint4: always 16 bytes.
  f.setColor(kj::arrayPtr(static_cast<const kj::byte*>(color), 16));
  SetTriple(f.initOrigin(3), origin);
  SetTriple(f.initRegion(3), region);
  return enq.Post();
}

namespace {

cl_int CopyImageBuffer(cl_command_queue q, cl_mem image, cl_mem buffer, const size_t* origin,
                       const size_t* region, size_t offset, bool to_buffer, cl_uint nwait,
                       const cl_event* waits, cl_event* event) {
  if (cl_int e = CheckImage(q, image); e != CL_SUCCESS) return e;
  if (cl_int e = CheckMem(q, buffer); e != CL_SUCCESS) return e;
  if (buffer->is_image()) return CL_INVALID_MEM_OBJECT;
  if (!ValidTriple(origin) || !ValidTriple(region)) return CL_INVALID_VALUE;
  Enqueuer enq(q, nwait, waits, event,
               to_buffer ? CL_COMMAND_COPY_IMAGE_TO_BUFFER : CL_COMMAND_COPY_BUFFER_TO_IMAGE);
  if (enq.err() != CL_SUCCESS) return enq.err();
  auto c = to_buffer ? enq.cmd().initCopyImageToBuffer() : enq.cmd().initCopyBufferToImage();
  c.setImage(image->id);
  c.setBuffer(buffer->id);
  SetTriple(c.initOrigin(3), origin);
  SetTriple(c.initRegion(3), region);
  c.setOffset(offset);
  return enq.Post();
}

}  // namespace

cl_int CL_API_CALL EnqueueCopyImageToBuffer(cl_command_queue q, cl_mem src, cl_mem dst,
                                            const size_t* origin, const size_t* region,
                                            size_t dst_offset, cl_uint nwait,
                                            const cl_event* waits, cl_event* event) {
  return CopyImageBuffer(q, src, dst, origin, region, dst_offset, true, nwait, waits, event);
}

cl_int CL_API_CALL EnqueueCopyBufferToImage(cl_command_queue q, cl_mem src, cl_mem dst,
                                            size_t src_offset, const size_t* origin,
                                            const size_t* region, cl_uint nwait,
                                            const cl_event* waits, cl_event* event) {
  return CopyImageBuffer(q, dst, src, origin, region, src_offset, false, nwait, waits, event);
}

void* CL_API_CALL EnqueueMapImage(cl_command_queue q, cl_mem m, cl_bool blocking,
                                  cl_map_flags flags, const size_t* origin, const size_t* region,
                                  size_t* row_pitch, size_t* slice_pitch, cl_uint nwait,
                                  const cl_event* waits, cl_event* event, cl_int* err) {
  if (cl_int e = CheckImage(q, m); e != CL_SUCCESS) {
    SetErr(err, e);
    return nullptr;
  }
  if (!ValidTriple(origin) || !ValidTriple(region) || row_pitch == nullptr) {
    SetErr(err, CL_INVALID_VALUE);
    return nullptr;
  }
  bool layered = m->type == CL_MEM_OBJECT_IMAGE3D || m->type == CL_MEM_OBJECT_IMAGE2D_ARRAY ||
                 m->type == CL_MEM_OBJECT_IMAGE1D_ARRAY;
  if (layered && slice_pitch == nullptr) {
    SetErr(err, CL_INVALID_VALUE);
    return nullptr;
  }
  if (cl_int e = CheckMapAccess(m, flags); e != CL_SUCCESS) {
    SetErr(err, e);
    return nullptr;
  }
  Mapping map;
  map.flags = flags;
  for (int i = 0; i < 3; ++i) {
    map.origin[i] = origin[i];
    map.region[i] = region[i];
  }
  // The host layout: the application's own for USE_HOST_PTR images, else tightly packed.
  size_t read_row = 0, read_slice = 0;
  if (m->host_ptr != nullptr) {
    map.row_pitch = m->desc.image_row_pitch;
    map.slice_pitch = m->desc.image_slice_pitch;
    size_t y = m->type == CL_MEM_OBJECT_IMAGE1D_ARRAY ? 0 : origin[1];
    size_t z = m->type == CL_MEM_OBJECT_IMAGE1D_ARRAY ? origin[1] : origin[2];
    map.ptr = static_cast<uint8_t*>(m->host_ptr) + z * map.slice_pitch + y * map.row_pitch +
              origin[0] * m->element_bytes;
    read_row = m->type == CL_MEM_OBJECT_IMAGE1D_ARRAY ? 0 : map.row_pitch;
    read_slice = layered ? map.slice_pitch : 0;
  } else {
    map.row_pitch = region[0] * m->element_bytes;
    map.slice_pitch = m->type == CL_MEM_OBJECT_IMAGE1D_ARRAY ? map.row_pitch
                      : layered                             ? map.row_pitch * region[1]
                                                            : 0;
  }
  uint64_t bytes = ImageBytes(m, region, read_row, read_slice);
  if (bytes == 0) {
    SetErr(err, CL_INVALID_VALUE);
    return nullptr;
  }
  map.size = bytes;
  if (map.ptr == nullptr) {
    map.ptr = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    map.owned = true;
    if (map.ptr == nullptr) {
      SetErr(err, CL_OUT_OF_HOST_MEMORY);
      return nullptr;
    }
  }
  cl_int e;
  if ((flags & CL_MAP_WRITE_INVALIDATE_REGION) != 0) {
    e = Marker(q, nwait, waits, event, false, CL_COMMAND_MAP_IMAGE);
  } else {
    Enqueuer enq(q, nwait, waits, event, CL_COMMAND_MAP_IMAGE);
    e = enq.err();
    if (e == CL_SUCCESS) {
      e = ReadImageInto(enq, m, origin, region, read_row, read_slice, map.ptr, bytes, blocking);
    }
  }
  if (e != CL_SUCCESS) {
    if (map.owned) std::free(map.ptr);
    SetErr(err, e);
    return nullptr;
  }
  {
    std::lock_guard<std::mutex> lock(m->mu);
    m->maps.push_back(map);
  }
  *row_pitch = map.row_pitch;
  if (slice_pitch != nullptr) *slice_pitch = map.slice_pitch;
  SetErr(err, CL_SUCCESS);
  return map.ptr;
}

// ---- map / unmap ----

void* CL_API_CALL EnqueueMapBuffer(cl_command_queue q, cl_mem m, cl_bool blocking,
                                   cl_map_flags flags, size_t offset, size_t size, cl_uint nwait,
                                   const cl_event* waits, cl_event* event, cl_int* err) {
  if (cl_int e = CheckMem(q, m); e != CL_SUCCESS) {
    SetErr(err, e);
    return nullptr;
  }
  if (m->is_image()) {
    SetErr(err, CL_INVALID_MEM_OBJECT);
    return nullptr;
  }
  if (size == 0 || offset > m->size || size > m->size - offset) {
    SetErr(err, CL_INVALID_VALUE);
    return nullptr;
  }
  if (cl_int e = CheckMapAccess(m, flags); e != CL_SUCCESS) {
    SetErr(err, e);
    return nullptr;
  }
  Mapping map;
  map.offset = offset;
  map.size = size;
  map.flags = flags;
  const bool invalidate = (flags & CL_MAP_WRITE_INVALIDATE_REGION) != 0;
  Connection* conn = Conn();
  if (m->host_ptr != nullptr) {
    map.ptr = static_cast<uint8_t*>(m->host_ptr) + offset;
  } else if ((blocking || invalidate) && conn != nullptr && conn->UseShm(size) &&
             (map.shm = conn->AcquireShm(size)).valid()) {
    // Only when nothing can still be written into the buffer after this call returns (the read
    // is waited for, or there is none), so unmap may hand it straight back to the pool. The
    // buffer holds only this client's earlier data until the read overwrites it.
    map.ptr = map.shm.map;
  } else {
    map.ptr = std::aligned_alloc(64, (size + 63) / 64 * 64);
    map.owned = true;
    if (map.ptr == nullptr) {
      SetErr(err, CL_OUT_OF_HOST_MEMORY);
      return nullptr;
    }
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
      if (blocking) e = enq.conn()->Wait(seq);
    }
  }
  if (e != CL_SUCCESS) {
    if (map.shm.valid()) conn->ReleaseShm(map.shm);
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
  if ((map.flags & (CL_MAP_WRITE | CL_MAP_WRITE_INVALIDATE_REGION)) != 0) {
    Enqueuer enq(q, nwait, waits, event, CL_COMMAND_UNMAP_MEM_OBJECT);
    e = enq.err();
    if (e == CL_SUCCESS && m->is_image()) {
      bool host = m->host_ptr != nullptr;
      bool layered = m->type == CL_MEM_OBJECT_IMAGE3D || m->type == CL_MEM_OBJECT_IMAGE2D_ARRAY ||
                     m->type == CL_MEM_OBJECT_IMAGE1D_ARRAY;
      e = PostWriteImage(enq, m, map.origin, map.region,
                         host && m->type != CL_MEM_OBJECT_IMAGE1D_ARRAY ? map.row_pitch : 0,
                         host && layered ? map.slice_pitch : 0, map.ptr, map.size);
    } else if (e == CL_SUCCESS) {
      ShmBuffer held;
      uint64_t token;
      if (map.shm.valid()) {
        // Sent from where the application wrote it; the buffer goes back to the pool once the
        // write has run.
        token = enq.conn()->SendShm(map.shm, map.size);
        if (token != 0) held = map.shm;
      } else {
        token = enq.conn()->SendBulk(map.ptr, map.size, &held);
      }
      if (token == 0) {
        e = CL_OUT_OF_RESOURCES;
      } else {
        auto w = enq.cmd().initWriteBuffer();
        w.setMem(m->id);
        w.setOffset(map.offset);
        w.setSize(map.size);
        w.setBulk(token);
        e = enq.PostReleasing(held);
        handed_over = map.shm.valid();  // released by the write's answer
      }
    }
  } else {
    e = Marker(q, nwait, waits, event, false, CL_COMMAND_UNMAP_MEM_OBJECT);
  }
  if (map.shm.valid() && !handed_over) Conn()->ReleaseShm(map.shm);
  if (map.owned) std::free(map.ptr);  // the data was copied into the request
  return e;
}

// ---- programs ----

namespace {

cl_program NewProgram(cl_context ctx, std::vector<cl_device_id> devices) {
  auto* p = new _cl_program();
  p->id = Conn()->NextId();
  p->context = ctx;
  p->devices = std::move(devices);
  return p;
}

void FillDevices(capnp::List<uint64_t>::Builder l, const std::vector<cl_device_id>& devs) {
  for (unsigned i = 0; i < devs.size(); ++i) l.set(i, devs[i]->index);
}

bool DeviceList(cl_uint n, const cl_device_id* list, const std::vector<cl_device_id>& allowed,
                std::vector<cl_device_id>& out) {
  if ((n == 0) != (list == nullptr)) return false;
  for (cl_uint i = 0; i < n; ++i) {
    if (!Is(list[i], Kind::kDevice) ||
        std::find(allowed.begin(), allowed.end(), list[i]) == allowed.end()) {
      return false;
    }
    out.push_back(list[i]);
  }
  return true;
}

}  // namespace

cl_program CL_API_CALL CreateProgramWithSource(cl_context ctx, cl_uint count, const char** strings,
                                               const size_t* lengths, cl_int* err) {
  if (!Is(ctx, Kind::kContext)) {
    SetErr(err, CL_INVALID_CONTEXT);
    return nullptr;
  }
  if (count == 0 || strings == nullptr) {
    SetErr(err, CL_INVALID_VALUE);
    return nullptr;
  }
  std::string src;
  for (cl_uint i = 0; i < count; ++i) {
    if (strings[i] == nullptr) {
      SetErr(err, CL_INVALID_VALUE);
      return nullptr;
    }
    if (lengths == nullptr || lengths[i] == 0) {
      src += strings[i];
    } else {
      src.append(strings[i], lengths[i]);
    }
  }
  cl_program p = NewProgram(ctx, ctx->devices);
  p->source = src;
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<wire::Request>().initCreateProgramWithSource();
  r.setId(p->id);
  r.setContext(ctx->id);
  r.setSource(src);
  cl_int e = Conn()->Call(b);
  if (e != CL_SUCCESS) {
    delete p;
    SetErr(err, e);
    return nullptr;
  }
  RetainContext(ctx);
  SetErr(err, CL_SUCCESS);
  return p;
}

cl_program CL_API_CALL CreateProgramWithBinary(cl_context ctx, cl_uint n, const cl_device_id* devs,
                                               const size_t* lengths, const unsigned char** bins,
                                               cl_int* status, cl_int* err) {
  if (!Is(ctx, Kind::kContext)) {
    SetErr(err, CL_INVALID_CONTEXT);
    return nullptr;
  }
  std::vector<cl_device_id> dl;
  if (n == 0 || !DeviceList(n, devs, ctx->devices, dl)) {
    SetErr(err, n == 0 ? CL_INVALID_VALUE : CL_INVALID_DEVICE);
    return nullptr;
  }
  if (lengths == nullptr || bins == nullptr) {
    SetErr(err, CL_INVALID_VALUE);
    return nullptr;
  }
  for (cl_uint i = 0; i < n; ++i) {
    if (lengths[i] == 0 || bins[i] == nullptr) {
      if (status != nullptr) status[i] = CL_INVALID_VALUE;
      SetErr(err, CL_INVALID_VALUE);
      return nullptr;
    }
  }
  cl_program p = NewProgram(ctx, dl);
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<wire::Request>().initCreateProgramWithBinary();
  r.setId(p->id);
  r.setContext(ctx->id);
  FillDevices(r.initDevices(n), dl);
  auto bl = r.initBinaries(n);
  for (cl_uint i = 0; i < n; ++i) bl.set(i, kj::arrayPtr(bins[i], lengths[i]));
  std::optional<proto::Message> reply;
  cl_int e = Conn()->Call(b, &reply);
  if (status != nullptr) {
    for (cl_uint i = 0; i < n; ++i) status[i] = e;
    if (reply && reply->root<wire::Reply>().isBinaryStatus()) {
      auto bs = reply->root<wire::Reply>().getBinaryStatus();
      for (cl_uint i = 0; i < n && i < bs.size(); ++i) status[i] = bs[i];
    }
  }
  if (e != CL_SUCCESS) {
    delete p;
    SetErr(err, e);
    return nullptr;
  }
  RetainContext(ctx);
  SetErr(err, CL_SUCCESS);
  return p;
}

cl_int CL_API_CALL RetainProgram(cl_program p) {
  if (!Is(p, Kind::kProgram)) return CL_INVALID_PROGRAM;
  p->refs.fetch_add(1);
  return CL_SUCCESS;
}

cl_int CL_API_CALL ReleaseProgram(cl_program p) {
  if (!Is(p, Kind::kProgram)) return CL_INVALID_PROGRAM;
  if (p->refs.fetch_sub(1) == 1) {
    PostRelease(wire::ObjectKind::PROGRAM, p->id);
    cl_context ctx = p->context;
    p->kind = Kind::kDead;
    delete p;
    ReleaseContext(ctx);
  }
  return CL_SUCCESS;
}

// The options, and the headers of their -I directories read here (includes.h).
template <typename Builder>
void FillIncludes(Builder r, const char* options, const std::string& source) {
  IncludeSet inc = CollectIncludes(options != nullptr ? options : "", {source});
  r.setOptions(inc.options);
  r.setIncludeDirs(inc.dirs);
  auto files = r.initIncludeFiles(static_cast<unsigned>(inc.files.size()));
  for (size_t i = 0; i < inc.files.size(); ++i) {
    auto f = files[static_cast<unsigned>(i)];
    f.setDir(inc.files[i].dir);
    f.setName(inc.files[i].name);
    f.setData(kj::arrayPtr(reinterpret_cast<const kj::byte*>(inc.files[i].data.data()),
                           inc.files[i].data.size()));
  }
}

cl_int CL_API_CALL BuildProgram(cl_program p, cl_uint n, const cl_device_id* devs,
                                const char* options,
                                void(CL_CALLBACK* notify)(cl_program, void*), void* user) {
  if (!Is(p, Kind::kProgram)) return CL_INVALID_PROGRAM;
  std::vector<cl_device_id> dl;
  if (!DeviceList(n, devs, p->devices, dl)) return n != 0 && devs == nullptr ? CL_INVALID_VALUE : CL_INVALID_DEVICE;
  if (notify == nullptr && user != nullptr) return CL_INVALID_VALUE;
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<wire::Request>().initBuildProgram();
  r.setProgram(p->id);
  FillDevices(r.initDevices(static_cast<unsigned>(dl.size())), dl);
  FillIncludes(r, options, p->source);
  cl_int e = Conn()->Call(b);
  if (notify != nullptr) notify(p, user);
  return e;
}

cl_int CL_API_CALL CompileProgram(cl_program p, cl_uint n, const cl_device_id* devs,
                                  const char* options, cl_uint nh, const cl_program* headers,
                                  const char** names,
                                  void(CL_CALLBACK* notify)(cl_program, void*), void* user) {
  if (!Is(p, Kind::kProgram)) return CL_INVALID_PROGRAM;
  std::vector<cl_device_id> dl;
  if (!DeviceList(n, devs, p->devices, dl)) return CL_INVALID_DEVICE;
  if ((nh == 0) != (headers == nullptr) || (nh != 0 && names == nullptr)) return CL_INVALID_VALUE;
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<wire::Request>().initCompileProgram();
  r.setProgram(p->id);
  FillDevices(r.initDevices(static_cast<unsigned>(dl.size())), dl);
  FillIncludes(r, options, p->source);
  auto hl = r.initHeaders(nh);
  auto nl = r.initHeaderNames(nh);
  for (cl_uint i = 0; i < nh; ++i) {
    if (!Is(headers[i], Kind::kProgram)) return CL_INVALID_PROGRAM;
    hl.set(i, headers[i]->id);
    nl.set(i, names[i]);
  }
  cl_int e = Conn()->Call(b);
  if (notify != nullptr) notify(p, user);
  return e;
}

cl_program CL_API_CALL LinkProgram(cl_context ctx, cl_uint n, const cl_device_id* devs,
                                   const char* options, cl_uint ni, const cl_program* inputs,
                                   void(CL_CALLBACK* notify)(cl_program, void*), void* user,
                                   cl_int* err) {
  if (!Is(ctx, Kind::kContext)) {
    SetErr(err, CL_INVALID_CONTEXT);
    return nullptr;
  }
  std::vector<cl_device_id> dl;
  if (!DeviceList(n, devs, ctx->devices, dl) || ni == 0 || inputs == nullptr) {
    SetErr(err, CL_INVALID_VALUE);
    return nullptr;
  }
  cl_program p = NewProgram(ctx, dl.empty() ? ctx->devices : dl);
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<wire::Request>().initLinkProgram();
  r.setId(p->id);
  r.setContext(ctx->id);
  FillDevices(r.initDevices(static_cast<unsigned>(dl.size())), dl);
  r.setOptions(options != nullptr ? options : "");
  auto il = r.initInputs(ni);
  for (cl_uint i = 0; i < ni; ++i) {
    if (!Is(inputs[i], Kind::kProgram)) {
      delete p;
      SetErr(err, CL_INVALID_PROGRAM);
      return nullptr;
    }
    il.set(i, inputs[i]->id);
  }
  cl_int e = Conn()->Call(b);
  if (e != CL_SUCCESS && e != CL_LINK_PROGRAM_FAILURE) {
    delete p;
    SetErr(err, e);
    return nullptr;
  }
  // A failed link still yields a program whose build log explains the failure.
  RetainContext(ctx);
  if (notify != nullptr) notify(p, user);
  SetErr(err, e);
  return p;
}

cl_int CL_API_CALL UnloadCompiler() { return CL_SUCCESS; }
cl_int CL_API_CALL UnloadPlatformCompiler(cl_platform_id p) {
  return p == &g_platform ? CL_SUCCESS : CL_INVALID_PLATFORM;
}

cl_int CL_API_CALL GetProgramInfo(cl_program p, cl_program_info param, size_t size, void* value,
                                  size_t* size_ret) {
  if (!Is(p, Kind::kProgram)) return CL_INVALID_PROGRAM;
  switch (param) {
    case CL_PROGRAM_REFERENCE_COUNT: return Scalar<cl_uint>(static_cast<cl_uint>(p->refs.load()), size, value, size_ret);
    case CL_PROGRAM_CONTEXT: return Scalar(p->context, size, value, size_ret);
    case CL_PROGRAM_NUM_DEVICES: return Scalar<cl_uint>(static_cast<cl_uint>(p->devices.size()), size, value, size_ret);
    case CL_PROGRAM_DEVICES:
      return CopyOut(p->devices.data(), p->devices.size() * sizeof(cl_device_id), size, value, size_ret);
    case CL_PROGRAM_SOURCE: return String(p->source, size, value, size_ret);
    case CL_PROGRAM_BINARIES: {
      size_t n = p->devices.size() * sizeof(unsigned char*);
      if (value == nullptr) return CopyOut(nullptr, n, 0, nullptr, size_ret);
      if (size < n) return CL_INVALID_VALUE;
      std::vector<uint8_t> sizes_raw, all;
      cl_int e = RemoteInfo(wire::ObjectKind::PROGRAM, p->id, CL_PROGRAM_BINARY_SIZES, sizes_raw);
      if (e != CL_SUCCESS) return e;
      e = RemoteInfo(wire::ObjectKind::PROGRAM, p->id, CL_PROGRAM_BINARIES, all);
      if (e != CL_SUCCESS) return e;
      auto** out = static_cast<unsigned char**>(value);
      size_t at = 0;
      for (size_t i = 0; i < p->devices.size() && (i + 1) * sizeof(size_t) <= sizes_raw.size(); ++i) {
        size_t len;
        std::memcpy(&len, sizes_raw.data() + i * sizeof(size_t), sizeof(size_t));
        if (at + len > all.size()) return CL_OUT_OF_RESOURCES;
        if (out[i] != nullptr) std::memcpy(out[i], all.data() + at, len);
        at += len;
      }
      if (size_ret != nullptr) *size_ret = n;
      return CL_SUCCESS;
    }
    default: return RemoteInfoOut(wire::ObjectKind::PROGRAM, p->id, param, size, value, size_ret);
  }
}

cl_int CL_API_CALL GetProgramBuildInfo(cl_program p, cl_device_id d, cl_program_build_info param,
                                       size_t size, void* value, size_t* size_ret) {
  if (!Is(p, Kind::kProgram)) return CL_INVALID_PROGRAM;
  if (!Is(d, Kind::kDevice) || std::find(p->devices.begin(), p->devices.end(), d) == p->devices.end()) {
    return CL_INVALID_DEVICE;
  }
  return RemoteInfoOut(wire::ObjectKind::PROGRAM, p->id, param, size, value, size_ret, d);
}

// ---- kernels ----

namespace {

std::map<const _cl_kernel*, std::vector<cl_uint>>& KernelQualifiers() {
  static auto* m = new std::map<const _cl_kernel*, std::vector<cl_uint>>();
  return *m;
}

}  // namespace

cl_kernel CL_API_CALL CreateKernel(cl_program p, const char* name, cl_int* err) {
  if (!Is(p, Kind::kProgram)) {
    SetErr(err, CL_INVALID_PROGRAM);
    return nullptr;
  }
  if (name == nullptr) {
    SetErr(err, CL_INVALID_VALUE);
    return nullptr;
  }
  // Owned here until the daemon's reply is read: a reply that throws while read frees it.
  auto owned = std::make_unique<_cl_kernel>();
  _cl_kernel* k = owned.get();
  k->id = Conn()->NextId();
  k->program = p;
  k->name = name;
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<wire::Request>().initCreateKernel();
  r.setId(k->id);
  r.setProgram(p->id);
  r.setName(name);
  std::optional<proto::Message> reply;
  cl_int e = Conn()->Call(b, &reply);
  if (e != CL_SUCCESS || !reply || !reply->root<wire::Reply>().isKernel()) {
    SetErr(err, e != CL_SUCCESS ? e : CL_OUT_OF_RESOURCES);
    return nullptr;
  }
  auto kr = reply->root<wire::Reply>().getKernel();
  k->args.resize(std::min<uint32_t>(kr.getNumArgs(), 4096));
  std::vector<cl_uint> quals(k->args.size(), 0);
  // The list is read once: every read of it counts its whole size against the reply's
  // traversal limit, so reading it per element would be quadratic in the argument count.
  auto reply_quals = kr.getArgAddressQualifiers();
  for (unsigned i = 0; i < quals.size() && i < reply_quals.size(); ++i) {
    quals[i] = reply_quals[i];
  }
  {
    std::lock_guard<std::mutex> lock(g_mu);
    KernelQualifiers()[k] = std::move(quals);
  }
  RetainProgram(p);
  SetErr(err, CL_SUCCESS);
  return owned.release();
}

cl_int CL_API_CALL CreateKernelsInProgram(cl_program p, cl_uint n, cl_kernel* kernels,
                                          cl_uint* n_ret) {
  if (!Is(p, Kind::kProgram)) return CL_INVALID_PROGRAM;
  std::vector<uint8_t> raw;
  cl_int e = RemoteInfo(wire::ObjectKind::PROGRAM, p->id, CL_PROGRAM_KERNEL_NAMES, raw);
  if (e != CL_SUCCESS) return e;
  std::string names(raw.begin(), raw.end());
  names = names.c_str();
  std::vector<std::string> list;
  size_t at = 0;
  while (at < names.size()) {
    size_t semi = names.find(';', at);
    if (semi == std::string::npos) semi = names.size();
    if (semi > at) list.push_back(names.substr(at, semi - at));
    at = semi + 1;
  }
  if (kernels != nullptr && n < list.size()) return CL_INVALID_VALUE;
  if (kernels != nullptr) {
    for (size_t i = 0; i < list.size(); ++i) {
      kernels[i] = CreateKernel(p, list[i].c_str(), &e);
      if (e != CL_SUCCESS) return e;
    }
  }
  if (n_ret != nullptr) *n_ret = static_cast<cl_uint>(list.size());
  return CL_SUCCESS;
}

cl_int CL_API_CALL RetainKernel(cl_kernel k) {
  if (!Is(k, Kind::kKernel)) return CL_INVALID_KERNEL;
  k->refs.fetch_add(1);
  return CL_SUCCESS;
}

cl_int CL_API_CALL ReleaseKernel(cl_kernel k) {
  if (!Is(k, Kind::kKernel)) return CL_INVALID_KERNEL;
  if (k->refs.fetch_sub(1) == 1) {
    PostRelease(wire::ObjectKind::KERNEL, k->id);
    {
      std::lock_guard<std::mutex> lock(g_mu);
      KernelQualifiers().erase(k);
    }
    cl_program p = k->program;
    k->kind = Kind::kDead;
    delete k;
    ReleaseProgram(p);
  }
  return CL_SUCCESS;
}

cl_int CL_API_CALL SetKernelArg(cl_kernel k, cl_uint index, size_t size, const void* value) {
  if (!Is(k, Kind::kKernel)) return CL_INVALID_KERNEL;
  std::lock_guard<std::mutex> lock(k->mu);
  if (index >= k->args.size()) return CL_INVALID_ARG_INDEX;
  cl_uint qual = 0;
  {
    std::lock_guard<std::mutex> l2(g_mu);
    qual = KernelQualifiers()[k][index];
  }
  KernelArgSlot slot;
  if (qual == CL_KERNEL_ARG_ADDRESS_LOCAL || (qual == 0 && value == nullptr && size != sizeof(cl_mem))) {
    if (value != nullptr || size == 0) return CL_INVALID_ARG_VALUE;
    slot.type = KernelArgSlot::kLocal;
    slot.local = size;
  } else if (value == nullptr) {
    if (size != sizeof(cl_mem)) return CL_INVALID_ARG_SIZE;
    slot.type = KernelArgSlot::kNullMem;
  } else if (size == sizeof(cl_sampler) && IsSampler(*static_cast<const cl_sampler*>(value))) {
    cl_sampler smp = *static_cast<const cl_sampler*>(value);
    if (smp->context != k->program->context) return CL_INVALID_SAMPLER;
    slot.type = KernelArgSlot::kSampler;
    slot.mem = smp->id;
  } else if (size == sizeof(cl_mem) && IsMem(*static_cast<const cl_mem*>(value)) &&
             (qual == CL_KERNEL_ARG_ADDRESS_GLOBAL || qual == CL_KERNEL_ARG_ADDRESS_CONSTANT ||
              qual == 0 || (*static_cast<const cl_mem*>(value))->is_image())) {
    cl_mem m = *static_cast<const cl_mem*>(value);
    if (m->context != k->program->context) return CL_INVALID_MEM_OBJECT;
    slot.type = KernelArgSlot::kMem;
    slot.mem = m->id;
  } else if (qual == CL_KERNEL_ARG_ADDRESS_GLOBAL || qual == CL_KERNEL_ARG_ADDRESS_CONSTANT) {
    return CL_INVALID_MEM_OBJECT;
  } else {
    if (size == 0) return CL_INVALID_ARG_SIZE;
    slot.type = KernelArgSlot::kValue;
    const auto* b = static_cast<const uint8_t*>(value);
    slot.bytes.assign(b, b + size);
  }
  k->args[index] = std::move(slot);
  return CL_SUCCESS;
}

cl_int CL_API_CALL GetKernelInfo(cl_kernel k, cl_kernel_info param, size_t size, void* value,
                                 size_t* size_ret) {
  if (!Is(k, Kind::kKernel)) return CL_INVALID_KERNEL;
  switch (param) {
    case CL_KERNEL_FUNCTION_NAME: return String(k->name, size, value, size_ret);
    case CL_KERNEL_NUM_ARGS: return Scalar<cl_uint>(static_cast<cl_uint>(k->args.size()), size, value, size_ret);
    case CL_KERNEL_REFERENCE_COUNT: return Scalar<cl_uint>(static_cast<cl_uint>(k->refs.load()), size, value, size_ret);
    case CL_KERNEL_CONTEXT: return Scalar(k->program->context, size, value, size_ret);
    case CL_KERNEL_PROGRAM: return Scalar(k->program, size, value, size_ret);
    default: return RemoteInfoOut(wire::ObjectKind::KERNEL, k->id, param, size, value, size_ret);
  }
}

cl_int CL_API_CALL GetKernelWorkGroupInfo(cl_kernel k, cl_device_id d,
                                          cl_kernel_work_group_info param, size_t size,
                                          void* value, size_t* size_ret) {
  if (!Is(k, Kind::kKernel)) return CL_INVALID_KERNEL;
  if (d != nullptr && !Is(d, Kind::kDevice)) return CL_INVALID_DEVICE;
  if (d == nullptr) {
    if (k->program->devices.size() != 1) return CL_INVALID_DEVICE;
    d = k->program->devices[0];
  }
  return RemoteInfoOut(wire::ObjectKind::KERNEL, k->id, param, size, value, size_ret, d);
}

cl_int CL_API_CALL GetKernelArgInfo(cl_kernel k, cl_uint index, cl_kernel_arg_info param,
                                    size_t size, void* value, size_t* size_ret) {
  if (!Is(k, Kind::kKernel)) return CL_INVALID_KERNEL;
  if (index >= k->args.size()) return CL_INVALID_ARG_INDEX;
  return RemoteInfoOut(wire::ObjectKind::KERNEL, k->id, param, size, value, size_ret, nullptr, index);
}

cl_int CL_API_CALL EnqueueNDRangeKernel(cl_command_queue q, cl_kernel k, cl_uint dim,
                                        const size_t* offset, const size_t* global,
                                        const size_t* local, cl_uint nwait, const cl_event* waits,
                                        cl_event* event) {
  if (!Is(q, Kind::kQueue)) return CL_INVALID_COMMAND_QUEUE;
  if (!Is(k, Kind::kKernel)) return CL_INVALID_KERNEL;
  if (k->program->context != q->context) return CL_INVALID_CONTEXT;
  if (dim < 1 || dim > 3) return CL_INVALID_WORK_DIMENSION;
  if (global == nullptr) return CL_INVALID_GLOBAL_WORK_SIZE;
  for (cl_uint i = 0; i < dim; ++i) {
    if (global[i] == 0) return CL_INVALID_GLOBAL_WORK_SIZE;
    if (local != nullptr && (local[i] == 0 || global[i] % local[i] != 0)) {
      return CL_INVALID_WORK_GROUP_SIZE;
    }
  }
  Enqueuer enq(q, nwait, waits, event, CL_COMMAND_NDRANGE_KERNEL);
  if (enq.err() != CL_SUCCESS) return enq.err();
  auto nd = enq.cmd().initNdrange();
  nd.setKernel(k->id);
  nd.setWorkDim(dim);
  auto g = nd.initGlobalSize(dim);
  for (cl_uint i = 0; i < dim; ++i) g.set(i, global[i]);
  if (local != nullptr) {
    auto l = nd.initLocalSize(dim);
    for (cl_uint i = 0; i < dim; ++i) l.set(i, local[i]);
  }
  if (offset != nullptr) {
    auto o = nd.initGlobalOffset(dim);
    for (cl_uint i = 0; i < dim; ++i) o.set(i, offset[i]);
  }
  {
    std::lock_guard<std::mutex> lock(k->mu);
    auto args = nd.initArgs(static_cast<unsigned>(k->args.size()));
    for (unsigned i = 0; i < k->args.size(); ++i) {
      const KernelArgSlot& s = k->args[i];
      switch (s.type) {
        case KernelArgSlot::kUnset: return CL_INVALID_KERNEL_ARGS;
        case KernelArgSlot::kValue: args[i].setValue(kj::arrayPtr(s.bytes.data(), s.bytes.size())); break;
        case KernelArgSlot::kMem: args[i].setMem(s.mem); break;
        case KernelArgSlot::kNullMem: args[i].setNullMem(); break;
        case KernelArgSlot::kLocal: args[i].setLocal(s.local); break;
        case KernelArgSlot::kSampler: args[i].setSampler(s.mem); break;
      }
    }
  }
  return enq.Post();
}

cl_int CL_API_CALL EnqueueNativeKernel(cl_command_queue q, void(CL_CALLBACK*)(void*), void*,
                                       size_t, cl_uint, const cl_mem*, const void**, cl_uint,
                                       const cl_event*, cl_event*) {
  if (!Is(q, Kind::kQueue)) return CL_INVALID_COMMAND_QUEUE;
  // A native kernel is a host function of the application; the device runs in another
  // process, so it has no CL_EXEC_NATIVE_KERNEL capability (GetDeviceInfo) and the call fails
  // as OpenCL requires for such a device.
  return CL_INVALID_OPERATION;
}

cl_int CL_API_CALL EnqueueTask(cl_command_queue q, cl_kernel k, cl_uint nwait,
                               const cl_event* waits, cl_event* event) {
  size_t one = 1;
  return EnqueueNDRangeKernel(q, k, 1, nullptr, &one, &one, nwait, waits, event);
}

}  // namespace gmux::icd

// ---- the dispatch table ----

namespace gmux::icd {
namespace {

// Unsupported<F>::Fn has exactly the slot's signature and fails the call the way OpenCL
// expects: CL_INVALID_OPERATION, with *errcode_ret set and NULL returned by creators.
template <typename F>
struct Unsupported;

template <typename R, typename... A>
struct Unsupported<R(CL_API_CALL*)(A...)> {
  static R CL_API_CALL Fn(A... args) {
    if constexpr (sizeof...(A) > 0) {
      using Last = std::tuple_element_t<sizeof...(A) - 1, std::tuple<A...>>;
      if constexpr (std::is_same_v<Last, cl_int*>) {
        Last e = std::get<sizeof...(A) - 1>(std::forward_as_tuple(args...));
        if (e != nullptr) *e = CL_INVALID_OPERATION;
      }
    }
    ((void)args, ...);
    if constexpr (std::is_same_v<R, cl_int>) {
      return CL_INVALID_OPERATION;
    } else if constexpr (std::is_pointer_v<R>) {
      return nullptr;
    } else if constexpr (!std::is_void_v<R>) {
      return R{};
    }
  }
};

// Guarded<F>::Fn calls F and turns any exception escaping it (a Cap'n Proto decode error, a
// failed allocation, a library's own exception) into an OpenCL error for that call: the ICD
// never lets an exception reach its host program, which would terminate it.
template <auto F>
struct Guarded;

template <typename R, typename... A, R(CL_API_CALL* F)(A...)>
struct Guarded<F> {
  static R CL_API_CALL Fn(A... args) {
    cl_int code = CL_OUT_OF_RESOURCES;
    try {
      return F(args...);
    } catch (const std::bad_alloc&) {
      code = CL_OUT_OF_HOST_MEMORY;
    } catch (...) {
      code = CL_OUT_OF_RESOURCES;
    }
    if constexpr (sizeof...(A) > 0) {
      using Last = std::tuple_element_t<sizeof...(A) - 1, std::tuple<A...>>;
      if constexpr (std::is_same_v<Last, cl_int*>) {
        Last e = std::get<sizeof...(A) - 1>(std::forward_as_tuple(args...));
        if (e != nullptr) *e = code;
      }
    }
    if constexpr (std::is_same_v<R, cl_int>) {
      return code;
    } else if constexpr (std::is_pointer_v<R>) {
      return nullptr;
    } else if constexpr (!std::is_void_v<R>) {
      return R{};
    }
  }
};

// Slots typed void* in the headers (APIs of other windowing systems) get a function that
// returns CL_INVALID_OPERATION; they are never NULL.
cl_int CL_API_CALL UnsupportedUntyped() { return CL_INVALID_OPERATION; }

template <typename Slot>
void FillUnsupported(Slot& slot) {
  if constexpr (std::is_same_v<Slot, void*>) {
    slot = reinterpret_cast<void*>(&UnsupportedUntyped);
  } else {
    slot = &Unsupported<Slot>::Fn;
  }
}

cl_icd_dispatch MakeTable() {
  cl_icd_dispatch d{};
#define GMUX_SLOT(name) FillUnsupported(d.name);
#include "icd/dispatch_slots.inc"
#undef GMUX_SLOT
  d.clGetPlatformIDs = &Guarded<&GetPlatformIDs>::Fn;
  d.clGetPlatformInfo = &Guarded<&GetPlatformInfo>::Fn;
  d.clGetDeviceIDs = &Guarded<&GetDeviceIDs>::Fn;
  d.clGetDeviceInfo = &Guarded<&GetDeviceInfo>::Fn;
  d.clRetainDevice = &Guarded<&RetainDevice>::Fn;
  d.clReleaseDevice = &Guarded<&ReleaseDevice>::Fn;
  d.clCreateContext = &Guarded<&CreateContext>::Fn;
  d.clCreateContextFromType = &Guarded<&CreateContextFromType>::Fn;
  d.clRetainContext = &Guarded<&RetainContext>::Fn;
  d.clReleaseContext = &Guarded<&ReleaseContext>::Fn;
  d.clGetContextInfo = &Guarded<&GetContextInfo>::Fn;
  d.clCreateCommandQueue = &Guarded<&CreateCommandQueue>::Fn;
  d.clCreateCommandQueueWithProperties = &Guarded<&CreateCommandQueueWithProperties>::Fn;
  d.clRetainCommandQueue = &Guarded<&RetainCommandQueue>::Fn;
  d.clReleaseCommandQueue = &Guarded<&ReleaseCommandQueue>::Fn;
  d.clGetCommandQueueInfo = &Guarded<&GetCommandQueueInfo>::Fn;
  d.clFlush = &Guarded<&Flush>::Fn;
  d.clFinish = &Guarded<&Finish>::Fn;
  d.clCreateBuffer = &Guarded<&CreateBuffer>::Fn;
  d.clCreateSubBuffer = &Guarded<&CreateSubBuffer>::Fn;
  d.clRetainMemObject = &Guarded<&RetainMemObject>::Fn;
  d.clReleaseMemObject = &Guarded<&ReleaseMemObject>::Fn;
  d.clGetMemObjectInfo = &Guarded<&GetMemObjectInfo>::Fn;
  d.clSetMemObjectDestructorCallback = &Guarded<&SetMemObjectDestructorCallback>::Fn;
  d.clGetSupportedImageFormats = &Guarded<&GetSupportedImageFormats>::Fn;
  d.clCreateImage = &Guarded<&CreateImage>::Fn;
  d.clCreateImage2D = &Guarded<&CreateImage2D>::Fn;
  d.clCreateImage3D = &Guarded<&CreateImage3D>::Fn;
  d.clGetImageInfo = &Guarded<&GetImageInfo>::Fn;
  d.clCreateSampler = &Guarded<&CreateSampler>::Fn;
  d.clRetainSampler = &Guarded<&RetainSampler>::Fn;
  d.clReleaseSampler = &Guarded<&ReleaseSampler>::Fn;
  d.clGetSamplerInfo = &Guarded<&GetSamplerInfo>::Fn;
  d.clEnqueueReadImage = &Guarded<&EnqueueReadImage>::Fn;
  d.clEnqueueWriteImage = &Guarded<&EnqueueWriteImage>::Fn;
  d.clEnqueueCopyImage = &Guarded<&EnqueueCopyImage>::Fn;
  d.clEnqueueFillImage = &Guarded<&EnqueueFillImage>::Fn;
  d.clEnqueueCopyImageToBuffer = &Guarded<&EnqueueCopyImageToBuffer>::Fn;
  d.clEnqueueCopyBufferToImage = &Guarded<&EnqueueCopyBufferToImage>::Fn;
  d.clEnqueueMapImage = &Guarded<&EnqueueMapImage>::Fn;
  d.clRetainEvent = &Guarded<&RetainEvent>::Fn;
  d.clReleaseEvent = &Guarded<&ReleaseEvent>::Fn;
  d.clWaitForEvents = &Guarded<&WaitForEvents>::Fn;
  d.clGetEventInfo = &Guarded<&GetEventInfo>::Fn;
  d.clGetEventProfilingInfo = &Guarded<&GetEventProfilingInfo>::Fn;
  d.clSetEventCallback = &Guarded<&SetEventCallback>::Fn;
  d.clCreateUserEvent = &Guarded<&CreateUserEvent>::Fn;
  d.clSetUserEventStatus = &Guarded<&SetUserEventStatus>::Fn;
  d.clEnqueueReadBuffer = &Guarded<&EnqueueReadBuffer>::Fn;
  d.clEnqueueWriteBuffer = &Guarded<&EnqueueWriteBuffer>::Fn;
  d.clEnqueueReadBufferRect = &Guarded<&EnqueueReadBufferRect>::Fn;
  d.clEnqueueWriteBufferRect = &Guarded<&EnqueueWriteBufferRect>::Fn;
  d.clEnqueueCopyBuffer = &Guarded<&EnqueueCopyBuffer>::Fn;
  d.clEnqueueCopyBufferRect = &Guarded<&EnqueueCopyBufferRect>::Fn;
  d.clEnqueueFillBuffer = &Guarded<&EnqueueFillBuffer>::Fn;
  d.clEnqueueMarker = &Guarded<&EnqueueMarker>::Fn;
  d.clEnqueueBarrier = &Guarded<&EnqueueBarrier>::Fn;
  d.clEnqueueWaitForEvents = &Guarded<&EnqueueWaitForEvents>::Fn;
  d.clEnqueueMarkerWithWaitList = &Guarded<&EnqueueMarkerWithWaitList>::Fn;
  d.clEnqueueBarrierWithWaitList = &Guarded<&EnqueueBarrierWithWaitList>::Fn;
  d.clEnqueueMigrateMemObjects = &Guarded<&EnqueueMigrateMemObjects>::Fn;
  d.clEnqueueMapBuffer = &Guarded<&EnqueueMapBuffer>::Fn;
  d.clEnqueueUnmapMemObject = &Guarded<&EnqueueUnmapMemObject>::Fn;
  d.clCreateProgramWithSource = &Guarded<&CreateProgramWithSource>::Fn;
  d.clCreateProgramWithBinary = &Guarded<&CreateProgramWithBinary>::Fn;
  d.clRetainProgram = &Guarded<&RetainProgram>::Fn;
  d.clReleaseProgram = &Guarded<&ReleaseProgram>::Fn;
  d.clBuildProgram = &Guarded<&BuildProgram>::Fn;
  d.clCompileProgram = &Guarded<&CompileProgram>::Fn;
  d.clLinkProgram = &Guarded<&LinkProgram>::Fn;
  d.clUnloadCompiler = &Guarded<&UnloadCompiler>::Fn;
  d.clUnloadPlatformCompiler = &Guarded<&UnloadPlatformCompiler>::Fn;
  d.clGetProgramInfo = &Guarded<&GetProgramInfo>::Fn;
  d.clGetProgramBuildInfo = &Guarded<&GetProgramBuildInfo>::Fn;
  d.clCreateKernel = &Guarded<&CreateKernel>::Fn;
  d.clCreateKernelsInProgram = &Guarded<&CreateKernelsInProgram>::Fn;
  d.clRetainKernel = &Guarded<&RetainKernel>::Fn;
  d.clReleaseKernel = &Guarded<&ReleaseKernel>::Fn;
  d.clSetKernelArg = &Guarded<&SetKernelArg>::Fn;
  d.clGetKernelInfo = &Guarded<&GetKernelInfo>::Fn;
  d.clGetKernelWorkGroupInfo = &Guarded<&GetKernelWorkGroupInfo>::Fn;
  d.clGetKernelArgInfo = &Guarded<&GetKernelArgInfo>::Fn;
  d.clEnqueueNDRangeKernel = &Guarded<&EnqueueNDRangeKernel>::Fn;
  d.clEnqueueTask = &Guarded<&EnqueueTask>::Fn;
  d.clEnqueueNativeKernel = &Guarded<&EnqueueNativeKernel>::Fn;
  d.clGetExtensionFunctionAddress = &Guarded<&GetExtensionFunctionAddress>::Fn;
  d.clGetExtensionFunctionAddressForPlatform =
      &Guarded<&GetExtensionFunctionAddressForPlatform>::Fn;
  return d;
}

}  // namespace

const cl_icd_dispatch* DispatchTable() {
  static const cl_icd_dispatch table = MakeTable();
  return &table;
}

void* CL_API_CALL GetExtensionFunctionAddress(const char* name) {
  if (name != nullptr && std::strcmp(name, "clIcdGetPlatformIDsKHR") == 0) {
    return reinterpret_cast<void*>(&Guarded<&GetPlatformIDs>::Fn);
  }
  return nullptr;
}

void* CL_API_CALL GetExtensionFunctionAddressForPlatform(cl_platform_id p, const char* name) {
  if (p != &g_platform) return nullptr;
  return GetExtensionFunctionAddress(name);
}

}  // namespace gmux::icd

// ---- the exported ICD entry points (everything else is hidden) ----
// ocl-icd looks clGetPlatformInfo up by name to read the platform's suffix, so it is exported
// beside the three functions every ICD loader needs.

extern "C" {

__attribute__((visibility("default"))) cl_int CL_API_CALL
clIcdGetPlatformIDsKHR(cl_uint num_entries, cl_platform_id* platforms, cl_uint* num_platforms) {
  return gmux::icd::Guarded<&gmux::icd::GetPlatformIDs>::Fn(num_entries, platforms,
                                                              num_platforms);
}

__attribute__((visibility("default"))) void* CL_API_CALL
clGetExtensionFunctionAddress(const char* name) {
  return gmux::icd::Guarded<&gmux::icd::GetExtensionFunctionAddress>::Fn(name);
}

__attribute__((visibility("default"))) void* CL_API_CALL
clGetExtensionFunctionAddressForPlatform(cl_platform_id platform, const char* name) {
  return gmux::icd::Guarded<&gmux::icd::GetExtensionFunctionAddressForPlatform>::Fn(platform,
                                                                                      name);
}

__attribute__((visibility("default"))) cl_int CL_API_CALL
clGetPlatformInfo(cl_platform_id platform, cl_platform_info param, size_t size, void* value,
                  size_t* size_ret) {
  return gmux::icd::Guarded<&gmux::icd::GetPlatformInfo>::Fn(platform, param, size, value,
                                                               size_ret);
}

}  // extern "C"
