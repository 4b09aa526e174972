// cluster_job: what a Slurm job of the cluster test runs, an OpenCL program written the obvious
// way (a std::vector, one launch then clFinish, in a closed loop) that knows nothing of gmux. It
// runs until the wall clock reaches STOP and counts its launches, and those that ended inside
// [FROM, UNTIL) (Unix seconds, so that jobs started a little apart compare the same window).
//
//   cluster_job FROM UNTIL STOP [ITEMS]
//
// Prints one line of JSON: {"launches":N,"window_launches":W,"window_s":S,
// "device_s":D,"platform":"..."} where D sums the launches' profiled END-START.
#include <CL/cl.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

const char* kSource = R"(
__kernel void spin(__global float* out, int iters) {
  size_t i = get_global_id(0);
  float x = (float)i;
  for (int k = 0; k < iters; ++k) x = x * 0.999f + 1.0f;
  out[i] = x;
})";

double Now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

int Fail(const char* what, cl_int err) {
  std::fprintf(stderr, "cluster_job: %s failed: %d\n", what, err);
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: cluster_job FROM UNTIL STOP [ITEMS]\n");
    return 2;
  }
  const double from = std::atof(argv[1]), until = std::atof(argv[2]), stop = std::atof(argv[3]);
  const size_t items = argc > 4 ? std::strtoul(argv[4], nullptr, 10) : 4096;
  cl_platform_id platform = nullptr;
  cl_device_id device = nullptr;
  cl_int err = clGetPlatformIDs(1, &platform, nullptr);
  if (err != CL_SUCCESS) return Fail("clGetPlatformIDs", err);
  err = clGetDeviceIDs(platform, CL_DEVICE_TYPE_ALL, 1, &device, nullptr);
  if (err != CL_SUCCESS) return Fail("clGetDeviceIDs", err);
  char name[256] = {};
  clGetPlatformInfo(platform, CL_PLATFORM_NAME, sizeof(name) - 1, name, nullptr);
  cl_context ctx = clCreateContext(nullptr, 1, &device, nullptr, nullptr, &err);
  if (err != CL_SUCCESS) return Fail("clCreateContext", err);
  cl_command_queue q = clCreateCommandQueue(ctx, device, CL_QUEUE_PROFILING_ENABLE, &err);
  if (err != CL_SUCCESS) return Fail("clCreateCommandQueue", err);
  cl_program prog = clCreateProgramWithSource(ctx, 1, &kSource, nullptr, &err);
  if (err != CL_SUCCESS) return Fail("clCreateProgramWithSource", err);
  err = clBuildProgram(prog, 1, &device, nullptr, nullptr, nullptr);
  if (err != CL_SUCCESS) return Fail("clBuildProgram", err);
  cl_kernel k = clCreateKernel(prog, "spin", &err);
  if (err != CL_SUCCESS) return Fail("clCreateKernel", err);
  std::vector<float> host(items);
  cl_mem out = clCreateBuffer(ctx, CL_MEM_WRITE_ONLY, items * sizeof(float), nullptr, &err);
  if (err != CL_SUCCESS) return Fail("clCreateBuffer", err);
  const cl_int iters = 2000;
  clSetKernelArg(k, 0, sizeof(out), &out);
  clSetKernelArg(k, 1, sizeof(iters), &iters);
  long launches = 0, window = 0;
  double device_s = 0;
  while (Now() < stop) {
    cl_event ev = nullptr;
    err = clEnqueueNDRangeKernel(q, k, 1, nullptr, &items, nullptr, 0, nullptr, &ev);
    if (err != CL_SUCCESS) return Fail("clEnqueueNDRangeKernel", err);
    err = clFinish(q);
    if (err != CL_SUCCESS) return Fail("clFinish", err);
    cl_ulong start = 0, end = 0;
    clGetEventProfilingInfo(ev, CL_PROFILING_COMMAND_START, sizeof(start), &start, nullptr);
    clGetEventProfilingInfo(ev, CL_PROFILING_COMMAND_END, sizeof(end), &end, nullptr);
    clReleaseEvent(ev);
    device_s += static_cast<double>(end - start) * 1e-9;
    ++launches;
    const double t = Now();
    if (t >= from && t < until) ++window;
  }
  // The last result, read back and checked: the loop really ran on a device.
  err = clEnqueueReadBuffer(q, out, CL_TRUE, 0, items * sizeof(float), host.data(), 0, nullptr,
                            nullptr);
  if (err != CL_SUCCESS) return Fail("clEnqueueReadBuffer", err);
  float want = 1.0f;
  for (int i = 0; i < iters; ++i) want = want * 0.999f + 1.0f;
  if (launches > 0 && (host[1] < want * 0.999f || host[1] > want * 1.001f)) {
    std::fprintf(stderr, "cluster_job: wrong result %f (want %f)\n", host[1], want);
    return 1;
  }
  std::printf("{\"launches\":%ld,\"window_launches\":%ld,\"window_s\":%.3f,\"device_s\":%.6f,"
              "\"platform\":\"%s\"}\n",
              launches, window, until - from, device_s, name);
  clReleaseMemObject(out);
  clReleaseKernel(k);
  clReleaseProgram(prog);
  clReleaseCommandQueue(q);
  clReleaseContext(ctx);
  return 0;
}
