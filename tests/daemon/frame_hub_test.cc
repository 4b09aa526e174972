// gmuxd's frame-rate controller (FrameHub, vGASA) against fake frame agents on the real socket:
// the handshake, SA's control from the first frame, the PI's decisions (Eq. 1), ESA's common rate
// from reported Present times, run-time policy and target changes, and hostile agents (malformed
// messages, time going backwards, floods of claimed frames, too many agents) ending only their
// own connection. Deterministic: the decisions depend on the reported times, not on the clock.
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "daemon/server.h"
#include "proto/frame.h"

namespace gmux::daemon {
namespace {

namespace wire = proto::wire;

int64_t Now() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int Dial(const std::string& path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::strncpy(a.sun_path, path.c_str(), sizeof(a.sun_path) - 1);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return -1;
  }
  timeval tv{10, 0};  // a broken daemon fails the test instead of hanging it
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return fd;
}

struct Decision {
  bool ok = false;
  int32_t status = 0;
  std::string message;
  uint64_t seq = 0;
  uint64_t sleep_ns = 0;
  bool controlled = false;
  double reference = 0;
};

class FakeAgent {
 public:
  FakeAgent(const std::string& socket, const std::string& renderer) {
    fd_ = Dial(socket);
    if (fd_ < 0) return;
    capnp::MallocMessageBuilder b;
    auto r = b.initRoot<wire::Request>();
    r.setSeq(1);
    auto h = r.initHello();
    h.setProtocolVersion(proto::kProtocolVersion);
    h.setFrameAgent(true);
    h.setProgram("fake");
    h.setRenderer(renderer);
    if (!proto::WriteFrame(fd_, proto::FrameKind::kRequest, b).ok()) return;
    auto m = proto::ReadFrame(fd_, proto::FrameKind::kReply);
    if (!m.ok()) return;
    auto rep = m->root<wire::Reply>();
    hello_status_ = rep.getStatus();
    hello_message_ = rep.getMessage();
    hello_ok_ = rep.getStatus() == 0 && rep.isHello();
  }
  ~FakeAgent() {
    if (fd_ >= 0) ::close(fd_);
  }
  bool hello_ok() const { return hello_ok_; }
  const std::string& hello_message() const { return hello_message_; }

  // Reports `frames` frames ending at `end_ns` with `present_ns` of Present time in total;
  // seq != 0 asks for the decision for a frame of `cpu_ns`.
  bool Report(uint64_t seq, uint32_t frames, int64_t end_ns, uint64_t present_ns,
              uint64_t cpu_ns = 0) {
    capnp::MallocMessageBuilder b;
    auto r = b.initRoot<wire::Request>();
    r.setSeq(seq);
    auto f = r.initFrame();
    f.setFrames(frames);
    f.setPresentEndNs(static_cast<uint64_t>(end_ns));
    f.setPresentNs(present_ns);
    f.setCpuNs(cpu_ns);
    return proto::WriteFrame(fd_, proto::FrameKind::kRequest, b).ok();
  }
  bool SendBytes(const std::string& bytes) {
    return ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL) ==
           static_cast<ssize_t>(bytes.size());
  }
  bool SendRaw(capnp::MallocMessageBuilder& b) {
    return proto::WriteFrame(fd_, proto::FrameKind::kRequest, b).ok();
  }
  // The next message from gmuxd.
  Decision Next() {
    Decision d;
    auto m = proto::ReadFrame(fd_, proto::FrameKind::kReply);
    if (!m.ok()) return d;
    auto rep = m->root<wire::Reply>();
    d.ok = true;
    d.status = rep.getStatus();
    d.message = rep.getMessage();
    d.seq = rep.getSeq();
    if (rep.isFrame()) {
      d.sleep_ns = rep.getFrame().getSleepNs();
      d.controlled = rep.getFrame().getControlled();
      d.reference = rep.getFrame().getReferenceFps();
    }
    return d;
  }
  // The reply to `seq`, skipping control messages (seq 0) on the way; they are kept.
  Decision ReplyTo(uint64_t seq) {
    for (int i = 0; i < 100; ++i) {
      Decision d = Next();
      if (!d.ok || d.seq == seq || d.status != 0) return d;
      last_control_ = d;
    }
    return {};
  }
  // Waits for a control message (seq 0) saying `controlled`.
  std::optional<Decision> AwaitControl(bool controlled) {
    if (last_control_ && last_control_->controlled == controlled) return last_control_;
    for (int i = 0; i < 100; ++i) {
      Decision d = Next();
      if (!d.ok) return std::nullopt;
      if (d.seq == 0 && d.status == 0) {
        last_control_ = d;
        if (d.controlled == controlled) return d;
      }
    }
    return std::nullopt;
  }
  // True when gmuxd closed the connection (after any error message).
  bool Closed(std::string* message) {
    for (int i = 0; i < 100; ++i) {
      auto m = proto::ReadFrame(fd_, proto::FrameKind::kReply);
      if (!m.ok()) return m.status().code() == StatusCode::kUnavailable ||
                          m.status().code() == StatusCode::kDataLoss;
      auto rep = m->root<wire::Reply>();
      if (rep.getStatus() != 0 && message != nullptr) *message = rep.getMessage();
    }
    return false;
  }

