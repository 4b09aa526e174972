// The dispatch table every object of libgmux-icd points to, built from the one list of slots
// (dispatch_slots.inc), and the symbols the library exports.
#include <cstring>
#include <new>
#include <tuple>
#include <type_traits>

#include "icd/common.h"

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
    } catch (const NoDaemon&) {
      code = CL_DEVICE_NOT_AVAILABLE;
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
#define GMUX_API(slot, fn) d.slot = &Guarded<&fn>::Fn;
#define GMUX_NONE(slot) FillUnsupported(d.slot);
#include "icd/dispatch_slots.inc"
#undef GMUX_API
#undef GMUX_NONE
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
  if (p != Platform()) return nullptr;
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

