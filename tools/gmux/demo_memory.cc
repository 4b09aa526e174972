#include "demo_memory.h"

#include <CL/cl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "demo_common.h"
#include "status.h"

namespace gmux::cli {

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

const char* kBump = R"(
__kernel void bump(__global uint* a) { a[get_global_id(0)] += 1u; }
)";

// Tenant i: launches per round and think time after it, so that the tenants use the device
// differently (what the utilization policy places by).
int LaunchesOf(int i) { return std::max(1, 4 - i); }
int ThinkMsOf(int i) { return i == 0 ? 0 : 25 * i; }

// What a tenant's exit status says about where it stopped.
const char* SetupStep(int code) {
  switch (code) {
    case 3: return "switching to the tenant's uid";
    case 10: return "clGetPlatformIDs";
    case 11: return "clGetDeviceIDs";
    case 12: return "clCreateContext";
    case 13: return "creating the queue or building the program";
    case 14: return "clCreateKernel";
    case 15: return "clCreateBuffer";
    case 16: return "clSetKernelArg";
    case 17: return "telling the demo it is ready";
    case 18: return "waiting for the start";
    default: return "an unknown step";
  }
}

// A set-up step that failed: said on stderr (which the tenant shares with the demo) with the
// OpenCL error, and returned as the tenant's exit status (10-16, named by SetupStep()).
int SetupFailed(int i, int code, cl_int err) {
  std::fprintf(stderr, "gmux demo memory: tenant %d: %s failed (OpenCL error %d)\n", i,
               SetupStep(code), err);
  return code;
}

// One tenant process: a buffer of `mib` MiB with known contents; each round bumps every word
// LaunchesOf(i) times (one launch + clFinish each), reads the whole buffer back and checks it
// against the CPU's copy, then thinks. Writes "rounds mismatched_rounds seconds" and exits 0
// when every round matched.
int TenantMain(int i, int mib, int rounds, int ready_fd, int start_fd) {
  cl_platform_id platform;
  cl_uint np = 0;
  cl_int err = clGetPlatformIDs(1, &platform, &np);
  if (err != CL_SUCCESS || np == 0) return SetupFailed(i, 10, err);
  cl_device_id dev;
  err = clGetDeviceIDs(platform, CL_DEVICE_TYPE_ALL, 1, &dev, nullptr);
  if (err != CL_SUCCESS) return SetupFailed(i, 11, err);
  cl_context ctx = clCreateContext(nullptr, 1, &dev, nullptr, nullptr, &err);
  if (ctx == nullptr) return SetupFailed(i, 12, err);
  cl_command_queue q = clCreateCommandQueue(ctx, dev, 0, &err);
  if (q == nullptr) return SetupFailed(i, 13, err);
  cl_program p = clCreateProgramWithSource(ctx, 1, &kBump, nullptr, &err);
  if (p == nullptr) return SetupFailed(i, 13, err);
  if (cl_int b = clBuildProgram(p, 1, &dev, "", nullptr, nullptr); b != CL_SUCCESS) {
    char log[2048] = {};
    clGetProgramBuildInfo(p, dev, CL_PROGRAM_BUILD_LOG, sizeof(log) - 1, log, nullptr);
    std::fprintf(stderr, "gmux demo memory: tenant %d: clBuildProgram -> %d\n%s\n", i, b, log);
    return 13;
  }
  cl_kernel k = clCreateKernel(p, "bump", &err);
  if (k == nullptr) return SetupFailed(i, 14, err);
  const size_t words = static_cast<size_t>(mib) * (1u << 20) / 4;
  std::vector<cl_uint> expect(words), back(words);
  for (size_t w = 0; w < words; ++w) expect[w] = static_cast<cl_uint>(w * 2654435761u + i);
  cl_mem buf = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, words * 4,
                              expect.data(), &err);
  if (buf == nullptr) return SetupFailed(i, 15, err);
  err = clSetKernelArg(k, 0, sizeof(cl_mem), &buf);
  if (err != CL_SUCCESS) return SetupFailed(i, 16, err);
  if (!WriteAll(ready_fd, "r")) return 17;
  char c = 0;
  if (::read(start_fd, &c, 1) != 1) return 18;
  const auto t0 = Clock::now();
  int bad = 0;
  for (int r = 0; r < rounds; ++r) {
    for (int l = 0; l < LaunchesOf(i); ++l) {
      if (clEnqueueNDRangeKernel(q, k, 1, nullptr, &words, nullptr, 0, nullptr, nullptr) !=
              CL_SUCCESS ||
          clFinish(q) != CL_SUCCESS) {
        return 19;
      }
    }
    for (auto& e : expect) e += static_cast<cl_uint>(LaunchesOf(i));
    if (clEnqueueReadBuffer(q, buf, CL_TRUE, 0, words * 4, back.data(), 0, nullptr, nullptr) !=
        CL_SUCCESS) {
      return 21;
    }
    if (back != expect) ++bad;
    std::this_thread::sleep_for(std::chrono::milliseconds(ThinkMsOf(i)));
  }
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  WriteAll(ready_fd, " " + std::to_string(rounds) + " " + std::to_string(bad) + " " +
                         std::to_string(secs));
  clReleaseMemObject(buf);
  clReleaseKernel(k);
  clReleaseProgram(p);
  clReleaseCommandQueue(q);
  clReleaseContext(ctx);
  return bad == 0 ? 0 : 20;
}

