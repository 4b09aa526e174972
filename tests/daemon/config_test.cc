#include "daemon/config.h"

#include <gtest/gtest.h>

namespace gmux::daemon {
namespace {

TEST(DaemonConfigTest, EmptyConfigGivesDocumentedDefaults) {
  auto o = ParseDaemonConfig("", "gmux.toml");
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->policy, "fifo");
  EXPECT_EQ(o->unknown_peers, UnknownPeers::kOwnTenant);
  auto t = o->TenantForUid(1234);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->name, "uid-1234");
}

TEST(DaemonConfigTest, TenantsMapUidsAndUnknownPeersCanBeRejected) {
  auto o = ParseDaemonConfig(R"(
[daemon]
socket = "/tmp/x.sock"
inflight_per_device = 2

[tenants]
unknown_peers = "reject"

[[tenant]]
name = "alice"
weight = 2.0
uids = [1000, 1001]
)", "gmux.toml");
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->socket_path, "/tmp/x.sock");
  EXPECT_EQ(o->inflight_per_device, 2u);
  auto a = o->TenantForUid(1001);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->name, "alice");
  EXPECT_EQ(a->weight, 2.0);
  EXPECT_EQ(o->TenantForUid(5).status().code(), StatusCode::kPermissionDenied);
}

TEST(DaemonConfigTest, ASlurmJobsProcessesAreItsTenantWhateverTheirUid) {
  auto o = ParseDaemonConfig(R"(
[[tenant]]
name = "alice"
uids = [1000]

[[tenant]]
name = "job-17"
weight = 6
slurm_job = 17
)", "gmux.toml");
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->TenantForPeer(1000, 17)->name, "job-17");
  EXPECT_EQ(o->TenantForPeer(1000, 18)->name, "alice");  // a job with no tenant: the uid's
  EXPECT_EQ(o->TenantForPeer(1000, 0)->name, "alice");
  EXPECT_EQ(o->TenantForPeer(5, 17)->weight, 6.0);
  auto twice = ParseDaemonConfig(
      "[[tenant]]\nname = \"a\"\nslurm_job = 3\n[[tenant]]\nname = \"b\"\nslurm_job = 3\n",
      "gmux.toml");
  ASSERT_FALSE(twice.ok());
  EXPECT_NE(twice.status().message().find("Slurm job 3 is mapped to two tenants"),
            std::string::npos) << twice.status().ToString();
  auto negative = ParseDaemonConfig("[[tenant]]\nname = \"a\"\nslurm_job = -1\n", "g.toml");
  ASSERT_FALSE(negative.ok());
  EXPECT_NE(negative.status().message().find("slurm_job"), std::string::npos);
}

TEST(DaemonConfigTest, WorkerResourceLimitsDefaultAndPerTenant) {
  auto o = ParseDaemonConfig(R"(
[limits]
worker_open_files = 512

[[tenant]]
name = "small"
uids = [1000]
worker_memory_bytes = 536870912
)", "gmux.toml");
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->limits.worker_memory_bytes, 0u);  // no memory limit unless configured
  EXPECT_EQ(o->limits.worker_open_files, 512u);
  auto t = o->TenantForUid(1000);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->limits.worker_memory_bytes, 536870912u);
  EXPECT_EQ(t->limits.worker_open_files, 512u);  // inherited from [limits]
  EXPECT_EQ(ParseDaemonConfig("", "g.toml")->limits.worker_open_files, 1024u);

  auto tiny = ParseDaemonConfig("[limits]\nworker_memory_bytes = 1048576\n", "g.toml");
  ASSERT_FALSE(tiny.ok());
  EXPECT_NE(tiny.status().message().find("g.toml:2"), std::string::npos) << tiny.status().message();
  EXPECT_NE(tiny.status().message().find("256 MiB"), std::string::npos) << tiny.status().message();
  auto files = ParseDaemonConfig("[[tenant]]\nname = \"a\"\nworker_open_files = 3\n", "g.toml");
  ASSERT_FALSE(files.ok());
  EXPECT_NE(files.status().message().find("worker_open_files"), std::string::npos);
}

