// plain_launch: tiny kernel launches written the obvious way, as a user's program would issue
// them, for comparing gmux against native PoCL (or one gmux build against another) with the
// same binary. It uses whatever platform the ICD loader offers whose name contains PLATFORM, so
// the caller picks gmux or native with OCL_ICD_VENDORS / GMUX_SOCKET.
//
//   plain_launch PLATFORM blocking  COUNT [ITEMS]   COUNT x (launch; clFinish), prints the median
//   plain_launch PLATFORM pipelined COUNT [ITEMS]   one warm-up launch, then COUNT launches and one
//                                                   clFinish, prints launches per second
//
// Output is one line of JSON, e.g. {"mode":"blocking","count":1000,"items":1,"median_us":121.5,
// "p90_us":180.2} or {"mode":"pipelined","count":20000,"items":1,"per_s":91344}.
#include <CL/cl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

int Usage() {
  std::fprintf(stderr,
               "usage: plain_launch PLATFORM blocking|pipelined COUNT [ITEMS]\n"
               "  PLATFORM  part of the OpenCL platform name (\"gmux\", \"Portable\")\n"
               "  COUNT     launches (1 to 10000000)\n"
               "  ITEMS     work-items per launch (default 1)\n");
  return 2;
}

bool Check(cl_int err, const char* what) {
  if (err == CL_SUCCESS) return true;
  std::fprintf(stderr, "plain_launch: %s failed: %d\n", what, err);
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) return Usage();
  const std::string want = argv[1], mode = argv[2];
  const long count = std::strtol(argv[3], nullptr, 10);
  const long items = argc > 4 ? std::strtol(argv[4], nullptr, 10) : 1;
  if ((mode != "blocking" && mode != "pipelined") || count < 1 || count > 10000000 || items < 1 ||
      items > (1L << 24)) {
    return Usage();
  }
  cl_uint n = 0;
  clGetPlatformIDs(0, nullptr, &n);
  std::vector<cl_platform_id> platforms(n);
  if (n > 0) clGetPlatformIDs(n, platforms.data(), nullptr);
  cl_platform_id platform = nullptr;
  for (cl_platform_id p : platforms) {
    char name[256] = {};
    clGetPlatformInfo(p, CL_PLATFORM_NAME, sizeof(name) - 1, name, nullptr);
    if (std::strstr(name, want.c_str()) != nullptr) platform = p;
  }
  if (platform == nullptr) {
    std::fprintf(stderr, "plain_launch: no OpenCL platform whose name contains '%s'\n",
                 want.c_str());
    return 1;
  }
  cl_device_id device = nullptr;
  if (!Check(clGetDeviceIDs(platform, CL_DEVICE_TYPE_ALL, 1, &device, nullptr), "clGetDeviceIDs")) {
    return 1;
  }
  cl_int err = CL_SUCCESS;
  cl_context context = clCreateContext(nullptr, 1, &device, nullptr, nullptr, &err);
  if (!Check(err, "clCreateContext")) return 1;
  cl_command_queue queue = clCreateCommandQueue(context, device, 0, &err);
  if (!Check(err, "clCreateCommandQueue")) return 1;
  const char* source = "__kernel void add(__global int* a) { a[get_global_id(0)] += 1; }";
  cl_program program = clCreateProgramWithSource(context, 1, &source, nullptr, &err);
  if (!Check(err, "clCreateProgramWithSource") ||
      !Check(clBuildProgram(program, 1, &device, "", nullptr, nullptr), "clBuildProgram")) {
    return 1;
  }
  cl_kernel kernel = clCreateKernel(program, "add", &err);
  if (!Check(err, "clCreateKernel")) return 1;
  std::vector<int> host(static_cast<size_t>(items), 0);
  cl_mem buffer = clCreateBuffer(context, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR,
                                 host.size() * sizeof(int), host.data(), &err);
  if (!Check(err, "clCreateBuffer") ||
      !Check(clSetKernelArg(kernel, 0, sizeof(buffer), &buffer), "clSetKernelArg")) {
    return 1;
  }
  const size_t global = static_cast<size_t>(items);
  auto launch = [&] {
    return clEnqueueNDRangeKernel(queue, kernel, 1, nullptr, &global, nullptr, 0, nullptr,
                                  nullptr);
  };
  using Clock = std::chrono::steady_clock;
  if (mode == "blocking") {
    std::vector<double> us;
    us.reserve(static_cast<size_t>(count));
    for (long i = 0; i < count; ++i) {
      auto start = Clock::now();
      if (!Check(launch(), "clEnqueueNDRangeKernel") || !Check(clFinish(queue), "clFinish")) {
        return 1;
      }
      us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count());
    }
    std::sort(us.begin(), us.end());
    std::printf("{\"mode\":\"blocking\",\"count\":%ld,\"items\":%ld,\"median_us\":%.1f,"
                "\"p90_us\":%.1f}\n",
                count, items, us[us.size() / 2], us[us.size() * 9 / 10]);
  } else {
    if (!Check(launch(), "clEnqueueNDRangeKernel") || !Check(clFinish(queue), "clFinish")) {
      return 1;
    }
    auto start = Clock::now();
    for (long i = 0; i < count; ++i) {
      if (!Check(launch(), "clEnqueueNDRangeKernel")) return 1;
    }
    if (!Check(clFinish(queue), "clFinish")) return 1;
    const double s = std::chrono::duration<double>(Clock::now() - start).count();
    std::printf("{\"mode\":\"pipelined\",\"count\":%ld,\"items\":%ld,\"per_s\":%.0f}\n", count,
                items, static_cast<double>(count) / s);
  }
  // Every launch added 1 to every element: check, so a broken path cannot look fast.
  const long launches = count + (mode == "pipelined" ? 1 : 0);
  if (!Check(clEnqueueReadBuffer(queue, buffer, CL_TRUE, 0, host.size() * sizeof(int), host.data(),
                                 0, nullptr, nullptr),
             "clEnqueueReadBuffer")) {
    return 1;
  }
  for (int v : host) {
    if (v != static_cast<int>(launches)) {
      std::fprintf(stderr, "plain_launch: wrong result %d, expected %ld\n", v, launches);
      return 1;
    }
  }
  clReleaseMemObject(buffer);
  clReleaseKernel(kernel);
  clReleaseProgram(program);
  clReleaseCommandQueue(queue);
  clReleaseContext(context);
  return 0;
}
