#include "demo_fairness.h"

#include <CL/cl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/metrics.h"
#include "core/policy.h"
#include "demo_common.h"
#include "status.h"

namespace gmux::cli {

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

const char* kSource = R"(
__kernel void matmul(__global const float* A, __global const float* B, __global float* C, int n) {
  int row = get_global_id(1), col = get_global_id(0);
  float acc = 0.0f;
  for (int k = 0; k < n; ++k) acc += A[row * n + k] * B[k * n + col];
  C[row * n + col] = acc;
})";

// The closed-loop setups' kernel: each work-item runs kSpinIters dependent multiply-adds, so a
// launch's work is proportional to its work-items. kSpinSource uses only get_global_id (gmux may
// cut it into chunks as it is); kGroupedSource computes the same index from get_group_id, so
// gmux cuts it only through a restoring variant built after its first launch of a shape
// (kernel_scan.h, restore.h); kWholeSource builds the name with the token-pasting operator,
// which no scan sees through, so its launches always run whole, as some real kernels' do.
const char* kSpinSource = R"(
__kernel void spin(__global float* out, int iters) {
  size_t i = get_global_id(0);
  float x = (float)(i % 97);
  for (int k = 0; k < iters; ++k) x = x * 0.9990f + 1.0f;
  out[i] = x;
})";
const char* kGroupedSource = R"(
__kernel void spin(__global float* out, int iters) {
  size_t i = get_group_id(0) * get_local_size(0) + get_local_id(0);
  float x = (float)(i % 97);
  for (int k = 0; k < iters; ++k) x = x * 0.9990f + 1.0f;
  out[i] = x;
})";
const char* kWholeSource = R"(
#define BUILTIN(what) get_##what##_id
__kernel void spin(__global float* out, int iters) {
  size_t i = BUILTIN(global)(0);
  float x = (float)(i % 97);
  for (int k = 0; k < iters; ++k) x = x * 0.9990f + 1.0f;
  out[i] = x;
})";
enum class SpinKind { kSplittable, kRestored, kWhole };
constexpr int kSpinItems = 4096;  // work-items of a 1x launch
constexpr int kSpinLocal = 64;
constexpr int kSpinIters = 600;   // about 1 ms per 1x launch on two CPU cores under PoCL

struct TenantSpec {
  std::string name;
  double weight = 1;
  int n = 128;        // matmul: matrix size; one launch is n x n work-items, n^3 multiply-adds
  int mult = 0;       // > 0: the spin kernel with mult x kSpinItems work-items per launch
  int depth = 0;      // launches kept outstanding; 0: --depth; 1: launch + clFinish, a closed loop
  SpinKind kind = SpinKind::kSplittable;  // spin only: which source
};

struct Setup {
  std::string label;
  std::vector<TenantSpec> tenants;
  // Shares from each tenant's own work rate against its rate alone through the same daemon
  // (runs every tenant alone first), rather than from the daemon's device-time books.
  bool normalised = false;
};

