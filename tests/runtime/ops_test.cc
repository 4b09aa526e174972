// Operations on the real runtime: the usage ledger against what real OpenCL tenants measured
// (including gmuxd killed with SIGKILL under load), and tenants changed at run time with
// `gmux tenant` and SIGHUP while their sessions run. Tenants are forked processes under uids of
// their own (as root), through the gmux ICD; `gmux usage` and `gmux tenant` are the real CLI.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/isolation_harness.h"

namespace gmux::testing {
namespace {

using namespace iso;
using nlohmann::json;

// About a millisecond or more of device work per work-item batch; `n` sets the length.
constexpr const char* kSpin = R"(
__kernel void spin(__global uint* a, uint n) {
  uint x = a[get_global_id(0)];
  for (uint i = 0; i < n; ++i) x = x * 1664525u + 1013904223u;
  a[get_global_id(0)] = x;
}
)";

int64_t WallMicros() {
  timeval tv{};
  ::gettimeofday(&tv, nullptr);
  return static_cast<int64_t>(tv.tv_sec) * 1000000 + tv.tv_usec;
}

// A closed-loop tenant that measures its own device time: each round one launch (profiled) and
// a blocking read of `bytes`; after each round it sends up the wall time (µs) at which the
// round had completed and its cumulative kernel time (ns, START..END from its own events).
int MeasuringTenant(Channel& ch, int rounds, size_t bytes) {
  GmuxDevice d;
  if (!OpenGmux(d)) return 50;
  cl_int err = CL_SUCCESS;
  cl_command_queue q =
      clCreateCommandQueue(d.context, d.device, CL_QUEUE_PROFILING_ENABLE, &err);
  cl_program p = Build(d, kSpin);
  if (q == nullptr || p == nullptr) return 51;
  cl_kernel k = clCreateKernel(p, "spin", &err);
  std::vector<cl_uint> host(bytes / 4, 1);
  cl_mem m = clCreateBuffer(d.context, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, bytes,
                            host.data(), &err);
  const cl_uint n = 20000;
  if (k == nullptr || m == nullptr || clSetKernelArg(k, 0, sizeof(m), &m) != CL_SUCCESS ||
      clSetKernelArg(k, 1, sizeof(n), &n) != CL_SUCCESS) {
    return 52;
  }
  const size_t items = 1024;
  int64_t device_ns = 0;
  for (int r = 0; r < rounds; ++r) {
    cl_event e = nullptr;
    if (clEnqueueNDRangeKernel(q, k, 1, nullptr, &items, nullptr, 0, nullptr, &e) != CL_SUCCESS ||
        clWaitForEvents(1, &e) != CL_SUCCESS) {
      return 60;
    }
    cl_ulong start = 0, end = 0;
    clGetEventProfilingInfo(e, CL_PROFILING_COMMAND_START, sizeof(start), &start, nullptr);
    clGetEventProfilingInfo(e, CL_PROFILING_COMMAND_END, sizeof(end), &end, nullptr);
    clReleaseEvent(e);
    if (end < start) return 61;
    device_ns += static_cast<int64_t>(end - start);
    if (clEnqueueReadBuffer(q, m, CL_TRUE, 0, bytes, host.data(), 0, nullptr, nullptr) !=
        CL_SUCCESS) {
      return 62;
    }
    ch.Send(WallMicros());
    ch.Send(device_ns);
  }
  clReleaseMemObject(m);
  clReleaseKernel(k);
  clReleaseProgram(p);
  clReleaseCommandQueue(q);
  return 0;
}

struct Round {
  double wall_s;
  double device_s;
};

// Reads a MeasuringTenant's reports until it stops sending (or `until` says enough).
std::vector<Round> Collect(Child& c, const std::function<bool(const std::vector<Round>&)>& until,
                           std::chrono::milliseconds wait = 30s) {
  std::vector<Round> out;
  for (;;) {
    auto t = c.Receive(wait);
    if (!t) break;
    auto dev = c.Receive(wait);
    if (!dev) break;
    out.push_back({static_cast<double>(*t) / 1e6, static_cast<double>(*dev) / 1e9});
    if (until && until(out)) break;
  }
  return out;
}

class OpsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!RunningAsRoot()) GTEST_SKIP() << "needs root: each tenant runs as its own uid";
    char tmpl[] = "/tmp/gmux-ops-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    books_ = tmpl;
    ledger_ = books_ + "/usage.db";
  }
  void TearDown() override {
    std::error_code ec;
    if (!books_.empty()) std::filesystem::remove_all(books_, ec);
  }
  std::string LedgerConfig(double interval_s) {
    std::ostringstream c;
    c << "[daemon]\nledger = \"" << ledger_ << "\"\nledger_interval_s = " << interval_s
      << "\n\n[scheduler]\npolicy = \"credit\"\n";
    return c.str();
  }
  // `gmux usage --json` (through `daemon`, or the file itself when it is null): device
  // seconds booked for `tenant`, and the last booked interval's end.
  std::pair<double, double> Booked(const std::string& tenant, const PrivateDaemon* daemon) {
    int code = -1;
    std::vector<std::string> args = {"usage", "--json", "--rows", "--tenant", tenant};
    if (daemon != nullptr) {
      args.insert(args.end(), {"--socket", daemon->socket()});
    } else {
      args.insert(args.end(), {"--ledger", ledger_});
    }
    std::string out = RunGmux(-1, args, &code, false);
    json j = json::parse(out, nullptr, false);
    EXPECT_EQ(code, 0) << out;
    double sum = 0, end = 0;
    if (!j.is_object()) return {-1, -1};
    for (const auto& e : j.value("entries", json::array())) {
      sum += e.value("device_s", 0.0);
      end = std::max(end, e.value("end", 0.0));
    }
    return {sum, end};
  }
  // A field of `tenant`'s entry in `gmux status --json`: -1 without a status, 0 without the
  // tenant.
  double StatusOf(const PrivateDaemon& d, const std::string& tenant, const char* field) {
    json s = json::parse(StatusJson(d, -1), nullptr, false);
    if (!s.is_object()) return -1;
    for (const auto& t : s.value("tenants", json::array())) {
      if (t.value("name", "") == tenant) return t.value(field, 0.0);
    }
    return 0;
  }
  double StatusDeviceSeconds(const PrivateDaemon& d, const std::string& tenant) {
    return StatusOf(d, tenant, "device_time_s");
  }
  double StatusSessions(const PrivateDaemon& d, const std::string& tenant) {
    return StatusOf(d, tenant, "sessions");
  }

  std::string books_, ledger_;
};

