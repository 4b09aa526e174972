// The device pool on the real runtime (BioCloud, docs/operations.md "Device pool"): PoCL gives
// three CPU devices (POCL_DEVICES), device 0 shared and devices 1 and 2 lent whole. Tenants are
// forked processes under uids of their own (as root), each a real OpenCL program through the
// gmux ICD; `gmux lease` is the real CLI.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/isolation_harness.h"

namespace gmux::testing {
namespace {

using namespace iso;
using nlohmann::json;

constexpr const char* kBump = R"(
__kernel void bump(__global uint* a, uint by) { a[get_global_id(0)] += by + get_global_id(0); }
)";

std::string PoolConfig(const std::string& pool_extra, int pool_devices = 2) {
  std::ostringstream c;
  c << "[scheduler]\npolicy = \"fifo\"\n\n";
  for (int d = 1; d <= pool_devices; ++d) {
    c << "[[scheduler.device]]\nindex = " << d << "\nmode = \"exclusive\"\n\n";
  }
  c << "[pool]\n" << pool_extra << "\n";
  return c.str();
}

class PoolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!RunningAsRoot()) GTEST_SKIP() << "needs root: each tenant runs as its own uid";
    // The daemon (and its workers) see three PoCL devices; tenants see gmux's only.
    ::setenv("POCL_DEVICES", "pthread pthread pthread", 1);
  }
  void TearDown() override { ::unsetenv("POCL_DEVICES"); }

  json LeaseList() {
    int code = -1;
    std::string out = RunGmux(-1, {"lease", "list", "--json", "--socket", daemon_.socket()},
                              &code, false);
    json j = json::parse(out, nullptr, false);
    return code == 0 && j.is_object() ? j : json();
  }
  // The first device of the pool's state as `gmux lease list` shows it.
  json LeaseOf(const std::string& tenant) {
    json l = LeaseList();
    for (const auto& x : l.value("leases", json::array())) {
      if (x.value("tenant", "") == tenant) return x;
    }
    return json();
  }
  // Polls `pred` on the lease list for up to `within`.
  bool WaitList(const std::function<bool(const json&)>& pred,
                std::chrono::milliseconds within = 10s) {
    const auto end = std::chrono::steady_clock::now() + within;
    while (std::chrono::steady_clock::now() < end) {
      if (pred(LeaseList())) return true;
      std::this_thread::sleep_for(50ms);
    }
    return false;
  }

  PrivateDaemon daemon_;
};

// The pool's device of the gmux platform (the second device: device 0 is shared, and the
// pool's devices are one).
bool OpenPool(GmuxDevice& d, cl_int* create_err = nullptr) { return OpenGmux(d, 1, create_err); }

// A tenant on the pool: a buffer of `words` bumped `rounds` times, each round checked against
// the CPU; between rounds it sends its round number up and waits for "go" when `pause`.
int PoolTenant(Channel& ch, int rounds, bool pause) {
  GmuxDevice d;
  cl_int create_err = CL_SUCCESS;
  if (!OpenPool(d, &create_err)) {
    ch.Send(create_err);
    return create_err == CL_DEVICE_NOT_AVAILABLE ? 40 : 50;
  }
  ch.Send(0);  // has its lease
  std::string log;
  cl_program p = Build(d, kBump, &log);
  if (p == nullptr) return 51;
  cl_int err = CL_SUCCESS;
  cl_kernel k = clCreateKernel(p, "bump", &err);
  const size_t words = 1 << 16;
  std::vector<cl_uint> want(words), got(words);
  for (size_t i = 0; i < words; ++i) want[i] = static_cast<cl_uint>(i * 7);
  cl_mem m = clCreateBuffer(d.context, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, words * 4,
                            want.data(), &err);
  if (k == nullptr || m == nullptr || clSetKernelArg(k, 0, sizeof(m), &m) != CL_SUCCESS) return 52;
  for (int r = 1; r <= rounds; ++r) {
    const cl_uint by = static_cast<cl_uint>(r);
    if (clSetKernelArg(k, 1, sizeof(by), &by) != CL_SUCCESS ||
        clEnqueueNDRangeKernel(d.queue, k, 1, nullptr, &words, nullptr, 0, nullptr, nullptr) !=
            CL_SUCCESS ||
        clFinish(d.queue) != CL_SUCCESS) {
      return 60 + r;
    }
    for (size_t i = 0; i < words; ++i) want[i] += by + static_cast<cl_uint>(i);
    if (clEnqueueReadBuffer(d.queue, m, CL_TRUE, 0, words * 4, got.data(), 0, nullptr, nullptr) !=
            CL_SUCCESS ||
        got != want) {
      return 80 + r;
    }
    ch.Send(r);
    if (pause && r < rounds && !ch.WaitGo()) return 90;
  }
  clReleaseMemObject(m);
  clReleaseKernel(k);
  clReleaseProgram(p);
  return 0;
}

