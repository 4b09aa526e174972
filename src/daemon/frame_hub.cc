#include "daemon/frame_hub.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include <nlohmann/json.hpp>

#include <spdlog/spdlog.h>

#include "core/frame_controller.h"
#include "core/sla_policy.h"
#include "proto/frame.h"

namespace gmux::daemon {

namespace wire = proto::wire;

namespace {

// An agent's messages are a few dozen bytes.
constexpr uint32_t kAgentPayloadBytes = 4096;
// The most frames per second an agent may claim (a bound, not a goal).
constexpr double kMaxClaimedFps = 100000;
// Messages handled per agent per loop round, so one flooding agent cannot starve the others.
constexpr int kMessagesPerRound = 64;

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

proto::FrameLimits AgentLimits() {
  proto::FrameLimits l;
  l.max_payload_bytes = kAgentPayloadBytes;
  return l;
}

core::SlaPolicy MakeSla(const FramesOptions& o, const std::string& kind) {
  // Names and numbers were validated by FrameHub::Create and Op.
  auto sla = core::SlaPolicy::Create(o.Sla(core::ParseSlaKind(kind).value_or(core::SlaKind::kSa)));
  return std::move(sla).value();
}

double Finite(double x) { return std::isfinite(x) ? x : 0.0; }

// Program names, renderers, tenants and actions come from clients: text that is not UTF-8 is
// shown with replacement characters rather than failing the reply.
constexpr auto kReplaceBadUtf8 = nlohmann::json::error_handler_t::replace;

bool SoftwareRenderer(const std::string& r) {
  for (const char* s : {"llvmpipe", "softpipe", "swrast", "Software Rasterizer"}) {
    if (r.find(s) != std::string::npos) return true;
  }
  return false;
}

// utime + stime of `pid` from /proc (all its threads), in seconds; nullopt when unreadable.
std::optional<double> ProcessCpuSeconds(pid_t pid) {
  if (pid <= 0) return std::nullopt;
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", static_cast<int>(pid));
  FILE* f = std::fopen(path, "re");
  if (f == nullptr) return std::nullopt;
  char buf[1024];
  size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  const char* p = std::strrchr(buf, ')');  // the name may hold spaces and parentheses
  if (p == nullptr) return std::nullopt;
  unsigned long long utime = 0, stime = 0;
  // Fields after the name: state (3), ..., utime (14), stime (15).
  if (std::sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &utime,
                  &stime) != 2) {
    return std::nullopt;
  }
  const long tick = ::sysconf(_SC_CLK_TCK);
  return static_cast<double>(utime + stime) / static_cast<double>(tick > 0 ? tick : 100);
}

double Cpus() {
  unsigned n = std::thread::hardware_concurrency();
  return n > 0 ? static_cast<double>(n) : 1.0;
}

}  // namespace

struct FrameHub::Group {
  std::string renderer;
  std::string policy;
  std::optional<core::SlaPolicy> sla;
};

struct FrameHub::Agent {
  Agent(uint64_t id_, int fd_, AgentInfo info_, core::FrameController ctl_)
      : id(id_), fd(fd_), info(std::move(info_)), ctl(std::move(ctl_)) {}
  uint64_t id;
  int fd;
  AgentInfo info;
  core::FrameController ctl;
  Group* group = nullptr;
  bool dead = false;
  std::vector<uint8_t> buf;
  size_t need = proto::kHeaderBytes;
  bool have_header = false;
  bool told_controlled = false;
  bool cpu_usage = false;        // its usage is its process's CPU time (a software renderer)
  double proc_cpu_s = -1;        // its process's CPU time at the last period, read by gmuxd
  double claimed_present_s = 0;  // every Present and CPU second it reported
  double claimed_cpu_s = 0;
  core::SlaTenantState sla;
  int64_t since_ns = 0;
  int64_t last_end_ns = 0;       // the last Present end it reported (0: none yet)
  // This control period.
  std::chrono::steady_clock::time_point period_from;
  uint64_t p_frames = 0;
  double p_present_s = 0;
  double p_cpu_s = 0;
  double p_sleep_s = 0;
  // The last complete period.
  double fps = 0;
  double usage = 0;
  double sleep_ms = 0;     // mean sleep per frame
  double present_ms = 0;   // mean Present execution time per frame
  // Totals.
  uint64_t frames = 0;
  uint64_t decisions = 0;
  double command_fps = 0;
};