 private:
  int fd_ = -1;
  bool hello_ok_ = false;
  int32_t hello_status_ = 0;
  std::string hello_message_;
  std::optional<Decision> last_control_;
};

class FrameHubTest : public ::testing::Test {
 protected:
  void Start(const std::string& policy, double period_s = 0.2, uint32_t max_agents = 8,
             double fps_target = 0) {
    char tmpl[] = "/tmp/gmux-frames-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    DaemonOptions o;
    o.socket_path = dir_ + "/gmuxd.sock";
    o.spare_workers = 0;
    o.frames.policy = policy;
    o.frames.control_period_s = period_s;
    o.frames.max_agents = max_agents;
    o.frames.usage = "present";
    if (fps_target > 0) {
      TenantConfig t;
      t.name = "me";
      t.uids = {static_cast<uint32_t>(::getuid())};
      t.fps_target = fps_target;
      o.tenants.push_back(t);
    }
    auto s = Server::Create(o);
    if (!s.ok() && s.status().code() != StatusCode::kInvalidArgument) {
      GTEST_SKIP() << "no OpenCL backend: " << s.status().ToString();
    }
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    server_ = std::move(s).value();
    ASSERT_TRUE(server_->Start().ok());
  }
  void TearDown() override {
    if (server_) server_->Stop();
    std::error_code ec;
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
  }
  std::string socket() const { return dir_ + "/gmuxd.sock"; }

  // A control connection's FramesOp (or Stats when `action` is empty): the JSON answer.
  nlohmann::json Control(const std::string& action, const std::string& policy = "",
                         const std::string& tenant = "", double fps = 0) {
    int fd = Dial(socket());
    if (fd < 0) return {};
    capnp::MallocMessageBuilder hb;
    auto h = hb.initRoot<wire::Request>();
    h.setSeq(1);
    h.initHello().setProtocolVersion(proto::kProtocolVersion);
    h.getHello().setControl(true);
    proto::WriteFrame(fd, proto::FrameKind::kRequest, hb).IgnoreError();
    auto hr = proto::ReadFrame(fd, proto::FrameKind::kReply);
    capnp::MallocMessageBuilder b;
    auto r = b.initRoot<wire::Request>();
    r.setSeq(2);
    if (action.empty()) {
      r.setStats();
    } else {
      auto f = r.initFrames();
      f.setAction(action);
      f.setPolicy(policy);
      f.setTenant(tenant);
      f.setFps(fps);
    }
    proto::WriteFrame(fd, proto::FrameKind::kRequest, b).IgnoreError();
    auto m = proto::ReadFrame(fd, proto::FrameKind::kReply);
    ::close(fd);
    if (!hr.ok() || !m.ok()) return {};
    auto rep = m->root<wire::Reply>();
    std::string text = action.empty() ? rep.getStats().getFrames().cStr() : rep.getFrames().cStr();
    return nlohmann::json::parse(text, nullptr, false);
  }

  std::string dir_;
  std::unique_ptr<Server> server_;
};