TEST_F(PoolTest, ImplicitLeaseFollowsTheTenantsContextsAndResultsAreRight) {
  daemon_.Start(PoolConfig("wait_s = 10\n"));
  Child a = Child::Spawn(daemon_, {1, 60, {}}, [](Channel& ch) {
    const int rc = PoolTenant(ch, 2, true);
    if (rc != 0) return rc;
    ch.WaitGo();
    return 0;
  });
  ASSERT_EQ(a.Receive(30s), 0) << daemon_.Log();
  ASSERT_EQ(a.Receive(30s), 1) << daemon_.Log();
  // Its first context took a lease on a pool device, implicit and ready.
  json l = LeaseOf(UidTenantName(1));
  ASSERT_TRUE(l.is_object()) << LeaseList().dump();
  EXPECT_EQ(l["kind"], "implicit");
  EXPECT_EQ(l["state"], "ready");
  EXPECT_TRUE(l["device"] == 1 || l["device"] == 2) << l.dump();
  // `gmux status` shows it too (its table, and under "pool" in its JSON).
  const std::string table = StatusOutput(daemon_, -1, false);
  EXPECT_NE(table.find("pool device " + std::to_string(l["device"].get<int>()) + ": leased"),
            std::string::npos)
      << table;
  json st = json::parse(StatusJson(daemon_, -1), nullptr, false);
  ASSERT_TRUE(st.is_object());
  EXPECT_EQ(st["pool"]["leases"].size(), 1u) << st.dump();
  a.Go();
  ASSERT_EQ(a.Receive(30s), 2);
  a.Go();
  EXPECT_TRUE(a.Wait(30s).ok()) << daemon_.Log();
  // Its program ended: the lease went back, and both devices are free.
  EXPECT_TRUE(WaitList([](const json& j) {
    if (!j.is_object() || !j["leases"].empty()) return false;
    for (const auto& d : j["devices"]) {
      if (d["state"] != "free") return false;
    }
    return true;
  })) << LeaseList().dump();
  EXPECT_GE(LeaseList().value("grants", 0), 1);
}

// Programs that end and start again at once (BioCloud's runs): the next context comes while
// the last lease is still being given back; every run's results are right, and the worker never
// reports work on a device after giving it back (that would end its session).
TEST_F(PoolTest, ProgramsEndingAndStartingAtOnceKeepWorking) {
  daemon_.Start(PoolConfig("wait_s = 10\n"));
  Child a = Child::Spawn(daemon_, {1, 90, {}}, [](Channel& ch) {
    for (int i = 0; i < 8; ++i) {
      Channel quiet(-1, -1);
      if (int rc = PoolTenant(quiet, 2, false); rc != 0) return rc;
    }
    ch.Send(1);
    return 0;
  });
  EXPECT_EQ(a.Receive(60s), 1) << daemon_.Log();
  EXPECT_TRUE(a.Wait(30s).ok()) << daemon_.Log();
  EXPECT_EQ(daemon_.Log().find("broke the control protocol"), std::string::npos) << daemon_.Log();
  EXPECT_GE(LeaseList().value("grants", 0), 2) << LeaseList().dump();
}