Result<std::unique_ptr<FrameHub>> FrameHub::Create(const FramesOptions& options,
                                                   uint32_t max_per_uid,
                                                   const std::vector<std::string>& tenants) {
  GMUX_RETURN_IF_ERROR(options.Controller().Validate());
  auto main_kind = core::ParseSlaKind(options.policy);
  if (!main_kind) {
    return InvalidArgument("[frames] policy: unknown policy '" + options.policy + "'");
  }
  GMUX_RETURN_IF_ERROR(options.Sla(*main_kind).Validate());
  for (const auto& [renderer, kind] : options.device_policies) {
    if (!core::ParseSlaKind(kind)) {
      return InvalidArgument("[[frames.device]] '" + renderer + "': unknown policy '" + kind + "'");
    }
  }
  if (!(options.control_period_s > 0)) {
    return InvalidArgument("[frames] control_period_s must be > 0");
  }
  auto hub = std::unique_ptr<FrameHub>(new FrameHub(options, max_per_uid));
  hub->known_tenants_.insert(tenants.begin(), tenants.end());
  return hub;
}

FrameHub::FrameHub(const FramesOptions& options, uint32_t max_per_uid)
    : options_(options), max_per_uid_(max_per_uid) {}

void FrameHub::Wake() {
  char c = 1;
  (void)!::write(wake_pipe_[1], &c, 1);
}

FrameHub::~FrameHub() { Stop(); }

Status FrameHub::Start() {
  if (::pipe2(wake_pipe_, O_CLOEXEC | O_NONBLOCK) != 0) {
    return Internal(std::string("pipe: ") + std::strerror(errno));
  }
  period_start_ = std::chrono::steady_clock::now();
  thread_ = std::thread([this] { Loop(); });
  return Status::Ok();
}