TEST(DaemonConfigTest, MemoryQuotasAndCapacityTakeSizesWithUnits) {
  auto o = ParseDaemonConfig(R"([daemon]
memory_bytes = "1GiB"

[limits]
memory_quota = "512 MiB"

[[tenant]]
name = "small"
uids = [1000]
memory_quota = 1048576

[[tenant]]
name = "decimal"
uids = [1001]
memory_quota = "1.5GB"
)", "gmux.toml");
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->memory_bytes, 1ull << 30);
  EXPECT_EQ(o->limits.memory_quota, 512ull << 20);
  EXPECT_EQ(o->TenantForUid(1000)->limits.memory_quota, 1ull << 20);
  EXPECT_EQ(o->TenantForUid(1001)->limits.memory_quota, 1500000000ull);
  EXPECT_EQ(o->TenantForUid(4242)->limits.memory_quota, 512ull << 20);  // [limits] default
  EXPECT_EQ(ParseDaemonConfig("", "g.toml")->limits.memory_quota, 0u);  // none unless set
  EXPECT_EQ(ParseDaemonConfig("", "g.toml")->memory_bytes, 0u);         // the backend's
  for (const char* bad : {"memory_quota = \"lots\"", "memory_quota = \"2 GiBs\"",
                          "memory_quota = -1", "memory_quota = \"GiB\"", "memory_quota = true",
                          "memory_quota = \"99999999TB\""}) {
    auto r = ParseDaemonConfig(std::string("[limits]\n") + bad + "\n", "g.toml");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("g.toml:2"), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find("memory_quota"), std::string::npos) << r.status().message();
  }
}

TEST(DaemonConfigTest, MemorySlotsAreOffUnlessAPlacementPolicyIsNamed) {
  auto none = ParseDaemonConfig("", "g.toml");
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->memory_slots, "off");
  EXPECT_EQ(none->slot_bytes, 64ull << 20);  // DymGPU's 64 MB slots
  EXPECT_EQ(none->memory_idle_s, 20.0);      // and its 20 s idle rule
  EXPECT_EQ(none->swap_batch, 2.0);          // swaps batched by default
  auto on = ParseDaemonConfig(
      "[daemon]\nmemory_slots = \"utilization\"\nslot_bytes = \"8MiB\"\nmemory_idle_s = 2\n"
      "swap_batch = 0\n",
      "g.toml");
  ASSERT_TRUE(on.ok()) << on.status().message();
  EXPECT_EQ(on->memory_slots, "utilization");
  EXPECT_EQ(on->slot_bytes, 8ull << 20);
  EXPECT_EQ(on->memory_idle_s, 2.0);
  EXPECT_EQ(on->swap_batch, 0.0);
  for (const char* bad : {"memory_slots = \"lru\"", "memory_slots = 3", "slot_bytes = \"4KiB\"",
                          "memory_idle_s = 0", "swap_batch = -1", "swap_batch = 101",
                          "swap_batch = \"2\""}) {
    auto r = ParseDaemonConfig(std::string("[daemon]\n") + bad + "\n", "g.toml");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("g.toml:2"), std::string::npos) << r.status().message();
  }
}

TEST(DaemonConfigTest, ExpressDispatchIsOnUnlessTurnedOff) {
  auto none = ParseDaemonConfig("", "g.toml");
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->express_dispatch);
  auto off = ParseDaemonConfig("[daemon]\nexpress_dispatch = false\n", "g.toml");
  ASSERT_TRUE(off.ok()) << off.status().message();
  EXPECT_FALSE(off->express_dispatch);
  auto bad = ParseDaemonConfig("[daemon]\nexpress_dispatch = 1\n", "g.toml");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("express_dispatch"), std::string::npos)
      << bad.status().message();
}