TEST_F(PoolTest, ContextWaitsForAFreeDeviceThenFailsWithDeviceNotAvailable) {
  daemon_.Start(PoolConfig("wait_s = 1.5\n", /*pool_devices=*/1));
  Child a = Child::Spawn(daemon_, {1, 60, {}}, [](Channel& ch) {
    GmuxDevice d;
    if (!OpenPool(d)) return 50;
    ch.Send(1);
    return ch.WaitGo() ? 0 : 1;
  });
  ASSERT_EQ(a.Receive(30s), 1) << daemon_.Log();
  const auto t0 = std::chrono::steady_clock::now();
  Child b = Child::Spawn(daemon_, {2, 60, {}}, [](Channel& ch) {
    GmuxDevice d;
    cl_int err = CL_SUCCESS;
    OpenPool(d, &err);
    ch.Send(err);
    return 0;
  });
  // While it waits, `gmux lease list` shows it in the queue.
  EXPECT_TRUE(WaitList([](const json& j) {
    return j.is_object() && j["waiting"].size() == 1 && j["waiting"][0]["kind"] == "implicit";
  }, 5s)) << LeaseList().dump();
  ASSERT_EQ(b.Receive(30s), CL_DEVICE_NOT_AVAILABLE) << daemon_.Log();
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 1400ms);
  EXPECT_TRUE(b.Wait(10s).ok());
  EXPECT_GE(LeaseList().value("timeouts", 0), 1);
  // The holder's program ends: the next tenant gets the device at once.
  a.Go();
  EXPECT_TRUE(a.Wait(10s).ok());
  Child c = Child::Spawn(daemon_, {2, 60, {}}, [](Channel& ch) {
    return PoolTenant(ch, 1, false);
  });
  EXPECT_EQ(c.Receive(30s), 0);
  EXPECT_TRUE(c.Wait(30s).ok()) << daemon_.Log();
}

TEST_F(PoolTest, IdleLeaseIsReclaimedAndReacquiredOnAnotherDeviceWithTheSameResults) {
  // Idle for 2 s: long enough that neither lease is taken back between the steps below on a
  // loaded machine (each is a client call or a `gmux lease list`), short enough to wait for.
  daemon_.Start(PoolConfig("check_period_s = 0.2\nidle_s = 2\nwait_s = 20\n"));
  Child a = Child::Spawn(daemon_, {1, 90, {}}, [](Channel& ch) { return PoolTenant(ch, 3, true); });
  ASSERT_EQ(a.Receive(30s), 0) << daemon_.Log();
  ASSERT_EQ(a.Receive(30s), 1) << daemon_.Log();
  const json first = LeaseOf(UidTenantName(1));
  ASSERT_TRUE(first.is_object());
  // Idle: the checker takes the lease back and the tenant's data leaves the device.
  ASSERT_TRUE(WaitList([](const json& j) { return j.is_object() && j["leases"].empty(); }, 10s))
      << LeaseList().dump();
  // Another tenant takes that device meanwhile (the lowest free one).
  Child b = Child::Spawn(daemon_, {2, 60, {}}, [](Channel& ch) {
    GmuxDevice d;
    if (!OpenPool(d)) return 50;
    ch.Send(1);
    return ch.WaitGo() ? 0 : 1;
  });
  ASSERT_EQ(b.Receive(30s), 1) << daemon_.Log();
  const json other = LeaseOf(UidTenantName(2));
  ASSERT_TRUE(other.is_object()) << LeaseList().dump();
  // The first tenant's next command re-acquires a device transparently: its results stay right.
  a.Go();
  ASSERT_EQ(a.Receive(30s), 2) << daemon_.Log();
  const json second = LeaseOf(UidTenantName(1));
  ASSERT_TRUE(second.is_object()) << LeaseList().dump();
  EXPECT_NE(second["device"], other["device"]);
  a.Go();
  EXPECT_EQ(a.Receive(30s), 3);
  EXPECT_TRUE(a.Wait(30s).ok()) << daemon_.Log();
  b.Go();
  EXPECT_TRUE(b.Wait(10s).ok());
  const json j = LeaseList();
  EXPECT_GE(j.value("reclaims", 0), 1) << j.dump();
  EXPECT_GE(j.value("reacquires", 0), 1) << j.dump();
  EXPECT_GT(j.value("mean_reclaim_to_reacquire_s", 0.0), 0.0) << j.dump();
}