std::vector<Setup> AllSetups() {
  // Kang & Yu Section 5: 6 tenants in two groups, short and long matrix multiplies (8x apart in
  // work, 4x in work-items).
  Setup ky{"kangyu", {}};
  for (int i = 1; i <= 3; ++i) ky.tenants.push_back({"short-" + std::to_string(i), 1, 128});
  for (int i = 1; i <= 3; ++i) ky.tenants.push_back({"long-" + std::to_string(i), 1, 256});
  // VMCG Section 6: 3 tenants with different kernel sizes, equal weights, then 4:2:1.
  Setup eq{"vmcg-equal", {{"small", 1, 128}, {"medium", 1, 192}, {"large", 1, 256}}};
  Setup w{"vmcg-weighted", {{"small", 4, 128}, {"medium", 2, 192}, {"large", 1, 256}}};
  // Ordinary programs: closed loops of one launch + clFinish (docs/reproductions.md, "Closed
  // loops"); kernels 1x to 64x in work per launch, splittable and not, open loops beside them.
  auto closed = [](std::string name, double weight, int mult, int depth = 1,
                   SpinKind kind = SpinKind::kSplittable) {
    return TenantSpec{std::move(name), weight, 0, mult, depth, kind};
  };
  Setup c211{"closed-211", {closed("x1", 2, 1), closed("x4", 1, 4), closed("x16", 1, 16)}, true};
  Setup ceq{"closed-equal", {closed("x1", 1, 1), closed("x4", 1, 4), closed("x16", 1, 16)}, true};
  Setup small{"small-among-large",
              {closed("x1", 1, 1), closed("x16-a", 1, 16), closed("x16-b", 1, 16)}, true};
  Setup open{"open-closed", {closed("x1", 1, 1), closed("x16-open", 1, 16, 4)}, true};
  Setup unsplit{"unsplittable",
                {closed("x1", 1, 1), closed("x4-whole", 1, 4, 1, SpinKind::kWhole),
                 closed("x16", 1, 16)},
                true};
  Setup restored{"restored",
                 {closed("x1-groups", 1, 1, 1, SpinKind::kRestored),
                  closed("x4-groups", 1, 4, 1, SpinKind::kRestored),
                  closed("x16-groups", 1, 16, 1, SpinKind::kRestored)},
                 true};
  Setup eight{"eight",
              {closed("x1-a", 2, 1), closed("x1-b", 1, 1), closed("x4-a", 2, 4),
               closed("x4-b", 1, 4), closed("x16-a", 1, 16), closed("x16-b", 1, 16),
               closed("x64", 1, 64), closed("x16-open", 1, 16, 4)},
              true};
  return {ky, eq, w, c211, ceq, small, open, unsplit, restored, eight};
}

// "POLICY.KEY=VALUE" -> params[POLICY][KEY] = VALUE; the defaults first, then `given`, each
// checked by building the policy it names.
Result<std::map<std::string, std::map<std::string, double>>> ParsePolicyParams(
    const std::vector<std::string>& given) {
  std::map<std::string, std::map<std::string, double>> out;
  std::vector<std::string> all(std::begin(kDefaultParams), std::end(kDefaultParams));
  all.insert(all.end(), given.begin(), given.end());
  for (const std::string& p : all) {
    const size_t dot = p.find('.'), eq = p.find('=');
    if (dot == std::string::npos || eq == std::string::npos || dot == 0 || eq < dot + 2 ||
        eq + 1 == p.size()) {
      return InvalidArgument("--param " + p + ": expected POLICY.KEY=VALUE");
    }
    const std::string value = p.substr(eq + 1);
    char* end = nullptr;
    const double x = std::strtod(value.c_str(), &end);
    if (end == value.c_str() || *end != '\0' || !std::isfinite(x)) {
      return InvalidArgument("--param " + p + ": VALUE must be a number");
    }
    out[p.substr(0, dot)][p.substr(dot + 1, eq - dot - 1)] = x;
  }
  for (const auto& [policy, params] : out) {
    core::PolicySpec spec{policy, params, {}};
    auto made = core::MakePolicy(spec);
    if (!made.ok()) return InvalidArgument("--param: " + made.status().message());
  }
  return out;
}

// A tenant's OpenCL objects: the first platform's first device, an in-order queue, and kernel
// `name` built from `source`. Returns 0 or the tenant's exit code for the step that failed.
struct TenantCl {
  cl_device_id dev = nullptr;
  cl_context ctx = nullptr;
  cl_command_queue q = nullptr;
  cl_program p = nullptr;
  cl_kernel k = nullptr;
  ~TenantCl() {
    if (k != nullptr) clReleaseKernel(k);
    if (p != nullptr) clReleaseProgram(p);
    if (q != nullptr) clReleaseCommandQueue(q);
    if (ctx != nullptr) clReleaseContext(ctx);
  }
};

