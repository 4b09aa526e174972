// Programs: creation, builds (with the -I headers read here), info.
#include "icd/common.h"
#include "icd/includes.h"

namespace gmux::icd {

namespace {

// Owned by the caller until the daemon has accepted it.
std::unique_ptr<_cl_program> NewProgram(cl_context ctx, std::vector<cl_device_id> devices) {
  auto p = std::make_unique<_cl_program>();
  p->id = Conn().NextId();
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
  if (!Valid(ctx)) return Fail(err, CL_INVALID_CONTEXT);
  if (count == 0 || strings == nullptr) return Fail(err, CL_INVALID_VALUE);
  std::string src;
  for (cl_uint i = 0; i < count; ++i) {
    if (strings[i] == nullptr) return Fail(err, CL_INVALID_VALUE);
    if (lengths == nullptr || lengths[i] == 0) {
      src += strings[i];
    } else {
      src.append(strings[i], lengths[i]);
    }
  }
  auto p = NewProgram(ctx, ctx->devices);
  p->source = src;
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<wire::Request>().initCreateProgramWithSource();
  r.setId(p->id);
  r.setContext(ctx->id);
  r.setSource(src);
  cl_int e = Conn().Call(b);
  if (e != CL_SUCCESS) return Fail(err, e);
  RetainContext(ctx);
  SetErr(err, CL_SUCCESS);
  return p.release();
}

cl_program CL_API_CALL CreateProgramWithBinary(cl_context ctx, cl_uint n, const cl_device_id* devs,
                                               const size_t* lengths, const unsigned char** bins,
                                               cl_int* status, cl_int* err) {
  if (!Valid(ctx)) return Fail(err, CL_INVALID_CONTEXT);
  std::vector<cl_device_id> dl;
  if (n == 0 || !DeviceList(n, devs, ctx->devices, dl)) {
    SetErr(err, n == 0 ? CL_INVALID_VALUE : CL_INVALID_DEVICE);
    return nullptr;
  }
  if (lengths == nullptr || bins == nullptr) return Fail(err, CL_INVALID_VALUE);
  for (cl_uint i = 0; i < n; ++i) {
    if (lengths[i] == 0 || bins[i] == nullptr) {
      if (status != nullptr) status[i] = CL_INVALID_VALUE;
      SetErr(err, CL_INVALID_VALUE);
      return nullptr;
    }
  }
  auto p = NewProgram(ctx, dl);
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<wire::Request>().initCreateProgramWithBinary();
  r.setId(p->id);
  r.setContext(ctx->id);
  FillDevices(r.initDevices(n), dl);
  auto bl = r.initBinaries(n);
  for (cl_uint i = 0; i < n; ++i) bl.set(i, kj::arrayPtr(bins[i], lengths[i]));
  std::optional<proto::Message> reply;
  cl_int e = Conn().Call(b, &reply);
  if (status != nullptr) {
    for (cl_uint i = 0; i < n; ++i) status[i] = e;
    if (reply && reply->root<wire::Reply>().isBinaryStatus()) {
      auto bs = reply->root<wire::Reply>().getBinaryStatus();
      for (cl_uint i = 0; i < n && i < bs.size(); ++i) status[i] = bs[i];
    }
  }
  if (e != CL_SUCCESS) return Fail(err, e);
  RetainContext(ctx);
  SetErr(err, CL_SUCCESS);
  return p.release();
}

cl_int CL_API_CALL RetainProgram(cl_program p) { return Retain(p); }
cl_int CL_API_CALL ReleaseProgram(cl_program p) { return Release(p); }

void Destroy(_cl_program* p) {
  cl_context ctx = p->context;
  delete p;
  ReleaseContext(ctx);
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
  if (!Valid(p)) return CL_INVALID_PROGRAM;
  std::vector<cl_device_id> dl;
  if (!DeviceList(n, devs, p->devices, dl)) return n != 0 && devs == nullptr ? CL_INVALID_VALUE : CL_INVALID_DEVICE;
  if (notify == nullptr && user != nullptr) return CL_INVALID_VALUE;
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<wire::Request>().initBuildProgram();
  r.setProgram(p->id);
  FillDevices(r.initDevices(static_cast<unsigned>(dl.size())), dl);
  FillIncludes(r, options, p->source);
  cl_int e = Conn().Call(b);
  if (notify != nullptr) notify(p, user);
  return e;
}

cl_int CL_API_CALL CompileProgram(cl_program p, cl_uint n, const cl_device_id* devs,
                                  const char* options, cl_uint nh, const cl_program* headers,
                                  const char** names,
                                  void(CL_CALLBACK* notify)(cl_program, void*), void* user) {
  if (!Valid(p)) return CL_INVALID_PROGRAM;
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
    if (!Valid(headers[i])) return CL_INVALID_PROGRAM;
    hl.set(i, headers[i]->id);
    nl.set(i, names[i]);
  }
  cl_int e = Conn().Call(b);
  if (notify != nullptr) notify(p, user);
  return e;
}

cl_program CL_API_CALL LinkProgram(cl_context ctx, cl_uint n, const cl_device_id* devs,
                                   const char* options, cl_uint ni, const cl_program* inputs,
                                   void(CL_CALLBACK* notify)(cl_program, void*), void* user,
                                   cl_int* err) {
  if (!Valid(ctx)) return Fail(err, CL_INVALID_CONTEXT);
  std::vector<cl_device_id> dl;
  if (!DeviceList(n, devs, ctx->devices, dl) || ni == 0 || inputs == nullptr) {
    SetErr(err, CL_INVALID_VALUE);
    return nullptr;
  }
  auto p = NewProgram(ctx, dl.empty() ? ctx->devices : dl);
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<wire::Request>().initLinkProgram();
  r.setId(p->id);
  r.setContext(ctx->id);
  FillDevices(r.initDevices(static_cast<unsigned>(dl.size())), dl);
  r.setOptions(options != nullptr ? options : "");
  auto il = r.initInputs(ni);
  for (cl_uint i = 0; i < ni; ++i) {
    if (!Valid(inputs[i])) return Fail(err, CL_INVALID_PROGRAM);
    il.set(i, inputs[i]->id);
  }
  cl_int e = Conn().Call(b);
  if (e != CL_SUCCESS && e != CL_LINK_PROGRAM_FAILURE) return Fail(err, e);
  // A failed link still yields a program whose build log explains the failure.
  RetainContext(ctx);
  if (notify != nullptr) notify(p.get(), user);
  SetErr(err, e);
  return p.release();
}

cl_int CL_API_CALL UnloadCompiler() { return CL_SUCCESS; }
cl_int CL_API_CALL UnloadPlatformCompiler(cl_platform_id p) {
  return p == Platform() ? CL_SUCCESS : CL_INVALID_PLATFORM;
}

cl_int CL_API_CALL GetProgramInfo(cl_program p, cl_program_info param, size_t size, void* value,
                                  size_t* size_ret) {
  if (!Valid(p)) return CL_INVALID_PROGRAM;
  switch (param) {
    case CL_PROGRAM_REFERENCE_COUNT: return Scalar(RefCount(p), size, value, size_ret);
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
  if (!Valid(p)) return CL_INVALID_PROGRAM;
  if (!Is(d, Kind::kDevice) || std::find(p->devices.begin(), p->devices.end(), d) == p->devices.end()) {
    return CL_INVALID_DEVICE;
  }
  return RemoteInfoOut(wire::ObjectKind::PROGRAM, p->id, param, size, value, size_ret, d);
}
// An IL program (SPIR-V): forwarded whole; the backend says whether its devices take IL
// (CL_INVALID_OPERATION when none does). Its kernels always run whole: there is no source to
// make them splittable.
cl_program CL_API_CALL CreateProgramWithIL(cl_context ctx, const void* il, size_t length,
                                           cl_int* err) {
  if (!Valid(ctx)) return Fail(err, CL_INVALID_CONTEXT);
  if (il == nullptr || length == 0) return Fail(err, CL_INVALID_VALUE);
  auto p = NewProgram(ctx, ctx->devices);
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<wire::Request>().initCreateProgramWithIL();
  r.setId(p->id);
  r.setContext(ctx->id);
  r.setIl(kj::arrayPtr(static_cast<const kj::byte*>(il), length));
  if (cl_int e = Conn().Call(b); e != CL_SUCCESS) return Fail(err, e);
  RetainContext(ctx);
  SetErr(err, CL_SUCCESS);
  return p.release();
}

cl_program CL_API_CALL CreateProgramWithBuiltInKernels(cl_context ctx, cl_uint n,
                                                       const cl_device_id* devs,
                                                       const char* names, cl_int* err) {
  if (!Valid(ctx)) return Fail(err, CL_INVALID_CONTEXT);
  if (n == 0 || devs == nullptr || names == nullptr) return Fail(err, CL_INVALID_VALUE);
  std::vector<cl_device_id> dl;
  if (!DeviceList(n, devs, ctx->devices, dl)) return Fail(err, CL_INVALID_DEVICE);
  auto p = NewProgram(ctx, dl);
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<wire::Request>().initCreateProgramWithBuiltInKernels();
  r.setId(p->id);
  r.setContext(ctx->id);
  FillDevices(r.initDevices(n), dl);
  r.setKernelNames(names);
  if (cl_int e = Conn().Call(b); e != CL_SUCCESS) return Fail(err, e);
  RetainContext(ctx);
  SetErr(err, CL_SUCCESS);
  return p.release();
}

cl_int CL_API_CALL SetProgramSpecializationConstant(cl_program p, cl_uint spec_id,
                                                   size_t spec_size, const void* spec_value) {
  if (!Valid(p)) return CL_INVALID_PROGRAM;
  if (spec_value == nullptr || spec_size == 0) return CL_INVALID_VALUE;
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<wire::Request>().initSetSpecConstant();
  r.setProgram(p->id);
  r.setSpecId(spec_id);
  r.setValue(kj::arrayPtr(static_cast<const kj::byte*>(spec_value), spec_size));
  return Conn().Call(b);
}

}  // namespace gmux::icd
