// The platform and its devices: what the application sees of the daemon's devices, with the
// backend's device info filtered to what works through gmux.
//
// Versions. gmux reports OpenCL 3.0 when the backend platform does, and 1.2 otherwise: 3.0
// makes SVM, pipes, device-side enqueue and the other 2.x features optional, and a device
// reached through gmux has none of them (its memory lives in another process, and its kernels
// are scheduled by the daemon), so a 2.x backend is reported as 1.2. A 3.0 device keeps its
// version with those features reported absent (docs/conformance.md).
#include <cstdio>
#include <map>
#include <set>

#include "icd/common.h"

namespace gmux::icd {

namespace {

// Never destroyed: the devices live as long as the process (an application may still call in
// from its own exit handlers), and they stay reachable for leak checkers.
struct Devices {
  std::mutex mu;  // guards everything here
  std::vector<_cl_device_id*> list;
  bool ready = false;
  std::map<std::pair<uint32_t, cl_uint>, std::vector<uint8_t>> info;  // filtered, by device
};

Devices& TheDevices() {
  static auto* d = new Devices();
  return *d;
}

struct Version {
  int major = 0;
  int minor = 0;
};

// "OpenCL 3.0 ..." / "OpenCL C 1.2 ..." → {3, 0} / {1, 2}; {0, 0} when unreadable.
Version ParseVersion(const std::string& s, const char* prefix) {
  Version v;
  if (s.rfind(prefix, 0) != 0 ||
      std::sscanf(s.c_str() + std::strlen(prefix), "%d.%d", &v.major, &v.minor) != 2) {
    return {};
  }
  return v;
}

// Replaces the "X.Y" after `prefix`, keeping the backend's own description after it.
std::string WithVersion(const std::string& s, const char* prefix, const char* version) {
  size_t sp = s.find(' ', std::strlen(prefix));
  return prefix + std::string(version) + (sp == std::string::npos ? std::string() : s.substr(sp));
}

std::string AsString(const std::vector<uint8_t>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), strnlen(reinterpret_cast<const char*>(v.data()), v.size()));
}

void SetString(std::vector<uint8_t>& v, const std::string& s) {
  v.assign(s.begin(), s.end());
  v.push_back(0);
}

template <typename T>
void SetScalar(std::vector<uint8_t>& v, T t) {
  v.resize(sizeof(T));
  std::memcpy(v.data(), &t, sizeof(T));
}

// The device extensions that work through gmux: those of the kernel language and of info
// queries alone. An extension that adds host API functions (cl_khr_subgroups,
// cl_khr_il_program, cl_khr_command_buffer, sharing with GL, vendor APIs, ...) is not
// reported, since the ICD does not carry its functions to the backend.
bool DeviceSideExtension(const std::string& name) {
  static const std::set<std::string> kAllowed = {
      "cl_khr_byte_addressable_store",
      "cl_khr_fp16",
      "cl_khr_fp64",
      "cl_khr_int64",
      "cl_khr_global_int32_base_atomics",
      "cl_khr_global_int32_extended_atomics",
      "cl_khr_local_int32_base_atomics",
      "cl_khr_local_int32_extended_atomics",
      "cl_khr_int64_base_atomics",
      "cl_khr_int64_extended_atomics",
      "cl_khr_3d_image_writes",
      "cl_khr_depth_images",
      "cl_khr_image2d_from_buffer",
      "cl_khr_srgb_image_writes",
      "cl_khr_select_fprounding_mode",
      "cl_khr_spir",
      "cl_khr_device_uuid",
      "cl_khr_pci_bus_info",
      "cl_khr_extended_versioning",
      "cl_khr_integer_dot_product",
      "cl_khr_expect_assume",
      "cl_khr_extended_bit_ops",
      "cl_khr_kernel_clock",
      "cl_khr_work_group_uniform_arithmetic",
      "cl_khr_subgroup_extended_types",
      "cl_khr_subgroup_non_uniform_vote",
      "cl_khr_subgroup_ballot",
      "cl_khr_subgroup_non_uniform_arithmetic",
      "cl_khr_subgroup_shuffle",
      "cl_khr_subgroup_shuffle_relative",
      "cl_khr_subgroup_clustered_reduce",
      "cl_khr_subgroup_rotate",
      "cl_ext_float_atomics",
      "cl_ext_cxx_for_opencl",
  };
  return kAllowed.count(name) != 0;
}