TEST_F(PoolTest, ExplicitLeaseIsPinnedExpiresAndIsReleasedByTheCli) {
  daemon_.Start(PoolConfig("check_period_s = 0.2\nidle_s = 0.3\nwait_s = 5\n") +
                "[[tenant]]\nname = \"batch\"\nuids = [" + std::to_string(TenantUid(1)) + "]\n");
  int code = -1;
  std::string out = RunGmux(-1, {"lease", "acquire", "--tenant", "batch", "--json", "--socket",
                                 daemon_.socket()},
                            &code, false);
  ASSERT_EQ(code, 0) << out;
  json got = json::parse(out, nullptr, false);
  ASSERT_TRUE(got.is_object()) << out;
  EXPECT_EQ(got["kind"], "explicit");
  EXPECT_EQ(got["state"], "ready");
  const std::string id = got["lease"];
  // Pinned: idle for many checker periods, still held.
  std::this_thread::sleep_for(1s);
  EXPECT_EQ(LeaseOf("batch").value("lease", ""), id);
  // The tenant's own program uses it (its context finds the lease its own).
  Child a = Child::Spawn(daemon_, {1, 60, {}}, [](Channel& ch) {
    return PoolTenant(ch, 1, false);
  });
  EXPECT_EQ(a.Receive(30s), 0);
  EXPECT_TRUE(a.Wait(30s).ok()) << daemon_.Log();
  EXPECT_EQ(LeaseOf("batch").value("lease", ""), id) << "a program's end keeps a pinned lease";
  // Another tenant may not release it; the operator (root) may.
  out = RunGmux(2, {"lease", "release", id, "--socket", daemon_.socket()}, &code);
  EXPECT_NE(code, 0) << out;
  out = RunGmux(-1, {"lease", "release", id, "--socket", daemon_.socket()}, &code);
  EXPECT_EQ(code, 0) << out;
  EXPECT_TRUE(WaitList([](const json& j) { return j.is_object() && j["leases"].empty(); }, 5s));
  // --device: that one (not the lowest free).
  out = RunGmux(-1, {"lease", "acquire", "--device", "2", "--json", "--socket", daemon_.socket()},
                &code, false);
  ASSERT_EQ(code, 0) << out;
  got = json::parse(out, nullptr, false);
  ASSERT_TRUE(got.is_object()) << out;
  EXPECT_EQ(got["device"], 2) << out;
  out = RunGmux(-1, {"lease", "release", got["lease"], "--socket", daemon_.socket()}, &code);
  EXPECT_EQ(code, 0) << out;
  out = RunGmux(-1, {"lease", "acquire", "--device", "0", "--socket", daemon_.socket()}, &code);
  EXPECT_EQ(code, 1) << out;
  EXPECT_NE(out.find("device 0 is not in the pool"), std::string::npos) << out;
  EXPECT_TRUE(WaitList([](const json& j) { return j.is_object() && j["leases"].empty(); }, 5s));
  // --for: given back by itself.
  out = RunGmux(-1, {"lease", "acquire", "--for", "500ms", "--json", "--socket",
                     daemon_.socket()},
                &code, false);
  ASSERT_EQ(code, 0) << out;
  EXPECT_TRUE(WaitList([](const json& j) { return j.is_object() && j["leases"].empty(); }, 5s))
      << LeaseList().dump();
  // --wait with every device taken: withdrawn and exit 1.
  for (int i = 0; i < 2; ++i) {
    out = RunGmux(-1, {"lease", "acquire", "--tenant", i == 0 ? "batch" : "default", "--socket",
                       daemon_.socket()},
                  &code);
    ASSERT_EQ(code, 0) << out;
  }
  out = RunGmux(2, {"lease", "acquire", "--wait", "300ms", "--socket", daemon_.socket()}, &code);
  EXPECT_EQ(code, 1) << out;
  EXPECT_NE(out.find("no pool device became free"), std::string::npos) << out;
  EXPECT_TRUE(LeaseList()["waiting"].empty()) << LeaseList().dump();
  // Bad input is a clear error.
  out = RunGmux(-1, {"lease", "acquire", "--for", "soon", "--socket", daemon_.socket()}, &code);
  EXPECT_EQ(code, 1);
  EXPECT_NE(out.find("bad --for"), std::string::npos) << out;
  out = RunGmux(-1, {"lease", "release", "L999", "--socket", daemon_.socket()}, &code);
  EXPECT_EQ(code, 1);
  EXPECT_NE(out.find("no lease L999"), std::string::npos) << out;
}