// The device's own copy bandwidth, for the swap bandwidth to be read against: a blocking read
// and a blocking write of `bytes` on the first platform that is not gmux, in GB/s (0 if none).
double NativeCopyGbps(size_t bytes) {
  cl_uint n = 0;
  if (clGetPlatformIDs(0, nullptr, &n) != CL_SUCCESS || n == 0) return 0;
  std::vector<cl_platform_id> ps(n);
  clGetPlatformIDs(n, ps.data(), nullptr);
  for (cl_platform_id p : ps) {
    char name[256] = {};
    clGetPlatformInfo(p, CL_PLATFORM_NAME, sizeof(name) - 1, name, nullptr);
    if (std::string(name).find("gmux") != std::string::npos) continue;
    cl_device_id dev;
    if (clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, 1, &dev, nullptr) != CL_SUCCESS) continue;
    cl_int err = CL_SUCCESS;
    cl_context ctx = clCreateContext(nullptr, 1, &dev, nullptr, nullptr, &err);
    if (ctx == nullptr) continue;
    cl_command_queue q = clCreateCommandQueue(ctx, dev, 0, &err);
    std::vector<uint8_t> host(bytes, 1);
    cl_mem m = clCreateBuffer(ctx, CL_MEM_READ_WRITE, bytes, nullptr, &err);
    double best = 0;
    for (int rep = 0; rep < 3 && m != nullptr && q != nullptr; ++rep) {
      auto t0 = Clock::now();
      clEnqueueWriteBuffer(q, m, CL_TRUE, 0, bytes, host.data(), 0, nullptr, nullptr);
      clEnqueueReadBuffer(q, m, CL_TRUE, 0, bytes, host.data(), 0, nullptr, nullptr);
      const double s = std::chrono::duration<double>(Clock::now() - t0).count();
      if (s > 0) best = std::max(best, 2.0 * static_cast<double>(bytes) / s / 1e9);
    }
    if (m != nullptr) clReleaseMemObject(m);
    if (q != nullptr) clReleaseCommandQueue(q);
    clReleaseContext(ctx);
    return best;
  }
  return 0;
}