// The tenant's cumulative device time at `t` per its own reports: the last round done by then,
// and the first one after (the booking happened between them).
std::pair<double, double> MeasuredAround(const std::vector<Round>& rounds, double t) {
  double before = 0, after = rounds.empty() ? 0 : rounds.back().device_s;
  for (const Round& r : rounds) {
    if (r.wall_s <= t) {
      before = r.device_s;
    } else {
      after = r.device_s;
      break;
    }
  }
  return {before, after};
}

TEST_F(OpsTest, NothingCommittedIsLostWhenGmuxdIsKilled) {
  PrivateDaemon daemon;
  daemon.Start(LedgerConfig(0.5));
  ASSERT_TRUE(daemon.started()) << daemon.Log();
  Child a = Child::Spawn(daemon, {1, 120, {}}, [](Channel& ch) {
    return MeasuringTenant(ch, 100000, 64 << 10);
  });
  // Load for a few booked intervals, then SIGKILL the daemon (and its workers) mid-round.
  std::vector<Round> rounds = Collect(a, [](const std::vector<Round>& r) {
    return r.back().device_s >= 2.0 && r.back().wall_s - r.front().wall_s >= 2.0;
  });
  ASSERT_FALSE(rounds.empty()) << daemon.Log();
  ASSERT_GE(rounds.back().device_s, 2.0) << daemon.Log();
  const std::string tenant = UidTenantName(1);
  // What gmuxd says it has committed, just before the kill.
  auto [committed, committed_end] = Booked(tenant, &daemon);
  ASSERT_GT(committed, 0) << daemon.Log();
  daemon.KillTree();
  // Whatever the tenant finished before the kill and it had not reported yet.
  std::vector<Round> more = Collect(a, nullptr, 5s);
  rounds.insert(rounds.end(), more.begin(), more.end());
  a.Kill();

  auto [booked, last_end] = Booked(tenant, nullptr);
  // Nothing committed is lost: the file holds at least what gmuxd had said was booked.
  EXPECT_GE(booked, committed);
  EXPECT_GE(last_end, committed_end);
  // At most about an interval less than the tenant had done by the last commit. gmuxd counts a
  // kernel when its worker reports the completion, which may come a little after the tenant
  // hears of it (express dispatch reports in batches): the lower bound is what the tenant had
  // done an interval before the last commit. (No upper bound from the tenant's own figure: it
  // times its kernels only, gmuxd books its reads' device time too.)
  const double total = rounds.back().device_s;
  const double lagged = MeasuredAround(rounds, last_end - 0.5).first;
  std::printf("committed %.4f s before the kill, %.4f s in the file after it; the tenant "
              "measured %.4f s by the last commit minus an interval, %.4f s in all\n",
              committed, booked, lagged, total);
  EXPECT_GE(booked, lagged - 0.02 - 0.02 * lagged);

  // A restarted gmuxd keeps the books and adds to them; `gmux usage` through it says the same.
  PrivateDaemon again;
  again.Start(LedgerConfig(0.5));
  ASSERT_TRUE(again.started()) << again.Log();
  auto [via_daemon, end2] = Booked(tenant, &again);
  EXPECT_DOUBLE_EQ(via_daemon, booked);
  EXPECT_DOUBLE_EQ(end2, last_end);
  again.Stop();
}