int OpenTenantCl(const char* source, const char* name, TenantCl& cl) {
  cl_platform_id platform;
  cl_uint np = 0;
  if (clGetPlatformIDs(1, &platform, &np) != CL_SUCCESS || np == 0) return 10;
  if (clGetDeviceIDs(platform, CL_DEVICE_TYPE_ALL, 1, &cl.dev, nullptr) != CL_SUCCESS) return 11;
  cl_int err;
  cl.ctx = clCreateContext(nullptr, 1, &cl.dev, nullptr, nullptr, &err);
  if (err != CL_SUCCESS) return 12;
  cl.q = clCreateCommandQueue(cl.ctx, cl.dev, 0, &err);
  cl.p = clCreateProgramWithSource(cl.ctx, 1, &source, nullptr, &err);
  if (clBuildProgram(cl.p, 1, &cl.dev, "", nullptr, nullptr) != CL_SUCCESS) return 13;
  cl.k = clCreateKernel(cl.p, name, &err);
  return err == CL_SUCCESS ? 0 : 14;
}

// One tenant process: builds its program, reports "ready", waits for the start byte, then keeps
// `depth` launches outstanding until `run_s` has passed; writes its latencies and exits.
int SpinTenantMain(const TenantSpec& t, int depth, double run_s, int ready_fd, int start_fd);

int TenantMain(const TenantSpec& t, int depth, double run_s, int ready_fd, int start_fd) {
  if (t.mult > 0) return SpinTenantMain(t, depth, run_s, ready_fd, start_fd);
  TenantCl cl;
  if (int failed = OpenTenantCl(kSource, "matmul", cl); failed != 0) return failed;
  cl_context ctx = cl.ctx;
  cl_command_queue q = cl.q;
  cl_kernel k = cl.k;
  cl_int err;
  const int n = t.n;
  std::vector<float> A(static_cast<size_t>(n) * n), B(A.size()), C(A.size());
  for (size_t i = 0; i < A.size(); ++i) {
    A[i] = static_cast<float>((i * 7) % 13) * 0.25f;
    B[i] = static_cast<float>((i * 3) % 11) * 0.5f;
  }
  size_t bytes = A.size() * sizeof(float);
  cl_mem dA = clCreateBuffer(ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, bytes, A.data(), &err);
  cl_mem dB = clCreateBuffer(ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, bytes, B.data(), &err);
  cl_mem dC = clCreateBuffer(ctx, CL_MEM_WRITE_ONLY, bytes, nullptr, &err);
  if (err != CL_SUCCESS) return 15;
  clSetKernelArg(k, 0, sizeof(cl_mem), &dA);
  clSetKernelArg(k, 1, sizeof(cl_mem), &dB);
  clSetKernelArg(k, 2, sizeof(cl_mem), &dC);
  clSetKernelArg(k, 3, sizeof(int), &n);
  size_t gs[2] = {static_cast<size_t>(n), static_cast<size_t>(n)};
  // One warm launch so the kernel is compiled before the clock starts.
  if (clEnqueueNDRangeKernel(q, k, 2, nullptr, gs, nullptr, 0, nullptr, nullptr) != CL_SUCCESS ||
      clFinish(q) != CL_SUCCESS) {
    return 16;
  }
  char c = 'r';
  if (::write(ready_fd, &c, 1) != 1) return 17;
  if (::read(start_fd, &c, 1) != 1) return 18;

  struct Pending {
    cl_event ev;
    Clock::time_point at;
  };
  std::vector<Pending> pending;
  std::string out;
  const auto start = Clock::now();
  const auto stop = start + std::chrono::duration_cast<Clock::duration>(
                                std::chrono::duration<double>(run_s));
  uint64_t done = 0;
  while (Clock::now() < stop || !pending.empty()) {
    if (Clock::now() < stop && static_cast<int>(pending.size()) < depth) {
      cl_event ev;
      if (clEnqueueNDRangeKernel(q, k, 2, nullptr, gs, nullptr, 0, nullptr, &ev) != CL_SUCCESS) {
        return 19;
      }
      clFlush(q);
      pending.push_back({ev, Clock::now()});
      continue;
    }
    if (clWaitForEvents(1, &pending.front().ev) != CL_SUCCESS) return 20;
    auto now = Clock::now();
    // "<seconds since start at completion> <latency>" per completed launch.
    out += std::to_string(std::chrono::duration<double>(now - start).count()) + " " +
           std::to_string(std::chrono::duration<double>(now - pending.front().at).count()) + "\n";
    clReleaseEvent(pending.front().ev);
    pending.erase(pending.begin());
    ++done;
  }
  if (clEnqueueReadBuffer(q, dC, CL_TRUE, 0, bytes, C.data(), 0, nullptr, nullptr) != CL_SUCCESS) {
    return 21;
  }
  int wrong = 0;
  for (int i = 0; i < n; i += 31) {
    for (int j = 0; j < n; j += 17) {
      double ref = 0;
      for (int x = 0; x < n; ++x) ref += static_cast<double>(A[i * n + x]) * B[x * n + j];
      wrong += std::fabs(ref - C[i * n + j]) > 1e-3 * std::fabs(ref) + 1e-3;
    }
  }
  if (wrong != 0) return 22;
  if (!WriteAll(ready_fd, out)) return 23;
  clReleaseMemObject(dA);
  clReleaseMemObject(dB);
  clReleaseMemObject(dC);
  return 0;
}