// OpenCL C features that need what gmux turns off.
bool OffFeature(const char* name) {
  return std::strcmp(name, "__opencl_c_pipes") == 0 ||
         std::strcmp(name, "__opencl_c_device_enqueue") == 0;
}

// The size of a device info value of fixed size (0 for strings and arrays): a value of another
// size from the daemon is refused rather than half copied.
size_t FixedSize(cl_device_info param) {
  switch (param) {
    case CL_DEVICE_TYPE: return sizeof(cl_device_type);
    case CL_DEVICE_VENDOR_ID:
    case CL_DEVICE_MAX_COMPUTE_UNITS:
    case CL_DEVICE_MAX_WORK_ITEM_DIMENSIONS:
    case CL_DEVICE_PREFERRED_VECTOR_WIDTH_CHAR:
    case CL_DEVICE_PREFERRED_VECTOR_WIDTH_SHORT:
    case CL_DEVICE_PREFERRED_VECTOR_WIDTH_INT:
    case CL_DEVICE_PREFERRED_VECTOR_WIDTH_LONG:
    case CL_DEVICE_PREFERRED_VECTOR_WIDTH_FLOAT:
    case CL_DEVICE_PREFERRED_VECTOR_WIDTH_DOUBLE:
    case CL_DEVICE_PREFERRED_VECTOR_WIDTH_HALF:
    case CL_DEVICE_NATIVE_VECTOR_WIDTH_CHAR:
    case CL_DEVICE_NATIVE_VECTOR_WIDTH_SHORT:
    case CL_DEVICE_NATIVE_VECTOR_WIDTH_INT:
    case CL_DEVICE_NATIVE_VECTOR_WIDTH_LONG:
    case CL_DEVICE_NATIVE_VECTOR_WIDTH_FLOAT:
    case CL_DEVICE_NATIVE_VECTOR_WIDTH_DOUBLE:
    case CL_DEVICE_NATIVE_VECTOR_WIDTH_HALF:
    case CL_DEVICE_MAX_CLOCK_FREQUENCY:
    case CL_DEVICE_ADDRESS_BITS:
    case CL_DEVICE_MAX_READ_IMAGE_ARGS:
    case CL_DEVICE_MAX_WRITE_IMAGE_ARGS:
    case CL_DEVICE_MAX_READ_WRITE_IMAGE_ARGS:
    case CL_DEVICE_MAX_SAMPLERS:
    case CL_DEVICE_MEM_BASE_ADDR_ALIGN:
    case CL_DEVICE_MIN_DATA_TYPE_ALIGN_SIZE:
    case CL_DEVICE_GLOBAL_MEM_CACHELINE_SIZE:
    case CL_DEVICE_MAX_CONSTANT_ARGS:
    case CL_DEVICE_PARTITION_MAX_SUB_DEVICES:
    case CL_DEVICE_IMAGE_PITCH_ALIGNMENT:
    case CL_DEVICE_IMAGE_BASE_ADDRESS_ALIGNMENT:
    case CL_DEVICE_MAX_PIPE_ARGS:
    case CL_DEVICE_PIPE_MAX_ACTIVE_RESERVATIONS:
    case CL_DEVICE_PIPE_MAX_PACKET_SIZE:
    case CL_DEVICE_QUEUE_ON_DEVICE_PREFERRED_SIZE:
    case CL_DEVICE_QUEUE_ON_DEVICE_MAX_SIZE:
    case CL_DEVICE_MAX_ON_DEVICE_QUEUES:
    case CL_DEVICE_MAX_ON_DEVICE_EVENTS:
    case CL_DEVICE_PREFERRED_PLATFORM_ATOMIC_ALIGNMENT:
    case CL_DEVICE_PREFERRED_GLOBAL_ATOMIC_ALIGNMENT:
    case CL_DEVICE_PREFERRED_LOCAL_ATOMIC_ALIGNMENT:
    case CL_DEVICE_MAX_NUM_SUB_GROUPS:
    case CL_DEVICE_NUMERIC_VERSION:
      return sizeof(cl_uint);
    case CL_DEVICE_MAX_WORK_GROUP_SIZE:
    case CL_DEVICE_IMAGE2D_MAX_WIDTH:
    case CL_DEVICE_IMAGE2D_MAX_HEIGHT:
    case CL_DEVICE_IMAGE3D_MAX_WIDTH:
    case CL_DEVICE_IMAGE3D_MAX_HEIGHT:
    case CL_DEVICE_IMAGE3D_MAX_DEPTH:
    case CL_DEVICE_IMAGE_MAX_BUFFER_SIZE:
    case CL_DEVICE_IMAGE_MAX_ARRAY_SIZE:
    case CL_DEVICE_MAX_PARAMETER_SIZE:
    case CL_DEVICE_PROFILING_TIMER_RESOLUTION:
    case CL_DEVICE_PRINTF_BUFFER_SIZE:
    case CL_DEVICE_MAX_GLOBAL_VARIABLE_SIZE:
    case CL_DEVICE_GLOBAL_VARIABLE_PREFERRED_TOTAL_SIZE:
    case CL_DEVICE_PREFERRED_WORK_GROUP_SIZE_MULTIPLE:
      return sizeof(size_t);
    case CL_DEVICE_MAX_MEM_ALLOC_SIZE:
    case CL_DEVICE_GLOBAL_MEM_CACHE_SIZE:
    case CL_DEVICE_GLOBAL_MEM_SIZE:
    case CL_DEVICE_MAX_CONSTANT_BUFFER_SIZE:
    case CL_DEVICE_LOCAL_MEM_SIZE:
      return sizeof(cl_ulong);
    case CL_DEVICE_IMAGE_SUPPORT:
    case CL_DEVICE_ERROR_CORRECTION_SUPPORT:
    case CL_DEVICE_HOST_UNIFIED_MEMORY:
    case CL_DEVICE_ENDIAN_LITTLE:
    case CL_DEVICE_AVAILABLE:
    case CL_DEVICE_COMPILER_AVAILABLE:
    case CL_DEVICE_LINKER_AVAILABLE:
    case CL_DEVICE_PREFERRED_INTEROP_USER_SYNC:
    case CL_DEVICE_SUB_GROUP_INDEPENDENT_FORWARD_PROGRESS:
    case CL_DEVICE_NON_UNIFORM_WORK_GROUP_SUPPORT:
    case CL_DEVICE_WORK_GROUP_COLLECTIVE_FUNCTIONS_SUPPORT:
    case CL_DEVICE_GENERIC_ADDRESS_SPACE_SUPPORT:
    case CL_DEVICE_PIPE_SUPPORT:
      return sizeof(cl_bool);
    case CL_DEVICE_GLOBAL_MEM_CACHE_TYPE: return sizeof(cl_device_mem_cache_type);
    case CL_DEVICE_LOCAL_MEM_TYPE: return sizeof(cl_device_local_mem_type);
    case CL_DEVICE_SINGLE_FP_CONFIG:
    case CL_DEVICE_DOUBLE_FP_CONFIG:
    case CL_DEVICE_HALF_FP_CONFIG:
    case CL_DEVICE_EXECUTION_CAPABILITIES:
    case CL_DEVICE_QUEUE_ON_HOST_PROPERTIES:
    case CL_DEVICE_QUEUE_ON_DEVICE_PROPERTIES:
    case CL_DEVICE_SVM_CAPABILITIES:
    case CL_DEVICE_PARTITION_AFFINITY_DOMAIN:
    case CL_DEVICE_ATOMIC_MEMORY_CAPABILITIES:
    case CL_DEVICE_ATOMIC_FENCE_CAPABILITIES:
    case CL_DEVICE_DEVICE_ENQUEUE_CAPABILITIES:
      return sizeof(cl_bitfield);
    default: return 0;
  }
}