TEST(DaemonConfigTest, WorkerSpinIsAHundredMicrosecondsWithinItsBounds) {
  auto none = ParseDaemonConfig("", "g.toml");
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->worker_spin_us, 100u);
  auto off = ParseDaemonConfig("[daemon]\nworker_spin_us = 0\n", "g.toml");
  ASSERT_TRUE(off.ok()) << off.status().message();
  EXPECT_EQ(off->worker_spin_us, 0u);
  for (const char* bad : {"-1", "10001", "\"100\"", "1.5"}) {
    auto o = ParseDaemonConfig(std::string("[daemon]\nworker_spin_us = ") + bad + "\n", "g.toml");
    ASSERT_FALSE(o.ok()) << bad;
    EXPECT_NE(o.status().message().find("worker_spin_us"), std::string::npos)
        << o.status().message();
  }
}

TEST(DaemonConfigTest, ErrorsNameFileLineAndKey) {
  auto o = ParseDaemonConfig("[daemon]\n\ninflight_per_device = 0\n", "conf/gmux.toml");
  ASSERT_FALSE(o.ok());
  EXPECT_NE(o.status().message().find("conf/gmux.toml:3"), std::string::npos) << o.status().message();
  EXPECT_NE(o.status().message().find("inflight_per_device"), std::string::npos);

  auto typo = ParseDaemonConfig("[daemon]\nsockett = \"x\"\n", "g.toml");
  ASSERT_FALSE(typo.ok());
  EXPECT_NE(typo.status().message().find("sockett"), std::string::npos) << typo.status().message();

  auto policy = ParseDaemonConfig("[scheduler]\npolicy = \"nope\"\n", "g.toml");
  ASSERT_FALSE(policy.ok());
  EXPECT_NE(policy.status().message().find("g.toml:2"), std::string::npos) << policy.status().message();

  auto dup = ParseDaemonConfig("[[tenant]]\nname = \"a\"\nuids = [1]\n[[tenant]]\nname = \"b\"\nuids = [1]\n",
                               "g.toml");
  ASSERT_FALSE(dup.ok());
}

TEST(DaemonConfigTest, TcpListenerAndTokens) {
  auto o = ParseDaemonConfig(R"(
[daemon]
listen = "127.0.0.1:7450"

[tenants]
unknown_tokens = "shared"
default_tenant = "guests"

[[tenant]]
name = "alice"
tokens = ["a-secret", "a-second"]
)", "gmux.toml");
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->listen, "127.0.0.1:7450");
  EXPECT_EQ(o->TenantForToken("a-second")->name, "alice");
  EXPECT_EQ(o->TenantForToken("a-secre")->name, "guests");
  EXPECT_EQ(o->TenantForToken("")->name, "guests");
  o->unknown_tokens = UnknownTokens::kReject;
  EXPECT_EQ(o->TenantForToken("nope").status().code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(o->TenantForToken("").status().code(), StatusCode::kPermissionDenied);

  auto v6 = ParseListenAddress("[::1]:0");
  ASSERT_TRUE(v6.ok());
  EXPECT_EQ(v6->host, "::1");
  EXPECT_EQ(v6->port, 0);
  for (const char* bad : {"7450", ":7450", "host:", "host:65536", "host:7x"}) {
    EXPECT_FALSE(ParseListenAddress(bad).ok()) << bad;
  }
  auto err = ParseDaemonConfig("[daemon]\nlisten = \"localhost\"\n", "g.toml");
  ASSERT_FALSE(err.ok());
  EXPECT_NE(err.status().message().find("g.toml:2"), std::string::npos) << err.status().message();
  auto dup = ParseDaemonConfig("[[tenant]]\nname = \"a\"\ntokens = [\"t\"]\n"
                               "[[tenant]]\nname = \"b\"\ntokens = [\"t\"]\n", "g.toml");
  EXPECT_FALSE(dup.ok());
}