TEST_F(PoolTest, HooksRunWithTheLeaseAndAFailingOrSlowHookFailsTheLease) {
  const std::string log = "/tmp/gmux-pool-hooks-" + std::to_string(::getpid());
  ::unlink(log.c_str());
  {
    daemon_.Start(PoolConfig("wait_s = 5\nattach_hook = \"echo attach $GMUX_DEVICE $GMUX_TENANT "
                             "$GMUX_LEASE >> " + log + "\"\ndetach_hook = \"echo detach "
                             "$GMUX_DEVICE $GMUX_TENANT $GMUX_REASON >> " + log + "\"\n"));
    Child a = Child::Spawn(daemon_, {1, 60, {}}, [](Channel& ch) {
      return PoolTenant(ch, 1, false);
    });
    EXPECT_EQ(a.Receive(30s), 0) << daemon_.Log();
    EXPECT_TRUE(a.Wait(30s).ok()) << daemon_.Log();
    EXPECT_TRUE(WaitList([](const json& j) {
      return j.is_object() && j.value("detach_hooks", 0) == 1;
    })) << LeaseList().dump();
    std::ifstream in(log);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_NE(text.find("attach 1 " + UidTenantName(1) + " L1"), std::string::npos) << text;
    EXPECT_NE(text.find("detach 1 " + UidTenantName(1) + " program-end"), std::string::npos)
        << text;
    EXPECT_GT(LeaseList().value("attach_hook_s", 0.0), 0.0);
    daemon_.Stop();
  }
  ::unlink(log.c_str());
  for (const char* hook : {"exit 3", "sleep 10"}) {
    PrivateDaemon d;
    d.Start(PoolConfig(std::string("wait_s = 5\nhook_timeout_s = 0.5\nattach_hook = \"") + hook +
                       "\"\n"));
    Child a = Child::Spawn(d, {1, 60, {}}, [](Channel& ch) {
      GmuxDevice dev;
      cl_int err = CL_SUCCESS;
      OpenPool(dev, &err);
      ch.Send(err);
      return 0;
    });
    EXPECT_EQ(a.Receive(30s), CL_DEVICE_NOT_AVAILABLE) << hook << "\n" << d.Log();
    EXPECT_TRUE(a.Wait(10s).ok());
    EXPECT_NE(d.Log().find("attach hook for device 1 failed"), std::string::npos) << d.Log();
  }
}

TEST_F(PoolTest, TenantKilledWhileHoldingOrWaitingFreesThePool) {
  daemon_.Start(PoolConfig("wait_s = 30\n", /*pool_devices=*/1));
  Child a = Child::Spawn(daemon_, {1, 60, {}}, [](Channel& ch) -> int {
    GmuxDevice d;
    if (!OpenPool(d)) return 50;
    ch.Send(1);
    LingerUntilKilled();
  });
  ASSERT_EQ(a.Receive(30s), 1) << daemon_.Log();
  Child b = Child::Spawn(daemon_, {2, 60, {}}, [](Channel& ch) -> int {
    GmuxDevice d;
    OpenPool(d);
    ch.Send(2);
    LingerUntilKilled();
  });
  ASSERT_TRUE(WaitList([](const json& j) { return j.is_object() && j["waiting"].size() == 1; }))
      << LeaseList().dump();
  b.Kill();  // killed while waiting: it leaves the queue
  ASSERT_TRUE(WaitList([](const json& j) { return j.is_object() && j["waiting"].empty(); }))
      << LeaseList().dump();
  a.Kill();  // killed while holding: the device goes back
  EXPECT_TRUE(WaitList([](const json& j) {
    return j.is_object() && j["leases"].empty() && j["devices"][0]["state"] == "free";
  })) << LeaseList().dump();
  Child c = Child::Spawn(daemon_, {3, 60, {}}, [](Channel& ch) {
    return PoolTenant(ch, 1, false);
  });
  EXPECT_EQ(c.Receive(30s), 0);
  EXPECT_TRUE(c.Wait(30s).ok()) << daemon_.Log();
  EXPECT_TRUE(daemon_.Alive());
}

// A pool the backend cannot make is refused at start, with the reason.
TEST_F(PoolTest, BadPoolConfigStopsTheDaemonWithAClearError) {
  const std::string dir = "/tmp/gmux-pool-bad-" + std::to_string(::getpid());
  ::mkdir(dir.c_str(), 0755);
  const std::string cfg = dir + "/g.toml";
  {
    std::ofstream f(cfg);
    f << "[daemon]\nsocket = \"" << dir << "/s.sock\"\n" << PoolConfig("", 2)
      << "[[scheduler.device]]\nindex = 7\nmode = \"exclusive\"\n";
  }
  const std::string cmd = std::string("timeout 60 ") + GMUXD_PATH + " --config " + cfg +
                          " --exit-after 5 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[512];
  while (size_t n = std::fread(buf, 1, sizeof(buf), p)) out.append(buf, n);
  const int rc = ::pclose(p);
  EXPECT_NE(rc, 0) << out;
  EXPECT_NE(out.find("index 7 is exclusive, but the backend has 3 device(s)"), std::string::npos)
      << out;
  ::unlink(cfg.c_str());
  ::rmdir(dir.c_str());
}

}  // namespace
}  // namespace gmux::testing