// A closed-loop (depth 1: one launch, then clFinish) or open-loop spin tenant, written the way an
// ordinary program is: a std::vector, blocking calls. Same protocol as TenantMain.
int SpinTenantMain(const TenantSpec& t, int depth, double run_s, int ready_fd, int start_fd) {
  TenantCl cl;
  const char* source = t.kind == SpinKind::kWhole      ? kWholeSource
                       : t.kind == SpinKind::kRestored ? kGroupedSource
                                                       : kSpinSource;
  if (int failed = OpenTenantCl(source, "spin", cl);
      failed != 0) {
    return failed;
  }
  cl_command_queue q = cl.q;
  cl_kernel k = cl.k;
  cl_int err;
  const size_t items = static_cast<size_t>(kSpinItems) * static_cast<size_t>(t.mult);
  std::vector<float> host(items, -1.0f);
  cl_mem out = clCreateBuffer(cl.ctx, CL_MEM_WRITE_ONLY, items * sizeof(float), nullptr, &err);
  if (err != CL_SUCCESS) return 15;
  const int iters = kSpinIters;
  clSetKernelArg(k, 0, sizeof(cl_mem), &out);
  clSetKernelArg(k, 1, sizeof(int), &iters);
  const size_t global = items, local = kSpinLocal;
  if (clEnqueueNDRangeKernel(q, k, 1, nullptr, &global, &local, 0, nullptr, nullptr) != CL_SUCCESS ||
      clFinish(q) != CL_SUCCESS) {
    return 16;
  }
  char c = 'r';
  if (::write(ready_fd, &c, 1) != 1) return 17;
  if (::read(start_fd, &c, 1) != 1) return 18;
  std::string log;
  const auto start = Clock::now();
  const auto stop = start + std::chrono::duration_cast<Clock::duration>(
                                std::chrono::duration<double>(run_s));
  auto record = [&](Clock::time_point at) {
    auto now = Clock::now();
    log += std::to_string(std::chrono::duration<double>(now - start).count()) + " " +
           std::to_string(std::chrono::duration<double>(now - at).count()) + "\n";
  };
  if (depth <= 1) {
    while (Clock::now() < stop) {
      const auto at = Clock::now();
      if (clEnqueueNDRangeKernel(q, k, 1, nullptr, &global, &local, 0, nullptr, nullptr) !=
              CL_SUCCESS ||
          clFinish(q) != CL_SUCCESS) {
        return 19;
      }
      record(at);
    }
  } else {
    std::vector<std::pair<cl_event, Clock::time_point>> pending;
    while (Clock::now() < stop || !pending.empty()) {
      if (Clock::now() < stop && static_cast<int>(pending.size()) < depth) {
        cl_event ev;
        if (clEnqueueNDRangeKernel(q, k, 1, nullptr, &global, &local, 0, nullptr, &ev) !=
            CL_SUCCESS) {
          return 19;
        }
        clFlush(q);
        pending.emplace_back(ev, Clock::now());
        continue;
      }
      if (clWaitForEvents(1, &pending.front().first) != CL_SUCCESS) return 20;
      record(pending.front().second);
      clReleaseEvent(pending.front().first);
      pending.erase(pending.begin());
    }
  }
  if (clEnqueueReadBuffer(q, out, CL_TRUE, 0, items * sizeof(float), host.data(), 0, nullptr,
                          nullptr) != CL_SUCCESS) {
    return 21;
  }
  for (size_t i = 0; i < items; i += 511) {
    float x = static_cast<float>(i % 97);
    for (int j = 0; j < iters; ++j) x = x * 0.9990f + 1.0f;
    if (std::fabs(x - host[i]) > 1e-3f * std::fabs(x) + 1e-3f) return 22;
  }
  if (!WriteAll(ready_fd, log)) return 23;
  clReleaseMemObject(out);
  return 0;
}