// Rewrites a backend device info value into what the application sees through gmux.
void Filter(cl_device_info param, std::vector<uint8_t>& v) {
  const bool v30 = Backend30();
  switch (param) {
    case CL_DEVICE_EXECUTION_CAPABILITIES:
      // A native kernel is a function of the application's address space, which the worker
      // process cannot call: the device does not offer native kernels through gmux.
      if (v.size() == sizeof(cl_device_exec_capabilities)) {
        cl_device_exec_capabilities caps;
        std::memcpy(&caps, v.data(), sizeof(caps));
        SetScalar<cl_device_exec_capabilities>(v, caps & ~static_cast<cl_device_exec_capabilities>(CL_EXEC_NATIVE_KERNEL));
      }
      break;
    case CL_DEVICE_VERSION: {
      // A 2.x device (or any device above 1.2 on a platform gmux reports as 1.2) is 1.2.
      std::string s = AsString(v);
      Version ver = ParseVersion(s, "OpenCL ");
      if ((ver.major == 2 || (ver.major >= 3 && !v30)) ) SetString(v, WithVersion(s, "OpenCL ", "1.2"));
      break;
    }
    case CL_DEVICE_NUMERIC_VERSION:
      if (v.size() == sizeof(cl_version)) {
        cl_version ver;
        std::memcpy(&ver, v.data(), sizeof(ver));
        const cl_version major = CL_VERSION_MAJOR(ver);
        if (major == 2 || (major >= 3 && !v30)) SetScalar<cl_version>(v, CL_MAKE_VERSION(1, 2, 0));
      }
      break;
    case CL_DEVICE_OPENCL_C_VERSION: {
      // OpenCL C 2.x requires pipes and device-side enqueue.
      std::string s = AsString(v);
      Version ver = ParseVersion(s, "OpenCL C ");
      if (ver.major == 2 || (ver.major >= 3 && !v30)) SetString(v, WithVersion(s, "OpenCL C ", "1.2"));
      break;
    }
    case CL_DEVICE_OPENCL_C_ALL_VERSIONS: {
      std::vector<uint8_t> kept;
      for (size_t at = 0; at + sizeof(cl_name_version) <= v.size(); at += sizeof(cl_name_version)) {
        cl_name_version nv;
        std::memcpy(&nv, v.data() + at, sizeof(nv));
        if (CL_VERSION_MAJOR(nv.version) == 2) continue;
        kept.insert(kept.end(), v.data() + at, v.data() + at + sizeof(nv));
      }
      v = std::move(kept);
      break;
    }
    case CL_DEVICE_EXTENSIONS: {
      std::string s = AsString(v), out, name;
      for (size_t at = 0; at <= s.size(); ++at) {
        if (at == s.size() || s[at] == ' ') {
          if (DeviceSideExtension(name)) out += (out.empty() ? "" : " ") + name;
          name.clear();
        } else {
          name += s[at];
        }
      }
      SetString(v, out);
      break;
    }
    case CL_DEVICE_EXTENSIONS_WITH_VERSION:
    case CL_DEVICE_OPENCL_C_FEATURES: {
      std::vector<uint8_t> kept;
      for (size_t at = 0; at + sizeof(cl_name_version) <= v.size(); at += sizeof(cl_name_version)) {
        cl_name_version nv;
        std::memcpy(&nv, v.data() + at, sizeof(nv));
        nv.name[CL_NAME_VERSION_MAX_NAME_SIZE - 1] = '\0';
        bool keep = param == CL_DEVICE_EXTENSIONS_WITH_VERSION ? DeviceSideExtension(nv.name)
                                                              : !OffFeature(nv.name);
        if (keep) kept.insert(kept.end(), v.data() + at, v.data() + at + sizeof(nv));
      }
      v = std::move(kept);
      break;
    }
    // Shared virtual memory, device-side enqueue and pipes: none through gmux.
    case CL_DEVICE_SVM_CAPABILITIES: SetScalar<cl_device_svm_capabilities>(v, 0); break;
    case CL_DEVICE_DEVICE_ENQUEUE_CAPABILITIES:
      SetScalar<cl_device_device_enqueue_capabilities>(v, 0);
      break;
    case CL_DEVICE_QUEUE_ON_DEVICE_PROPERTIES: SetScalar<cl_command_queue_properties>(v, 0); break;
    case CL_DEVICE_QUEUE_ON_DEVICE_PREFERRED_SIZE:
    case CL_DEVICE_QUEUE_ON_DEVICE_MAX_SIZE:
    case CL_DEVICE_MAX_ON_DEVICE_QUEUES:
    case CL_DEVICE_MAX_ON_DEVICE_EVENTS:
    case CL_DEVICE_MAX_PIPE_ARGS:
    case CL_DEVICE_PIPE_MAX_ACTIVE_RESERVATIONS:
    case CL_DEVICE_PIPE_MAX_PACKET_SIZE:
      SetScalar<cl_uint>(v, 0);
      break;
    case CL_DEVICE_PIPE_SUPPORT: SetScalar<cl_bool>(v, CL_FALSE); break;
    // Sub-devices are not offered (clCreateSubDevices is not carried to the backend).
    case CL_DEVICE_PARTITION_MAX_SUB_DEVICES: SetScalar<cl_uint>(v, 0); break;
    case CL_DEVICE_PARTITION_PROPERTIES: SetScalar<cl_device_partition_property>(v, 0); break;
    case CL_DEVICE_PARTITION_AFFINITY_DOMAIN:
      SetScalar<cl_device_affinity_domain>(v, 0);
      break;
    default: break;
  }
}

}  // namespace