TEST_F(FrameHubTest, SaControlsAnAgentFromItsFirstFrameWithEquationOne) {
  Start("sa");
  FakeAgent a(socket(), "FakeGPU 1");
  ASSERT_TRUE(a.hello_ok()) << a.hello_message();
  auto c = a.AwaitControl(true);
  ASSERT_TRUE(c.has_value());
  EXPECT_DOUBLE_EQ(c->reference, 30);  // the paper's criterion, the default
  // Frames of 5 ms CPU and 2 ms Present: Eq. (1) asks for 1/30 s - 7 ms of sleep, which the PI
  // adjusts by its disturbance estimate (zero before any controlled frame).
  int64_t t = Now() - 100'000'000;
  ASSERT_TRUE(a.Report(0, 1, t, 2'000'000));
  ASSERT_TRUE(a.Report(7, 0, 0, 0, 5'000'000));
  Decision d = a.ReplyTo(7);
  ASSERT_TRUE(d.ok);
  ASSERT_EQ(d.status, 0) << d.message;
  EXPECT_TRUE(d.controlled);
  EXPECT_NEAR(static_cast<double>(d.sleep_ns) * 1e-9, 1.0 / 30 - 0.007, 1e-3);
  // The frame ran long (disturbance): the next sleep is shorter.
  t += 45'000'000;
  ASSERT_TRUE(a.Report(8, 1, t, 2'000'000, 5'000'000));
  Decision d2 = a.ReplyTo(8);
  ASSERT_EQ(d2.status, 0) << d2.message;
  EXPECT_LT(d2.sleep_ns, d.sleep_ns);
  // gmux status shows it.
  auto st = Control("");
  ASSERT_TRUE(st.is_object()) << st;
  ASSERT_EQ(st["groups"].size(), 1u);
  EXPECT_EQ(st["groups"][0]["policy"], "sa");
  EXPECT_EQ(st["groups"][0]["agents"][0]["program"], "fake");
  EXPECT_EQ(st["groups"][0]["agents"][0]["frames"], 2);
  EXPECT_EQ(st["groups"][0]["agents"][0]["decisions"], 2);
}

