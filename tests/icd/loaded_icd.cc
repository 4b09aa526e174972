#include "icd/loaded_icd.h"

#include <dlfcn.h>

#include <CL/cl_ext.h>

#include <condition_variable>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <thread>

namespace gmux::testing {

namespace {

LoadedIcd Load() {
  LoadedIcd icd;
  static std::unique_ptr<FakeDaemon> daemon;  // destroyed at exit, after every test
  auto started = FakeDaemon::Start();
  if (!started.ok()) {
    icd.error = "fake daemon: " + started.status().ToString();
    return icd;
  }
  daemon = std::move(*started);
  // Before the ICD's first device query, which reads both once.
  ::setenv("GMUX_SOCKET", daemon->socket_path().c_str(), 1);
  ::setenv("GMUX_SHM", "0", 1);
  void* lib = ::dlopen(GMUX_ICD_PATH, RTLD_NOW | RTLD_LOCAL);  // never closed
  if (lib == nullptr) {
    icd.error = std::string("dlopen: ") + ::dlerror();
    return icd;
  }
  auto get_platforms =
      reinterpret_cast<clIcdGetPlatformIDsKHR_fn>(::dlsym(lib, "clIcdGetPlatformIDsKHR"));
  if (get_platforms == nullptr) {
    icd.error = "libgmux-icd.so exports no clIcdGetPlatformIDsKHR";
    return icd;
  }
  cl_platform_id platform = nullptr;
  if (cl_int e = get_platforms(1, &platform, nullptr); e != CL_SUCCESS || platform == nullptr) {
    icd.error = "clIcdGetPlatformIDsKHR: " + std::to_string(e);
    return icd;
  }
  const cl_icd_dispatch* cl = *reinterpret_cast<const cl_icd_dispatch* const*>(platform);
  cl_device_id device = nullptr;
  if (cl_int e = cl->clGetDeviceIDs(platform, CL_DEVICE_TYPE_ALL, 1, &device, nullptr);
      e != CL_SUCCESS) {
    icd.error = "clGetDeviceIDs against the fake daemon: " + std::to_string(e);
    return icd;
  }
  icd.daemon = daemon.get();
  icd.cl = cl;
  icd.platform = platform;
  icd.device = device;
  return icd;
}

}  // namespace

const LoadedIcd& Icd() {
  static const LoadedIcd icd = Load();
  return icd;
}

std::optional<cl_int> ReturnsWithin(std::chrono::seconds limit, std::function<cl_int()> call) {
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    std::optional<cl_int> result;
  };
  auto state = std::make_shared<State>();
  std::thread([state, call = std::move(call)] {
    cl_int r = call();
    std::lock_guard<std::mutex> lock(state->mu);
    state->result = r;
    state->cv.notify_all();
  }).detach();
  std::unique_lock<std::mutex> lock(state->mu);
  state->cv.wait_for(lock, limit, [&] { return state->result.has_value(); });
  return state->result;
}

FakeDaemon::Handler OnDeviceInfo(cl_device_info param, std::function<Response(uint64_t)> answer) {
  return [param, answer = std::move(answer)](proto::wire::Request::Reader r) {
    if (r.isGetInfo() && r.getGetInfo().getKind() == proto::wire::ObjectKind::DEVICE &&
        r.getGetInfo().getParam() == param) {
      return answer(r.getSeq());
    }
    return FakeDaemon::Default(r);
  };
}

void IcdTest::SetUp() {
  const LoadedIcd& icd = Icd();
  ASSERT_NE(icd.cl, nullptr) << icd.error;
  daemon().SetHandler(nullptr);
  cl_int err = CL_SUCCESS;
  ctx_ = cl().clCreateContext(nullptr, 1, &icd.device, nullptr, nullptr, &err);
  ASSERT_EQ(err, CL_SUCCESS);
  queue_ = cl().clCreateCommandQueueWithProperties(ctx_, icd.device, nullptr, &err);
  ASSERT_EQ(err, CL_SUCCESS);
  daemon().ClearSeen();
}

void IcdTest::TearDown() {
  if (Icd().cl == nullptr) return;
  if (queue_ != nullptr) cl().clReleaseCommandQueue(queue_);
  if (ctx_ != nullptr) cl().clReleaseContext(ctx_);
  // Returns once a handler still running (which may refer to the test's locals) has finished.
  daemon().SetHandler(nullptr);
}

cl_int IcdTest::Sync() {
  // A marker first: clFinish on a queue whose commands are all known to be done asks nothing.
  const cl_int e = cl().clEnqueueMarkerWithWaitList(queue_, 0, nullptr, nullptr);
  return e != CL_SUCCESS ? e : cl().clFinish(queue_);
}

}  // namespace gmux::testing