json RunOne(const DemoPaths& paths, const std::string& policy, double batch,
           const DemoMemoryOptions& o) {
  DemoDaemon daemon;
  if (!daemon.Prepare("gmux-mem", paths)) return json{{"error", "cannot make a temp dir"}};
  const std::string socket = daemon.socket();
  const bool root = ::getuid() == 0;
  std::ostringstream cfg;
  cfg << "inflight_per_device = 2\nmemory_bytes = \"" << o.capacity << "\"\nmemory_slots = \""
      << policy << "\"\nslot_bytes = \"" << o.slot << "\"\nswap_batch = " << batch
      << "\n\n[scheduler]\npolicy = \"fifo\"\n\n";
  for (int i = 0; i < o.tenants; ++i) {
    cfg << "[[tenant]]\nname = \"t" << i << "\"\nuids = [" << (root ? 60201 + i : ::getuid())
        << "]\n\n";
  }
  if (!daemon.Start(cfg.str(), 1800)) {
    return json{{"error", "gmuxd did not start (is the configuration valid?)"}};
  }
  std::vector<DemoTenant> kids(static_cast<size_t>(o.tenants));
  bool ok = true;
  for (int i = 0; i < o.tenants; ++i) {
    ok = ok && kids[i].Spawn(daemon, root ? static_cast<uid_t>(60201 + i) : 0,
                             [&o, i](int up, int down) {
                               return TenantMain(i, o.mib, o.rounds, up, down);
                             });
  }
  const auto t0 = Clock::now();
  int not_ready = -1;
  ok = StartAll(kids, &not_ready) && ok;
  json result;
  if (not_ready >= 0) {
    // Completed with the tenant's exit status below, which names the step.
    result["error"] = "tenant t" + std::to_string(not_ready) + " failed while setting up";
  }
  json tenants = json::array();
  const auto deadline = t0 + std::chrono::duration_cast<Clock::duration>(
                                 std::chrono::duration<double>(o.timeout_s));
  bool timed_out = false;
  json status_at_timeout;
  for (int i = 0; i < o.tenants; ++i) {
    int status = -1;
    const std::string out = kids[i].Finish(status, deadline);
    if (status == DemoTenant::kTimedOut && status_at_timeout.is_null()) {
      // The first tenant past the deadline (killed): what the daemon was doing, before the
      // others are.
      if (auto s = QuerySchedulerStatus(socket); s.ok()) {
        status_at_timeout = json::parse(*s, nullptr, false);
      }
    }
    int rounds = 0, bad = -1;
    double secs = 0;
    std::stringstream(out) >> rounds >> bad >> secs;
    if (i == not_ready) {
      result["error"] = result["error"].get<std::string>() +
                        (status > 0 ? std::string(" at ") + SetupStep(status) + " (exit " +
                                          std::to_string(status) + ")"
                                    : std::string(" (it did not exit normally)"));
    }
    if (status == DemoTenant::kTimedOut) {
      ok = false;
      if (!timed_out) {
        result["error"] = "tenant t" + std::to_string(i) + " did not finish within " +
                          std::to_string(o.timeout_s) + " s (killed)";
      }
      timed_out = true;
    } else if (status != 0 && !result.contains("error")) {  // the first failure is named
      ok = false;
      result["error"] = "tenant t" + std::to_string(i) + " failed (exit " +
                        std::to_string(status) +
                        (bad > 0 ? ", results differed from the CPU's" : "") + ")";
    }
    tenants.push_back(json{{"name", "t" + std::to_string(i)},
                           {"mib", o.mib},
                           {"launches_per_round", LaunchesOf(i)},
                           {"think_ms", ThinkMsOf(i)},
                           {"rounds", rounds},
                           {"rounds_wrong", bad},
                           {"seconds", secs}});
  }
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  json status = json::object();
  if (auto s = QuerySchedulerStatus(socket); s.ok()) {
    status = json::parse(*s, nullptr, false);
    if (status.is_discarded()) status = json::object();
  }
  if (!ok) {
    if (!status_at_timeout.is_null()) result["status_at_timeout"] = status_at_timeout;
    result["daemon_log"] = daemon.LogTail();
  }
  daemon.Stop();
  if (!ok && !result.contains("error")) result["error"] = "a tenant did not start";
  json slots;
  if (status.contains("devices") && !status["devices"].empty()) {
    slots = status["devices"][0].value("slots", json());
  }
  if (!slots.is_object()) {
    if (!result.contains("error")) result["error"] = "no slots in gmux status";
    return result;
  }
  for (auto& t : tenants) {
    if (!status.contains("tenants")) break;
    for (const auto& st : status["tenants"]) {
      if (st.value("name", std::string()) != t["name"]) continue;
      t["swap"] = st.value("swap", json());
      t["device_time_s"] = st.value("device_time_s", 0.0);
      t["commands"] = st.value("completed_commands", uint64_t{0});
    }
  }
  result["policy"] = policy;
  result["swap_batch"] = batch;
  result["wall_s"] = wall;
  result["slots"] = slots;
  result["tenants"] = tenants;
  const double moved = static_cast<double>(slots.value("bytes_out", uint64_t{0}) +
                                           slots.value("bytes_in", uint64_t{0}));
  const double swap_s = slots.value("swap_out_s", 0.0) + slots.value("swap_in_s", 0.0);
  result["swap_gbps"] = swap_s > 0 ? moved / swap_s / 1e9 : 0.0;
  return result;
}

}  // namespace

