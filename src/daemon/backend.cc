#include "daemon/backend.h"

#include <dlfcn.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "daemon/cl_ref.h"

namespace gmux::daemon {

std::atomic<int64_t>& LiveBackendCounter() {
  static std::atomic<int64_t> counter{0};
  return counter;
}

Status BackendOptions::Validate() const {
  if (library.empty() && vendors_dir.empty()) {
    return InvalidArgument("backend: set either library or vendors_dir");
  }
  return Status::Ok();
}

std::vector<std::string> VendorLibraries(const std::string& dir) {
  std::vector<std::filesystem::path> files;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    if (entry.path().extension() == ".icd") files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  std::vector<std::string> libs;
  for (const auto& f : files) {
    std::ifstream in(f);
    std::string line;
    std::getline(in, line);
    while (!line.empty() && (line.back() == '\n' || line.back() == '\r' || line.back() == ' ')) {
      line.pop_back();
    }
    if (line.empty() || line.find("gmux") != std::string::npos) continue;
    libs.push_back(line);
  }
  return libs;
}

namespace {

std::string PlatformString(const cl_icd_dispatch& d, cl_platform_id p, cl_platform_info what) {
  size_t n = 0;
  if (d.clGetPlatformInfo(p, what, 0, nullptr, &n) != CL_SUCCESS || n == 0) return "";
  std::string s(n, '\0');
  if (d.clGetPlatformInfo(p, what, n, s.data(), nullptr) != CL_SUCCESS) return "";
  s.resize(n - 1);
  return s;
}

}  // namespace

std::string Backend::PlatformName() const {
  return PlatformString(*dispatch_, platform_, CL_PLATFORM_NAME);
}

std::string Backend::DeviceName(size_t index) const {
  size_t n = 0;
  cl_device_id dev = devices_.at(index);
  if (dispatch_->clGetDeviceInfo(dev, CL_DEVICE_NAME, 0, nullptr, &n) != CL_SUCCESS) return "";
  std::string s(n, '\0');
  dispatch_->clGetDeviceInfo(dev, CL_DEVICE_NAME, n, s.data(), nullptr);
  if (!s.empty()) s.resize(n - 1);
  return s;
}

Result<std::unique_ptr<Backend>> Backend::Open(const BackendOptions& options) {
  GMUX_RETURN_IF_ERROR(options.Validate());
  std::vector<std::string> candidates;
  if (!options.library.empty()) {
    candidates.push_back(options.library);
  } else {
    candidates = VendorLibraries(options.vendors_dir);
    if (candidates.empty()) {
      return NotFound("no OpenCL vendor ICD found in " + options.vendors_dir +
                      " (set [backend] library in the config)");
    }
  }
  std::string errors;
  for (const auto& lib : candidates) {
    void* h = ::dlopen(lib.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) {
      errors += "; " + lib + ": " + ::dlerror();
      continue;
    }
    using GetIds = cl_int (*)(cl_uint, cl_platform_id*, cl_uint*);
    using GetExt = void* (*)(const char*);
    auto get_ids = reinterpret_cast<GetIds>(::dlsym(h, "clIcdGetPlatformIDsKHR"));
    if (get_ids == nullptr) {
      auto ext = reinterpret_cast<GetExt>(::dlsym(h, "clGetExtensionFunctionAddress"));
      if (ext != nullptr) get_ids = reinterpret_cast<GetIds>(ext("clIcdGetPlatformIDsKHR"));
    }
    if (get_ids == nullptr) {
      errors += "; " + lib + ": not an ICD (no clIcdGetPlatformIDsKHR)";
      continue;
    }
    cl_uint n = 0;
    if (get_ids(0, nullptr, &n) != CL_SUCCESS || n == 0) {
      errors += "; " + lib + ": no platforms";
      continue;
    }
    std::vector<cl_platform_id> platforms(n);
    get_ids(n, platforms.data(), nullptr);
    for (cl_platform_id p : platforms) {
      const cl_icd_dispatch& d = Dispatch(p);
      std::string name = PlatformString(d, p, CL_PLATFORM_NAME);
      if (!options.platform.empty() && name.find(options.platform) == std::string::npos) continue;
      cl_uint nd = 0;
      if (d.clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, 0, nullptr, &nd) != CL_SUCCESS || nd == 0) {
        errors += "; " + lib + ": platform '" + name + "' has no devices";
        continue;
      }
      auto b = std::unique_ptr<Backend>(new Backend());
      b->library_ = lib;
      b->handle_ = h;
      b->dispatch_ = &d;
      b->platform_ = p;
      b->devices_.resize(nd);
      d.clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, nd, b->devices_.data(), nullptr);
      return b;
    }
  }
  return Unavailable("no usable OpenCL backend platform" + errors);
}

}  // namespace gmux::daemon
