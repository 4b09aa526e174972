#include "demo_pool.h"

#include <CL/cl.h>
#include <unistd.h>

#include <algorithm>
#include <memory>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "demo_common.h"
#include "sim/pool_sim.h"
#include "status.h"

namespace gmux::cli {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr size_t kItems = 256;

const char* kSpin = R"(
__kernel void spin(__global uint* a, uint iters) {
  uint x = get_global_id(0);
  for (uint i = 0; i < iters; ++i) x = x * 1664525u + 1013904223u;
  a[get_global_id(0)] = x;
}
)";

uint32_t SpinOnCpu(uint32_t gid, uint32_t iters) {
  uint32_t x = gid;
  for (uint32_t i = 0; i < iters; ++i) x = x * 1664525u + 1013904223u;
  return x;
}

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// One run's OpenCL: a context on the pool (timed: the lease wait), the program and a buffer.
struct Job {
  cl_context ctx = nullptr;
  cl_command_queue q = nullptr;
  cl_program p = nullptr;
  cl_kernel k = nullptr;
  cl_mem m = nullptr;
  ~Job() {
    if (m != nullptr) clReleaseMemObject(m);
    if (k != nullptr) clReleaseKernel(k);
    if (p != nullptr) clReleaseProgram(p);
    if (q != nullptr) clReleaseCommandQueue(q);
    if (ctx != nullptr) clReleaseContext(ctx);
  }
  // 0, or an exit code naming the step that failed.
  int Open(cl_device_id dev) {
    cl_int err = CL_SUCCESS;
    ctx = clCreateContext(nullptr, 1, &dev, nullptr, nullptr, &err);
    if (ctx == nullptr) {
      std::fprintf(stderr, "gmux demo pool: clCreateContext -> %d\n", err);
      return err == CL_DEVICE_NOT_AVAILABLE ? 12 : 13;
    }
    q = clCreateCommandQueue(ctx, dev, 0, &err);
    p = clCreateProgramWithSource(ctx, 1, &kSpin, nullptr, &err);
    if (q == nullptr || p == nullptr) return 14;
    if (cl_int b = clBuildProgram(p, 1, &dev, "", nullptr, nullptr); b != CL_SUCCESS) {
      char log[2048] = {};
      clGetProgramBuildInfo(p, dev, CL_PROGRAM_BUILD_LOG, sizeof(log) - 1, log, nullptr);
      std::fprintf(stderr, "gmux demo pool: clBuildProgram -> %d\n%s\n", b, log);
      return 14;
    }
    k = clCreateKernel(p, "spin", &err);
    m = clCreateBuffer(ctx, CL_MEM_READ_WRITE, kItems * 4, nullptr, &err);
    if (k == nullptr || m == nullptr || clSetKernelArg(k, 0, sizeof(m), &m) != CL_SUCCESS) {
      return 15;
    }
    return 0;
  }
  // `launches` launches of `iters`, one clFinish, the results checked; 0 or an exit code.
  int Run(uint32_t iters, int launches) {
    if (clSetKernelArg(k, 1, sizeof(iters), &iters) != CL_SUCCESS) return 16;
    for (int l = 0; l < launches; ++l) {
      if (clEnqueueNDRangeKernel(q, k, 1, nullptr, &kItems, nullptr, 0, nullptr, nullptr) !=
          CL_SUCCESS) {
        return 17;
      }
    }
    std::vector<uint32_t> got(kItems);
    if (clFinish(q) != CL_SUCCESS ||
        clEnqueueReadBuffer(q, m, CL_TRUE, 0, kItems * 4, got.data(), 0, nullptr, nullptr) !=
            CL_SUCCESS) {
      return 18;
    }
    for (uint32_t i = 0; i < kItems; i += 37) {
      if (got[i] != SpinOnCpu(i, iters)) return 20;
    }
    return 0;
  }
};

// The gmux platform's devices: [0] the shared device (used only to warm the tenant's kernel
// cache), [1] the pool.
bool Devices(cl_device_id (&devs)[2]) {
  cl_platform_id platform;
  cl_uint np = 0, nd = 0;
  if (clGetPlatformIDs(1, &platform, &np) != CL_SUCCESS || np == 0) return false;
  return clGetDeviceIDs(platform, CL_DEVICE_TYPE_ALL, 2, devs, &nd) == CL_SUCCESS && nd == 2;
}

