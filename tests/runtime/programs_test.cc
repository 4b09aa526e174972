// The papers' workloads through gmux, each compared with the same program run directly on the
// backend platform in the same process: vector add, matrix multiply, Sobel, binomial options.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <sys/stat.h>
#include <unistd.h>

#include "runtime/runtime_env.h"

namespace gmux::testing {
namespace {

// Deterministic inputs (a fixed LCG; the seed is in the name).
std::vector<float> Inputs(size_t n, uint32_t seed) {
  std::vector<float> v(n);
  uint32_t x = seed;
  for (auto& f : v) {
    x = x * 1664525u + 1013904223u;
    f = static_cast<float>((x >> 8) % 10000) / 1000.0f;
  }
  return v;
}

// Runs kernel `name` of `src` on `platform` over the given buffers (args: in buffers, then the
// out buffer, then extra int/float scalars), returning the output.
struct Scalar {
  bool is_int;
  int i;
  float f;
};

std::vector<float> RunKernel(const char* platform, const char* src, const char* name,
                       const std::vector<std::vector<float>>& ins, size_t out_n,
                       const std::vector<Scalar>& scalars, std::vector<size_t> global,
                       std::vector<size_t> local = {}) {
  ClDevice d;
  EXPECT_TRUE(OpenDevice(platform, d)) << platform;
  if (!d.ok()) return {};
  std::string log;
  cl_program p = BuildProgram(d, src, &log);
  EXPECT_NE(p, nullptr) << log;
  if (p == nullptr) return {};
  cl_int err = CL_SUCCESS;
  cl_kernel k = clCreateKernel(p, name, &err);
  EXPECT_EQ(err, CL_SUCCESS);
  std::vector<cl_mem> bufs;
  cl_uint arg = 0;
  for (const auto& in : ins) {
    cl_mem b = clCreateBuffer(d.context, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR,
                              in.size() * sizeof(float), const_cast<float*>(in.data()), &err);
    EXPECT_EQ(err, CL_SUCCESS);
    bufs.push_back(b);
    EXPECT_EQ(clSetKernelArg(k, arg++, sizeof(cl_mem), &b), CL_SUCCESS);
  }
  cl_mem out = clCreateBuffer(d.context, CL_MEM_WRITE_ONLY, out_n * sizeof(float), nullptr, &err);
  EXPECT_EQ(err, CL_SUCCESS);
  EXPECT_EQ(clSetKernelArg(k, arg++, sizeof(cl_mem), &out), CL_SUCCESS);
  for (const auto& s : scalars) {
    if (s.is_int) {
      EXPECT_EQ(clSetKernelArg(k, arg++, sizeof(int), &s.i), CL_SUCCESS);
    } else {
      EXPECT_EQ(clSetKernelArg(k, arg++, sizeof(float), &s.f), CL_SUCCESS);
    }
  }
  EXPECT_EQ(clEnqueueNDRangeKernel(d.queue, k, static_cast<cl_uint>(global.size()), nullptr,
                                   global.data(), local.empty() ? nullptr : local.data(), 0,
                                   nullptr, nullptr),
            CL_SUCCESS);
  std::vector<float> result(out_n);
  EXPECT_EQ(clEnqueueReadBuffer(d.queue, out, CL_TRUE, 0, out_n * sizeof(float), result.data(), 0,
                                nullptr, nullptr),
            CL_SUCCESS);
  EXPECT_EQ(clFinish(d.queue), CL_SUCCESS);
  for (cl_mem b : bufs) clReleaseMemObject(b);
  clReleaseMemObject(out);
  clReleaseKernel(k);
  clReleaseProgram(p);
  return result;
}

void ExpectSame(const std::vector<float>& gmux, const std::vector<float>& native) {
  ASSERT_EQ(gmux.size(), native.size());
  ASSERT_FALSE(gmux.empty());
  size_t bad = 0;
  for (size_t i = 0; i < gmux.size(); ++i) {
    // Same device, same compiler: results are expected bit-identical.
    if (gmux[i] != native[i] && !(std::isnan(gmux[i]) && std::isnan(native[i]))) ++bad;
  }
  EXPECT_EQ(bad, 0u) << "first values " << gmux[0] << " vs " << native[0];
}

const char* kVectorAdd = R"(
__kernel void vadd(__global const float* a, __global const float* b, __global float* c, int n) {
  int i = get_global_id(0);
  if (i < n) c[i] = a[i] + b[i];
})";

TEST(ProgramsTest, VectorAddMatchesNative) {
  const int n = 100000;
  auto a = Inputs(n, 1), b = Inputs(n, 2);
  auto g = RunKernel(kGmux, kVectorAdd, "vadd", {a, b}, n, {{true, n, 0}}, {static_cast<size_t>(n)});
  auto nat = RunKernel(kNative, kVectorAdd, "vadd", {a, b}, n, {{true, n, 0}}, {static_cast<size_t>(n)});
  ExpectSame(g, nat);
  ASSERT_EQ(g.size(), static_cast<size_t>(n));
  EXPECT_EQ(g[12345], a[12345] + b[12345]);
}

const char* kMatMul = R"(
__kernel void matmul(__global const float* A, __global const float* B, __global float* C, int n) {
  int row = get_global_id(1), col = get_global_id(0);
  float acc = 0.0f;
  for (int k = 0; k < n; ++k) acc += A[row * n + k] * B[k * n + col];
  C[row * n + col] = acc;
})";