TEST_F(OpsTest, LedgerSumsMatchStatusWithinOneInterval) {
  PrivateDaemon daemon;
  daemon.Start(LedgerConfig(0.5));
  ASSERT_TRUE(daemon.started()) << daemon.Log();
  // a's reads take the device's copying path: a blocking read the client copies itself from a
  // buffer on shared memory moves no bytes on the device, and the books count device transfers.
  Child a = Child::Spawn(daemon, {1, 120, {{"GMUX_BUFFER_STORAGE", "0"}}}, [](Channel& ch) {
    return MeasuringTenant(ch, 40, 1 << 20);
  });
  Child b = Child::Spawn(daemon, {2, 120, {}}, [](Channel& ch) {
    return MeasuringTenant(ch, 25, 4096);
  });
  std::vector<Round> ra = Collect(a, nullptr);
  std::vector<Round> rb = Collect(b, nullptr);
  ASSERT_TRUE(a.Wait(30s).ok()) << daemon.Log();
  ASSERT_TRUE(b.Wait(30s).ok()) << daemon.Log();
  ASSERT_EQ(ra.size(), 40u);
  ASSERT_EQ(rb.size(), 25u);
  // The workers end after their clients: what they report before ending is in the status once
  // gmuxd has seen them go.
  for (int t = 1; t <= 2; ++t) {
    for (int i = 0; i < 100 && StatusSessions(daemon, UidTenantName(t)) != 0; ++i) {
      std::this_thread::sleep_for(100ms);
    }
    ASSERT_EQ(StatusSessions(daemon, UidTenantName(t)), 0) << daemon.Log();
  }
  // Idle now: after an interval or two the books catch up with the status exactly.
  for (int t = 1; t <= 2; ++t) {
    const std::string name = UidTenantName(t);
    const double status = StatusDeviceSeconds(daemon, name);
    double booked = 0;
    for (int i = 0; i < 100; ++i) {
      booked = Booked(name, nullptr).first;
      if (std::abs(booked - status) < 1e-6) break;
      std::this_thread::sleep_for(100ms);
    }
    EXPECT_NEAR(booked, status, 1e-6) << name;
    // And the status (gmuxd's measure) holds all the kernel time the tenant measured itself
    // (the same profiling times, summed by both), and the device time of the tenant's reads:
    // a worker reports what finished before it ends, so the last round is counted too.
    const double own = (t == 1 ? ra : rb).back().device_s;
    EXPECT_GE(status, own - 1e-6) << name;
  }
  // Bytes and commands: a's 40 reads of 1 MiB and 40 launches are in the books, the last ones
  // too (its client exits right after the last read).
  int code = -1;
  json j = json::parse(RunGmux(-1, {"usage", "--json", "--ledger", ledger_, "--tenant",
                                    UidTenantName(1)}, &code, false), nullptr, false);
  ASSERT_TRUE(j.is_object());
  ASSERT_FALSE(j["entries"].empty());
  EXPECT_GE(j["entries"][0].value("bytes", uint64_t{0}), 40ull << 20);
  EXPECT_GE(j["entries"][0].value("commands", uint64_t{0}), 80u);
  EXPECT_GT(j["entries"][0].value("memory_byte_s", 0.0), 0.0);
  // The table and CSV forms.
  std::string table = RunGmux(-1, {"usage", "--socket", daemon.socket()}, &code);
  EXPECT_EQ(code, 0) << table;
  EXPECT_NE(table.find(UidTenantName(2)), std::string::npos) << table;
  std::string csv = RunGmux(-1, {"usage", "--csv", "--ledger", ledger_}, &code, false);
  EXPECT_EQ(csv.rfind("tenant,device,", 0), 0u) << csv;
  // A tenant sees its own books only.
  std::string own = RunGmux(2, {"usage", "--json", "--socket", daemon.socket()}, &code, false);
  json oj = json::parse(own, nullptr, false);
  ASSERT_TRUE(oj.is_object()) << own;
  for (const auto& e : oj["entries"]) EXPECT_EQ(e.value("tenant", ""), UidTenantName(2));
  std::string other = RunGmux(2, {"usage", "--tenant", UidTenantName(1), "--socket",
                                  daemon.socket()}, &code);
  EXPECT_NE(code, 0);
  EXPECT_NE(other.find("only operators"), std::string::npos) << other;
  daemon.Stop();
}