json Snapshot(const std::string& socket) {
  auto s = QuerySchedulerStatus(socket);
  if (!s.ok()) return json::object();
  json j = json::parse(*s, nullptr, false);
  return j.is_discarded() ? json::object() : j;
}

const json* FindTenant(const json& snap, const std::string& name) {
  if (!snap.contains("tenants")) return nullptr;
  for (const auto& t : snap["tenants"]) {
    if (t.value("name", std::string()) == name) return &t;
  }
  return nullptr;
}

// One run: a gmuxd with `policy`, the setup's tenants; returns the run's JSON (or an error
// object with "error").
json RunOne(const DemoPaths& paths, const Setup& setup, const std::string& policy,
            const std::map<std::string, double>& params, const DemoFairnessOptions& o) {
  DemoDaemon daemon;
  if (!daemon.Prepare("gmux-fair", paths)) return json{{"error", "cannot make a temp dir"}};
  const std::string socket = daemon.socket();
  const bool root = ::getuid() == 0;
  std::ostringstream cfg;
  cfg << "inflight_per_device = " << o.inflight << "\n\n[scheduler]\npolicy = \"" << policy
      << "\"\n\n";
  if (!params.empty()) {
    cfg << "[scheduler.params]\n";
    char num[64];
    for (const auto& [k, v] : params) {
      std::snprintf(num, sizeof(num), "%.17g", v);
      // TOML floats need a '.' or exponent only when not integral; integers parse as numbers.
      cfg << k << " = " << num << "\n";
    }
    cfg << "\n";
  }
  for (size_t i = 0; i < setup.tenants.size(); ++i) {
    cfg << "[[tenant]]\nname = \"" << setup.tenants[i].name
        << "\"\nweight = " << setup.tenants[i].weight << "\nuids = ["
        << (root ? 60101 + i : ::getuid()) << "]\n\n";
  }
  json result;
  if (!daemon.Start(cfg.str(), 900)) return json{{"error", "gmuxd did not start"}};
  const double run_s = o.warmup_s + o.window_s + 0.5;
  std::vector<DemoTenant> kids(setup.tenants.size());
  bool ok = true;
  for (size_t i = 0; i < setup.tenants.size(); ++i) {
    const int depth = setup.tenants[i].depth > 0 ? setup.tenants[i].depth : o.depth;
    ok = ok && kids[i].Spawn(daemon, root ? static_cast<uid_t>(60101 + i) : 0,
                             [&, i, depth](int up, int down) {
                               return TenantMain(setup.tenants[i], depth, run_s, up, down);
                             });
  }
  ok = StartAll(kids) && ok;
  std::this_thread::sleep_for(std::chrono::duration<double>(o.warmup_s));
  json a = Snapshot(socket);
  auto t0 = Clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(o.window_s));
  json b = Snapshot(socket);
  double window = std::chrono::duration<double>(Clock::now() - t0).count();
  std::vector<std::string> outputs(kids.size());
  for (size_t i = 0; i < kids.size(); ++i) {
    int status = -1;
    outputs[i] = kids[i].Finish(status);
    if (status != 0) {
      ok = false;
      result["error"] = "tenant " + setup.tenants[i].name + " failed (exit " +
                        std::to_string(status) + ")";
    }
  }
  daemon.Stop();
  if (!ok) {
    if (!result.contains("error")) result["error"] = "a tenant did not start";
    return result;
  }

  std::vector<double> weights, device_s, shares;
  double items = 0, total_device = 0;
  json tenants = json::array();
  for (size_t i = 0; i < setup.tenants.size(); ++i) {
    const json* ta = FindTenant(a, setup.tenants[i].name);
    const json* tb = FindTenant(b, setup.tenants[i].name);
    if (ta == nullptr || tb == nullptr) return json{{"error", "tenant missing from gmux status"}};
    double dt = tb->value("device_time_s", 0.0) - ta->value("device_time_s", 0.0);
    weights.push_back(setup.tenants[i].weight);
    device_s.push_back(dt);
    total_device += dt;
    items += static_cast<double>(tb->value("processed_items", uint64_t{0}) -
                                 ta->value("processed_items", uint64_t{0}));
    // Latencies of the launches that completed inside the window (tenant clock: the window
    // starts warmup_s after the tenants' start).
    std::vector<double> lat;
    std::stringstream in(outputs[i]);
    double at, l;
    while (in >> at >> l) {
      if (at >= o.warmup_s && at < o.warmup_s + o.window_s) lat.push_back(l);
    }
    double lat_sum = 0;
    for (double x : lat) lat_sum += x;
    // Work done, in 1x launches per second, from the tenant's own clock.
    const double work_rate = static_cast<double>(lat.size()) *
                             std::max(1, setup.tenants[i].mult) / o.window_s;
    tenants.push_back(json{
        {"name", setup.tenants[i].name},
        {"weight", setup.tenants[i].weight},
        {"matrix_n", setup.tenants[i].n},
        {"device_time_s", dt},
        // split only: the Eq. (1) usage the policy charged in the window (what it equalises).
        {"usage_s", tb->value("usage_s", 0.0) - ta->value("usage_s", 0.0)},
        {"next_chunk_items", tb->value("next_chunk_items", uint64_t{0})},
        {"commands", tb->value("completed_commands", uint64_t{0}) -
                         ta->value("completed_commands", uint64_t{0})},
        {"dispatches", tb->value("dispatches", uint64_t{0}) - ta->value("dispatches", uint64_t{0})},
        {"unsplit_kernel_s", tb->value("unsplit_kernel_s", 0.0) - ta->value("unsplit_kernel_s", 0.0)},
        {"launches", lat.size()},
        {"work_rate", work_rate},
        {"mean_latency_s", lat.empty() ? 0.0 : lat_sum / static_cast<double>(lat.size())},
        {"completions_s", lat}});
  }
  for (size_t i = 0; i < tenants.size(); ++i) {
    double share = total_device > 0 ? device_s[i] / total_device : 0;
    shares.push_back(share);
    tenants[i]["share"] = share;
  }
  const json sched_b = b.value("scheduler", json::object());
  const json sched_a = a.value("scheduler", json::object());
  double busy = sched_b.value("busy_s", 0.0) - sched_a.value("busy_s", 0.0);
  double disp = static_cast<double>(sched_b.value("dispatches", uint64_t{0}) -
                                    sched_a.value("dispatches", uint64_t{0}));
  result["label"] = setup.label;
  result["policy"] = policy;
  json pj{{"inflight_per_device", o.inflight}, {"depth", o.depth}};
  for (const auto& [k, v] : params) pj[k] = v;
  result["params"] = pj;
  result["lambda"] = core::FairnessLambda(weights, device_s);
  result["jain"] = core::JainIndex(weights, shares);
  auto [mn, mx] = std::minmax_element(shares.begin(), shares.end());
  result["max_min_share"] = *mn > 0 ? *mx / *mn : 0.0;
  result["window_s"] = window;
  result["device_busy"] = window > 0 ? total_device / window : 0;
  result["throughput"] = window > 0 ? items / window : 0;
  result["sched_ns_per_dispatch"] = disp > 0 ? busy * 1e9 / disp : 0;
  result["tenants"] = tenants;
  return result;
}

}  // namespace