TEST_F(FrameHubTest, TheTenantsFpsTargetIsItsReferenceAndCanBeChangedAtRunTime) {
  Start("sa", 0.2, 8, /*fps_target=*/60);
  FakeAgent a(socket(), "FakeGPU 1");
  ASSERT_TRUE(a.hello_ok()) << a.hello_message();
  auto c = a.AwaitControl(true);
  ASSERT_TRUE(c.has_value());
  EXPECT_DOUBLE_EQ(c->reference, 60);
  auto ans = Control("target", "", "me", 24);
  ASSERT_TRUE(ans.value("ok", false)) << ans;
  EXPECT_EQ(ans["agents"], 1);
  // Applied at the next period; decisions follow the new reference.
  for (int i = 0; i < 50; ++i) {
    auto st = Control("list");
    if (st["groups"][0]["agents"][0]["reference_fps"] == 24.0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(a.Report(3, 1, Now(), 1'000'000, 1'000'000));
  Decision d = a.ReplyTo(3);
  ASSERT_EQ(d.status, 0);
  EXPECT_NEAR(static_cast<double>(d.sleep_ns) * 1e-9, 1.0 / 24 - 0.002, 2e-3);
  EXPECT_NE(Control("target", "", "me", 5000).value("error", ""), "");
}

TEST_F(FrameHubTest, EsaGivesEveryAgentOneRateFromTheirPresentTimes) {
  Start("esa", 0.1);
  FakeAgent a(socket(), "FakeGPU 1"), b(socket(), "FakeGPU 1");
  ASSERT_TRUE(a.hello_ok() && b.hello_ok());
  // a: 10 ms of device time per frame, b: 15 ms. Algorithm 3: F = 1 / (0.010 + 0.015) = 40.
  // A frame each every 30 ms; each round asks both for a decision, which carries the reference.
  // A period that saw only one of them plans for that one alone, so the rounds go on until a
  // period saw both (at most a few periods of 0.1 s; the deadline is for a stalled machine).
  double ra = 0, rb = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  for (uint64_t seq = 2; std::chrono::steady_clock::now() < deadline; ++seq) {
    ASSERT_TRUE(a.Report(0, 1, Now(), 10'000'000));
    ASSERT_TRUE(b.Report(0, 1, Now(), 15'000'000));
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    ASSERT_TRUE(a.Report(seq, 0, 0, 0) && b.Report(seq, 0, 0, 0));
    const Decision da = a.ReplyTo(seq), db = b.ReplyTo(seq);
    ASSERT_TRUE(da.ok && db.ok && da.status == 0 && db.status == 0);
    ra = da.reference;
    rb = db.reference;
    if (std::abs(ra - 40) < 1e-6 && std::abs(rb - 40) < 1e-6) break;
  }
  EXPECT_NEAR(ra, 40, 1e-6);
  EXPECT_NEAR(rb, 40, 1e-6);
  EXPECT_TRUE(a.AwaitControl(true).has_value());
  EXPECT_TRUE(b.AwaitControl(true).has_value());
  // Switched to none at run time: both are told they are free.
  auto ans = Control("policy", "none");
  ASSERT_TRUE(ans.value("ok", false)) << ans;
  EXPECT_TRUE(a.AwaitControl(false).has_value());
  EXPECT_TRUE(b.AwaitControl(false).has_value());
  EXPECT_NE(Control("policy", "fifo").value("error", ""), "");
}

TEST_F(FrameHubTest, ABatchLongerThanAPeriodKeepsItsTimePerFrame) {
  Start("esa", 0.1);
  FakeAgent a(socket(), "FakeGPU 1");
  ASSERT_TRUE(a.hello_ok());
  // One report of 10 frames of 50 ms each (a program that ran uncontrolled for a while, its
  // unsent frames going with the next report): 0.5 s of Present time reaches a period of about
  // 0.1 s. k = 0.05 s per frame, so Algorithm 3's rate for the one agent is 1 / 0.05 = 20;
  // counting the frames over the period while the usage is clamped to 1 would give 100.
  ASSERT_TRUE(a.Report(0, 10, Now(), 500'000'000));
  auto c = a.AwaitControl(true);
  ASSERT_TRUE(c.has_value());
  EXPECT_NEAR(c->reference, 20, 1e-6);
}

TEST_F(FrameHubTest, HostileAgentsEndOnlyTheirOwnConnection) {
  Start("sa");
  FakeAgent good(socket(), "FakeGPU 1");
  ASSERT_TRUE(good.hello_ok());
  ASSERT_TRUE(good.AwaitControl(true).has_value());
  std::string why;
  {  // Present end times going backwards.
    FakeAgent a(socket(), "FakeGPU 1");
    ASSERT_TRUE(a.hello_ok());
    const int64_t t = Now();
    ASSERT_TRUE(a.Report(0, 1, t, 1000));
    ASSERT_TRUE(a.Report(0, 1, t - 1'000'000, 1000));
    EXPECT_TRUE(a.Closed(&why));
    EXPECT_NE(why.find("forward"), std::string::npos) << why;
  }
  {  // A time in the future.
    FakeAgent a(socket(), "FakeGPU 1");
    ASSERT_TRUE(a.hello_ok());
    ASSERT_TRUE(a.Report(0, 1, Now() + 60'000'000'000, 1000));
    EXPECT_TRUE(a.Closed(&why));
  }
  {  // A billion frames in a millisecond.
    FakeAgent a(socket(), "FakeGPU 1");
    ASSERT_TRUE(a.hello_ok());
    ASSERT_TRUE(a.Report(0, 1'000'000'000, Now(), 1000));
    EXPECT_TRUE(a.Closed(&why));
    EXPECT_NE(why.find("more frames"), std::string::npos) << why;
  }
  {  // Something other than a frame report.
    FakeAgent a(socket(), "FakeGPU 1");
    ASSERT_TRUE(a.hello_ok());
    capnp::MallocMessageBuilder b;
    b.initRoot<wire::Request>().setStats();
    ASSERT_TRUE(a.SendRaw(b));
    EXPECT_TRUE(a.Closed(&why));
    EXPECT_NE(why.find("only send frame reports"), std::string::npos) << why;
  }
  {  // Garbage instead of a frame header.
    FakeAgent a(socket(), "FakeGPU 1");
    ASSERT_TRUE(a.hello_ok());
    ASSERT_TRUE(a.SendBytes(std::string(64, 'x')));
    EXPECT_TRUE(a.Closed(&why));
    EXPECT_NE(why.find("malformed"), std::string::npos) << why;
  }
  {  // A frame larger than an agent's limit.
    FakeAgent a(socket(), "FakeGPU 1");
    ASSERT_TRUE(a.hello_ok());
    capnp::MallocMessageBuilder b;
    auto r = b.initRoot<wire::Request>();
    r.initHello().setProgram(std::string(100000, 'p'));
    // The send itself may fail: the hub refuses the frame on its header and closes the
    // connection, possibly before the rest of the 100 KB is written (EPIPE, a reset).
    (void)a.SendRaw(b);
    EXPECT_TRUE(a.Closed(&why));
  }
  // The well-behaved agent is still served.
  ASSERT_TRUE(good.Report(9, 1, Now(), 1'000'000, 1'000'000));
  Decision d = good.ReplyTo(9);
  ASSERT_TRUE(d.ok);
  EXPECT_EQ(d.status, 0);
  EXPECT_TRUE(d.controlled);
  auto st = Control("");
  EXPECT_GE(st.value("agents_dropped", 0), 6);
}

TEST_F(FrameHubTest, AgentsBeyondTheLimitAreToldWhy) {
  Start("sa", 0.2, /*max_agents=*/2);
  FakeAgent a(socket(), "FakeGPU"), b(socket(), "FakeGPU");
  ASSERT_TRUE(a.hello_ok() && b.hello_ok());
  FakeAgent c(socket(), "FakeGPU");
  EXPECT_FALSE(c.hello_ok());
  EXPECT_NE(c.hello_message().find("max_agents"), std::string::npos) << c.hello_message();
}

TEST_F(FrameHubTest, AgentsOfOtherRenderersHaveTheirOwnPolicy) {
  Start("sa");
  FakeAgent a(socket(), "GPU A"), b(socket(), "GPU B");
  ASSERT_TRUE(a.hello_ok() && b.hello_ok());
  ASSERT_TRUE(a.AwaitControl(true).has_value());
  ASSERT_TRUE(b.AwaitControl(true).has_value());
  // Only B's group goes uncontrolled.
  int fd = Dial(socket());
  ASSERT_GE(fd, 0);
  ::close(fd);
  auto ans = nlohmann::json::object();
  {
    int cfd = Dial(socket());
    capnp::MallocMessageBuilder hb;
    auto h = hb.initRoot<wire::Request>();
    h.setSeq(1);
    h.initHello().setProtocolVersion(proto::kProtocolVersion);
    h.getHello().setControl(true);
    proto::WriteFrame(cfd, proto::FrameKind::kRequest, hb).IgnoreError();
    ASSERT_TRUE(proto::ReadFrame(cfd, proto::FrameKind::kReply).ok());
    capnp::MallocMessageBuilder ob;
    auto r = ob.initRoot<wire::Request>();
    r.setSeq(2);
    auto f = r.initFrames();
    f.setAction("policy");
    f.setPolicy("none");
    f.setRenderer("GPU B");
    proto::WriteFrame(cfd, proto::FrameKind::kRequest, ob).IgnoreError();
    auto m = proto::ReadFrame(cfd, proto::FrameKind::kReply);
    ASSERT_TRUE(m.ok());
    ans = nlohmann::json::parse(std::string(m->root<wire::Reply>().getFrames().cStr()));
    ::close(cfd);
  }
  EXPECT_EQ(ans["groups_changed"], 1) << ans;
  EXPECT_TRUE(b.AwaitControl(false).has_value());
  ASSERT_TRUE(a.Report(4, 1, Now(), 1'000'000, 1'000'000));
  Decision d = a.ReplyTo(4);
  EXPECT_TRUE(d.controlled);
}

TEST_F(FrameHubTest, FsaLiftsTheAgentBelowItsTargetAndTakesFromTheFastOne) {
  Start("fsa", 0.3);
  FakeAgent slow(socket(), "FakeGPU"), fast(socket(), "FakeGPU");
  ASSERT_TRUE(slow.hello_ok() && fast.hello_ok());
  // Algorithm 2 starts without control. One period: `slow` shows a few frames of 40 ms of
  // device time (far below 30 FPS), `fast` hundreds of 1 ms frames (far above).
  int64_t t = Now() - 300'000'000;
  for (int i = 0; i < 150; ++i) {
    t += 1'000'000;
    ASSERT_TRUE(fast.Report(0, 1, t, 1'000'000));
    if (i % 50 == 0) {
      ASSERT_TRUE(slow.Report(0, 1, t, 40'000'000));
    }
  }
  auto s = slow.AwaitControl(true);
  auto f = fast.AwaitControl(true);
  ASSERT_TRUE(s.has_value() && f.has_value());
  // The one below is aimed just above the criterion, 30 * (1 + fsa_headroom 0.05).
  EXPECT_NEAR(s->reference, 31.5, 1e-9);
  // The donor gives device time but never goes below the criterion.
  EXPECT_GE(f->reference, 30);
  auto st = Control("list");
  EXPECT_EQ(st["groups"][0]["policy"], "fsa");
}

}  // namespace
}  // namespace gmux::daemon