void FrameHub::Stop() {
  if (thread_.joinable()) {
    stopping_ = true;
    Wake();
    thread_.join();
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& a : agents_) {
    if (a->fd >= 0) ::close(a->fd);
    a->fd = -1;
  }
  agents_.clear();
  for (int& fd : wake_pipe_) {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
}

std::string FrameHub::PolicyFor(const std::string& renderer) const {
  for (const auto& [match, kind] : policy_overrides_) {
    if (match.empty() || renderer.find(match) != std::string::npos) return kind;
  }
  for (const auto& [match, kind] : options_.device_policies) {
    if (renderer.find(match) != std::string::npos) return kind;
  }
  return options_.policy;
}

FrameHub::Group& FrameHub::GroupFor(const std::string& renderer) {
  auto it = groups_.find(renderer);
  if (it != groups_.end()) return *it->second;
  auto g = std::make_unique<Group>();
  g->renderer = renderer;
  g->policy = PolicyFor(renderer);
  g->sla.emplace(MakeSla(options_, g->policy));
  return *groups_.emplace(renderer, std::move(g)).first->second;
}

double FrameHub::TargetOf(const Agent& a) const {
  auto it = target_overrides_.find(a.info.tenant_name);
  return it != target_overrides_.end() ? it->second : a.info.fps_target;
}

void FrameHub::SetTenantTargets(const std::map<std::string, double>& targets) {
  std::lock_guard<std::mutex> lock(mu_);
  known_tenants_.clear();
  for (const auto& [name, fps] : targets) known_tenants_.insert(name);
  for (auto& a : agents_) {
    auto it = targets.find(a->info.tenant_name);
    if (it != targets.end()) a->info.fps_target = it->second;
  }
  dirty_ = true;
  Wake();
}

Status FrameHub::CanAdopt(uid_t uid) const {
  std::lock_guard<std::mutex> lock(mu_);
  return CanAdoptLocked(uid);
}

Status FrameHub::CanAdoptLocked(uid_t uid) const {
  size_t live = 0, mine = 0;
  for (const auto& a : agents_) {
    if (a->dead) continue;
    ++live;
    mine += a->info.uid == uid ? 1 : 0;
  }
  if (live >= options_.max_agents) {
    return ResourceExhausted("too many frame agents ([frames] max_agents " +
                             std::to_string(options_.max_agents) + ")");
  }
  if (mine >= max_per_uid_) {
    return ResourceExhausted("too many frame agents for uid " + std::to_string(uid) +
                             " (max_connections_per_identity)");
  }
  return Status::Ok();
}

Status FrameHub::Adopt(int fd, const AgentInfo& info) {
  auto ctl = core::FrameController::Create(options_.Controller());
  if (!ctl.ok()) {
    ::close(fd);
    return ctl.status();
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (Status can = CanAdoptLocked(info.uid); !can.ok()) {
    ::close(fd);
    return can;
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  auto a = std::make_unique<Agent>(next_id_++, fd, info, std::move(ctl).value());
  a->group = &GroupFor(info.renderer);
  a->cpu_usage = options_.usage == "process_cpu" ||
                 (options_.usage == "auto" && SoftwareRenderer(info.renderer));
  a->since_ns = NowNs();
  a->period_from = std::chrono::steady_clock::now();
  // SA needs no measurement: the agent is under control from its first frame.
  if (a->group->policy == "sa") {
    core::SlaTenantState one;
    one.target_fps = TargetOf(*a);
    a->group->sla->Update(std::span<core::SlaTenantState>(&one, 1));
    a->sla.reference_fps = one.reference_fps;
    a->ctl.SetReference(one.reference_fps);
  }
  Agent& ref = *a;
  agents_.push_back(std::move(a));
  if (std::isfinite(ref.ctl.reference_fps())) Send(ref, 0, 0, true);
  spdlog::info("frame agent {}: tenant {}, pid {}, {} on '{}' ({})",
               static_cast<unsigned long long>(ref.id), info.tenant_name.c_str(),
               static_cast<int>(info.pid), info.program.c_str(), info.renderer.c_str(),
               ref.group->policy.c_str());
  Wake();
  return Status::Ok();
}

size_t FrameHub::AgentCount() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (const auto& a : agents_) n += a->dead ? 0 : 1;
  return n;
}

void FrameHub::Drop(Agent& a, const std::string& why) {
  if (a.dead) return;
  a.dead = true;
  if (!why.empty()) {
    capnp::MallocMessageBuilder b;
    auto rep = b.initRoot<wire::Reply>();
    rep.setSeq(0);
    rep.setStatus(-59);  // CL_INVALID_OPERATION
    rep.setMessage("gmuxd: " + why);
    auto bytes = proto::EncodeFrame(proto::FrameKind::kReply, b);
    if (bytes.ok()) (void)!::send(a.fd, bytes->data(), bytes->size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    ++dropped_;
    spdlog::warn("frame agent {} (tenant {}, pid {}) dropped: {}",
                 static_cast<unsigned long long>(a.id), a.info.tenant_name.c_str(),
                 static_cast<int>(a.info.pid), why.c_str());
  }
  ::close(a.fd);
  a.fd = -1;
}

bool FrameHub::Send(Agent& a, uint64_t seq, uint64_t sleep_ns, bool controlled) {
  capnp::MallocMessageBuilder b;
  auto rep = b.initRoot<wire::Reply>();
  rep.setSeq(seq);
  rep.setStatus(0);
  auto d = rep.initFrame();
  d.setSleepNs(sleep_ns);
  d.setControlled(controlled);
  d.setReferenceFps(controlled ? Finite(a.ctl.reference_fps()) : 0.0);
  d.setCommandFps(controlled ? Finite(a.command_fps) : 0.0);
  if (seq == 0) a.told_controlled = controlled;
  auto bytes = proto::EncodeFrame(proto::FrameKind::kReply, b);
  if (!bytes.ok()) return false;
  ssize_t n = ::send(a.fd, bytes->data(), bytes->size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  if (n != static_cast<ssize_t>(bytes->size())) {
    // Replies are tiny and the agent reads each one it asked for: a full socket means an agent
    // that does not read.
    Drop(a, n < 0 && errno != EAGAIN ? "" : "it does not read its replies");
    return false;
  }
  return true;
}

bool FrameHub::OnReadable(Agent& a) {
  for (int handled = 0; handled < kMessagesPerRound;) {
    const size_t at = a.buf.size();
    a.buf.resize(a.need);
    ssize_t n = ::recv(a.fd, a.buf.data() + at, a.need - at, 0);
    if (n <= 0) {
      a.buf.resize(at);
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) return true;
      Drop(a, "");  // gone
      return false;
    }
    a.buf.resize(at + static_cast<size_t>(n));
    if (a.buf.size() < a.need) continue;
    if (!a.have_header) {
      auto h = proto::DecodeHeader(a.buf, AgentLimits());
      if (!h.ok()) {
        Drop(a, "malformed frame agent message: " + h.status().message());
        return false;
      }
      if (h->kind != proto::FrameKind::kRequest) {
        Drop(a, "a frame agent sends requests only");
        return false;
      }
      a.have_header = true;
      a.need = proto::kHeaderBytes + h->payload_bytes;
      continue;
    }
    if (!OnMessage(a, a.buf)) return false;
    a.buf.clear();
    a.need = proto::kHeaderBytes;
    a.have_header = false;
    ++handled;
  }
  return true;
}

bool FrameHub::OnMessage(Agent& a, const std::vector<uint8_t>& frame) {
  const size_t payload = frame.size() - proto::kHeaderBytes;
  auto words = kj::heapArray<capnp::word>(payload / sizeof(capnp::word));
  std::memcpy(words.begin(), frame.data() + proto::kHeaderBytes, payload);
  auto msg = proto::DecodePayload(std::move(words), proto::FrameKind::kRequest, AgentLimits());
  if (!msg.ok()) {
    Drop(a, "malformed frame agent message: " + msg.status().message());
    return false;
  }
  uint64_t seq = 0, present_end = 0, present_ns = 0, cpu_ns = 0, proc_ns = 0;
  uint32_t frames = 0;
  bool is_frame = false;
  KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() {
    auto req = msg->root<wire::Request>();
    seq = req.getSeq();
    is_frame = req.isFrame();
    if (is_frame) {
      auto f = req.getFrame();
      frames = f.getFrames();
      present_end = f.getPresentEndNs();
      present_ns = f.getPresentNs();
      cpu_ns = f.getCpuNs();
      proc_ns = f.getProcessCpuNs();
    }
  })) {
    Drop(a, "malformed frame agent message");
    return false;
  }
  if (!is_frame) {
    Drop(a, "a frame agent may only send frame reports");
    return false;
  }
  const int64_t now = NowNs();
  // What an agent claims in total may not exceed what the daemon's clock allows since it came:
  // its Present time the time elapsed, its CPU time the elapsed time on every CPU (1 s slack).
  const double alive_s = static_cast<double>(now - a.since_ns) * 1e-9;
  a.claimed_present_s += static_cast<double>(present_ns) * 1e-9;
  a.claimed_cpu_s += static_cast<double>(proc_ns) * 1e-9;
  if ((frames == 0 && present_ns != 0) || a.claimed_present_s > alive_s + 1.0 ||
      a.claimed_cpu_s > (alive_s + 1.0) * Cpus()) {
    Drop(a, "frame report: more frames or Present time than the time elapsed allows");
    return false;
  }
  if (frames > 0) {
    const int64_t end = static_cast<int64_t>(std::min<uint64_t>(present_end, INT64_MAX));
    const int64_t from = a.last_end_ns > 0 ? a.last_end_ns : a.since_ns - 1'000'000'000;
    if (end <= 0 || end < a.last_end_ns || end > now + 1'000'000) {
      Drop(a, "frame report: Present end times must move forward and not be in the future");
      return false;
    }
    const double span_s = static_cast<double>(end - from) * 1e-9;
    if (static_cast<double>(frames) > 1 + span_s * kMaxClaimedFps ||
        static_cast<double>(present_ns) * 1e-9 > span_s + 1.0 ||
        static_cast<double>(proc_ns) * 1e-9 > (span_s + 1.0) * Cpus()) {
      Drop(a, "frame report: more frames or Present time than the time elapsed allows");
      return false;
    }
    a.ctl.Observe({TimePoint(Duration(end)), Duration(static_cast<int64_t>(present_ns / frames))});
    a.last_end_ns = end;
    a.p_frames += frames;
    a.frames += frames;
    a.p_present_s += static_cast<double>(present_ns) * 1e-9;
  }
  // Counted with or without frames (CPU spent before the first frame of a batch is still its).
  // Used only where the daemon cannot read the process's CPU time itself (see Tick).
  a.p_cpu_s += static_cast<double>(proc_ns) * 1e-9;
  if (seq == 0) return true;
  if (cpu_ns > 3600ull * 1'000'000'000) {
    Drop(a, "frame report: CPU time over an hour");
    return false;
  }
  uint64_t sleep_ns = 0;
  const bool controlled = std::isfinite(a.ctl.reference_fps());
  if (controlled) {
    core::FrameDecision d = a.ctl.Decide(Duration(static_cast<int64_t>(cpu_ns)));
    sleep_ns = static_cast<uint64_t>(std::max<int64_t>(0, d.sleep.count()));
    a.command_fps = d.command_fps;
    a.p_sleep_s += static_cast<double>(sleep_ns) * 1e-9;
    ++a.decisions;
  }
  return Send(a, seq, sleep_ns, controlled);
}

void FrameHub::Tick() {
  const auto now = std::chrono::steady_clock::now();
  std::map<Group*, std::vector<Agent*>> by_group;
  for (auto& a : agents_) {
    if (!a->dead) by_group[a->group].push_back(a.get());
  }
  for (auto& [g, members] : by_group) {
    // Agents with no frame this period (a paused program) keep their state: a program that
    // shows nothing neither needs nor gives device time.
    std::vector<core::SlaTenantState> states;
    std::vector<Agent*> active;
    for (Agent* a : members) {
      const double el = std::chrono::duration<double>(now - a->period_from).count();
      if (el < 1e-3) continue;
      a->fps = static_cast<double>(a->p_frames) / el;
      // A software renderer's usage is its process's CPU time, read here from the kernel (the
      // agent's connection's pid, from the kernel too), so an agent cannot claim another's.
      double cpu_s = a->p_cpu_s;
      if (a->cpu_usage) {
        if (auto now_cpu = ProcessCpuSeconds(a->info.pid)) {
          cpu_s = a->proc_cpu_s >= 0 ? std::max(0.0, *now_cpu - a->proc_cpu_s) : a->p_cpu_s;
          a->proc_cpu_s = *now_cpu;
        }
      }
      // Reports come in batches, so a period can receive more Present (or CPU) time than it
      // lasted: a batch reaching back before the period began, or a short period after a join
      // or a policy change. Both rates are then taken over the time the reports claim rather
      // than over the period, so k_i = g_i / f_i stays the time per frame (docs/policies.md,
      // "On the real runtime", item 13) instead of being cut by the clamp to 1.
      const double raw = a->cpu_usage ? cpu_s / (el * Cpus()) : a->p_present_s / el;
      if (raw > 1.0) a->fps /= raw;
      a->usage = std::min(1.0, raw);
      a->sleep_ms = a->p_frames > 0 ? 1e3 * a->p_sleep_s / static_cast<double>(a->p_frames) : 0;
      a->present_ms = a->p_frames > 0 ? 1e3 * a->p_present_s / static_cast<double>(a->p_frames) : 0;
      a->p_frames = 0;
      a->p_present_s = a->p_sleep_s = a->p_cpu_s = 0;
      a->period_from = now;
      if (a->fps <= 0 && g->policy != "sa" && g->policy != "none") continue;
      core::SlaTenantState s = a->sla;
      s.fps = a->fps;
      s.gpu_usage = a->usage;
      s.target_fps = TargetOf(*a);
      states.push_back(s);
      active.push_back(a);
    }
    g->sla->Update(states);
    for (size_t i = 0; i < active.size(); ++i) {
      Agent& a = *active[i];
      a.sla = states[i];
      a.ctl.SetReference(states[i].reference_fps);
      const bool controlled = std::isfinite(states[i].reference_fps);
      if (controlled != a.told_controlled) Send(a, 0, 0, controlled);
    }
  }
  period_start_ = now;
}

void FrameHub::Loop() {
  std::vector<pollfd> fds;
  std::vector<Agent*> polled;
  const auto period = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(options_.control_period_s));
  while (!stopping_) {
    fds.clear();
    polled.clear();
    fds.push_back({wake_pipe_[0], POLLIN, 0});
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& a : agents_) {
        if (a->dead) continue;
        fds.push_back({a->fd, POLLIN, 0});
        polled.push_back(a.get());
      }
    }
    const auto left = period_start_ + period - std::chrono::steady_clock::now();
    const int timeout_ms = static_cast<int>(std::clamp<int64_t>(
        std::chrono::duration_cast<std::chrono::milliseconds>(left).count() + 1, 0, 1000));
    ::poll(fds.data(), fds.size(), timeout_ms);
    if (stopping_) break;
    if ((fds[0].revents & POLLIN) != 0) {
      char buf[64];
      while (::read(wake_pipe_[0], buf, sizeof(buf)) > 0) {
      }
    }
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < polled.size(); ++i) {
      if ((fds[i + 1].revents & (POLLIN | POLLHUP | POLLERR)) == 0 || polled[i]->dead) continue;
      OnReadable(*polled[i]);
    }
    if (dirty_ || std::chrono::steady_clock::now() >= period_start_ + period) {
      dirty_ = false;
      Tick();
    }
    agents_.erase(std::remove_if(agents_.begin(), agents_.end(),
                                 [](const auto& a) { return a->dead; }),
                  agents_.end());
    for (auto it = groups_.begin(); it != groups_.end();) {
      bool used = std::any_of(agents_.begin(), agents_.end(),
                              [&](const auto& a) { return a->group == it->second.get(); });
      it = used ? std::next(it) : groups_.erase(it);
    }
  }
}