_cl_platform_id* Platform() {
  static auto* p = new _cl_platform_id();
  return p;
}

bool Backend30() {
  // Asked once a daemon answers (until then: no devices, and 1.2).
  static std::atomic<int> known{-1};
  int k = known.load();
  if (k < 0) {
    std::vector<uint8_t> v;
    try {
      if (RemoteInfo(wire::ObjectKind::PLATFORM, 0, CL_PLATFORM_VERSION, v) != CL_SUCCESS) {
        return false;
      }
    } catch (...) {
      return false;  // an unreadable answer: as if no daemon answered (asked again next time)
    }
    k = ParseVersion(AsString(v), "OpenCL ").major >= 3 ? 1 : 0;
    known.store(k);
  }
  return k == 1;
}

void EnsureDevices() {
  Connection* c = TryConn();
  Devices& d = TheDevices();
  std::lock_guard<std::mutex> lock(d.mu);
  if (d.ready || c == nullptr) return;
  for (const auto& desc : c->devices()) {
    auto* dev = new _cl_device_id();
    dev->index = desc.index;
    dev->type = desc.type;
    dev->id = desc.index;
    d.list.push_back(dev);
  }
  d.ready = true;
}

bool KnownDevice(cl_device_id dev) {
  Devices& d = TheDevices();
  std::lock_guard<std::mutex> lock(d.mu);
  return std::find(d.list.begin(), d.list.end(), dev) != d.list.end();
}