int RunDemoFairness(const DemoFairnessOptions& o) {
  DemoPaths paths;
  if (!paths.Find("gmux demo fairness")) return 2;
  std::vector<std::string> policies = SplitList(o.policies), wanted = SplitList(o.setups);
  auto params = ParsePolicyParams(o.params);
  if (!params.ok()) {
    std::cerr << "gmux demo fairness: " << params.status().message() << "\n";
    return 2;
  }
  for (const std::string& p : policies) {
    auto made = core::MakePolicy(core::PolicySpec{p, {}, {}});
    if (!made.ok()) {
      std::cerr << "gmux demo fairness: " << made.status().message() << "\n";
      return 2;
    }
  }
  const std::vector<Setup> setups = AllSetups();
  std::string known;
  for (const Setup& s : setups) known += (known.empty() ? "" : ", ") + s.label;
  for (const std::string& w : wanted) {
    if (std::none_of(setups.begin(), setups.end(), [&](const Setup& s) { return s.label == w; })) {
      std::cerr << "gmux demo fairness: unknown setup '" << w << "' (known: " << known << ")\n";
      return 2;
    }
  }
  json runs = json::array();
  if (::getuid() != 0 && !o.json) {
    std::cerr << "(not root: every tenant process runs as the caller's uid and so is one tenant;"
                 " run as root for a meaningful experiment)\n";
  }
  int failures = 0;
  for (const Setup& s : setups) {
    if (std::find(wanted.begin(), wanted.end(), s.label) == wanted.end()) continue;
    // Normalised setups: every tenant alone first (fifo: a lone tenant is never held back or
    // split under any policy), for its work rate and latency alone.
    std::vector<double> alone_rate(s.tenants.size(), 0), alone_latency(s.tenants.size(), 0);
    if (s.normalised) {
      for (size_t i = 0; i < s.tenants.size(); ++i) {
        if (!o.json) std::cerr << "running " << s.label << "/" << s.tenants[i].name << " alone ...\n";
        Setup one{s.label, {s.tenants[i]}, true};
        json r = RunOne(paths, one, "fifo", {}, o);
        if (r.contains("error") || r["tenants"].empty()) {
          ++failures;
          std::cerr << "gmux demo fairness: " << s.label << "/" << s.tenants[i].name
                    << " alone: " << r.value("error", std::string("no result")) << "\n";
          continue;
        }
        alone_rate[i] = r["tenants"][0].value("work_rate", 0.0);
        alone_latency[i] = r["tenants"][0].value("mean_latency_s", 0.0);
      }
    }
    double fifo_total = 0;
    for (const std::string& p : policies) {
      if (!o.json) std::cerr << "running " << s.label << " under " << p << " ...\n";
      auto pp = params->find(p);
      json r = RunOne(paths, s, p, pp != params->end() ? pp->second : std::map<std::string, double>{},
                      o);
      if (r.contains("error")) {
        ++failures;
        std::cerr << "gmux demo fairness: " << s.label << "/" << p << ": "
                  << r["error"].get<std::string>() << "\n";
        r["label"] = s.label;
        r["policy"] = p;
      } else if (s.normalised) {
        // share_i = rate_i / rate_i alone; fairness compares share_i / Σ share with w_i / Σ w.
        std::vector<double> w, norm;
        double total = 0;
        for (size_t i = 0; i < s.tenants.size(); ++i) {
          json& t = r["tenants"][i];
          const double share = alone_rate[i] > 0 ? t.value("work_rate", 0.0) / alone_rate[i] : 0;
          t["alone_work_rate"] = alone_rate[i];
          t["alone_latency_s"] = alone_latency[i];
          t["latency_vs_alone"] = alone_latency[i] > 0 ? t.value("mean_latency_s", 0.0) / alone_latency[i] : 0;
          t["work_share"] = share;
          w.push_back(s.tenants[i].weight);
          norm.push_back(share);
          total += share;
        }
        double wsum = 0;
        for (double x : w) wsum += x;
        double worst = 0;
        for (size_t i = 0; i < norm.size(); ++i) {
          json& t = r["tenants"][i];
          t["share"] = total > 0 ? norm[i] / total : 0;
          t["weight_share"] = w[i] / wsum;
          worst = std::max(worst, std::fabs(t["share"].get<double>() - w[i] / wsum));
        }
        r["share_basis"] = "work rate against the tenant alone";
        r["total_work"] = total;  // Σ share_i: 1 = the device as busy as each tenant alone
        if (p == "fifo") fifo_total = total;
        // (null when fifo did not run before this policy in the same invocation)
        r["total_vs_fifo"] = fifo_total > 0 ? json(total / fifo_total) : json(nullptr);
        r["jain"] = core::JainIndex(w, norm);
        r["max_share_error"] = worst;
        std::vector<double> shares;
        for (const auto& t : r["tenants"]) shares.push_back(t["share"].get<double>());
        r["lambda"] = core::FairnessLambda(w, norm);
        auto [mn, mx] = std::minmax_element(shares.begin(), shares.end());
        r["max_min_share"] = *mn > 0 ? *mx / *mn : 0.0;
      }
      runs.push_back(r);
    }
  }
  if (o.json) {
    std::cout << json{{"kind", "demo-fairness"}, {"runs", runs}}.dump(2) << "\n";
  } else {
    std::printf("%-17s %-7s %7s %6s %8s %14s %9s  %s\n", "setup", "policy", "lambda", "jain",
                "max/min", "items/s", "ns/disp", "shares (weight: share)");
    for (const auto& r : runs) {
      if (r.contains("error")) continue;
      std::string sh;
      for (const auto& t : r["tenants"]) {
        char b[96];
        std::snprintf(b, sizeof(b), "%s %g: %.3f  ", t["name"].get<std::string>().c_str(),
                      t["weight"].get<double>(), t["share"].get<double>());
        sh += b;
      }
      if (r.contains("total_vs_fifo")) {
        char b[96];
        std::snprintf(b, sizeof(b), "| err %.3f, work %.2f", r["max_share_error"].get<double>(),
                      r["total_work"].get<double>());
        sh += b;
        if (r["total_vs_fifo"].is_number()) {
          std::snprintf(b, sizeof(b), " (%.2fx fifo)", r["total_vs_fifo"].get<double>());
          sh += b;
        }
      }
      std::printf("%-17s %-7s %7.3f %6.3f %8.2f %14.0f %9.0f  %s\n",
                  r["label"].get<std::string>().c_str(), r["policy"].get<std::string>().c_str(),
                  r["lambda"].get<double>(), r["jain"].get<double>(),
                  r["max_min_share"].get<double>(), r["throughput"].get<double>(),
                  r["sched_ns_per_dispatch"].get<double>(), sh.c_str());
    }
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace gmux::cli