TEST(DaemonConfigTest, TcpIsTlsOrExplicitlyPlain) {
  auto tls = ParseDaemonConfig("[daemon]\nlisten = \"0.0.0.0:7450\"\ntls_cert = \"/c.pem\"\n"
                               "tls_key = \"/k.pem\"\ntls_client_ca = \"/ca.pem\"\n",
                               "g.toml");
  ASSERT_TRUE(tls.ok()) << tls.status().ToString();
  EXPECT_EQ(tls->tls_cert, "/c.pem");
  EXPECT_EQ(tls->tls_client_ca, "/ca.pem");
  EXPECT_TRUE(tls->ValidateTls().ok());
  // listen alone: parsed (the command line may add --plain-tcp), refused once final.
  auto bare = ParseDaemonConfig("[daemon]\nlisten = \"0.0.0.0:7450\"\n", "g.toml");
  ASSERT_TRUE(bare.ok());
  Status final_check = bare->ValidateTls();
  ASSERT_FALSE(final_check.ok());
  EXPECT_NE(final_check.message().find("plain_tcp = true"), std::string::npos);
  bare->plain_tcp = true;
  EXPECT_TRUE(bare->ValidateTls().ok());
  // Contradictions and halves are the file's errors, with its line.
  for (const char* bad : {"plain_tcp = true\ntls_cert = \"/c\"\ntls_key = \"/k\"\n",
                          "tls_cert = \"/c\"\n", "tls_key = \"/k\"\n",
                          "tls_client_ca = \"/ca\"\n"}) {
    auto r = ParseDaemonConfig(std::string("[daemon]\n") + bad, "g.toml");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("g.toml:"), std::string::npos) << r.status().message();
  }
  // Files that do not load are named (checked when the gateway is made).
  tls::ServerOptions so;
  so.cert_file = "/nonexistent/cert.pem";
  so.key_file = "/nonexistent/key.pem";
  Status files = so.Validate();
  ASSERT_FALSE(files.ok());
  EXPECT_NE(files.message().find("tls_cert '/nonexistent/cert.pem'"), std::string::npos)
      << files.message();
}

TEST(DaemonConfigTest, MissingFileIsNotFound) {
  EXPECT_EQ(LoadDaemonConfig("/nonexistent/gmux.toml").status().code(), StatusCode::kNotFound);
}

// The example every operator starts from parses, and says what the defaults are.
TEST(DaemonConfigTest, TheBackendsThreadsAreBatchUnlessSaidNormal) {
  auto none = ParseDaemonConfig("", "g.toml");
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->backend.batch_threads);
  auto normal = ParseDaemonConfig("[backend]\nthreads = \"normal\"\n", "g.toml");
  ASSERT_TRUE(normal.ok()) << normal.status().message();
  EXPECT_FALSE(normal->backend.batch_threads);
  auto bad = ParseDaemonConfig("[backend]\nthreads = \"realtime\"\n", "g.toml");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("threads"), std::string::npos) << bad.status().message();
}

TEST(DaemonConfigTest, TheExampleConfigParsesWithTheDefaults) {
  auto o = LoadDaemonConfig(std::string(GMUX_SOURCE_DIR) + "/config/gmuxd.example.toml");
  ASSERT_TRUE(o.ok()) << o.status().message();
  auto none = ParseDaemonConfig("", "g.toml");
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(o->memory_slots, none->memory_slots);
  EXPECT_EQ(o->slot_bytes, none->slot_bytes);
  EXPECT_EQ(o->memory_idle_s, none->memory_idle_s);
  EXPECT_EQ(o->memory_bytes, none->memory_bytes);
  EXPECT_EQ(o->limits.memory_quota, none->limits.memory_quota);
  EXPECT_EQ(o->express_dispatch, none->express_dispatch);
  EXPECT_EQ(o->backend.batch_threads, none->backend.batch_threads);
  EXPECT_EQ(o->inflight_per_device, none->inflight_per_device);
  EXPECT_EQ(o->pool.check_period_s, none->pool.check_period_s);
  EXPECT_EQ(o->pool.idle_s, none->pool.idle_s);
  EXPECT_EQ(o->pool.wait_s, none->pool.wait_s);
  EXPECT_EQ(o->pool.hook_timeout_s, none->pool.hook_timeout_s);
  EXPECT_TRUE(o->exclusive_devices.empty());
}

