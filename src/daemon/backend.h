// Backend: the vendor OpenCL platform gmuxd serves, opened directly and never through the
// OpenCL loader, so gmuxd can never load its own ICD.
//
// How: the vendor ICD library is named by BackendOptions::library, or found in the ICD vendor
// directory (/etc/OpenCL/vendors/*.icd, skipping any whose library name contains "gmux"). It is
// dlopen()ed with RTLD_LOCAL, its clIcdGetPlatformIDsKHR (exported, or found through its
// clGetExtensionFunctionAddress) lists its platforms, and every further call goes through the
// dispatch table each ICD object begins with (CL/cl_icd.h). Thread-safe after Open().
#pragma once

#include <CL/cl_icd.h>

#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace gmux::daemon {

struct BackendOptions {
  std::string library;                            // empty: search vendors_dir
  std::string vendors_dir = "/etc/OpenCL/vendors";
  std::string platform = "";                      // substring of the platform name; empty: first
  // The scheduling policy of the threads the backend starts while a worker opens it (a CPU
  // device's compute threads, a driver's helpers): SCHED_BATCH by default, so that, woken by
  // an enqueue, they do not preempt the worker's own threads (docs/policies.md, "The backend's
  // threads run as batch"); false: the default policy.
  bool batch_threads = true;

  Status Validate() const;
};

class Backend {
 public:
  // Errors: kNotFound (no vendor library / platform), kUnavailable (dlopen failure, no devices).
  static Result<std::unique_ptr<Backend>> Open(const BackendOptions& options);

  const cl_icd_dispatch& cl() const { return *dispatch_; }
  cl_platform_id platform() const { return platform_; }
  const std::vector<cl_device_id>& devices() const { return devices_; }
  const std::string& library() const { return library_; }
  std::string PlatformName() const;
  std::string DeviceName(size_t index) const;

 private:
  Backend() = default;
  std::string library_;
  void* handle_ = nullptr;  // never dlclose()d: vendor libraries rarely survive unloading
  const cl_icd_dispatch* dispatch_ = nullptr;
  cl_platform_id platform_ = nullptr;
  std::vector<cl_device_id> devices_;
};

// The library named by each *.icd file in `dir` (sorted by file name), gmux's own skipped.
std::vector<std::string> VendorLibraries(const std::string& dir);

}  // namespace gmux::daemon