// Builds the kernel once on the shared device: the tenant's compiled-kernel cache is warm, so
// that each run's build is what a program's restart costs, not a first compile.
int WarmUp(cl_device_id shared) {
  Job j;
  if (int rc = j.Open(shared); rc != 0) return rc;
  return j.Run(1, 1);
}

// Calibration: how many iterations make one launch last ~50 ms on a pool device, and how long
// `launches` of them take alone. Writes "iters launches job_s".
int CalibrateMain(double job_s, int ready_fd, int start_fd) {
  (void)start_fd;
  cl_device_id devs[2];
  if (!Devices(devs)) return 10;
  if (int rc = WarmUp(devs[0]); rc != 0) return rc;
  cl_device_id dev = devs[1];
  uint32_t iters = 1 << 12;
  double t = 0;
  {
    Job j;
    if (int rc = j.Open(dev); rc != 0) return rc;
    // The first launch compiles the kernel for the device: not part of a launch's time.
    if (int rc = j.Run(iters, 1); rc != 0) return rc;
    for (int k = 0; k < 24; ++k) {
      auto t0 = Clock::now();
      if (int rc = j.Run(iters, 1); rc != 0) return rc;
      t = Since(t0);
      if (t >= 0.05 || iters >= (1u << 30)) break;
      iters *= 2;
    }
  }
  const int launches = std::max(1, static_cast<int>(job_s / std::max(t, 1e-4) + 0.5));
  // One whole run alone, as a `pool` run does it: a program's context, build, job and release.
  auto t0 = Clock::now();
  {
    Job run;
    if (int rc = run.Open(dev); rc != 0) return rc;
    if (int rc = run.Run(iters, launches); rc != 0) return rc;
  }
  const double measured = Since(t0);
  WriteAll(ready_fd, "r" + std::to_string(iters) + " " + std::to_string(launches) + " " +
                         std::to_string(measured));
  return 0;
}

// One tenant: `runs` jobs with `sleep_s` between them. `per_run`: each run is a program of its
// own (context made and released: an implicit lease per run); else one context for all runs.
// Writes, per run, "wait_s end_s" (end from the common start).
int TenantMain(bool per_run, int runs, uint32_t iters, int launches, double sleep_s, int ready_fd,
               int start_fd) {
  cl_device_id devs[2];
  if (!Devices(devs)) return 10;
  if (int rc = WarmUp(devs[0]); rc != 0) return rc;
  cl_device_id dev = devs[1];
  if (!WriteAll(ready_fd, "r")) return 11;
  char c = 0;
  if (::read(start_fd, &c, 1) != 1) return 11;
  const auto t0 = Clock::now();
  std::ostringstream out;
  std::unique_ptr<Job> held;
  for (int r = 0; r < runs; ++r) {
    const auto w0 = Clock::now();
    double wait = 0;
    if (per_run || !held) {
      held = std::make_unique<Job>();
      if (int rc = held->Open(dev); rc != 0) return rc;
      wait = Since(w0);
    }
    if (int rc = held->Run(iters, launches); rc != 0) return rc;
    if (per_run) held.reset();  // the program ends: its lease goes back
    out << " " << wait << " " << Since(t0);
    if (r + 1 < runs) std::this_thread::sleep_for(std::chrono::duration<double>(sleep_s));
  }
  held.reset();
  WriteAll(ready_fd, out.str());
  return 0;
}

// BioCloud's checker (5 s) and idle limit (10 s) scaled like the job (18 s), the idle limit at
// least 1 s: a program compiling its kernels is not using its device, and a limit shorter than
// a build would reclaim leases of programs about to run. `static` never reclaims (a device per
// tenant for the whole run).
double CheckPeriod(double job_s) { return 5.0 / 18.0 * job_s; }
double IdleLimit(double job_s) { return std::max(1.0, 10.0 / 18.0 * job_s); }

std::string Config(int devices, bool pin, double job_s) {
  std::ostringstream c;
  c << "[scheduler]\npolicy = \"fifo\"\n\n";
  // Device 0 is shared (each tenant warms its kernel cache there); 1..N are the pool.
  for (int d = 1; d <= devices; ++d) {
    c << "[[scheduler.device]]\nindex = " << d << "\nmode = \"exclusive\"\n\n";
  }
  c << "[pool]\nwait_s = 3600\ncheck_period_s = " << CheckPeriod(job_s)
    << "\nidle_s = " << (pin ? 86400.0 : IdleLimit(job_s)) << "\n";
  return c.str();
}

