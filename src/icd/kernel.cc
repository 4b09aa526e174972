// Kernels: creation, arguments (kept client-side until the launch), info, launches.
#include "icd/common.h"

namespace gmux::icd {

cl_kernel CL_API_CALL CreateKernel(cl_program p, const char* name, cl_int* err) {
  if (!Valid(p)) return Fail(err, CL_INVALID_PROGRAM);
  if (name == nullptr) return Fail(err, CL_INVALID_VALUE);
  // Owned here until the daemon's reply is read: a reply that throws while read frees it.
  auto owned = std::make_unique<_cl_kernel>();
  _cl_kernel* k = owned.get();
  k->id = Conn().NextId();
  k->program = p;
  k->name = name;
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<wire::Request>().initCreateKernel();
  r.setId(k->id);
  r.setProgram(p->id);
  r.setName(name);
  std::optional<proto::Message> reply;
  cl_int e = Conn().Call(b, &reply);
  if (e != CL_SUCCESS || !reply || !reply->root<wire::Reply>().isKernel()) {
    SetErr(err, e != CL_SUCCESS ? e : CL_OUT_OF_RESOURCES);
    return nullptr;
  }
  auto kr = reply->root<wire::Reply>().getKernel();
  k->args.resize(std::min<uint32_t>(kr.getNumArgs(), 4096));
  // Each list is read once: every read of it counts its whole size against the reply's
  // traversal limit, so reading it per element would be quadratic in the argument count.
  // Arguments the list does not reach are 0 (unknown).
  auto per_arg = [n = k->args.size()](capnp::List<uint32_t>::Reader list) {
    std::vector<uint32_t> out(n, 0);
    for (unsigned i = 0; i < n && i < list.size(); ++i) out[i] = list[i];
    return out;
  };
  k->arg_qualifiers = per_arg(kr.getArgAddressQualifiers());
  k->arg_value_sizes = per_arg(kr.getArgValueSizes());
  RetainProgram(p);
  SetErr(err, CL_SUCCESS);
  return owned.release();
}

cl_int CL_API_CALL CreateKernelsInProgram(cl_program p, cl_uint n, cl_kernel* kernels,
                                          cl_uint* n_ret) {
  if (!Valid(p)) return CL_INVALID_PROGRAM;
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

cl_int CL_API_CALL RetainKernel(cl_kernel k) { return Retain(k); }
cl_int CL_API_CALL ReleaseKernel(cl_kernel k) { return Release(k); }

void Destroy(_cl_kernel* k) {
  cl_program p = k->program;
  delete k;
  ReleaseProgram(p);
}

// A new kernel of the same program and function, with the arguments `source` has now.
cl_kernel CL_API_CALL CloneKernel(cl_kernel source, cl_int* err) {
  if (!Valid(source)) return Fail(err, CL_INVALID_KERNEL);
  cl_int e = CL_SUCCESS;
  cl_kernel k = CreateKernel(source->program, source->name.c_str(), &e);
  if (k == nullptr) return Fail(err, e);
  {
    std::scoped_lock lock(source->mu, k->mu);
    k->args = source->args;
  }
  SetErr(err, CL_SUCCESS);
  return k;
}

cl_int CL_API_CALL SetKernelArg(cl_kernel k, cl_uint index, size_t size, const void* value) {
  if (!Valid(k)) return CL_INVALID_KERNEL;
  std::lock_guard<std::mutex> lock(k->mu);
  if (index >= k->args.size()) return CL_INVALID_ARG_INDEX;
  const cl_uint qual = index < k->arg_qualifiers.size() ? k->arg_qualifiers[index] : 0;
  KernelArgSlot slot;
  if (qual == CL_KERNEL_ARG_ADDRESS_LOCAL || (qual == 0 && value == nullptr && size != sizeof(cl_mem))) {
    if (value != nullptr) return CL_INVALID_ARG_VALUE;
    if (size == 0) return CL_INVALID_ARG_SIZE;  // OpenCL 1.2, 5.7.2
    slot.type = KernelArgSlot::kLocal;
    slot.local = size;
  } else if (value == nullptr) {
    // A by-value argument needs its value (OpenCL 1.2, 5.7.2); a buffer's may be NULL.
    if (qual == CL_KERNEL_ARG_ADDRESS_PRIVATE) return CL_INVALID_ARG_VALUE;
    if (size != sizeof(cl_mem)) return CL_INVALID_ARG_SIZE;
    slot.type = KernelArgSlot::kNullMem;
  } else if (size == sizeof(cl_sampler) && Valid(*static_cast<const cl_sampler*>(value))) {
    cl_sampler smp = *static_cast<const cl_sampler*>(value);
    if (smp->context != k->program->context) return CL_INVALID_SAMPLER;
    slot.type = KernelArgSlot::kSampler;
    slot.mem = smp->id;
  } else if (size == sizeof(cl_mem) && Valid(*static_cast<const cl_mem*>(value)) &&
             (qual == CL_KERNEL_ARG_ADDRESS_GLOBAL || qual == CL_KERNEL_ARG_ADDRESS_CONSTANT ||
              qual == 0 || (*static_cast<const cl_mem*>(value))->is_image())) {
    cl_mem m = *static_cast<const cl_mem*>(value);
    if (m->context != k->program->context) return CL_INVALID_MEM_OBJECT;
    slot.type = KernelArgSlot::kMem;
    slot.mem = m->id;
  } else if ((qual == CL_KERNEL_ARG_ADDRESS_GLOBAL || qual == CL_KERNEL_ARG_ADDRESS_CONSTANT) &&
             size == sizeof(cl_mem) && *static_cast<const cl_mem*>(value) == nullptr) {
    slot.type = KernelArgSlot::kNullMem;  // a pointer to a NULL buffer (OpenCL 1.2, 5.7.2)
  } else if (qual == CL_KERNEL_ARG_ADDRESS_GLOBAL || qual == CL_KERNEL_ARG_ADDRESS_CONSTANT) {
    return CL_INVALID_MEM_OBJECT;
  } else {
    // A by-value argument of a type whose size the worker knows (0: unknown, the backend
    // checks it when the kernel is launched).
    const uint32_t want = index < k->arg_value_sizes.size() ? k->arg_value_sizes[index] : 0;
    if (size == 0 || (want != 0 && size != want)) return CL_INVALID_ARG_SIZE;
    slot.type = KernelArgSlot::kValue;
    const auto* b = static_cast<const uint8_t*>(value);
    slot.bytes.assign(b, b + size);
  }
  k->args[index] = std::move(slot);
  return CL_SUCCESS;
}

cl_int CL_API_CALL GetKernelInfo(cl_kernel k, cl_kernel_info param, size_t size, void* value,
                                 size_t* size_ret) {
  if (!Valid(k)) return CL_INVALID_KERNEL;
  switch (param) {
    case CL_KERNEL_FUNCTION_NAME: return String(k->name, size, value, size_ret);
    case CL_KERNEL_NUM_ARGS: return Scalar<cl_uint>(static_cast<cl_uint>(k->args.size()), size, value, size_ret);
    case CL_KERNEL_REFERENCE_COUNT: return Scalar(RefCount(k), size, value, size_ret);
    case CL_KERNEL_CONTEXT: return Scalar(k->program->context, size, value, size_ret);
    case CL_KERNEL_PROGRAM: return Scalar(k->program, size, value, size_ret);
    default: return RemoteInfoOut(wire::ObjectKind::KERNEL, k->id, param, size, value, size_ret);
  }
}

cl_int CL_API_CALL GetKernelWorkGroupInfo(cl_kernel k, cl_device_id d,
                                          cl_kernel_work_group_info param, size_t size,
                                          void* value, size_t* size_ret) {
  if (!Valid(k)) return CL_INVALID_KERNEL;
  if (d != nullptr && !Is(d, Kind::kDevice)) return CL_INVALID_DEVICE;
  if (d == nullptr) {
    if (k->program->devices.size() != 1) return CL_INVALID_DEVICE;
    d = k->program->devices[0];
  }
  // Fixed once the program is built, so cached per device (CL_KERNEL_LOCAL_MEM_SIZE is not: it
  // counts the __local arguments set since). Only successful answers are kept.
  const bool fixed = param == CL_KERNEL_WORK_GROUP_SIZE ||
                     param == CL_KERNEL_COMPILE_WORK_GROUP_SIZE ||
                     param == CL_KERNEL_PREFERRED_WORK_GROUP_SIZE_MULTIPLE ||
                     param == CL_KERNEL_PRIVATE_MEM_SIZE;
  if (!fixed) return RemoteInfoOut(wire::ObjectKind::KERNEL, k->id, param, size, value, size_ret, d);
  const std::pair<const void*, cl_uint> key{d, param};
  {
    std::lock_guard<std::mutex> lock(k->mu);
    for (const auto& [at, v] : k->wg_info) {
      if (at == key) return CopyOut(v.data(), v.size(), size, value, size_ret);
    }
  }
  std::vector<uint8_t> v;
  cl_int err = RemoteInfo(wire::ObjectKind::KERNEL, k->id, param, v, d);
  if (err != CL_SUCCESS) return err;
  {
    std::lock_guard<std::mutex> lock(k->mu);
    bool known = false;
    for (const auto& e : k->wg_info) known = known || e.first == key;
    if (!known) k->wg_info.emplace_back(key, v);
  }
  return CopyOut(v.data(), v.size(), size, value, size_ret);
}

cl_int CL_API_CALL GetKernelArgInfo(cl_kernel k, cl_uint index, cl_kernel_arg_info param,
                                    size_t size, void* value, size_t* size_ret) {
  if (!Valid(k)) return CL_INVALID_KERNEL;
  if (index >= k->args.size()) return CL_INVALID_ARG_INDEX;
  return RemoteInfoOut(wire::ObjectKind::KERNEL, k->id, param, size, value, size_ret, nullptr, index);
}

namespace {

// The local size against the kernel's and the device's limits, as OpenCL checks them at the
// call (1.2, 5.8: CL_INVALID_WORK_GROUP_SIZE, CL_INVALID_WORK_ITEM_SIZE); the backend would
// fail the command only when it runs. The limits are asked for once per kernel and device.
cl_int CheckLocalSize(cl_command_queue q, cl_kernel k, cl_uint dim, const size_t* local) {
  _cl_kernel::LaunchLimits lim;
  bool known = false;
  {
    std::lock_guard<std::mutex> lock(k->mu);
    for (const auto& l : k->launch_limits) {
      if (l.device == q->device) {
        lim = l;
        known = true;
        break;
      }
    }
  }
  if (!known) {
    lim.device = q->device;
    GetKernelWorkGroupInfo(k, q->device, CL_KERNEL_WORK_GROUP_SIZE, sizeof(lim.kernel_max),
                           &lim.kernel_max, nullptr);
    if (GetKernelWorkGroupInfo(k, q->device, CL_KERNEL_COMPILE_WORK_GROUP_SIZE,
                               sizeof(lim.reqd), lim.reqd, nullptr) != CL_SUCCESS) {
      lim.reqd[0] = lim.reqd[1] = lim.reqd[2] = 0;
    }
    std::vector<uint8_t> items;
    if (DeviceInfo(q->device, CL_DEVICE_MAX_WORK_ITEM_SIZES, items) == CL_SUCCESS &&
        items.size() >= 3 * sizeof(size_t)) {
      std::memcpy(lim.item_max, items.data(), sizeof(lim.item_max));
    }
    std::lock_guard<std::mutex> lock(k->mu);
    k->launch_limits.push_back(lim);
  }
  const bool reqd = lim.reqd[0] != 0;
  if (local == nullptr) return reqd ? CL_INVALID_WORK_GROUP_SIZE : CL_SUCCESS;
  // The work-group checks first, as the backend orders them.
  size_t total = 1;
  for (cl_uint i = 0; i < dim; ++i) {
    if (reqd && local[i] != lim.reqd[i]) return CL_INVALID_WORK_GROUP_SIZE;
    if (__builtin_mul_overflow(total, local[i], &total)) return CL_INVALID_WORK_GROUP_SIZE;
  }
  if (lim.kernel_max != 0 && total > lim.kernel_max) return CL_INVALID_WORK_GROUP_SIZE;
  for (cl_uint i = 0; i < dim; ++i) {
    if (lim.item_max[i] != 0 && local[i] > lim.item_max[i]) return CL_INVALID_WORK_ITEM_SIZE;
  }
  return CL_SUCCESS;
}

}  // namespace

cl_int CL_API_CALL EnqueueNDRangeKernel(cl_command_queue q, cl_kernel k, cl_uint dim,
                                        const size_t* offset, const size_t* global,
                                        const size_t* local, cl_uint nwait, const cl_event* waits,
                                        cl_event* event) {
  if (!Valid(q)) return CL_INVALID_COMMAND_QUEUE;
  if (!Valid(k)) return CL_INVALID_KERNEL;
  if (k->program->context != q->context) return CL_INVALID_CONTEXT;
  if (dim < 1 || dim > 3) return CL_INVALID_WORK_DIMENSION;
  if (global == nullptr) return CL_INVALID_GLOBAL_WORK_SIZE;
  // OpenCL 3.0 allows an empty launch (a zero global size), which runs no work-item but
  // completes as a kernel command after its wait list; 1.2 rejects it. A launch whose global
  // size is not a multiple of its local size needs CL_DEVICE_NON_UNIFORM_WORK_GROUP_SUPPORT,
  // checked here for a clear error (the backend decides the rest, such as the program's -cl-std).
  const bool v30 = Backend30();
  bool empty = false;
  bool non_uniform = false;
  for (cl_uint i = 0; i < dim; ++i) {
    if (global[i] == 0) {
      if (!v30) return CL_INVALID_GLOBAL_WORK_SIZE;
      empty = true;
    }
    if (local != nullptr && local[i] == 0) return CL_INVALID_WORK_GROUP_SIZE;
    if (local != nullptr && global[i] % local[i] != 0) non_uniform = true;
  }
  if (non_uniform &&
      (!v30 || DeviceScalar<cl_bool>(q->device, CL_DEVICE_NON_UNIFORM_WORK_GROUP_SUPPORT,
                                     CL_FALSE) == CL_FALSE)) {
    return CL_INVALID_WORK_GROUP_SIZE;
  }
  {
    std::lock_guard<std::mutex> lock(k->mu);
    for (const KernelArgSlot& s : k->args) {
      if (s.type == KernelArgSlot::kUnset) return CL_INVALID_KERNEL_ARGS;
    }
  }
  if (cl_int e = CheckLocalSize(q, k, dim, local); e != CL_SUCCESS) return e;
  if (empty) return Marker(q, nwait, waits, event, false, CL_COMMAND_NDRANGE_KERNEL);
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
  if (!Valid(q)) return CL_INVALID_COMMAND_QUEUE;
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

cl_int CL_API_CALL GetKernelSubGroupInfo(cl_kernel k, cl_device_id d,
                                         cl_kernel_sub_group_info param, size_t input_size,
                                         const void* input, size_t size, void* value,
                                         size_t* size_ret) {
  if (!Valid(k)) return CL_INVALID_KERNEL;
  if (d != nullptr && (!Is(d, Kind::kDevice) ||
                       std::find(k->program->devices.begin(), k->program->devices.end(), d) ==
                           k->program->devices.end())) {
    return CL_INVALID_DEVICE;
  }
  if (d == nullptr) {
    if (k->program->devices.size() != 1) return CL_INVALID_DEVICE;
    d = k->program->devices[0];
  }
  // The input is a local size (one size_t per dimension) or a sub-group count.
  if (input_size > 3 * sizeof(size_t) || (input_size != 0 && input == nullptr)) {
    return CL_INVALID_VALUE;
  }
  capnp::MallocMessageBuilder b;
  auto gi = b.initRoot<wire::Request>().initGetInfo();
  gi.setKind(wire::ObjectKind::KERNEL);
  gi.setId(k->id);
  gi.setParam(param);
  gi.setHasDevice(true);
  gi.setDevice(d->index);
  gi.setSubGroup(true);
  gi.setInput(kj::arrayPtr(static_cast<const kj::byte*>(input), input_size));
  std::optional<proto::Message> reply;
  if (cl_int e = Conn().Call(b, &reply); e != CL_SUCCESS) return e;
  if (!reply || !reply->root<wire::Reply>().isInfo()) return CL_OUT_OF_RESOURCES;
  auto info = reply->root<wire::Reply>().getInfo();
  return CopyOut(info.begin(), info.size(), size, value, size_ret);
}

}  // namespace gmux::icd