// The pool's keys: device modes, [pool] values and their errors at their line.
TEST(DaemonConfigTest, PoolDevicesAndOptions) {
  auto o = ParseDaemonConfig(
      "[[scheduler.device]]\nindex = 1\nmode = \"exclusive\"\n"
      "[[scheduler.device]]\nindex = 2\nmode = \"shared\"\n"
      "[pool]\nidle_s = 3\nwait_s = 0.5\nattach_hook = \"true\"\n",
      "g.toml");
  ASSERT_TRUE(o.ok()) << o.status().message();
  EXPECT_EQ(o->exclusive_devices, std::vector<uint32_t>{1});
  EXPECT_EQ(o->pool.idle_s, 3);
  EXPECT_EQ(o->pool.wait_s, 0.5);
  EXPECT_EQ(o->pool.attach_hook, "true");
  auto bad_mode = ParseDaemonConfig("[[scheduler.device]]\nindex = 1\nmode = \"lent\"\n", "g.toml");
  ASSERT_FALSE(bad_mode.ok());
  EXPECT_NE(bad_mode.status().message().find("g.toml:3"), std::string::npos)
      << bad_mode.status().message();
  EXPECT_NE(bad_mode.status().message().find("mode"), std::string::npos);
  auto bad_key = ParseDaemonConfig("[pool]\nidle = 3\n", "g.toml");
  ASSERT_FALSE(bad_key.ok());
  EXPECT_NE(bad_key.status().message().find("idle"), std::string::npos);
  auto too_long = ParseDaemonConfig("[pool]\nwait_s = 100000\n", "g.toml");
  ASSERT_FALSE(too_long.ok());
  EXPECT_NE(too_long.status().message().find("at most 86400"), std::string::npos);
}

TEST(DaemonConfigTest, FramesPolicyTargetsAndControllerGains) {
  auto o = ParseDaemonConfig(
      "[frames]\npolicy = \"fsa\"\ncriterion_fps = 25\ncontrol_period_s = 0.5\n"
      "kp = 0.2\nki = 0.4\nusage = \"present\"\n"
      "[[frames.device]]\nrenderer = \"llvmpipe\"\npolicy = \"esa\"\n"
      "[[tenant]]\nname = \"games\"\nuids = [1000]\nfps_target = 60\n",
      "g.toml");
  ASSERT_TRUE(o.ok()) << o.status().message();
  EXPECT_EQ(o->frames.policy, "fsa");
  EXPECT_EQ(o->frames.criterion_fps, 25);
  EXPECT_EQ(o->frames.control_period_s, 0.5);
  EXPECT_EQ(o->frames.kp, 0.2);
  EXPECT_EQ(o->frames.usage, "present");
  ASSERT_EQ(o->frames.device_policies.size(), 1u);
  EXPECT_EQ(o->frames.device_policies[0].first, "llvmpipe");
  EXPECT_EQ(o->frames.device_policies[0].second, "esa");
  ASSERT_EQ(o->tenants.size(), 1u);
  EXPECT_EQ(o->tenants[0].fps_target, 60);
  // Defaults: SA at the paper's 30 FPS.
  auto d = ParseDaemonConfig("", "g.toml");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->frames.policy, "sa");
  EXPECT_EQ(d->frames.criterion_fps, 30);
  // Errors name the file, the line and the key.
  auto bad_policy = ParseDaemonConfig("[frames]\npolicy = \"fair\"\n", "g.toml");
  ASSERT_FALSE(bad_policy.ok());
  EXPECT_NE(bad_policy.status().message().find("g.toml:2"), std::string::npos)
      << bad_policy.status().message();
  // An unstable PI (Eq. 8: |pole| >= 1) is refused.
  auto unstable = ParseDaemonConfig("[frames]\nkp = 0.1\nki = -0.1\n", "g.toml");
  ASSERT_FALSE(unstable.ok());
  EXPECT_NE(unstable.status().message().find("g.toml:3"), std::string::npos)
      << unstable.status().message();
  auto bad_target = ParseDaemonConfig("[[tenant]]\nname = \"a\"\nfps_target = -1\n", "g.toml");
  ASSERT_FALSE(bad_target.ok());
  EXPECT_NE(bad_target.status().message().find("fps_target"), std::string::npos);
  auto bad_key = ParseDaemonConfig("[frames]\nfps = 30\n", "g.toml");
  ASSERT_FALSE(bad_key.ok());
  EXPECT_NE(bad_key.status().message().find("fps"), std::string::npos);
}