// How the tenants use the pool: `static` holds a device per tenant for the whole run (never
// reclaimed), `pool` makes each run a program of its own (a lease per run), `reclaim` keeps one
// program up for all runs and leaves it to the checker to take the device back in the sleeps.
enum class Mode { kStatic, kPool, kReclaim };
const char* ModeName(Mode m) {
  return m == Mode::kStatic ? "static" : m == Mode::kPool ? "pool" : "reclaim";
}

json RunConfig(const DemoPaths& paths, int devices, Mode mode, double sleep_s, uint32_t iters,
               int launches, const DemoPoolOptions& o) {
  const bool per_run = mode == Mode::kPool;
  DemoDaemon daemon;
  if (!daemon.Prepare("gmux-pool", paths)) return json{{"error", "cannot make a temp dir"}};
  std::string pocl = "pthread";
  for (int d = 0; d < devices; ++d) pocl += " pthread";
  ::setenv("POCL_DEVICES", pocl.c_str(), 1);
  const bool started = daemon.Start(Config(devices, mode == Mode::kStatic, o.job_s), 3600);
  ::unsetenv("POCL_DEVICES");
  if (!started) return json{{"error", "gmuxd did not start"}};
  const bool root = ::getuid() == 0;
  std::vector<DemoTenant> kids(static_cast<size_t>(o.tenants));
  bool ok = true;
  for (int i = 0; i < o.tenants; ++i) {
    ok = ok && kids[i].Spawn(daemon, root ? static_cast<uid_t>(60301 + i) : 0,
                             [&, i](int up, int down) {
                               (void)i;
                               return TenantMain(per_run, o.runs, iters, launches, sleep_s, up,
                                                 down);
                             });
  }
  ok = StartAll(kids) && ok;
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(o.timeout_s));
  json result;
  json runs = json::array();  // per tenant, per run
  double makespan = 0, wait_sum = 0;
  int waits = 0;
  for (int i = 0; i < o.tenants; ++i) {
    int status = -1;
    std::stringstream in(kids[i].Finish(status, deadline));
    if (status != 0) {
      ok = false;
      result["error"] = "tenant " + std::to_string(i) +
                        (status == DemoTenant::kTimedOut ? " did not finish in time"
                                                         : " failed (exit " +
                                                               std::to_string(status) + ")");
    }
    double w = 0, end = 0, prev_end = 0;
    json t = json::array();
    while (in >> w >> end) {
      wait_sum += w;
      ++waits;
      makespan = std::max(makespan, end);
      // The run's own time: from its device being usable to its end.
      const double began = (t.empty() ? 0.0 : prev_end + sleep_s) + w;
      t.push_back(json{{"wait_s", w}, {"end_s", end}, {"run_s", end - began}});
      prev_end = end;
    }
    runs.push_back(t);
  }
  result["runs"] = runs;
  json pool;
  if (auto s = QuerySchedulerStatus(daemon.socket()); s.ok()) {
    json st = json::parse(*s, nullptr, false);
    if (!st.is_discarded()) pool = st.value("pool", json());
  }
  if (!ok) result["daemon_log"] = daemon.LogTail();
  daemon.Stop();
  result["makespan_s"] = makespan;
  result["mean_wait_s"] = waits > 0 ? wait_sum / waits : 0.0;
  if (pool.is_object()) {
    result["grants"] = pool.value("grants", 0);
    result["mean_grant_latency_s"] = pool.value("mean_grant_latency_s", 0.0);
    result["reclaims"] = pool.value("reclaims", 0);
    result["reacquires"] = pool.value("reacquires", 0);
    result["mean_reacquire_latency_s"] = pool.value("mean_reacquire_latency_s", 0.0);
  }
  return result;
}