TEST(ProgramsTest, MatrixMultiplyMatchesNative) {
  const int n = 128;
  auto a = Inputs(n * n, 3), b = Inputs(n * n, 4);
  std::vector<size_t> gs{static_cast<size_t>(n), static_cast<size_t>(n)}, ls{16, 16};
  auto g = RunKernel(kGmux, kMatMul, "matmul", {a, b}, n * n, {{true, n, 0}}, gs, ls);
  auto nat = RunKernel(kNative, kMatMul, "matmul", {a, b}, n * n, {{true, n, 0}}, gs, ls);
  ExpectSame(g, nat);
}

const char* kSobel = R"(
__kernel void sobel(__global const float* img, __global float* out, int w, int h) {
  int x = get_global_id(0), y = get_global_id(1);
  if (x < 1 || y < 1 || x >= w - 1 || y >= h - 1) { out[y * w + x] = 0.0f; return; }
  float gx = -img[(y-1)*w + x-1] - 2.0f*img[y*w + x-1] - img[(y+1)*w + x-1]
             + img[(y-1)*w + x+1] + 2.0f*img[y*w + x+1] + img[(y+1)*w + x+1];
  float gy = -img[(y-1)*w + x-1] - 2.0f*img[(y-1)*w + x] - img[(y-1)*w + x+1]
             + img[(y+1)*w + x-1] + 2.0f*img[(y+1)*w + x] + img[(y+1)*w + x+1];
  out[y * w + x] = sqrt(gx * gx + gy * gy);
})";

TEST(ProgramsTest, SobelFilterMatchesNative) {
  const int w = 256, h = 192;
  auto img = Inputs(w * h, 5);
  std::vector<size_t> gs{static_cast<size_t>(w), static_cast<size_t>(h)};
  auto g = RunKernel(kGmux, kSobel, "sobel", {img}, w * h, {{true, w, 0}, {true, h, 0}}, gs);
  auto nat = RunKernel(kNative, kSobel, "sobel", {img}, w * h, {{true, w, 0}, {true, h, 0}}, gs);
  ExpectSame(g, nat);
}

// Binomial option pricing, one option per work-group (the AMD SDK's formulation): each
// work-item holds one lattice node; the tree is rolled back in __local memory.
const char* kBinomial = R"(
#define STEPS 63
__kernel void binomial(__global const float* spot, __global float* price, float strike,
                       float rate, float vol, float t) {
  __local float v[STEPS + 1];
  int i = get_local_id(0);
  int opt = get_group_id(0);
  float s = spot[opt];
  float dt = t / STEPS;
  float u = exp(vol * sqrt(dt)), d = 1.0f / u;
  float pu = (exp(rate * dt) - d) / (u - d), pd = 1.0f - pu;
  float disc = exp(-rate * dt);
  float st = s * pow(u, (float)(2 * i - STEPS));
  v[i] = fmax(st - strike, 0.0f);
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int j = STEPS; j > 0; --j) {
    float nv = 0.0f;
    if (i < j) nv = disc * (pu * v[i + 1] + pd * v[i]);
    barrier(CLK_LOCAL_MEM_FENCE);
    if (i < j) v[i] = nv;
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  if (i == 0) price[opt] = v[0];
})";

TEST(ProgramsTest, BinomialOptionsMatchNative) {
  const int options = 256;
  auto spot = Inputs(options, 6);
  for (auto& s : spot) s += 5.0f;
  std::vector<Scalar> sc{{false, 0, 10.0f}, {false, 0, 0.02f}, {false, 0, 0.3f}, {false, 0, 1.0f}};
  std::vector<size_t> gs{static_cast<size_t>(options) * 64}, ls{64};
  auto g = RunKernel(kGmux, kBinomial, "binomial", {spot}, options, sc, gs, ls);
  auto nat = RunKernel(kNative, kBinomial, "binomial", {spot}, options, sc, gs, ls);
  ExpectSame(g, nat);
  // Deep in the money the price approaches spot - discounted strike.
  ASSERT_EQ(g.size(), static_cast<size_t>(options));
  for (int i = 0; i < options; ++i) EXPECT_GE(g[i], spot[i] - 10.0f - 1e-3f);
}