int RunDemoMemory(const DemoMemoryOptions& o) {
  DemoPaths paths;
  if (!paths.Find("gmux demo memory")) return 2;
  const std::vector<std::string> policies = SplitList(o.policies);
  for (const std::string& p : policies) {
    if (p != "baseline" && p != "size" && p != "utilization") {
      std::cerr << "gmux demo memory: unknown policy '" << p
                << "' (known: baseline, size, utilization)\n";
      return 2;
    }
  }
  if (::getuid() != 0 && !o.json) {
    std::cerr << "(not root: every tenant process runs as the caller's uid and so is one tenant,"
                 " which must fit the capacity alone; run as root for the experiment)\n";
  }
  std::vector<double> batches;
  for (const std::string& b : SplitList(o.swap_batch)) {
    char* end = nullptr;
    const double v = std::strtod(b.c_str(), &end);
    if (b.empty() || end == nullptr || *end != '\0' || !(v >= 0 && v <= 100)) {
      std::cerr << "gmux demo memory: --swap-batch: '" << b << "' is not a number in [0, 100]\n";
      return 2;
    }
    batches.push_back(v);
  }
  if (batches.empty()) batches.push_back(0);
  json runs = json::array();
  int failures = 0;
  for (double b : batches) {
    for (const std::string& p : policies) {
      if (!o.json) std::cerr << "running " << p << " with swap_batch " << b << " ...\n";
      json r = RunOne(paths, p, b, o);
      if (r.contains("error")) {
        ++failures;
        std::cerr << "gmux demo memory: " << p << " (swap_batch " << b
                  << "): " << r["error"].get<std::string>() << "\n";
      }
      runs.push_back(std::move(r));
    }
  }
  // Measured here in this process, after the runs: tenants are forked from it, and a loader
  // and platform opened before a fork do not work in the child.
  const double copy_gbps = NativeCopyGbps(static_cast<size_t>(std::min(o.mib, 256)) << 20);
  json out{{"capacity", o.capacity},
           {"slot_bytes", o.slot},
           {"tenants", o.tenants},
           {"mib_per_tenant", o.mib},
           {"rounds", o.rounds},
           {"device_copy_gbps", copy_gbps},
           {"runs", runs}};
  if (o.json) {
    std::cout << out.dump(1) << "\n";
    return failures == 0 ? 0 : 1;
  }
  std::printf("gmux demo memory: %d tenants x %d MiB on %s managed (slots of %s), %d rounds each,\n"
              "every result checked against the CPU; device copy bandwidth %.2f GB/s\n\n",
              o.tenants, o.mib, o.capacity.c_str(), o.slot.c_str(), o.rounds, copy_gbps);
  std::printf("%-12s %5s %11s %7s %8s %8s %9s %8s %8s %9s %7s %7s %6s\n", "policy", "batch",
              "slot copies", "batches", "evict", "restore", "GiB out", "GiB in", "swap s",
              "swap GB/s", "x copy", "wall s", "wrong");
  for (const json& r : runs) {
    if (!r.contains("slots")) {
      std::printf("%-12s  failed: %s\n", r.value("policy", std::string("?")).c_str(),
                  r.value("error", std::string()).c_str());
      continue;
    }
    const json& s = r["slots"];
    int wrong = 0;
    for (const auto& t : r["tenants"]) wrong += std::max(0, t.value("rounds_wrong", 0));
    const double gbps = r.value("swap_gbps", 0.0);
    std::printf("%-12s %5.1f %11lld %7lld %8lld %8lld %9.2f %8.2f %8.2f %9.2f %7.2f %7.1f %6d\n",
                r.value("policy", std::string()).c_str(), r.value("swap_batch", 0.0),
                static_cast<long long>(s.value("slot_copies", int64_t{0})),
                static_cast<long long>(s.value("batches", int64_t{0})),
                static_cast<long long>(s.value("evictions", int64_t{0})),
                static_cast<long long>(s.value("restores", int64_t{0})),
                static_cast<double>(s.value("bytes_out", uint64_t{0})) / (1u << 30),
                static_cast<double>(s.value("bytes_in", uint64_t{0})) / (1u << 30),
                s.value("swap_out_s", 0.0) + s.value("swap_in_s", 0.0), gbps,
                copy_gbps > 0 ? gbps / copy_gbps : 0.0, r.value("wall_s", 0.0), wrong);
  }
  std::printf("\nslot copies: DymGPU's count (slots copied in by switches and moves); evict and\n"
              "restore: a tenant's whole data moved off the device and back, with the bytes and\n"
              "time really spent; x copy: swap bandwidth over the device's own copy bandwidth;\n"
              "batch: [daemon] swap_batch, batches: times a tenant kept the device after a swap-in;\n"
              "wall s: until every tenant finished its rounds.\n");
  return failures == 0 ? 0 : 1;
}

}  // namespace gmux::cli