// The simulator's run of the same workload (docs/policies.md, LeasePool, "The simulator's
// model"): no plug-in/out time (the runtime has no hooks here), the same checker and idle limit.
json Simulate(int devices, Mode mode, double job_s, double sleep_s, const DemoPoolOptions& o) {
  sim::PoolSimConfig c;
  c.pool.devices = static_cast<uint32_t>(devices);
  c.pool.check_period = FromSeconds(CheckPeriod(job_s));
  c.pool.idle_threshold = FromSeconds(mode == Mode::kStatic ? 86400.0 : IdleLimit(job_s));
  c.pool.attach_time = Duration(0);
  c.pool.detach_time = Duration(0);
  c.mode = mode == Mode::kStatic ? sim::PoolClientMode::kExplicit
           : mode == Mode::kPool ? sim::PoolClientMode::kPool
                                 : sim::PoolClientMode::kIdleReclaim;
  for (int i = 0; i < o.tenants; ++i) {
    sim::PoolTenantSpec t;
    t.name = "t" + std::to_string(i);
    t.runs = o.runs;
    t.job_s = job_s;
    t.sleep_s = sleep_s;
    c.tenants.push_back(t);
  }
  auto r = sim::SimulatePool(c);
  if (!r.ok()) return json{{"error", r.status().message()}};
  return json{{"makespan_s", r->makespan_s},
              {"theoretical_s", r->theoretical_s},
              {"normalized_time", r->normalized_time},
              {"mean_wait_s", r->mean_wait_s}};
}

std::vector<double> Numbers(const std::string& list, const char* what, bool& ok) {
  std::vector<double> out;
  for (const std::string& x : SplitList(list)) {
    char* end = nullptr;
    const double v = std::strtod(x.c_str(), &end);
    if (end == nullptr || *end != '\0' || !(v >= 0 && v <= 1000)) {
      std::cerr << "gmux demo pool: " << what << ": '" << x << "' is not a number in [0, 1000]\n";
      ok = false;
    }
    out.push_back(v);
  }
  if (out.empty()) ok = false;
  return out;
}

}  // namespace