cl_int DeviceInfo(cl_device_id device, cl_device_info param, std::vector<uint8_t>& out) {
  Devices& d = TheDevices();
  {
    std::lock_guard<std::mutex> lock(d.mu);
    auto it = d.info.find({device->index, param});
    if (it != d.info.end()) {
      out = it->second;
      return CL_SUCCESS;
    }
  }
  std::vector<uint8_t> v;
  cl_int err = RemoteInfo(wire::ObjectKind::DEVICE, device->index, param, v);
  if (err != CL_SUCCESS) return err;
  Filter(param, v);  // first: what gmux answers itself is not the backend's to size
  if (size_t n = FixedSize(param); n != 0 && v.size() != n) return CL_OUT_OF_RESOURCES;
  out = v;
  std::lock_guard<std::mutex> lock(d.mu);
  d.info[{device->index, param}] = std::move(v);
  return CL_SUCCESS;
}

cl_int CL_API_CALL GetPlatformIDs(cl_uint num_entries, cl_platform_id* platforms,
                                  cl_uint* num_platforms) {
  if ((num_entries == 0 && platforms != nullptr) ||
      (platforms == nullptr && num_platforms == nullptr)) {
    return CL_INVALID_VALUE;
  }
  if (platforms != nullptr) platforms[0] = Platform();
  if (num_platforms != nullptr) *num_platforms = 1;
  return CL_SUCCESS;
}