TEST(DaemonConfigTest, MetricsListenIsAHostAndPort) {
  auto o = ParseDaemonConfig("[daemon]\nmetrics_listen = \"127.0.0.1:9400\"\n", "g.toml");
  ASSERT_TRUE(o.ok()) << o.status().message();
  EXPECT_EQ(o->metrics_listen, "127.0.0.1:9400");
  EXPECT_TRUE(ParseDaemonConfig("", "g.toml")->metrics_listen.empty());  // off by default
  auto bad = ParseDaemonConfig("[daemon]\nmetrics_listen = \"9400\"\n", "g.toml");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("g.toml:2"), std::string::npos) << bad.status().message();
  EXPECT_NE(bad.status().message().find("metrics_listen"), std::string::npos);
}

}  // namespace
}  // namespace gmux::daemon

namespace gmux::daemon {
namespace {

TEST(DaemonConfigTest, TokensMayBeStoredHashed) {
  const std::string hashed = HashToken("s3cret");
  // SHA-256 of "abc" (FIPS 180-2's example), in the config's form.
  EXPECT_EQ(HashToken("abc"),
            "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_TRUE(IsHashedToken(hashed));
  EXPECT_FALSE(IsHashedToken("s3cret"));
  EXPECT_FALSE(IsHashedToken("sha256:abc"));
  EXPECT_TRUE(TokenMatches(hashed, "s3cret"));
  EXPECT_FALSE(TokenMatches(hashed, "s3cret2"));
  EXPECT_FALSE(TokenMatches(hashed, hashed));  // presenting the stored hash is not the token
  EXPECT_TRUE(TokenMatches("plain", "plain"));
  EXPECT_FALSE(TokenMatches("plain", ""));
  auto o = ParseDaemonConfig("[daemon]\nadmin_tokens = [\"" + HashToken("root-tok") +
                                 "\"]\n[[tenant]]\nname = \"a\"\ntokens = [\"" + hashed +
                                 "\", \"legacy\"]\n",
                             "g.toml");
  ASSERT_TRUE(o.ok()) << o.status().message();
  ASSERT_TRUE(o->TenantForToken("s3cret").ok());
  EXPECT_EQ(o->TenantForToken("s3cret")->name, "a");
  EXPECT_EQ(o->TenantForToken("legacy")->name, "a");
  EXPECT_FALSE(o->TenantForToken(hashed).ok());
  // A malformed hash, and one token given twice (once hashed, once plain), are refused.
  auto bad = ParseDaemonConfig("[[tenant]]\nname = \"a\"\ntokens = [\"sha256:12\"]\n", "g.toml");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("64"), std::string::npos);
  auto dup = ParseDaemonConfig("[[tenant]]\nname = \"a\"\ntokens = [\"" + hashed +
                                   "\"]\n[[tenant]]\nname = \"b\"\ntokens = [\"s3cret\"]\n",
                               "g.toml");
  ASSERT_FALSE(dup.ok());
  EXPECT_NE(dup.status().message().find("two tenants"), std::string::npos);
}

TEST(DaemonConfigTest, ATenantTableChangesOnlyTheKeysItNames) {
  TenantConfig base;
  base.name = "job-7";
  base.weight = 2;
  base.uids = {1001};
  base.limits.memory_quota = 1 << 30;
  auto t = ParseTenantTable("[[tenant]]\nname = \"job-7\"\nweight = 6\n", "gmux tenant set",
                            base);
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_DOUBLE_EQ(t->weight, 6);
  EXPECT_EQ(t->uids, std::vector<uint32_t>{1001});
  EXPECT_EQ(t->limits.memory_quota, 1u << 30);
  auto q = ParseTenantTable("[[tenant]]\nname = \"job-7\"\nmemory_quota = \"2GiB\"\n"
                            "uids = [5, 6]\n", "gmux tenant set", base);
  ASSERT_TRUE(q.ok()) << q.status().message();
  EXPECT_EQ(q->limits.memory_quota, 2ull << 30);
  EXPECT_EQ(q->uids, (std::vector<uint32_t>{5, 6}));
  // Errors name the origin and the key; other tables cannot ride along.
  auto e = ParseTenantTable("[[tenant]]\nname = \"x\"\nweight = -1\n", "gmux tenant add", base);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("gmux tenant add"), std::string::npos);
  EXPECT_NE(e.status().message().find("weight"), std::string::npos);
  EXPECT_FALSE(ParseTenantTable("[daemon]\nsocket = \"/x\"\n[[tenant]]\nname = \"x\"\n", "t",
                                base).ok());
  EXPECT_FALSE(ParseTenantTable("[[tenant]]\nname = \"x\"\n[[tenant]]\nname = \"y\"\n", "t",
                                base).ok());
  EXPECT_FALSE(ParseTenantTable("not toml at all [", "t", base).ok());
}

TEST(DaemonConfigTest, LedgerAndLogKeys) {
  auto o = ParseDaemonConfig("[daemon]\nledger = \"/var/lib/gmux/usage.db\"\n"
                             "ledger_interval_s = 30\nlog_level = \"warn\"\nauth_failures = 3\n",
                             "g.toml");
  ASSERT_TRUE(o.ok()) << o.status().message();
  EXPECT_EQ(o->ledger, "/var/lib/gmux/usage.db");
  EXPECT_DOUBLE_EQ(o->ledger_interval_s, 30);
  EXPECT_EQ(o->log_level, "warn");
  EXPECT_EQ(o->auth_failures, 3u);
  auto bad = ParseDaemonConfig("[daemon]\nlog_level = \"loud\"\n", "g.toml");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("g.toml:2"), std::string::npos) << bad.status().message();
  EXPECT_FALSE(ParseDaemonConfig("[daemon]\nledger_interval_s = 0\n", "g.toml").ok());
}

}  // namespace
}  // namespace gmux::daemon

namespace gmux::daemon {
namespace {

TEST(DaemonConfigTest, TenantNamesArePrintableAndUidNamesAreReserved) {
  auto ctl = ParseDaemonConfig("[[tenant]]\nname = \"a\\u001b[31mb\"\n", "g.toml");
  ASSERT_FALSE(ctl.ok());
  EXPECT_NE(ctl.status().message().find("control character"), std::string::npos);
  EXPECT_FALSE(ParseDaemonConfig("[[tenant]]\nname = \"a\\nb\"\n", "g.toml").ok());
  auto uid = ParseDaemonConfig("[[tenant]]\nname = \"uid-1000\"\nuids = [2000]\n", "g.toml");
  ASSERT_FALSE(uid.ok());
  EXPECT_NE(uid.status().message().find("reserved"), std::string::npos);
  EXPECT_TRUE(ParseDaemonConfig("[[tenant]]\nname = \"uid-x\"\n", "g.toml").ok());
  EXPECT_TRUE(ParseDaemonConfig("[[tenant]]\nname = \"équipe-α\"\n", "g.toml").ok());
}

}  // namespace
}  // namespace gmux::daemon
