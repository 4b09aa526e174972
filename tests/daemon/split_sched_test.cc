// Scheduling decisions and split execution of the broker's Scheduler + a worker's queue on the real
// backend (PoCL), driven directly with Commands as a session would build them. No assertion
// depends on wall-clock timing: orders, results and counts only (deadlines only guard hangs).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include <nlohmann/json.hpp>

#include "daemon/backend.h"
#include "daemon/command.h"
#include "daemon/kernel_scan.h"
#include "daemon/scheduler.h"
#include "daemon/local_scheduler.h"  // tests/daemon
#include "daemon/restore.h"
#include "daemon/splitter.h"

namespace gmux::daemon {
namespace {

const char* kSource = R"(
__kernel void scale(__global const float* in, __global float* out, float a) {
  size_t i = get_global_id(0);
  out[i] = in[i] * a + (float)i;
}
__kernel void grid(__global int* out, int w) {
  size_t x = get_global_id(0), y = get_global_id(1);
  out[y * w + x] = (int)(x * 1000 + y);
}
__kernel void spin(__global const float* in, __global float* out, int iters) {
  size_t i = get_global_id(0);
  float x = in[i];
  for (int j = 0; j < iters; ++j) x = x * 0.999f + 1.0f;
  out[i] = x;
}
__kernel void advance(__global int* acc, int k) {
  if (get_global_id(0) == 0) acc[0] = acc[0] * 3 + k;
}
)";
const char* kGroupSource =
    "__kernel void groups(__global int* out) { out[get_global_id(0)] = (int)get_group_id(0); }";
const char* kSizeSource =
    "__kernel void gsize(__global int* out) { out[get_global_id(0)] = (int)get_global_size(0); }";

class SplitSchedTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto b = Backend::Open(BackendOptions{});
    if (!b.ok()) return;
    backend_ = std::move(b).value().release();
  }
  void SetUp() override {
    if (backend_ == nullptr) GTEST_SKIP() << "no OpenCL backend";
    const cl_icd_dispatch& cl = backend_->cl();
    dev_ = backend_->devices()[0];
    cl_int err;
    ctx_ = cl.clCreateContext(nullptr, 1, &dev_, nullptr, nullptr, &err);
    ASSERT_EQ(err, CL_SUCCESS);
    for (auto* q : {&qa_, &qb_}) {
      cl_command_queue h = cl.clCreateCommandQueue(ctx_, dev_, CL_QUEUE_PROFILING_ENABLE, &err);
      ASSERT_EQ(err, CL_SUCCESS);
      *q = Adopt(h);
    }
    prog_ = Build(kSource);
    ASSERT_NE(prog_, nullptr);
  }
  void TearDown() override {
    if (backend_ == nullptr) return;
    qa_.reset();
    qb_.reset();
    for (cl_program p : programs_) backend_->cl().clReleaseProgram(p);
    backend_->cl().clReleaseContext(ctx_);
  }

  cl_program Build(const char* src, const std::string& options = "") {
    const cl_icd_dispatch& cl = backend_->cl();
    cl_int err;
    cl_program p = cl.clCreateProgramWithSource(ctx_, 1, &src, nullptr, &err);
    if (cl.clBuildProgram(p, 1, &dev_, options.c_str(), nullptr, nullptr) != CL_SUCCESS) {
      cl.clReleaseProgram(p);
      return nullptr;
    }
    programs_.push_back(p);
    return p;
  }
  Ref<cl_kernel> Kernel(cl_program p, const char* name) {
    cl_int err;
    cl_kernel k = backend_->cl().clCreateKernel(p, name, &err);
    EXPECT_EQ(err, CL_SUCCESS);
    return Adopt(k);
  }
  Ref<cl_mem> Buffer(size_t bytes, const void* init = nullptr) {
    cl_int err;
    cl_mem m = backend_->cl().clCreateBuffer(
        ctx_, CL_MEM_READ_WRITE | (init ? CL_MEM_COPY_HOST_PTR : 0), bytes,
        const_cast<void*>(init), &err);
    EXPECT_EQ(err, CL_SUCCESS);
    return Adopt(m);
  }
  template <typename T>
  std::vector<T> Read(const Ref<cl_mem>& m, size_t n) {
    std::vector<T> out(n);
    EXPECT_EQ(backend_->cl().clEnqueueReadBuffer(qa_->h, m->h, CL_TRUE, 0, n * sizeof(T),
                                                 out.data(), 0, nullptr, nullptr),
              CL_SUCCESS);
    return out;
  }

  // A kernel launch as Session::Enqueue builds it; `set_args` runs on the executor thread.
  std::shared_ptr<Command> Launch(TenantId tenant, const Ref<cl_command_queue>& q,
                                  Ref<cl_kernel> k, std::function<void(cl_kernel)> set_args,
                                  uint32_t dim, std::array<size_t, 3> gs, bool splittable,
                                  std::shared_ptr<EventRecord> after = nullptr) {
    auto c = std::make_shared<Command>();
    c->tenant = tenant;
    c->queue = q;
    c->event = std::make_shared<EventRecord>(next_event_++, false, 0);
    if (after) c->order_deps.push_back(after);
    c->block.kind = core::BlockKind::kKernel;
    c->block.work_items = gs[0] * gs[1] * gs[2];
    std::array<size_t, 3> off{0, 0, 0};
    auto mu = std::make_shared<std::mutex>();
    c->run = [k, set_args, dim, gs, off, mu](cl_command_queue cq, const std::vector<cl_event>& w,
                                             cl_event* out) {
      std::lock_guard<std::mutex> lock(*mu);
      set_args(k->h);
      return Dispatch(cq).clEnqueueNDRangeKernel(cq, k->h, dim, off.data(), gs.data(), nullptr,
                                                 static_cast<cl_uint>(w.size()),
                                                 w.empty() ? nullptr : w.data(), out);
    };
    if (splittable) {
      auto plan = PlanSplit(backend_->cl(), k->h, dev_, dim, gs, nullptr);
      EXPECT_TRUE(plan.has_value());
      if (plan) {
        c->block.splittable = core::Splittable::kYes;
        c->block.work_groups = plan->granules;
        c->run_chunk = [k, set_args, dim, gs, off, mu, p = *plan](
                           cl_command_queue cq, const std::vector<cl_event>& w,
                           const core::WorkRange& r, cl_event* out) {
          std::lock_guard<std::mutex> lock(*mu);
          set_args(k->h);
          return EnqueueChunk(Dispatch(cq), cq, k->h, dim, off, gs, p, r,
                              static_cast<cl_uint>(w.size()), w.empty() ? nullptr : w.data(), out);
        };
      }
    }
    return c;
  }

  std::unique_ptr<testing::LocalScheduler> MakeScheduler(const std::string& policy, uint32_t inflight,
                                           std::map<std::string, double> params = {}) {
    core::DeviceInfo info;
    cl_uint cu = 1;
    backend_->cl().clGetDeviceInfo(dev_, CL_DEVICE_MAX_COMPUTE_UNITS, sizeof(cu), &cu, nullptr);
    info.compute_units = cu;
    auto s = Scheduler::Create({policy, params, {}}, {info}, inflight);
    EXPECT_TRUE(s.ok()) << s.status().message();
    if (!s.ok()) return nullptr;
    return std::make_unique<testing::LocalScheduler>(std::move(s).value(), 1);
  }

  static void Drain(testing::LocalScheduler& s) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (s.Outstanding() != 0 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    ASSERT_EQ(s.Outstanding(), 0u) << "commands did not finish";
  }

  // Waits (up to 10 s) for `done`: a command stops counting as outstanding when the scheduler
  // hears of its completion, just before its `finished` callback runs on the worker's thread.
  static void WaitUntil(const std::function<bool()>& done) {
    for (int i = 0; i < 10000 && !done(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

  static nlohmann::json TenantStatus(testing::LocalScheduler& s, TenantId id) {
    auto j = nlohmann::json::parse(s.Status());
    for (const auto& t : j["tenants"]) {
      if (t["id"] == id) return t;
    }
    return {};
  }

  static inline Backend* backend_ = nullptr;
  cl_device_id dev_ = nullptr;
  cl_context ctx_ = nullptr;
  Ref<cl_command_queue> qa_, qb_;
  cl_program prog_ = nullptr;
  std::vector<cl_program> programs_;
  uint64_t next_event_ = 1;
};

TEST(KernelScanTest, ForbiddenBuiltinsMakeAProgramUnsplittable) {
  EXPECT_TRUE(ScanForSplit(kSource, "").splittable);
  EXPECT_FALSE(ScanForSplit(kGroupSource, "").splittable);
  EXPECT_FALSE(ScanForSplit(kSizeSource, "").splittable);
  for (const char* f : {"get_num_groups(0)", "get_global_offset(1)", "get_global_linear_id()"}) {
    std::string src = std::string("__kernel void k(__global int* o) { o[0] = ") + f + "; }";
    SplitVerdict v = ScanForSplit(src, "");
    EXPECT_FALSE(v.splittable) << f;
    EXPECT_NE(v.reason.find(std::string(f).substr(0, std::string(f).find('('))), std::string::npos);
  }
}

TEST(KernelScanTest, CommentsStringsAndLookalikesDoNotCountButMacrosAndIncludesDo) {
  EXPECT_TRUE(ScanForSplit("// get_group_id\n/* get_global_size */ __kernel void k() {}", "")
                  .splittable);
  EXPECT_TRUE(ScanForSplit("__kernel void k(__global int* o) { int my_get_group_id = 1; }", "")
                  .splittable);
  EXPECT_FALSE(ScanForSplit("#define G(x) get_##x\n__kernel void k() {}", "").splittable);
  EXPECT_FALSE(ScanForSplit("#include \"h.cl\"\n__kernel void k() {}", "").splittable);
  EXPECT_FALSE(ScanForSplit("__kernel void k() {}", "-DGID=get_group_id").splittable);
  EXPECT_FALSE(ScanForSplit("__kernel void k() {}", "-I /tmp").splittable);
  EXPECT_TRUE(ScanForSplit("__kernel void k() { size_t l = get_local_size(0); }", "-cl-fast-relaxed-math")
                  .splittable);
}

TEST_F(SplitSchedTest, ChunksOfAPlainKernelGiveTheUnsplitResult) {
  const size_t n = 4096;
  std::vector<float> in(n);
  for (size_t i = 0; i < n; ++i) in[i] = static_cast<float>(i % 97) * 0.5f;
  auto din = Buffer(n * 4, in.data()), dout = Buffer(n * 4);
  auto k = Kernel(prog_, "scale");
  float a = 3;
  const auto& cl = backend_->cl();
  cl.clSetKernelArg(k->h, 0, sizeof(cl_mem), &din->h);
  cl.clSetKernelArg(k->h, 1, sizeof(cl_mem), &dout->h);
  cl.clSetKernelArg(k->h, 2, sizeof(float), &a);
  std::array<size_t, 3> gs{n, 1, 1}, off{0, 0, 0};
  auto plan = PlanSplit(cl, k->h, dev_, 1, gs, nullptr);
  ASSERT_TRUE(plan.has_value());
  ASSERT_GE(plan->granules, 2u);
  // Uneven chunks on granule boundaries, in order.
  const uint64_t g = n / plan->granules;
  ASSERT_GE(plan->granules, 4u);
  std::vector<core::WorkRange> ranges = {{0, g}, {g, 3 * g}, {3 * g, n}};
  for (const auto& r : ranges) {
    ASSERT_EQ(EnqueueChunk(cl, qa_->h, k->h, 1, off, gs, *plan, r, 0, nullptr, nullptr), CL_SUCCESS);
  }
  auto split = Read<float>(dout, n);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(split[i], in[i] * a + static_cast<float>(i)) << i;
}

TEST_F(SplitSchedTest, ChunksOfA2DKernelCoverWholeRows) {
  const size_t w = 48, h = 64;
  auto dout = Buffer(w * h * 4);
  auto k = Kernel(prog_, "grid");
  const auto& cl = backend_->cl();
  int wi = static_cast<int>(w);
  cl.clSetKernelArg(k->h, 0, sizeof(cl_mem), &dout->h);
  cl.clSetKernelArg(k->h, 1, sizeof(int), &wi);
  std::array<size_t, 3> gs{w, h, 1}, off{0, 0, 0};
  auto plan = PlanSplit(cl, k->h, dev_, 2, gs, nullptr);
  ASSERT_TRUE(plan.has_value());
  EXPECT_EQ(plan->row_items, w);
  const uint64_t g = w * h / plan->granules;
  for (core::WorkRange r : {core::WorkRange{0, 3 * g}, core::WorkRange{3 * g, w * h}}) {
    ASSERT_EQ(EnqueueChunk(cl, qa_->h, k->h, 2, off, gs, *plan, r, 0, nullptr, nullptr), CL_SUCCESS);
  }
  auto out = Read<int>(dout, w * h);
  for (size_t y = 0; y < h; ++y) {
    for (size_t x = 0; x < w; ++x) ASSERT_EQ(out[y * w + x], static_cast<int>(x * 1000 + y));
  }
}

TEST_F(SplitSchedTest, SplittingWouldChangeGroupIdAndGlobalSizeKernels) {
  // Why the scan refuses them: run in two chunks they compute something else.
  const size_t n = 1024;
  for (const char* src : {kGroupSource, kSizeSource}) {
    cl_program p = Build(src);
    ASSERT_NE(p, nullptr);
    auto k = Kernel(p, src == kGroupSource ? "groups" : "gsize");
    auto whole = Buffer(n * 4), split = Buffer(n * 4);
    const auto& cl = backend_->cl();
    std::array<size_t, 3> gs{n, 1, 1}, off{0, 0, 0}, ls{64, 1, 1};
    cl.clSetKernelArg(k->h, 0, sizeof(cl_mem), &whole->h);
    ASSERT_EQ(cl.clEnqueueNDRangeKernel(qa_->h, k->h, 1, nullptr, gs.data(), ls.data(), 0, nullptr,
                                        nullptr),
              CL_SUCCESS);
    cl.clSetKernelArg(k->h, 0, sizeof(cl_mem), &split->h);
    auto plan = PlanSplit(cl, k->h, dev_, 1, gs, &ls);
    ASSERT_TRUE(plan.has_value());
    for (core::WorkRange r : {core::WorkRange{0, n / 2}, core::WorkRange{n / 2, n}}) {
      ASSERT_EQ(EnqueueChunk(cl, qa_->h, k->h, 1, off, gs, *plan, r, 0, nullptr, nullptr),
                CL_SUCCESS);
    }
    EXPECT_NE(Read<int>(whole, n), Read<int>(split, n)) << src;
    EXPECT_FALSE(ScanForSplit(src, "").splittable);
  }
}

// Every builtin the prelude restores, in 1, 2 and 3 dimensions, with and without offsets:
// everything a work-item can ask about its launch, written out per work-item.
const char* kAllBuiltinsSource = R"(
__kernel void info(__global uint* out) {
  size_t lin = get_global_linear_id();
  uint d = get_work_dim();
  __global uint* o = out + lin * 16;
  o[0] = (uint)lin;
  for (uint k = 0; k < 3; ++k) {
    o[1 + k] = (uint)get_group_id(k);
    o[4 + k] = (uint)get_num_groups(k);
    o[7 + k] = (uint)get_global_size(k);
    o[10 + k] = (uint)get_global_offset(k);
  }
  o[13] = (uint)get_group_id(d);  // past work_dim: 0, 1, 1, 0 as the builtins say
  o[14] = (uint)get_num_groups(d) * 10u + (uint)get_global_size(d);
  o[15] = (uint)get_global_offset(d);
}
)";

TEST(KernelScanTest, ProgramsUsingOnlyTheFiveBuiltinsAreRestorable) {
  SplitVerdict v = ScanForSplit(kAllBuiltinsSource, "");
  EXPECT_FALSE(v.splittable);
  EXPECT_TRUE(v.restorable);
  EXPECT_TRUE(v.uses_groups);
  v = ScanForSplit(kSizeSource, "-cl-fast-relaxed-math");
  EXPECT_TRUE(v.restorable);
  EXPECT_FALSE(v.uses_groups);
  EXPECT_FALSE(ScanForSplit(kSource, "").restorable);  // splittable as it is
  // What no prelude can see through stays whole.
  EXPECT_FALSE(ScanForSplit(std::string(kGroupSource) + "\n#include \"x.h\"", "").restorable);
  EXPECT_FALSE(ScanForSplit(std::string("#define P(a) a##1\n") + kGroupSource, "").restorable);
  EXPECT_FALSE(ScanForSplit(kGroupSource, "-I /tmp").restorable);
  EXPECT_FALSE(ScanForSplit(kGroupSource, "-DG=get_group_id").restorable);
  EXPECT_FALSE(ScanForSplit(std::string("int __gmux_group_id;\n") + kGroupSource, "").restorable);
  // The prelude keeps the program's own line numbers for its diagnostics.
  std::string restored = RestoringSource("line1\nline2");
  EXPECT_NE(restored.find("#line 1\nline1\nline2"), std::string::npos);
  EXPECT_EQ(RestoringOptions(1, {64, 7, 9}, {5, 7, 9}),
            " -D__GMUX_GS0=64UL -D__GMUX_GO0=5UL -D__GMUX_GS1=1UL -D__GMUX_GO1=0UL"
            " -D__GMUX_GS2=1UL -D__GMUX_GO2=0UL");
}

TEST_F(SplitSchedTest, RestoredVariantsComputeInChunksWhatTheProgramComputesWhole) {
  const auto& cl = backend_->cl();
  cl_program orig = Build(kAllBuiltinsSource, "-cl-std=CL3.0");
  ASSERT_NE(orig, nullptr);
  struct Shape {
    uint32_t dim;
    std::array<size_t, 3> gs, off, ls;
  };
  for (const Shape& sh : {Shape{1, {1024, 1, 1}, {0, 0, 0}, {64, 1, 1}},
                          Shape{1, {1024, 1, 1}, {4096, 0, 0}, {32, 1, 1}},
                          Shape{2, {32, 48, 1}, {3, 8, 0}, {8, 4, 1}},
                          Shape{3, {8, 4, 24}, {1, 2, 5}, {4, 2, 3}}}) {
    const size_t items = sh.gs[0] * sh.gs[1] * sh.gs[2];
    auto whole = Buffer(items * 64), split = Buffer(items * 64);
    auto k = Kernel(orig, "info");
    cl.clSetKernelArg(k->h, 0, sizeof(cl_mem), &whole->h);
    ASSERT_EQ(cl.clEnqueueNDRangeKernel(qa_->h, k->h, sh.dim, sh.off.data(), sh.gs.data(),
                                        sh.ls.data(), 0, nullptr, nullptr),
              CL_SUCCESS);
    std::string src = RestoringSource(kAllBuiltinsSource);
    cl_program var = Build(src.c_str(), "-cl-std=CL3.0" + RestoringOptions(sh.dim, sh.gs, sh.off));
    ASSERT_NE(var, nullptr) << "the restoring variant did not build";
    auto vk = Kernel(var, "info");
    cl.clSetKernelArg(vk->h, 0, sizeof(cl_mem), &split->h);
    auto plan = PlanSplit(cl, vk->h, dev_, sh.dim, sh.gs, &sh.ls);
    ASSERT_TRUE(plan.has_value());
    // Three uneven chunks on granule boundaries.
    const uint64_t g = items / plan->granules;
    const uint64_t a = g * (plan->granules / 3), b = g * (plan->granules - 1);
    ASSERT_LT(0u, a);
    ASSERT_LT(a, b);
    for (core::WorkRange r : {core::WorkRange{0, a}, core::WorkRange{a, b}, core::WorkRange{b, items}}) {
      ASSERT_EQ(EnqueueChunk(cl, qa_->h, vk->h, sh.dim, sh.off, sh.gs, *plan, r, 0, nullptr, nullptr),
                CL_SUCCESS);
    }
    auto w = Read<uint32_t>(whole, items * 16), c = Read<uint32_t>(split, items * 16);
    size_t diffs = 0, first = 0;
    for (size_t i = 0; i < w.size(); ++i) {
      if (w[i] != c[i] && diffs++ == 0) first = i;
    }
    EXPECT_EQ(diffs, 0u) << sh.dim << "-D launch: first difference at work-item " << first / 16
                         << " field " << first % 16 << ": whole " << w[first] << ", chunks "
                         << c[first];
    // And the original program in the same chunks would not (why the variant exists).
    auto again = Buffer(items * 64);
    cl.clSetKernelArg(k->h, 0, sizeof(cl_mem), &again->h);
    for (core::WorkRange r : {core::WorkRange{0, a}, core::WorkRange{a, b}, core::WorkRange{b, items}}) {
      ASSERT_EQ(EnqueueChunk(cl, qa_->h, k->h, sh.dim, sh.off, sh.gs, *plan, r, 0, nullptr, nullptr),
                CL_SUCCESS);
    }
    EXPECT_NE(Read<uint32_t>(again, items * 16), w) << sh.dim << "-D";
  }
}

TEST_F(SplitSchedTest, RestoredVariantsBuildInTheBackgroundOncePerShape) {
  const auto& cl = backend_->cl();
  const char* src = kGroupSource;
  cl_int err;
  cl_program p = cl.clCreateProgramWithSource(ctx_, 1, &src, nullptr, &err);
  ASSERT_EQ(cl.clBuildProgram(p, 1, &dev_, "", nullptr, nullptr), CL_SUCCESS);
  auto prog = Adopt(p);
  RestoredVariants v(cl, prog, kGroupSource, "");
  LaunchShape a{1, {1024, 1, 1}, {0, 0, 0}}, b{1, {2048, 1, 1}, {0, 0, 0}};
  EXPECT_FALSE(v.Find("groups", a, dev_).has_value());  // starts its build
  EXPECT_FALSE(v.Find("groups", b, dev_).has_value());
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (v.built() + v.failed() < 2 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(v.built(), 2u);
  EXPECT_EQ(v.failed(), 0u);
  auto ka = v.Find("groups", a, dev_);
  ASSERT_TRUE(ka.has_value());
  EXPECT_GT(ka->work_group_size, 0u);
  auto ka2 = v.Find("groups", a, dev_);
  ASSERT_TRUE(ka2.has_value());
  EXPECT_EQ(ka->kernel, ka2->kernel);  // one kernel per variant, name and device
  EXPECT_FALSE(v.Find("no_such_kernel", a, dev_).has_value());
  // A shape whose variant does not build (a program that only builds with its options) stays
  // whole and is not tried again.
  RestoredVariants bad(cl, prog, "__kernel void groups(__global int* o) { o[get_group_id(0)] = X; }",
                       "");
  EXPECT_FALSE(bad.Find("groups", a, dev_).has_value());
  deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (bad.failed() < 1 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(bad.failed(), 1u);
  EXPECT_FALSE(bad.Find("groups", a, dev_).has_value());
  EXPECT_EQ(bad.built(), 0u);
  // More shapes than kept: each new one still gets built, the oldest goes.
  for (size_t i = 0; i < RestoredVariants::kMaxVariants + 2; ++i) {
    LaunchShape s{1, {64 * (i + 3), 1, 1}, {0, 0, 0}};
    v.Find("groups", s, dev_);
    deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (v.built() < 3 + i && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  EXPECT_EQ(v.built(), 2u + RestoredVariants::kMaxVariants + 2);
}

TEST_F(SplitSchedTest, SplitPolicyRunsChunksWithOneEventAndIdenticalResults) {
  auto s = MakeScheduler("split", 2, {{"beta", 8}});
  ASSERT_NE(s, nullptr);
  s->AddTenant(1, 1, "a");
  s->AddTenant(2, 1, "b");
  const size_t n = 1 << 16;
  std::vector<float> in(n);
  for (size_t i = 0; i < n; ++i) in[i] = static_cast<float>(i % 31);
  auto din = Buffer(n * 4, in.data());
  std::vector<Ref<cl_mem>> outs;
  std::vector<std::shared_ptr<Command>> cmds;
  auto k1 = Kernel(prog_, "scale"), k2 = Kernel(prog_, "scale");
  for (int i = 0; i < 6; ++i) {
    outs.push_back(Buffer(n * 4));
    TenantId t = i % 2 == 0 ? 1 : 2;
    float a = static_cast<float>(i + 1);
    cl_mem inh = din->h, outh = outs.back()->h;
    auto set = [inh, outh, a](cl_kernel k) {
      Dispatch(k).clSetKernelArg(k, 0, sizeof(cl_mem), &inh);
      Dispatch(k).clSetKernelArg(k, 1, sizeof(cl_mem), &outh);
      Dispatch(k).clSetKernelArg(k, 2, sizeof(float), &a);
    };
    std::shared_ptr<EventRecord> prev;
    for (auto it = cmds.rbegin(); it != cmds.rend(); ++it) {
      if ((*it)->tenant == t) {
        prev = (*it)->event;
        break;
      }
    }
    cmds.push_back(Launch(t, t == 1 ? qa_ : qb_, t == 1 ? k1 : k2, set, 1, {n, 1, 1}, true, prev));
  }
  // Both tenants must be active when the policy first decides, or there is nothing to split
  // against. Each tenant's commands reach the scheduler from a worker queue of its own, so a
  // gate alone does not do it: on a loaded host one tenant's launches can all be dispatched
  // whole before the other's arrive. So a third tenant's two long unsplittable launches fill
  // both in-flight slots first, and the gate opens only once they hold the device; the
  // scheduler then sees both tenants' work before a slot frees.
  s->AddTenant(3, 1, "blocker");
  auto spin_out = Buffer(n * 4);
  auto ks = Kernel(prog_, "spin");
  std::vector<std::shared_ptr<Command>> blockers;
  std::atomic<int> blockers_done{0};
  for (int i = 0; i < 2; ++i) {
    cl_mem inh = din->h, outh = spin_out->h;
    auto set = [inh, outh](cl_kernel k) {
      int iters = 20000;
      Dispatch(k).clSetKernelArg(k, 0, sizeof(cl_mem), &inh);
      Dispatch(k).clSetKernelArg(k, 1, sizeof(cl_mem), &outh);
      Dispatch(k).clSetKernelArg(k, 2, sizeof(int), &iters);
    };
    auto c = Launch(3, qb_, ks, set, 1, {1 << 14, 1, 1}, false);
    c->finished = [&blockers_done](cl_int) { blockers_done.fetch_add(1); };
    blockers.push_back(c);
  }
  s->Submit(blockers);
  auto gate = std::make_shared<EventRecord>(999, true, 0);
  cmds[0]->deps.push_back(gate);
  cmds[1]->deps.push_back(gate);
  s->Submit(cmds);
  WaitUntil([&] {
    auto b = TenantStatus(*s, 3);
    return !b.is_null() && b.value("dispatches", uint64_t{0}) >= 2;
  });
  gate->Complete(CL_COMPLETE);
  s->Rescan(gate);
  Drain(*s);
  WaitUntil([&] { return blockers_done.load() == 2; });
  // A command's event completes in its `finished` callback, just after the scheduler stops
  // counting it as outstanding.
  WaitUntil([&] {
    for (const auto& c : cmds) {
      if (c->event->status() != CL_COMPLETE) return false;
    }
    return true;
  });
  for (int i = 0; i < 6; ++i) {
    auto out = Read<float>(outs[i], n);
    for (size_t j = 0; j < n; j += 7) {
      ASSERT_EQ(out[j], in[j] * static_cast<float>(i + 1) + static_cast<float>(j)) << i << " " << j;
    }
  }
  auto ta = TenantStatus(*s, 1), tb = TenantStatus(*s, 2);
  // Chunks happened (more dispatches than commands), and the monitor balanced out.
  EXPECT_GT(ta["dispatches"].get<uint64_t>() + tb["dispatches"].get<uint64_t>(), 6u);
  EXPECT_EQ(ta["completed_commands"], 3);
  EXPECT_EQ(ta["total_items"], 3 * n);
  EXPECT_EQ(ta["processed_items"], 3 * n);
  EXPECT_EQ(ta["remaining_items"], 0);
  // One event per launch: START of the first chunk, END of the last, which came later.
  const auto& cl = backend_->cl();
  for (const auto& c : cmds) {
    ASSERT_EQ(c->event->status(), CL_COMPLETE);
    Ref<cl_event> first = c->event->ProfilingEvent(CL_PROFILING_COMMAND_START);
    Ref<cl_event> last = c->event->ProfilingEvent(CL_PROFILING_COMMAND_END);
    ASSERT_TRUE(first && last);
    cl_ulong start = 0, end = 0, last_start = 0;
    cl.clGetEventProfilingInfo(first->h, CL_PROFILING_COMMAND_START, 8, &start, nullptr);
    cl.clGetEventProfilingInfo(last->h, CL_PROFILING_COMMAND_END, 8, &end, nullptr);
    cl.clGetEventProfilingInfo(last->h, CL_PROFILING_COMMAND_START, 8, &last_start, nullptr);
    EXPECT_LE(start, last_start);
    EXPECT_LT(start, end);
    EXPECT_EQ(c->event->backend().get(), last.get());
  }
}

TEST_F(SplitSchedTest, EachTenantsOrderIsKeptUnderEveryPolicy) {
  for (const char* policy : {"fifo", "rr", "credit", "split"}) {
    auto s = MakeScheduler(policy, 3);
    ASSERT_NE(s, nullptr);
    s->AddTenant(1, 1, "a");
    s->AddTenant(2, 2, "b");
    int init = 1;
    auto acc_a = Buffer(4, &init), acc_b = Buffer(4, &init);
    auto ka = Kernel(prog_, "advance"), kb = Kernel(prog_, "advance");
    std::mutex mu;
    std::vector<std::pair<TenantId, int>> finished;
    std::vector<std::shared_ptr<Command>> cmds;
    std::shared_ptr<EventRecord> last_a, last_b;
    for (int i = 0; i < 40; ++i) {
      TenantId t = (i % 3 == 0) ? 1 : 2;
      cl_mem acc = t == 1 ? acc_a->h : acc_b->h;
      int kk = i;
      auto set = [acc, kk](cl_kernel k) {
        Dispatch(k).clSetKernelArg(k, 0, sizeof(cl_mem), &acc);
        Dispatch(k).clSetKernelArg(k, 1, sizeof(int), &kk);
      };
      auto& last = t == 1 ? last_a : last_b;
      auto c = Launch(t, t == 1 ? qa_ : qb_, t == 1 ? ka : kb, set, 1, {4096, 1, 1}, true, last);
      c->finished = [&mu, &finished, t, i](cl_int) {
        std::lock_guard<std::mutex> lock(mu);
        finished.emplace_back(t, i);
      };
      last = c->event;
      cmds.push_back(c);
    }
    s->Submit(cmds);
    Drain(*s);
    WaitUntil([&] {
      std::lock_guard<std::mutex> lock(mu);
      return finished.size() == cmds.size();
    });
    // The device's int arithmetic wraps; the host's expectation wraps the same way, unsigned.
    uint32_t ea = 1, eb = 1;
    std::vector<int> order_a, order_b, want_a, want_b;
    for (int i = 0; i < 40; ++i) {
      if (i % 3 == 0) {
        ea = ea * 3 + static_cast<uint32_t>(i);
        want_a.push_back(i);
      } else {
        eb = eb * 3 + static_cast<uint32_t>(i);
        want_b.push_back(i);
      }
    }
    {
      std::lock_guard<std::mutex> lock(mu);  // filled by callbacks on the workers' threads
      for (auto [t, i] : finished) (t == 1 ? order_a : order_b).push_back(i);
    }
    EXPECT_EQ(order_a, want_a) << policy;
    EXPECT_EQ(order_b, want_b) << policy;
    EXPECT_EQ(static_cast<uint32_t>(Read<int>(acc_a, 1)[0]), ea) << policy;
    EXPECT_EQ(static_cast<uint32_t>(Read<int>(acc_b, 1)[0]), eb) << policy;
  }
}

TEST_F(SplitSchedTest, UserEventDependencyHoldsACommandWhileOthersRun) {
  auto s = MakeScheduler("credit", 2);
  ASSERT_NE(s, nullptr);
  s->AddTenant(1, 1, "a");
  s->AddTenant(2, 1, "b");
  int init = 1;
  auto acc_a = Buffer(4, &init), acc_b = Buffer(4, &init);
  auto ka = Kernel(prog_, "advance"), kb = Kernel(prog_, "advance");
  auto gate = std::make_shared<EventRecord>(999, true, 0);
  std::atomic<int> b_done{0};
  std::atomic<int> b_done_when_a_ran{-1};
  auto set_for = [](cl_mem acc, int kk) {
    return [acc, kk](cl_kernel k) {
      Dispatch(k).clSetKernelArg(k, 0, sizeof(cl_mem), &acc);
      Dispatch(k).clSetKernelArg(k, 1, sizeof(int), &kk);
    };
  };
  auto held = Launch(1, qa_, ka, set_for(acc_a->h, 5), 1, {64, 1, 1}, false);
  held->deps.push_back(gate);
  held->finished = [&](cl_int) { b_done_when_a_ran = b_done.load(); };
  std::vector<std::shared_ptr<Command>> cmds{held};
  std::shared_ptr<EventRecord> last;
  for (int i = 0; i < 10; ++i) {
    auto c = Launch(2, qb_, kb, set_for(acc_b->h, i), 1, {64, 1, 1}, false, last);
    c->finished = [&](cl_int) { ++b_done; };
    last = c->event;
    cmds.push_back(c);
  }
  s->Submit(cmds);
  // Tenant b's ten commands finish although a's (submitted first) waits for the user event.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (b_done.load() < 10 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ASSERT_EQ(b_done.load(), 10);
  EXPECT_EQ(held->event->status(), CL_QUEUED);
  EXPECT_EQ(s->Outstanding(), 1u);
  gate->Complete(CL_COMPLETE);
  s->Rescan(gate);
  Drain(*s);
  WaitUntil([&] { return b_done_when_a_ran.load() >= 0; });
  EXPECT_EQ(b_done_when_a_ran.load(), 10);
  EXPECT_EQ(Read<int>(acc_a, 1)[0], 1 * 3 + 5);
}

TEST_F(SplitSchedTest, CreditWeightsShareTheDeviceOverManyDispatches) {
  // Both tenants backlogged with identical kernels, one command in flight: weights 3:1 give
  // device time 3:1. Counted while both are backlogged: until heavy's 150th completion (light
  // has 200 queued, so it is backlogged throughout); credit allocation cycles are tens of ms of
  // device time, so the kernels are large enough for many cycles to pass.
  auto s = MakeScheduler("credit", 1);
  ASSERT_NE(s, nullptr);
  s->AddTenant(1, 3, "heavy");
  s->AddTenant(2, 1, "light");
  const size_t n = 1 << 14;
  std::vector<float> in(n, 1.0f);
  auto din = Buffer(n * 4, in.data()), da = Buffer(n * 4), db = Buffer(n * 4);
  auto ka = Kernel(prog_, "spin"), kb = Kernel(prog_, "spin");
  std::mutex mu;
  std::vector<TenantId> done;
  std::vector<std::shared_ptr<Command>> cmds;
  std::shared_ptr<EventRecord> last_a, last_b;
  for (int i = 0; i < 200; ++i) {
    for (TenantId t : {TenantId{1}, TenantId{2}}) {
      cl_mem inh = din->h, outh = t == 1 ? da->h : db->h;
      auto set = [inh, outh](cl_kernel k) {
        int iters = 200;
        Dispatch(k).clSetKernelArg(k, 0, sizeof(cl_mem), &inh);
        Dispatch(k).clSetKernelArg(k, 1, sizeof(cl_mem), &outh);
        Dispatch(k).clSetKernelArg(k, 2, sizeof(int), &iters);
      };
      auto& last = t == 1 ? last_a : last_b;
      auto c = Launch(t, t == 1 ? qa_ : qb_, t == 1 ? ka : kb, set, 1, {n, 1, 1}, false, last);
      c->finished = [&mu, &done, t](cl_int) {
        std::lock_guard<std::mutex> lock(mu);
        done.push_back(t);
      };
      last = c->event;
      cmds.push_back(c);
    }
  }
  s->Submit(cmds);
  Drain(*s);
  WaitUntil([&] {
    std::lock_guard<std::mutex> lock(mu);
    return done.size() == 400u;
  });
  std::lock_guard<std::mutex> lock(mu);  // filled by callbacks on the workers' threads
  ASSERT_EQ(done.size(), 400u);
  int heavy = 0, light = 0;
  for (size_t i = 0; i < done.size() && heavy < 150; ++i) (done[i] == 1 ? heavy : light)++;
  ASSERT_GT(light, 0);
  const double ratio = static_cast<double>(heavy) / static_cast<double>(light);
  EXPECT_GT(ratio, 2.0) << heavy << " vs " << light << "\n" << s->Status();
  EXPECT_LT(ratio, 4.5) << heavy << " vs " << light;
}

}  // namespace
}  // namespace gmux::daemon