int RunDemoPool(const DemoPoolOptions& o) {
  DemoPaths paths;
  if (!paths.Find("gmux demo pool")) return 2;
  bool ok = true;
  const std::vector<double> device_counts = Numbers(o.devices, "--devices", ok);
  const std::vector<double> sleeps = Numbers(o.sleeps, "--sleeps", ok);
  for (double d : device_counts) {
    if (d < 1 || d > 16 || d != static_cast<int>(d)) {
      std::cerr << "gmux demo pool: --devices: pool sizes are whole numbers 1..16\n";
      ok = false;
    }
  }
  std::vector<Mode> modes;
  for (const std::string& m : SplitList(o.modes)) {
    if (m == "static") {
      modes.push_back(Mode::kStatic);
    } else if (m == "pool") {
      modes.push_back(Mode::kPool);
    } else if (m == "reclaim") {
      modes.push_back(Mode::kReclaim);
    } else {
      std::cerr << "gmux demo pool: --modes: unknown mode '" << m
                << "' (known: static, pool, reclaim)\n";
      ok = false;
    }
  }
  if (modes.empty()) ok = false;
  if (!ok) return 2;
  // One PoCL thread per device, so that N devices are N cores' worth of device (as far as the
  // host has cores).
  ::setenv("POCL_MAX_PTHREAD_COUNT", "1", 1);
  uint32_t iters = 0;
  int launches = 0;
  double job_alone = 0;
  {
    DemoDaemon daemon;
    ::setenv("POCL_DEVICES", "pthread pthread", 1);
    if (!daemon.Prepare("gmux-pool", paths) || !daemon.Start(Config(1, false, o.job_s), 600)) {
      std::cerr << "gmux demo pool: gmuxd did not start\n";
      return 1;
    }
    ::unsetenv("POCL_DEVICES");
    DemoTenant cal;
    cal.Spawn(daemon, 0, [&o](int up, int down) { return CalibrateMain(o.job_s, up, down); });
    int status = -1;
    std::string out = cal.Finish(status, Clock::now() + std::chrono::seconds(300));
    std::stringstream in(out.size() > 1 ? out.substr(1) : "");
    in >> iters >> launches >> job_alone;
    if (status != 0 || iters == 0) {
      std::cerr << "gmux demo pool: calibration failed (exit " << status << ")\n"
                << daemon.LogTail();
      return 1;
    }
  }
  const unsigned cores = std::thread::hardware_concurrency();
  json configs = json::array();
  int failures = 0;
  for (double s_rel : sleeps) {
    const double sleep_s = s_rel * job_alone;
    for (double dn : device_counts) {
      const int n = static_cast<int>(dn);
      json row{{"devices", n}, {"sleep_s", sleep_s}, {"sleep_over_job", s_rel}};
      for (Mode m : modes) {
        const char* mode = ModeName(m);
        if (!o.json) std::cerr << "running " << n << " device(s), sleep " << sleep_s << " s, "
                               << mode << " ...\n";
        json r = RunConfig(paths, n, m, sleep_s, iters, launches, o);
        json sim = Simulate(n, m, job_alone, sleep_s, o);
        const double theory = sim.value("theoretical_s", 0.0);
        if (theory > 0) r["normalized_time"] = r.value("makespan_s", 0.0) / theory;
        if (r.contains("error")) {
          ++failures;
          std::cerr << "gmux demo pool: " << n << " devices, " << mode << ": "
                    << r["error"].get<std::string>() << "\n";
        }
        row[mode] = r;
        row[std::string("sim_") + mode] = sim;
        row["theoretical_s"] = theory;
      }
      if (!row.contains("static") || !row.contains("pool")) {
        configs.push_back(row);
        continue;
      }
      // The pool's gain over static assignment, in points of the theoretical time, measured and
      // predicted.
      const double measured = row["static"].value("normalized_time", 0.0) -
                              row["pool"].value("normalized_time", 0.0);
      const double predicted = row["sim_static"].value("normalized_time", 0.0) -
                               row["sim_pool"].value("normalized_time", 0.0);
      row["gain_points"] = 100 * measured;
      row["sim_gain_points"] = 100 * predicted;
      row["gain_within_10_points"] = std::abs(measured - predicted) <= 0.10;
      configs.push_back(row);
    }
  }
  json out{{"tenants", o.tenants},
           {"runs", o.runs},
           {"job_s", job_alone},
           {"launches_per_job", launches},
           {"iterations_per_launch", iters},
           {"host_cores", cores},
           {"configs", configs}};
  if (o.json) {
    std::cout << out.dump(1) << "\n";
    return failures == 0 ? 0 : 1;
  }
  std::printf("gmux demo pool: %d tenants x %d runs of %.2f s device work (measured alone) on a\n"
              "pool of PoCL devices (one thread each; this host has %u cores), every result\n"
              "checked. static: one device per tenant for its whole run; pool: a lease per\n"
              "run; reclaim: one program per tenant, the checker takes the device back.\n\n",
              o.tenants, o.runs, job_alone, cores);
  auto norm = [](const json& row, const std::string& key) {
    return row.contains(key) ? row[key].value("normalized_time", 0.0) : 0.0;
  };
  std::printf("%7s %7s %9s | %7s %7s %7s %6s | %7s %7s %7s %6s | %6s %6s\n", "devices",
              "sleep s", "theory s", "static", "pool", "reclaim", "wait", "sim st", "sim pl",
              "sim rc", "wait", "gain", "sim");
  for (const json& r : configs) {
    std::printf("%7d %7.2f %9.2f | %7.3f %7.3f %7.3f %6.2f | %7.3f %7.3f %7.3f %6.2f |"
                " %5.1f%% %5.1f%%\n",
                r.value("devices", 0), r.value("sleep_s", 0.0), r.value("theoretical_s", 0.0),
                norm(r, "static"), norm(r, "pool"), norm(r, "reclaim"),
                r.contains("pool") ? r["pool"].value("mean_wait_s", 0.0) : 0.0,
                norm(r, "sim_static"), norm(r, "sim_pool"), norm(r, "sim_reclaim"),
                r.contains("sim_pool") ? r["sim_pool"].value("mean_wait_s", 0.0) : 0.0,
                r.value("gain_points", 0.0), r.value("sim_gain_points", 0.0));
  }
  std::printf("\nstatic/pool/reclaim (and sim): completion time over BioCloud's theoretical time\n"
              "(lower is better); wait: mean wait of a run for its device (pool); gain: static\n"
              "minus pool in points of the theoretical time, measured and as the simulator\n"
              "predicts.\n");
  if (cores < 4) {
    std::printf("(pool sizes above %u share this host's %u cores: those rows measure CPU\n"
                "contention as much as the pool)\n", cores, cores);
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace gmux::cli