std::string FrameHub::StatusJson(std::optional<TenantId> tenant) const {
  std::lock_guard<std::mutex> lock(mu_);
  return StatusJsonLocked(tenant);
}

std::string FrameHub::StatusJsonLocked(std::optional<TenantId> tenant) const {
  nlohmann::json groups = nlohmann::json::array();
  for (const auto& [renderer, g] : groups_) {
    nlohmann::json agents = nlohmann::json::array();
    double total_usage = 0;
    for (const auto& a : agents_) {
      if (!a->dead && a->group == g.get()) total_usage += a->usage;
    }
    for (const auto& a : agents_) {
      if (a->dead || a->group != g.get()) continue;
      if (tenant && a->info.tenant != *tenant) continue;
      const double target = TargetOf(*a);
      agents.push_back({{"id", a->id},
                        {"tenant", a->info.tenant_name},
                        {"pid", a->info.pid},
                        {"program", a->info.program},
                        {"target_fps", target > 0 ? target : options_.criterion_fps},
                        {"controlled", std::isfinite(a->ctl.reference_fps())},
                        {"reference_fps", Finite(a->ctl.reference_fps())},
                        {"command_fps", Finite(a->command_fps)},
                        {"fps", a->fps},
                        {"sleep_ms_per_frame", a->sleep_ms},
                        {"present_ms_per_frame", a->present_ms},
                        {"usage", a->usage},
                        {"usage_from", a->cpu_usage ? "process_cpu" : "present"},
                        {"share", total_usage > 0 ? a->usage / total_usage : 0.0},
                        {"coef", a->sla.coef},
                        {"frames", a->frames},
                        {"decisions", a->decisions}});
    }
    if (tenant && agents.empty()) continue;
    groups.push_back({{"renderer", renderer}, {"policy", g->policy}, {"agents", agents}});
  }
  return nlohmann::json{{"policy", options_.policy},
                        {"criterion_fps", options_.criterion_fps},
                        {"control_period_s", options_.control_period_s},
                        {"kp", options_.kp},
                        {"ki", options_.ki},
                        {"pole", core::ClosedLoopPole(options_.kp, options_.ki)},
                        {"agents_dropped", dropped_},
                        {"groups", groups}}
      .dump(-1, ' ', false, kReplaceBadUtf8);
}