json TenantList(const PrivateDaemon& d) {
  int code = -1;
  json j = json::parse(RunGmux(-1, {"tenant", "list", "--json", "--socket", d.socket()}, &code,
                               false), nullptr, false);
  return code == 0 && j.is_object() ? j : json();
}

json Find(const json& list, const std::string& name) {
  for (const auto& t : list.value("tenants", json::array())) {
    if (t.value("name", "") == name) return t;
  }
  return json();
}

double StatusWeight(const PrivateDaemon& d, const std::string& tenant) {
  json s = json::parse(StatusJson(d, -1), nullptr, false);
  for (const auto& t : s.value("tenants", json::array())) {
    if (t.value("name", "") == tenant) return t.value("weight", 0.0);
  }
  return 0;
}

TEST_F(OpsTest, TenantsChangeAtRunTimeWithoutDroppingSessions) {
  std::ostringstream c;
  c << "[scheduler]\npolicy = \"credit\"\n\n[[tenant]]\nname = \"alpha\"\nuids = ["
    << TenantUid(1) << "]\n";
  PrivateDaemon daemon;
  daemon.Start(c.str());
  ASSERT_TRUE(daemon.started()) << daemon.Log();
  const std::string sock = daemon.socket();
  int code = -1;
  EXPECT_EQ(Find(TenantList(daemon), "alpha").value("origin", ""), "config");

  // An operator adds a tenant for uid 2; its program then runs as that tenant.
  std::string out = RunGmux(-1, {"tenant", "add", "beta", "--uid", std::to_string(TenantUid(2)),
                                 "--weight", "3", "--memory-quota", "256MiB", "--socket", sock},
                            &code);
  ASSERT_EQ(code, 0) << out;
  json beta = Find(TenantList(daemon), "beta");
  EXPECT_EQ(beta.value("origin", ""), "run-time");
  EXPECT_EQ(beta["limits"].value("memory_quota", uint64_t{0}), 256ull << 20);
  Child b = Child::Spawn(daemon, {2, 120, {}}, [](Channel& ch) {
    GmuxDevice d;
    if (!OpenGmux(d)) return 50;
    ch.Send(1);
    if (!ch.WaitGo()) return 51;
    return GoodTenant(20);  // a second connection of the same tenant, after the changes
  });
  ASSERT_EQ(b.Receive(60s).value_or(-1), 1) << daemon.Log();
  EXPECT_EQ(Find(TenantList(daemon), "beta").value("sessions", 0), 1);
  EXPECT_DOUBLE_EQ(StatusWeight(daemon, "beta"), 3.0);

  // Changed while connected: the weight follows, the session stays.
  out = RunGmux(-1, {"tenant", "set", "beta", "--weight", "5", "--socket", sock}, &code);
  ASSERT_EQ(code, 0) << out;
  for (int i = 0; i < 50 && StatusWeight(daemon, "beta") != 5.0; ++i) {
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_DOUBLE_EQ(StatusWeight(daemon, "beta"), 5.0);

  // Invalid changes are refused whole, with the key named; nothing changes.
  out = RunGmux(-1, {"tenant", "set", "beta", "--weight", "7", "--limit", "max_bulk_bytes=10",
                     "--socket", sock}, &code);
  EXPECT_NE(code, 0);
  EXPECT_NE(out.find("max_bulk_bytes"), std::string::npos) << out;
  out = RunGmux(-1, {"tenant", "add", "gamma", "--uid", std::to_string(TenantUid(1)), "--socket",
                     sock}, &code);
  EXPECT_NE(code, 0);
  EXPECT_NE(out.find("two tenants"), std::string::npos) << out;
  out = RunGmux(-1, {"tenant", "set", "beta", "--limit", "no_such_key=1", "--socket", sock},
                &code);
  EXPECT_NE(code, 0);
  EXPECT_NE(out.find("no_such_key"), std::string::npos) << out;
  EXPECT_DOUBLE_EQ(Find(TenantList(daemon), "beta").value("weight", 0.0), 5.0);
  EXPECT_TRUE(Find(TenantList(daemon), "gamma").is_null());

  // Tenants do not change tenants, and see only themselves.
  out = RunGmux(3, {"tenant", "add", "mine", "--weight", "100", "--socket", sock}, &code);
  EXPECT_NE(code, 0);
  EXPECT_NE(out.find("operators"), std::string::npos) << out;
  out = RunGmux(2, {"tenant", "list", "--json", "--socket", sock}, &code, false);
  json seen = json::parse(out, nullptr, false);
  ASSERT_TRUE(seen.is_object()) << out;
  ASSERT_EQ(seen["tenants"].size(), 1u) << out;
  EXPECT_EQ(seen["tenants"][0].value("name", ""), "beta");

  // SIGHUP: an invalid file changes nothing; a valid one applies, and beta (run-time) stays.
  const std::string config = daemon.dir() + "/g.toml";
  std::ofstream(config) << c.str() << "weight = 4\nnonsense = 1\n";
  ASSERT_EQ(::kill(daemon.pid(), SIGHUP), 0);
  for (int i = 0; i < 100 && daemon.Log().find("reload refused") == std::string::npos; ++i) {
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_NE(daemon.Log().find("nonsense"), std::string::npos) << daemon.Log();
  EXPECT_DOUBLE_EQ(Find(TenantList(daemon), "alpha").value("weight", 0.0), 1.0);
  std::ofstream(config) << c.str() << "weight = 4\n";
  ASSERT_EQ(::kill(daemon.pid(), SIGHUP), 0);
  for (int i = 0; i < 100 && Find(TenantList(daemon), "alpha").value("weight", 0.0) != 4.0;
       ++i) {
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_DOUBLE_EQ(Find(TenantList(daemon), "alpha").value("weight", 0.0), 4.0);
  EXPECT_DOUBLE_EQ(Find(TenantList(daemon), "beta").value("weight", 0.0), 5.0);

  // The connected program never noticed: it opens a second session and computes correctly.
  b.Go();
  EXPECT_TRUE(b.Wait(60s).ok()) << daemon.Log();
  // Removed: gone from the list.
  out = RunGmux(-1, {"tenant", "remove", "beta", "--socket", sock}, &code);
  EXPECT_EQ(code, 0) << out;
  EXPECT_TRUE(Find(TenantList(daemon), "beta").is_null());
  EXPECT_TRUE(daemon.Alive());
  daemon.Stop();
}

// TCP tenants whose tokens the config stores hashed; failed authentications from one address
// are counted, and past the limit its connections are refused for a while (right token or
// not), while other origins are served.
// A Slurm job's tenant (docs/cluster.md): registered with its job, refused a comment to anyone
// but the job's own processes and operators, removed by the epilog. (The whole flow, with a
// real Slurm, is tests/cluster/slurm_test.sh.)
TEST_F(OpsTest, SlurmJobTenantsAndWhoMayWriteAJobsComment) {
  PrivateDaemon daemon;
  daemon.Start(LedgerConfig(1));
  ASSERT_TRUE(daemon.started()) << daemon.Log();
  const std::string sock = daemon.socket();
  int code = -1;
  std::string out = RunGmux(-1, {"tenant", "add", "job-77", "--slurm-job", "77", "--weight", "6",
                                 "--socket", sock}, &code);
  ASSERT_EQ(code, 0) << out;
  EXPECT_EQ(Find(TenantList(daemon), "job-77").value("slurm_job", 0), 77);
  // A process outside the job (a tenant's uid, not in job 77's cgroup) may not.
  out = RunGmux(1, {"slurm", "taskepilog", "--job", "77", "--wait", "0", "--socket", sock},
                &code);
  EXPECT_EQ(code, 1) << out;
  EXPECT_NE(out.find("only a process of a Slurm job"), std::string::npos) << out;
  // An operator may: gmuxd then runs scontrol, which has no cluster to talk to here.
  out = RunGmux(-1, {"slurm", "taskepilog", "--job", "77", "--wait", "0", "--socket", sock},
                &code);
  EXPECT_EQ(code, 1) << out;
  EXPECT_NE(out.find("scontrol"), std::string::npos) << out;
  // A job that is no tenant.
  out = RunGmux(-1, {"slurm", "taskepilog", "--job", "78", "--wait", "0", "--socket", sock},
                &code);
  EXPECT_NE(out.find("job 78 is no tenant"), std::string::npos) << out;
  // The epilog removes the tenant.
  out = RunGmux(-1, {"slurm", "epilog", "--job", "77", "--wait", "0", "--socket", sock}, &code);
  EXPECT_EQ(code, 0) << out;
  EXPECT_TRUE(Find(TenantList(daemon), "job-77").is_null());
  EXPECT_TRUE(daemon.Alive());
}

TEST_F(OpsTest, HashedTokensAndFailedAuthenticationsAreRateLimited) {
  int code = -1;
  RunGmux(-1, {"token", "hash"}, &code, false);  // no token on stdin: refused
  EXPECT_NE(code, 0);
  json made = json::parse(RunGmux(-1, {"token", "new", "--json"}, &code, false), nullptr, false);
  ASSERT_TRUE(made.is_object());
  const std::string token = made.value("token", "");
  ASSERT_EQ(token.size(), 64u);
  std::ostringstream c;
  c << "[daemon]\nauth_failures = 3\nauth_block_s = 30\n\n[[tenant]]\nname = \"remote\"\n"
    << "tokens = [\"" << made.value("hashed", "") << "\"]\n";
  PrivateDaemon daemon;
  daemon.Start(c.str(), /*tcp=*/true);
  ASSERT_TRUE(daemon.started()) << daemon.Log();
  auto hello = [&](const std::string& tok) {
    RawConn conn(ConnectTcp(daemon.tcp_port()));
    return conn.fd() >= 0 && conn.Hello(tok).ok();
  };
  EXPECT_TRUE(hello(token)) << daemon.Log();        // the token, not its stored hash
  EXPECT_FALSE(hello(made.value("hashed", "")));    // the hash itself is no token
  EXPECT_FALSE(hello("guess-1"));
  EXPECT_FALSE(hello("guess-2"));                   // the third failure: blocked from now
  EXPECT_FALSE(hello(token));                       // even with the right token
  EXPECT_NE(daemon.Log().find("failed authentications"), std::string::npos) << daemon.Log();
  EXPECT_NE(daemon.Log().find("refused address 127.0.0.1"), std::string::npos) << daemon.Log();
  // Local tenants (another origin) are served meanwhile.
  EXPECT_FALSE(StatusJson(daemon, -1).empty());
  EXPECT_TRUE(daemon.Alive());
  daemon.Stop();
}

// A client that connects the moment gmuxd's socket file appears is served: the file appears only
// once the socket listens (bound under a name of its own, then renamed into place), where a
// connect between bind() and listen() used to be refused and the tenant found no devices. No
// staging name is left behind, and a second gmuxd on the same path refuses to start without
// taking the path from the first.
TEST_F(OpsTest, TheSocketFileAppearsOnlyOnceItListens) {
  auto start = [&](const std::string& socket, const std::string& log) {
    pid_t pid = ::fork();
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd >= 0) ::dup2(fd, 2);
      ::execl(GMUXD_PATH, GMUXD_PATH, "--socket", socket.c_str(), "--exit-after", "60",
              static_cast<char*>(nullptr));
      ::_exit(127);
    }
    return pid;
  };
  // Whether a client connects now; errno's text when it does not.
  auto connects = [](const std::string& socket, int* err) {
    int fd = ConnectUnix(socket);
    *err = errno;
    if (fd >= 0) ::close(fd);
    return fd >= 0;
  };
  for (int round = 0; round < 5; ++round) {
    const std::string socket = books_ + "/g" + std::to_string(round) + ".sock";
    const std::string log = books_ + "/g" + std::to_string(round) + ".log";
    pid_t pid = start(socket, log);
    ASSERT_GT(pid, 0);
    const auto deadline = std::chrono::steady_clock::now() + 30s;
    struct stat st {};
    bool exited = false;
    // As tight as a watching script can be (a yield, no sleep), until gmuxd is up or gone.
    while (::stat(socket.c_str(), &st) != 0 && std::chrono::steady_clock::now() < deadline) {
      int status = 0;
      if (::waitpid(pid, &status, WNOHANG) == pid) {
        exited = true;
        break;
      }
      ::sched_yield();
    }
    ASSERT_FALSE(exited) << "gmuxd exited during start-up:\n" << ReadFile(log);
    int err = 0;
    EXPECT_TRUE(connects(socket, &err))
        << "round " << round << ": connect right after the file appeared: " << std::strerror(err)
        << "\n" << ReadFile(log);
    for (const auto& entry : std::filesystem::directory_iterator(books_)) {
      EXPECT_EQ(entry.path().filename().string().find(".new."), std::string::npos)
          << entry.path();
    }
    if (round == 0) {
      // A second daemon on the same path: refused, and the first keeps its socket.
      const std::string log2 = books_ + "/second.log";
      pid_t second = start(socket, log2);
      ASSERT_GT(second, 0);
      int status = 0;
      ASSERT_EQ(::waitpid(second, &status, 0), second);
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0) << ReadFile(log2);
      EXPECT_NE(ReadFile(log2).find("another gmuxd is serving"), std::string::npos)
          << ReadFile(log2);
      EXPECT_TRUE(connects(socket, &err)) << std::strerror(err);
    }
    ::kill(pid, SIGTERM);
    int status = 0;
    ::waitpid(pid, &status, 0);
  }
}