cl_int CL_API_CALL GetPlatformInfo(cl_platform_id platform, cl_platform_info param, size_t size,
                                   void* value, size_t* size_ret) {
  if (platform != nullptr && platform != Platform()) return CL_INVALID_PLATFORM;
  switch (param) {
    case CL_PLATFORM_PROFILE: return String("FULL_PROFILE", size, value, size_ret);
    case CL_PLATFORM_VERSION:
      return String(Backend30() ? "OpenCL 3.0 gmux 0.1" : "OpenCL 1.2 gmux 0.1", size, value,
                    size_ret);
    case CL_PLATFORM_NUMERIC_VERSION:
      return Scalar<cl_version>(
          Backend30() ? CL_MAKE_VERSION(3, 0, 0) : CL_MAKE_VERSION(1, 2, 0), size, value,
          size_ret);
    case CL_PLATFORM_NAME: return String("gmux", size, value, size_ret);
    case CL_PLATFORM_VENDOR: return String("gmux", size, value, size_ret);
    case CL_PLATFORM_EXTENSIONS: return String("cl_khr_icd", size, value, size_ret);
    case CL_PLATFORM_EXTENSIONS_WITH_VERSION: {
      cl_name_version icd{CL_MAKE_VERSION(1, 0, 0), "cl_khr_icd"};
      return Scalar(icd, size, value, size_ret);
    }
    // The host's clock is not the device's through another process: no host timer, so
    // clGetDeviceAndHostTimer and clGetHostTimer answer CL_INVALID_OPERATION.
    case CL_PLATFORM_HOST_TIMER_RESOLUTION: return Scalar<cl_ulong>(0, size, value, size_ret);
    case CL_PLATFORM_ICD_SUFFIX_KHR: return String("gmux", size, value, size_ret);
    default: return CL_INVALID_VALUE;
  }
}

cl_int CL_API_CALL GetDeviceIDs(cl_platform_id platform, cl_device_type type, cl_uint num_entries,
                                cl_device_id* devices, cl_uint* num_devices) {
  if (platform != nullptr && platform != Platform()) return CL_INVALID_PLATFORM;
  if ((num_entries == 0 && devices != nullptr) || (devices == nullptr && num_devices == nullptr)) {
    return CL_INVALID_VALUE;
  }
  EnsureDevices();
  std::vector<cl_device_id> match;
  {
    Devices& d = TheDevices();
    std::lock_guard<std::mutex> lock(d.mu);
    for (auto* dev : d.list) {
      bool ok = type == CL_DEVICE_TYPE_ALL || (dev->type & type) != 0 ||
                (type == CL_DEVICE_TYPE_DEFAULT && dev == d.list.front());
      if (ok) match.push_back(dev);
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
    case CL_DEVICE_PLATFORM: return Scalar<cl_platform_id>(Platform(), size, value, size_ret);
    case CL_DEVICE_PARENT_DEVICE: return Scalar<cl_device_id>(nullptr, size, value, size_ret);
    case CL_DEVICE_REFERENCE_COUNT: return Scalar<cl_uint>(1, size, value, size_ret);
    default: break;
  }
  std::vector<uint8_t> v;
  if (cl_int err = DeviceInfo(device, param, v); err != CL_SUCCESS) return err;
  return CopyOut(v.data(), v.size(), size, value, size_ret);
}

// Root devices are not reference counted.
cl_int CL_API_CALL RetainDevice(cl_device_id d) {
  return Is(d, Kind::kDevice) ? CL_SUCCESS : CL_INVALID_DEVICE;
}
cl_int CL_API_CALL ReleaseDevice(cl_device_id d) {
  return Is(d, Kind::kDevice) ? CL_SUCCESS : CL_INVALID_DEVICE;
}

cl_int CL_API_CALL GetDeviceAndHostTimer(cl_device_id d, cl_ulong* device_ts, cl_ulong* host_ts) {
  if (!Is(d, Kind::kDevice)) return CL_INVALID_DEVICE;
  if (device_ts == nullptr || host_ts == nullptr) return CL_INVALID_VALUE;
  return CL_INVALID_OPERATION;  // CL_PLATFORM_HOST_TIMER_RESOLUTION is 0
}

cl_int CL_API_CALL GetHostTimer(cl_device_id d, cl_ulong* host_ts) {
  if (!Is(d, Kind::kDevice)) return CL_INVALID_DEVICE;
  if (host_ts == nullptr) return CL_INVALID_VALUE;
  return CL_INVALID_OPERATION;
}

}  // namespace gmux::icd