std::string FrameHub::Op(const std::string& action, const std::string& policy,
                         const std::string& renderer, const std::string& tenant, double fps,
                         bool admin, std::optional<TenantId> caller) {
  std::lock_guard<std::mutex> lock(mu_);
  if (action == "list") return StatusJsonLocked(admin ? std::nullopt : caller);
  if (action != "policy" && action != "target") {
    return nlohmann::json{{"error", "unknown frames action '" + action +
                                        "' (list, policy, target)"}}
        .dump(-1, ' ', false, kReplaceBadUtf8);
  }
  if (!admin) {
    return R"({"error":"only root and admin_uids may change frame-rate policies or targets"})";
  }
  if (action == "policy") {
    if (!core::ParseSlaKind(policy)) {
      return nlohmann::json{{"error", "unknown policy '" + policy + "' (none, sa, fsa, esa)"}}
          .dump(-1, ' ', false, kReplaceBadUtf8);
    }
    // One override per renderer text, newest first; a bounded list.
    std::erase_if(policy_overrides_, [&](const auto& o) { return o.first == renderer; });
    if (renderer.empty()) policy_overrides_.clear();  // "every renderer" supersedes the rest
    if (policy_overrides_.size() >= 256) policy_overrides_.pop_back();
    policy_overrides_.insert(policy_overrides_.begin(), {renderer, policy});
    int changed = 0;
    for (auto& [r, g] : groups_) {
      if (!renderer.empty() && r.find(renderer) == std::string::npos) continue;
      g->policy = policy;
      g->sla.emplace(MakeSla(options_, policy));
      ++changed;
    }
    // A fresh start for the agents of the groups changed: FSA begins uncontrolled (Algorithm 2).
    for (auto& a : agents_) {
      if (a->dead) continue;
      if (!renderer.empty() && a->group->renderer.find(renderer) == std::string::npos) continue;
      a->sla.reference_fps = core::kUncappedFps;
    }
    dirty_ = true;
    Wake();
    return nlohmann::json{{"ok", true}, {"policy", policy}, {"renderer", renderer},
                          {"groups_changed", changed}}.dump(-1, ' ', false, kReplaceBadUtf8);
  }
  if (tenant.empty()) return R"({"error":"frames target: name a tenant"})";
  if (!(fps == 0 || (fps >= options_.min_fps && fps <= options_.max_fps))) {
    return nlohmann::json{{"error", "frames target: FPS must be 0 (the criterion) or between "
                                        "min_fps and max_fps of [frames]"}}
        .dump(-1, ' ', false, kReplaceBadUtf8);
  }
  bool known = known_tenants_.count(tenant) != 0;
  for (const auto& a : agents_) known = known || (!a->dead && a->info.tenant_name == tenant);
  if (!known) {
    return nlohmann::json{{"error", "frames target: no tenant '" + tenant +
                                        "' in the config or with a frame agent now"}}
        .dump(-1, ' ', false, kReplaceBadUtf8);
  }
  target_overrides_[tenant] = fps;
  int agents = 0;
  for (auto& a : agents_) agents += !a->dead && a->info.tenant_name == tenant ? 1 : 0;
  dirty_ = true;
  Wake();
  return nlohmann::json{{"ok", true}, {"tenant", tenant}, {"fps_target", fps},
                        {"agents", agents}}.dump(-1, ' ', false, kReplaceBadUtf8);
}

}  // namespace gmux::daemon