// A tenant gmuxd refuses hears why on its stderr (once), not only an empty platform.
TEST_F(OpsTest, ARefusedTenantIsToldWhy) {
  PrivateDaemon daemon;
  daemon.Start("[tenants]\nunknown_peers = \"reject\"\n");
  ASSERT_TRUE(daemon.started()) << daemon.Log();
  ASSERT_EQ(::chmod(books_.c_str(), 0755), 0);
  const std::string err = books_ + "/tenant.err";
  std::ofstream(err).close();
  ASSERT_EQ(::chmod(err.c_str(), 0666), 0);
  ChildOptions o;
  o.tenant = 5;
  Child c = Child::Spawn(daemon, o, [err](Channel&) {
    int fd = ::open(err.c_str(), O_WRONLY | O_APPEND);
    if (fd < 0) return 60;
    ::dup2(fd, 2);
    GmuxDevice d;
    const bool opened = OpenGmux(d);
    GmuxDevice again;  // the ICD tries again on the next call; said once all the same
    const bool reopened = OpenGmux(again);
    return opened || reopened ? 61 : 0;
  });
  Outcome out = c.Wait(60s);
  EXPECT_TRUE(out.ok()) << out.Describe();
  const std::string said = ReadFile(err);
  const std::string why = "uid " + std::to_string(TenantUid(5)) + " is not a configured tenant";
  EXPECT_NE(said.find("gmux: gmuxd: " + why), std::string::npos) << said;
  EXPECT_EQ(said.find("gmux:"), said.rfind("gmux:")) << "said more than once:\n" << said;
  EXPECT_TRUE(daemon.Alive());
}

}  // namespace
}  // namespace gmux::testing