// A program that builds its kernels with -I options and includes its own headers, as
// applications do: a relative -I (".", against the application's working directory), an
// absolute one, a quoted include found beside the header that includes it, and a <> include.
// gmux builds it as natively, over TCP too, where the daemon cannot see the client's files.
const char* kIncludingSource = R"(#include "./main.h"
#include <extra.h>
__kernel void scaled(__global const float* a, __global float* out) {
  int i = get_global_id(0);
  out[i] = a[i] * SCALE + OFFSET + EXTRA;
})";

std::vector<float> RunIncluding(const char* platform, const std::string& options,
                                const std::vector<float>& in) {
  ClDevice d;
  EXPECT_TRUE(OpenDevice(platform, d)) << platform;
  if (!d.ok()) return {};
  std::string log;
  cl_program p = BuildProgram(d, kIncludingSource, &log, options.c_str());
  EXPECT_NE(p, nullptr) << platform << ": " << log;
  if (p == nullptr) return {};
  cl_int err = CL_SUCCESS;
  cl_kernel k = clCreateKernel(p, "scaled", &err);
  EXPECT_EQ(err, CL_SUCCESS);
  cl_mem a = clCreateBuffer(d.context, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR,
                            in.size() * sizeof(float), const_cast<float*>(in.data()), &err);
  cl_mem out = clCreateBuffer(d.context, CL_MEM_WRITE_ONLY, in.size() * sizeof(float), nullptr,
                              &err);
  clSetKernelArg(k, 0, sizeof(cl_mem), &a);
  clSetKernelArg(k, 1, sizeof(cl_mem), &out);
  size_t n = in.size();
  EXPECT_EQ(clEnqueueNDRangeKernel(d.queue, k, 1, nullptr, &n, nullptr, 0, nullptr, nullptr),
            CL_SUCCESS);
  std::vector<float> result(n);
  EXPECT_EQ(clEnqueueReadBuffer(d.queue, out, CL_TRUE, 0, n * sizeof(float), result.data(), 0,
                                nullptr, nullptr),
            CL_SUCCESS);
  clReleaseMemObject(a);
  clReleaseMemObject(out);
  clReleaseKernel(k);
  clReleaseProgram(p);
  return result;
}

TEST(ProgramsTest, RelativeAndAbsoluteIncludeDirectoriesBuildAsNatively) {
  char tmpl[] = "/tmp/gmux-includes-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  auto write = [&](const std::string& name, const std::string& text) {
    FILE* f = std::fopen((dir + "/" + name).c_str(), "w");
    ASSERT_NE(f, nullptr) << name;
    std::fputs(text.c_str(), f);
    std::fclose(f);
  };
  ASSERT_EQ(::mkdir((dir + "/app").c_str(), 0700), 0);
  ASSERT_EQ(::mkdir((dir + "/app/sub").c_str(), 0700), 0);
  ASSERT_EQ(::mkdir((dir + "/shared").c_str(), 0700), 0);
  write("app/main.h", "#include \"sub/scale.h\"\n#define OFFSET 3.0f\n");
  write("app/sub/scale.h", "#include \"factor.h\"\n#define SCALE (FACTOR * 2.0f)\n");
  write("app/sub/factor.h", "#define FACTOR 1.5f\n");
  write("shared/extra.h", "#define EXTRA 0.25f\n");
  char cwd[4096];
  ASSERT_NE(::getcwd(cwd, sizeof(cwd)), nullptr);
  ASSERT_EQ(::chdir((dir + "/app").c_str()), 0);
  const std::string options = "-I. -I " + dir + "/shared -cl-std=CL1.2";
  auto in = Inputs(4096, 7);
  auto g = RunIncluding(kGmux, options, in);
  auto nat = RunIncluding(kNative, options, in);
  EXPECT_EQ(::chdir(cwd), 0);
  ExpectSame(g, nat);
  ASSERT_EQ(g.size(), in.size());
  EXPECT_EQ(g[100], in[100] * 3.0f + 3.0f + 0.25f);
  std::system(("rm -rf " + dir).c_str());
}

}  // namespace
}  // namespace gmux::testing
