#include "daemon/server.h"

#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <grp.h>
#include <pwd.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include <kj/exception.h>

#include <algorithm>
#include <limits>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>

#include <nlohmann/json.hpp>

#include <spdlog/spdlog.h>

#include "daemon/control.h"
#include "daemon/server_pending.h"
#include "daemon/session.h"
#include "daemon/slurm.h"

namespace gmux::daemon {

namespace wire = proto::wire;

namespace {

constexpr uint64_t kLogNot = ~uint64_t{0};

// Lines a flood may write to the log: at most kLines per kWindowS; Take() says whether this one
// may go (kLogNot when not), and how many were held back since the last that went.
struct LogBudget {
  static constexpr int kLines = 20;
  static constexpr int kWindowS = 10;
  std::chrono::steady_clock::time_point window;
  int lines = 0;
  uint64_t dropped = 0;

  uint64_t Take() {
    const auto now = std::chrono::steady_clock::now();
    if (now - window >= std::chrono::seconds(kWindowS)) {
      window = now;
      lines = 0;
    }
    if (lines >= kLines) {
      ++dropped;
      return kLogNot;
    }
    ++lines;
    return std::exchange(dropped, 0);
  }
};

core::DeviceInfo DescribeDevice(const Backend& b, cl_device_id dev) {
  const cl_icd_dispatch& cl = b.cl();
  core::DeviceInfo info;
  cl_uint cu = 1;
  cl_ulong mem = 0;
  cl.clGetDeviceInfo(dev, CL_DEVICE_MAX_COMPUTE_UNITS, sizeof(cu), &cu, nullptr);
  cl.clGetDeviceInfo(dev, CL_DEVICE_GLOBAL_MEM_SIZE, sizeof(mem), &mem, nullptr);
  info.compute_units = cu;
  info.memory_bytes = mem;
  return info;
}

// The frame limit before a hello: a hello is a few hundred bytes.
constexpr uint32_t kPreHelloPayloadBytes = 64 * 1024;
// A worker's start-up (exec, opening the backend) must not take longer.
constexpr std::chrono::seconds kWorkerStartTimeout{60};
// A worker whose client left gets this long to exit by itself before it is killed.
constexpr std::chrono::seconds kWorkerExitGrace{2};
// Spare workers of a uid (other than the daemon's own) outlive its last session by this much,
// so a program run again at once finds one, and a uid that has gone costs nothing after it.
constexpr std::chrono::seconds kSpareLinger{3};

extern "C" char** environ;

// Whether a daemon answers on the Unix socket at `addr` (a stale file refuses the connect).
bool SocketAnswers(const sockaddr_un& addr) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  const bool live = ::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0;
  ::close(fd);
  return live;
}

}  // namespace


Result<std::unique_ptr<Server>> Server::Create(const DaemonOptions& options) {
  GMUX_RETURN_IF_ERROR(options.Validate());
  GMUX_RETURN_IF_ERROR(options.ValidateTls(/*complete=*/true));
  auto s = std::unique_ptr<Server>(new Server());
  s->options_ = options;
  s->socket_path_ = options.socket_path.empty() ? DefaultSocketPath() : options.socket_path;
  GMUX_ASSIGN_OR_RETURN(s->backend_, Backend::Open(options.backend));
  std::vector<std::string> tenant_names;
  for (const auto& t : options.tenants) tenant_names.push_back(t.name);
  GMUX_ASSIGN_OR_RETURN(s->frames_, FrameHub::Create(options.frames,
                                                     options.max_connections_per_identity,
                                                     tenant_names));
  std::vector<core::DeviceInfo> devices;
  for (cl_device_id d : s->backend_->devices()) devices.push_back(DescribeDevice(*s->backend_, d));
  core::PolicySpec spec{options.policy, options.policy_params, {}};
  GMUX_ASSIGN_OR_RETURN(s->scheduler_,
                        Scheduler::Create(spec, devices, options.inflight_per_device,
                                          DevicePolicySpecs(options), options.express_dispatch));
  // The device memory gmuxd manages: configured, or all the backend reports.
  // The pool (BioCloud): exclusive devices, all of one kind, lent whole.
  std::vector<std::string> names;
  for (uint32_t i = 0; i < devices.size(); ++i) names.push_back(s->backend_->DeviceName(i));
  if (!options.exclusive_devices.empty()) {
    std::vector<uint32_t> pool = options.exclusive_devices;
    std::sort(pool.begin(), pool.end());
    for (uint32_t d : pool) {
      if (d >= devices.size()) {
        return InvalidArgument("[[scheduler.device]] index " + std::to_string(d) +
                               " is exclusive, but the backend has " +
                               std::to_string(devices.size()) + " device(s)");
      }
      if (d >= 64) return InvalidArgument("pool devices must have indices below 64");
      if (names[d] != names[pool[0]]) {
        return InvalidArgument("the pool's devices must be of one kind: device " +
                               std::to_string(d) + " is '" + names[d] + "', device " +
                               std::to_string(pool[0]) + " is '" + names[pool[0]] + "'");
      }
      s->pool_mask_ |= uint64_t{1} << d;
    }
    GMUX_RETURN_IF_ERROR(s->scheduler_->EnablePool(pool, options.pool, names));
  }
  for (uint32_t i = 0; i < devices.size(); ++i) {
    const uint64_t capacity =
        options.memory_bytes != 0 ? options.memory_bytes : devices[i].memory_bytes;
    s->scheduler_->SetMemoryCapacity(i, capacity);
    if (options.memory_slots != "off" && (s->pool_mask_ >> i & 1) == 0) {
      // The capacity in slots (docs/policies.md, "Device memory"): oversubscribed tenants are
      // placed on these by core's SlotAllocator.
      core::SlotAllocatorOptions so;
      GMUX_ASSIGN_OR_RETURN(so.policy, core::ParseSlotPolicy(options.memory_slots));
      so.slots = static_cast<int32_t>(std::clamp<uint64_t>(capacity / options.slot_bytes, 1,
                                                           1u << 20));
      so.idle_threshold = FromSeconds(options.memory_idle_s);
      so.utilization_window = std::max(so.utilization_window, so.monitor_period);
      GMUX_RETURN_IF_ERROR(s->scheduler_->EnableSlots(i, so, options.slot_bytes, options.swap_batch));
    }
  }
  s->root_ = ::geteuid() == 0;
  s->tcp_uid_ = ::geteuid();
  s->tcp_gid_ = ::getegid();
  if (s->root_) {
    passwd* pw = ::getpwnam(options.worker_user.c_str());
    if (pw == nullptr) {
      return InvalidArgument("worker_user '" + options.worker_user + "' does not exist");
    }
    s->tcp_uid_ = pw->pw_uid;
    s->tcp_gid_ = pw->pw_gid;
  }
  s->worker_path_ = options.worker_path;
  if (s->worker_path_.empty()) {
    std::error_code ec;
    auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
    s->worker_path_ = (self.parent_path() / "gmux-worker").string();
    // An installed gmuxd (bin/) finds its worker in libexec/gmux/.
    const std::string installed =
        (self.parent_path() / GMUX_WORKER_FROM_BINDIR).lexically_normal().string();
    if (::access(s->worker_path_.c_str(), X_OK) != 0 && ::access(installed.c_str(), X_OK) == 0) {
      s->worker_path_ = installed;
    }
  }
  if (::access(s->worker_path_.c_str(), X_OK) != 0) {
    return FailedPrecondition("cannot run the worker program " + s->worker_path_ +
                              " (set [daemon] worker_path)");
  }
  s->state_dir_ = options.state_dir.empty()
                      ? (std::filesystem::path(s->socket_path_).parent_path() / "gmux-state")
                            .string()
                      : options.state_dir;
  return s;
}

Server::~Server() { Stop(); }

Status Server::Start() {
  // The metrics endpoint first: a port it cannot have fails the start before anything runs.
  // (Scrapes before the threads start see an idle daemon.)
  if (!options_.metrics_listen.empty() && !metrics_) {
    MetricsEndpoint::Sources src;
    src.scheduler = [this] { return scheduler_->Status(); };
    src.frames = [this] { return frames_->StatusJson(std::nullopt); };
    src.sessions = [this] { return static_cast<uint64_t>(SessionCount()); };
    GMUX_ASSIGN_OR_RETURN(metrics_, MetricsEndpoint::Start(options_.metrics_listen, std::move(src)));
  }
  // The ledger next: an unusable file fails the start with the reason.
  if (!options_.ledger.empty() && !ledger_) {
    std::vector<std::string> names;
    for (uint32_t i = 0; i < backend_->devices().size(); ++i) {
      names.push_back(backend_->DeviceName(i));
    }
    GMUX_ASSIGN_OR_RETURN(ledger_, Ledger::Open(options_.ledger, options_.ledger_interval_s,
                                                std::move(names)));
  }
  sockaddr_un addr{};
  if (socket_path_.size() >= sizeof(addr.sun_path)) {
    return InvalidArgument("socket path too long: " + socket_path_);
  }
  std::error_code ec;
  auto parent = std::filesystem::path(socket_path_).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, socket_path_.c_str(), sizeof(addr.sun_path) - 1);
  // Replace a stale socket file, but never steal the socket of a daemon that is running.
  if (SocketAnswers(addr)) return FailedPrecondition("another gmuxd is serving " + socket_path_);
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Unavailable(std::string("socket: ") + std::strerror(errno));
  // The socket appears at its path only once it listens: bind() creates the file, and a client
  // that saw it (a script or test waiting for the file, a burst of tenants started right after
  // gmuxd) and connected before listen() was refused, and found no devices. So it is bound and
  // listening under a name of its own first, then renamed into place (below: never over a
  // live daemon's socket). A path too long for the extra suffix is bound in place.
  const std::string staged = socket_path_ + ".new." + std::to_string(::getpid());
  const bool staging = staged.size() < sizeof(addr.sun_path);
  sockaddr_un bound = addr;
  if (staging) std::strncpy(bound.sun_path, staged.c_str(), sizeof(bound.sun_path) - 1);
  const std::string& bound_path = staging ? staged : socket_path_;
  ::unlink(bound_path.c_str());
  if (::bind(fd, reinterpret_cast<sockaddr*>(&bound), sizeof(bound)) != 0) {
    int e = errno;
    ::close(fd);
    return Unavailable("bind " + bound_path + ": " + std::strerror(e));
  }
  ::chmod(bound_path.c_str(), options_.socket_mode);
  // The kernel's maximum backlog: dozens of tenants starting at once must queue, not be refused.
  if (::listen(fd, SOMAXCONN) != 0) {
    int e = errno;
    ::close(fd);
    ::unlink(bound_path.c_str());
    return Unavailable(std::string("listen: ") + std::strerror(e));
  }
  if (staging) {
    // Never over another daemon's socket (two gmuxd started at once both passed the check
    // above): the file is replaced only while it is stale, and a live one ends this start.
    Status placed = Status::Ok();
    for (int attempt = 0;; ++attempt) {
      if (::renameat2(AT_FDCWD, staged.c_str(), AT_FDCWD, socket_path_.c_str(),
                      RENAME_NOREPLACE) == 0) {
        break;
      }
      int e = errno;
      if (e == EINVAL || e == ENOSYS) {
        // A file system without RENAME_NOREPLACE: the plain rename (the check above stands).
        if (::rename(staged.c_str(), socket_path_.c_str()) == 0) break;
        e = errno;
      } else if (e == EEXIST && attempt == 0) {
        if (SocketAnswers(addr)) {
          placed = FailedPrecondition("another gmuxd is serving " + socket_path_);
          break;
        }
        ::unlink(socket_path_.c_str());  // stale: a daemon that did not clean up
        continue;
      }
      placed = Unavailable("rename " + staged + " to " + socket_path_ + ": " + std::strerror(e));
      break;
    }
    if (!placed.ok()) {
      ::close(fd);
      ::unlink(staged.c_str());
      return placed;
    }
  }
  listen_fd_ = fd;
  if (!options_.listen.empty()) {
    Status tcp = StartTcp();
    if (!tcp.ok()) {
      ::close(listen_fd_);
      ::unlink(socket_path_.c_str());
      listen_fd_ = -1;
      return tcp;
    }
  }
  if (::pipe2(wake_pipe_, O_CLOEXEC | O_NONBLOCK) != 0) return Unavailable("pipe failed");
  if (tcp_fd_ >= 0 && !options_.tls_cert.empty()) {
    // TLS ends in the gateway's thread; the broker gets each connection as a socketpair.
    auto gateway = tls::Gateway::Start(
        tcp_fd_, TlsServerOptions(options_),
        [this](tls::Accepted a) {
          {
            std::lock_guard<std::mutex> lock(tasks_mu_);
            tasks_.push_back(
                [this, a = std::make_shared<tls::Accepted>(std::move(a))] { AdmitTls(*a); });
          }
          char c = 1;
          (void)!::write(wake_pipe_[1], &c, 1);
        },
        [this, budget = std::make_shared<LogBudget>()](tls::Gateway::Failure f) {
          // A rejected client certificate is a failed authentication (logged, counted against
          // the address like a wrong token); a plain client or one that distrusts this server
          // is a misconfiguration, and a scanner's probe is noise. A flood of either is logged
          // in part (LogBudget), and counted whole.
          if (const uint64_t dropped = budget->Take(); dropped != kLogNot) {
            if (dropped > 0) {
              spdlog::info("{} failed TLS handshakes were not logged (at most {} lines per {} s)",
                           dropped, LogBudget::kLines, LogBudget::kWindowS);
            }
            if (!f.credential_rejected) {
              spdlog::info("TLS handshake with {} failed: {}", f.origin, f.why);
            } else {
              spdlog::warn("refused {}: client certificate: {}", f.origin, f.why);
            }
          }
          if (!f.credential_rejected) return;
          std::lock_guard<std::mutex> lock(tasks_mu_);
          tasks_.push_back([this, origin = f.origin] { NoteAuthFailure(origin); });
        });
    tcp_fd_ = -1;  // the gateway's now
    if (!gateway.ok()) {
      ::close(listen_fd_);
      ::unlink(socket_path_.c_str());
      listen_fd_ = -1;
      return gateway.status();
    }
    tls_ = std::move(gateway).value();
  }
  scheduler_->Start([this](uint64_t session, pid_t pid, Scheduler::GoneReason why) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      gone_.emplace_back(session, pid, why);
    }
    char c = 1;
    (void)!::write(wake_pipe_[1], &c, 1);
  });
  GMUX_RETURN_IF_ERROR(frames_->Start());
  if (ledger_) {
    GMUX_RETURN_IF_ERROR(ledger_->Start([this] { return scheduler_->Usage(); }));
  }
  thread_ = std::thread([this] { Loop(); });
  return Status::Ok();
}

Status Server::StartTcp() {
  GMUX_ASSIGN_OR_RETURN(ListenAddress la, ParseListenAddress(options_.listen));
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  std::string port = std::to_string(la.port);
  int gai = ::getaddrinfo(la.host.empty() ? nullptr : la.host.c_str(), port.c_str(), &hints, &res);
  if (gai != 0) return InvalidArgument("listen " + options_.listen + ": " + ::gai_strerror(gai));
  std::string last_error = "no address";
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) continue;
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || ::listen(fd, 64) != 0) {
      last_error = std::strerror(errno);
      ::close(fd);
      continue;
    }
    sockaddr_storage bound{};
    socklen_t len = sizeof(bound);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
    tcp_port_ = ntohs(bound.ss_family == AF_INET6
                          ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                          : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
    tcp_fd_ = fd;
    break;
  }
  ::freeaddrinfo(res);
  if (tcp_fd_ < 0) return Unavailable("listen " + options_.listen + ": " + last_error);
  return Status::Ok();
}


void Server::Stop() {
  if (stopping_.exchange(true)) return;
  metrics_.reset();  // no scrape reads the scheduler while it stops
  tls_.reset();      // no TLS connection reaches the broker while it stops; relays end
  if (thread_.joinable()) {
    char c = 1;
    (void)!::write(wake_pipe_[1], &c, 1);
    thread_.join();
  }
  {
    // Jobs' comments being written use the ledger and the scheduler: they end first (scontrol
    // is bounded to 10 s).
    std::unique_lock<std::mutex> lock(slurm_comments_->mu);
    slurm_comments_->cv.wait_for(lock, std::chrono::seconds(15),
                                 [this] { return slurm_comments_->jobs.empty(); });
  }
  // The interval in progress is booked while the scheduler can still answer.
  if (ledger_) ledger_->Stop();
  if (scheduler_) scheduler_->Stop();
  if (frames_) frames_->Stop();
  if (listen_fd_ >= 0) {
    ::close(listen_fd_);
    ::unlink(socket_path_.c_str());
    listen_fd_ = -1;
  }
  if (tcp_fd_ >= 0) {
    ::close(tcp_fd_);
    tcp_fd_ = -1;
  }
  for (int& fd : wake_pipe_) {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
}

size_t Server::SessionCount() const {
  std::lock_guard<std::mutex> lock(mu_);
  return sessions_.size();
}

bool Server::WaitForNoSessions(std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(mu_);
  return sessions_cv_.wait_for(lock, timeout, [&] { return sessions_.empty(); });
}

void Server::ReleaseIdentity(const std::string& identity) {
  if (!identity.empty() && --identity_conns_[identity] <= 0) identity_conns_.erase(identity);
}

void Server::NoteAuthFailure(const std::string& origin) {
  if (options_.auth_failures == 0) return;
  const auto now = std::chrono::steady_clock::now();
  const auto window = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(options_.auth_block_s));
  // Bounded: origins whose failures are old and whose block is over are forgotten first.
  if (auth_failures_.size() >= 4096) {
    std::erase_if(auth_failures_, [&](const auto& e) {
      return e.second.blocked_until <= now &&
             (e.second.times.empty() || e.second.times.back() + window <= now);
    });
    if (auth_failures_.size() >= 4096) auth_failures_.erase(auth_failures_.begin());
  }
  AuthFailures& f = auth_failures_[origin];
  f.times.push_back(now);
  while (!f.times.empty() && f.times.front() + window <= now) f.times.pop_front();
  if (f.times.size() >= options_.auth_failures) {
    f.blocked_until = now + window;
    f.times.clear();
    spdlog::warn("{}: {} failed authentications within {} s; its connections are refused for "
                 "{} s", origin, options_.auth_failures, options_.auth_block_s,
                 options_.auth_block_s);
  }
}

double Server::AuthBlockedFor(const std::string& origin) const {
  auto it = auth_failures_.find(origin);
  if (it == auth_failures_.end()) return 0;
  return std::chrono::duration<double>(it->second.blocked_until -
                                       std::chrono::steady_clock::now()).count();
}

bool Server::IsAdminToken(const std::string& token) const {
  bool admin = false;  // every entry compared: the time taken says nothing of which matched
  for (const std::string& a : options_.admin_tokens) admin = TokenMatches(a, token) || admin;
  return admin;
}

bool Server::IsAdmin(const Pending& p) const {
  if (p.tcp) return p.identity.rfind("token:", 0) == 0 && IsAdminToken(p.identity.substr(6));
  return p.uid == 0 || p.uid == ::geteuid() ||
         std::find(options_.admin_uids.begin(), options_.admin_uids.end(), p.uid) !=
             options_.admin_uids.end();
}

void Server::Loop() {
  // Spare workers for the daemon's own user, so its first client connects fast.
  if (options_.spare_workers > 0) TopUpSpares({::geteuid(), ::getegid(), false});
  std::vector<pollfd> fds;
  while (!stopping_) {
    const auto now = std::chrono::steady_clock::now();
    int timeout_ms = 1000;
    for (const auto& p : pending_) {
      if (p->waiting) continue;
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(p->deadline - now).count();
      timeout_ms = static_cast<int>(std::clamp<int64_t>(left + 1, 0, timeout_ms));
    }
    if (!reaping_.empty()) timeout_ms = std::min(timeout_ms, 50);
    fds.clear();
    fds.push_back({wake_pipe_[0], POLLIN, 0});
    fds.push_back({listen_fd_, POLLIN, 0});
    fds.push_back({tcp_fd_, static_cast<short>(tcp_fd_ >= 0 ? POLLIN : 0), 0});
    for (const auto& p : pending_) {
      fds.push_back({p->fd, static_cast<short>(p->waiting ? 0 : POLLIN), 0});
    }
    for (const auto& w : spawning_) fds.push_back({w.ctl, POLLIN, 0});
    ::poll(fds.data(), fds.size(), timeout_ms);
    if (stopping_) break;
    if ((fds[0].revents & POLLIN) != 0) {  // a wake-up: gone workers, broker tasks
      char buf[256];
      while (::read(wake_pipe_[0], buf, sizeof(buf)) > 0) {
      }
    }
    // Workers the scheduler dropped.
    for (;;) {
      std::tuple<uint64_t, pid_t, Scheduler::GoneReason> g;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (gone_.empty()) break;
        g = gone_.front();
        gone_.pop_front();
      }
      OnWorkerGone(std::get<0>(g), std::get<1>(g), std::get<2>(g));
    }
    RunBrokerTasks();
    // Workers starting (their first message) and spares (a message or a close means it died).
    const size_t base = 3 + pending_.size();
    std::vector<size_t> dead;
    for (size_t i = 0; i < spawning_.size(); ++i) {
      if ((fds[base + i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
      Spawned& w = spawning_[i];
      auto m = ctl::Receive(w.ctl, /*dont_wait=*/true);
      if (m.ok() && m->fd >= 0) ::close(m->fd);
      if (m.ok() && m->type == ctl::Type::kWorkerUp && !w.up) {
        w.up = true;
        continue;
      }
      if (!m.ok() && m.status().code() == StatusCode::kResourceExhausted) continue;
      dead.push_back(i);
    }
    for (size_t i = 0; i < spawning_.size(); ++i) {
      if (!spawning_[i].up && now - spawning_[i].started > kWorkerStartTimeout) dead.push_back(i);
    }
    std::sort(dead.begin(), dead.end());
    dead.erase(std::unique(dead.begin(), dead.end()), dead.end());
    for (auto it = dead.rbegin(); it != dead.rend(); ++it) {
      Spawned w = spawning_[*it];
      spawning_.erase(spawning_.begin() + static_cast<ptrdiff_t>(*it));
      spdlog::warn("worker pid {} failed to start (see its messages above)",
                   static_cast<int>(w.pid));
      ::close(w.ctl);
      ::kill(w.pid, SIGKILL);
      reaping_.push_back({w.pid, 0, Scheduler::GoneReason::kClosed, now, true});
      if (!w.cache_dir.empty()) {
        std::error_code ec;
        std::filesystem::remove_all(w.cache_dir, ec);
      }
      // Connections waiting for this kind of worker get an answer rather than a hang.
      bool other = false;
      for (const auto& s : spawning_) other = other || s.key == w.key;
      if (!other) {
        for (auto& p : pending_) {
          if (p->waiting && p->key == w.key) {
            ReplyError(p->fd, 1, "gmuxd: cannot start a worker process for this session");
            p->deadline = now;  // dropped below
            p->waiting = false;
          }
        }
      }
    }
    // Hand ready workers to waiting connections, oldest first.
    for (size_t i = 0; i < spawning_.size();) {
      if (!spawning_[i].up) {
        ++i;
        continue;
      }
      auto it = std::find_if(pending_.begin(), pending_.end(), [&](const auto& p) {
        return p->waiting && p->key == spawning_[i].key;
      });
      if (it == pending_.end()) {
        ++i;
        continue;
      }
      std::unique_ptr<Pending> p = std::move(*it);
      pending_.erase(it);
      Spawned w = spawning_[i];
      spawning_.erase(spawning_.begin() + static_cast<ptrdiff_t>(i));
      WorkerKey key = w.key;
      Assign(std::move(p), std::move(w));
      TopUpSpares(key);
    }
    // Handshakes; and connections waiting for a worker whose client has gone (their worker
    // would only find the connection closed).
    for (size_t i = 0; i < pending_.size(); ++i) {
      if (3 + i >= fds.size() || fds[3 + i].fd != pending_[i]->fd) continue;
      const short ev = fds[3 + i].revents;
      if (pending_[i]->waiting) {
        if ((ev & (POLLHUP | POLLERR)) != 0) {
          pending_[i]->waiting = false;
          pending_[i]->deadline = now;  // dropped below
        }
      } else if ((ev & (POLLIN | POLLHUP | POLLERR)) != 0) {
        OnReadable(*pending_[i]);
      }
    }
    const auto later = std::chrono::steady_clock::now();
    for (auto it = pending_.begin(); it != pending_.end();) {
      Pending& p = **it;
      if (p.fd >= 0 && (p.waiting || later < p.deadline)) {
        ++it;
        continue;
      }
      if (p.fd >= 0) ::close(p.fd);
      ReleaseIdentity(p.identity);
      it = pending_.erase(it);
    }
    if ((fds[1].revents & POLLIN) != 0) Accept(listen_fd_, false);
    if (tcp_fd_ >= 0 && (fds[2].revents & POLLIN) != 0) Accept(tcp_fd_, true);
    RetireSpares();
    Reap();
  }
  // Stopping: every worker ends now, whatever it is doing.
  for (auto& p : pending_) ::close(p->fd);
  pending_.clear();
  std::vector<pid_t> all;
  for (auto& w : spawning_) {
    ::close(w.ctl);
    all.push_back(w.pid);
  }
  spawning_.clear();
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [id, s] : sessions_) all.push_back(s.pid);
    sessions_.clear();
  }
  sessions_cv_.notify_all();
  for (auto& r : reaping_) all.push_back(r.pid);
  for (pid_t pid : all) ::kill(pid, SIGKILL);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  for (pid_t pid : all) {
    while (::waitpid(pid, nullptr, WNOHANG) == 0 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
}

void Server::Accept(int listen_fd, bool tcp) {
  ::fcntl(listen_fd, F_SETFL, ::fcntl(listen_fd, F_GETFL) | O_NONBLOCK);
  for (int n = 0; n < 64; ++n) {
    sockaddr_storage peer{};
    socklen_t peer_len = sizeof(peer);
    int fd = ::accept4(listen_fd, reinterpret_cast<sockaddr*>(&peer), &peer_len,
                       SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) return;
    auto p = std::make_unique<Pending>();
    p->fd = fd;
    p->tcp = tcp;
    if (tcp) {
      char host[NI_MAXHOST] = "?";
      ::getnameinfo(reinterpret_cast<sockaddr*>(&peer), peer_len, host, sizeof(host), nullptr, 0,
                    NI_NUMERICHOST);
      p->origin = std::string("address ") + host;
      // Requests and replies are small frames that must leave at once.
      int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    } else {
      ucred cred{};
      socklen_t len = sizeof(cred);
      if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
        ::close(fd);
        continue;
      }
      p->uid = cred.uid;
      p->gid = cred.gid;
      p->pid = cred.pid;
      p->origin = "uid " + std::to_string(cred.uid);
      // A process of a Slurm job is that job's tenant (when one is registered), by the kernel's
      // view of the connecting pid (slurm.h: a pid reused by another user counts for nothing).
      if (auto step = SlurmStepOf(cred.pid, cred.uid)) p->slurm_job = step->job;
    }
    Admit(std::move(p));
  }
}

void Server::AdmitTls(tls::Accepted a) {
  if (stopping_) {
    ::close(a.fd);
    return;
  }
  ::fcntl(a.fd, F_SETFL, ::fcntl(a.fd, F_GETFL) | O_NONBLOCK);
  auto p = std::make_unique<Pending>();
  p->fd = a.fd;
  p->tcp = true;
  p->origin = std::move(a.origin);
  p->tls_subject = std::move(a.subject);
  Admit(std::move(p));
}

void Server::Admit(std::unique_ptr<Pending> p) {
  const int fd = p->fd;
  if (const double left = AuthBlockedFor(p->origin); left > 0) {
    // Too many failed authentications lately: refused before reading anything.
    char why[160];
    std::snprintf(why, sizeof(why),
                  "gmuxd: too many failed authentications from %s; try again in %.0f s",
                  p->origin.c_str(), std::ceil(left));
    ReplyError(fd, 0, why);
    ::close(fd);
    return;
  }
  // A uid at its connection cap is refused before it could displace anyone's connection.
  if (const auto held = identity_conns_.find("uid:" + std::to_string(p->uid));
      !p->tcp && held != identity_conns_.end() &&
      held->second >= static_cast<int>(options_.max_connections_per_identity)) {
    ReplyError(fd, 1, "gmuxd: too many connections for uid " + std::to_string(p->uid) +
                          " (max_connections_per_identity)");
    ::close(fd);
    return;
  }
  p->since = std::chrono::steady_clock::now();
  if (!MakeRoomForUnidentified(*p)) {
    ReplyError(fd, 0, "gmuxd: too many connections are waiting to say hello (max_unidentified); "
                      "try again");
    ::close(fd);
    return;
  }
  p->deadline = std::chrono::steady_clock::now() +
                std::chrono::milliseconds(static_cast<int64_t>(options_.handshake_timeout_s * 1e3));
  if (!p->tcp) {
    p->identity = "uid:" + std::to_string(p->uid);
    ++identity_conns_[p->identity];
  }
  pending_.push_back(std::move(p));
}

bool Server::MakeRoomForUnidentified(const Pending& newcomer) {
  // Unix-socket and TCP connections wait in rooms of their own: no number of remote addresses
  // can keep a local user out. Within each, room::WaitingRoom's rule.
  std::vector<room::Waiter> waiting;
  std::vector<Pending*> who;
  for (const auto& p : pending_) {
    if (p->waiting || p->fd < 0 || p->tcp != newcomer.tcp) continue;
    waiting.push_back({room::OriginGroup(p->origin), p->since});
    who.push_back(p.get());
  }
  room::WaitingRoom& r = newcomer.tcp ? tcp_room_ : local_room_;
  r.set_capacity(options_.max_unidentified);
  const size_t out = r.Admit(waiting, room::OriginGroup(newcomer.origin), newcomer.since);
  if (out == room::kRoom) return true;
  if (out == room::kRefuse) return false;
  Pending& p = *who[out];
  spdlog::debug("{}: closed a connection that had not said hello, to make room for {} "
                "(max_unidentified)", p.origin, newcomer.origin);
  ReplyError(p.fd, 0, "gmuxd: closed: too many connections are waiting to say hello "
                      "(max_unidentified) and this one said nothing");
  ::close(p.fd);
  p.fd = -1;  // dropped by the loop
  p.deadline = std::chrono::steady_clock::now();
  return true;
}

void Server::OnReadable(Pending& p) {
  while (p.buf.size() < p.need) {
    const size_t at = p.buf.size();
    p.buf.resize(p.need);
    ssize_t n = ::recv(p.fd, p.buf.data() + at, p.need - at, 0);
    if (n <= 0) {
      p.buf.resize(at);
      if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
        p.deadline = std::chrono::steady_clock::now();  // gone: dropped by the loop
      }
      return;
    }
    p.buf.resize(at + static_cast<size_t>(n));
    if (p.buf.size() < p.need) continue;
    if (!p.have_header) {
      proto::FrameLimits pre = options_.frame;
      pre.max_payload_bytes = std::min(pre.max_payload_bytes, kPreHelloPayloadBytes);
      auto h = proto::DecodeHeader(p.buf, pre);
      if (!h.ok()) {
        ReplyError(p.fd, 0, "gmuxd: " + h.status().message());
        p.deadline = std::chrono::steady_clock::now();
        return;
      }
      p.have_header = true;
      p.need = proto::kHeaderBytes + h->payload_bytes;
      continue;
    }
    if (!OnFrame(p)) {
      p.deadline = std::chrono::steady_clock::now();
      return;
    }
    p.buf.clear();
    p.need = proto::kHeaderBytes;
    p.have_header = false;
    if (p.waiting || p.fd < 0) return;
  }
}

bool Server::OnFrame(Pending& p) {
  auto words = kj::heapArray<capnp::word>((p.buf.size() - proto::kHeaderBytes) / sizeof(capnp::word));
  std::memcpy(words.begin(), p.buf.data() + proto::kHeaderBytes, p.buf.size() - proto::kHeaderBytes);
  proto::FrameLimits pre = options_.frame;
  pre.max_payload_bytes = std::min(pre.max_payload_bytes, kPreHelloPayloadBytes);
  auto msg = proto::DecodePayload(std::move(words), proto::FrameKind::kRequest, pre);
  if (!msg.ok()) {
    ReplyError(p.fd, 0, "gmuxd: malformed request: " + msg.status().message());
    return false;
  }
  bool is_hello = false, is_stats = false, control = false, is_lease = false;
  bool is_frames = false, agent = false;
  uint32_t version = 0;
  uint64_t seq = 0;
  std::string token, program, renderer;
  LeaseRequest lease;
  FramesRequest frames_op;
  bool is_admin_op = false;
  std::string admin_command, admin_args;
  KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() {
    auto req = msg->root<wire::Request>();
    seq = req.getSeq();
    is_hello = req.isHello();
    is_stats = req.isStats();
    is_lease = req.isLease();
    if (is_lease) {
      auto l = req.getLease();
      lease.action = l.getAction();
      lease.tenant = l.getTenant();
      lease.id = l.getLease();
      lease.for_s = l.getForSeconds();
      lease.device = l.getDevice();
    }
    is_admin_op = req.isAdmin();
    if (is_admin_op) {
      admin_command = req.getAdmin().getCommand();
      admin_args = req.getAdmin().getArgs();
    }
    is_frames = req.isFrames();
    if (is_frames) {
      auto f = req.getFrames();
      frames_op.action = f.getAction();
      frames_op.policy = f.getPolicy();
      frames_op.renderer = f.getRenderer();
      frames_op.tenant = f.getTenant();
      frames_op.fps = f.getFps();
    }
    if (is_hello) {
      version = req.getHello().getProtocolVersion();
      token = req.getHello().getToken();
      control = req.getHello().getControl();
      agent = req.getHello().getFrameAgent();
      program = req.getHello().getProgram();
      renderer = req.getHello().getRenderer();
      p.probe = req.getHello().getProbe();
      p.probe_cookie = req.getHello().getProbeCookie();
      p.data_frames = req.getHello().getDataFrames();
    }
  })) {
    ReplyError(p.fd, 0, "gmuxd: malformed hello");
    return false;
  }
  if (p.said_hello) {
    // A control connection's one request.
    if (is_lease) {
      ServeLease(p, seq, lease);
      return false;
    }
    if (is_frames) {
      ServeFrames(p, seq, frames_op);
      return false;
    }
    if (is_admin_op) {
      ServeAdmin(p, seq, admin_command, admin_args);
      return false;
    }
    if (!is_stats) {
      ReplyError(p.fd, seq,
                 "gmuxd: a control connection may only ask for Stats, a lease, frames, "
                 "usage or tenants");
      return false;
    }
    ServeControl(p, seq);
    return false;  // answered; closed
  }
  if (!is_hello) {
    ReplyError(p.fd, seq, "gmuxd: the first request must be hello");
    return false;
  }
  if (version != proto::kProtocolVersion) {
    ReplyError(p.fd, seq, "gmuxd: client speaks protocol version " + std::to_string(version) +
                              ", gmuxd speaks " + std::to_string(proto::kProtocolVersion));
    return false;
  }
  Result<TenantConfig> tenant = PermissionDenied("no identity");
  bool operator_only = false;
  if (p.tcp) {
    tenant = options_.TenantForToken(token);
    if (!tenant.ok() && control && !token.empty() && IsAdminToken(token)) {
      // An operator's token opens control connections (gmux status, tenant, usage) from
      // another host, whether or not a tenant holds it too.
      tenant = TenantConfig{};
      operator_only = true;
    }
    if (tenant.ok()) {
      p.identity = "token:" + token;
      if (identity_conns_[p.identity] >= static_cast<int>(options_.max_connections_per_identity)) {
        p.identity.clear();
        ReplyError(p.fd, seq, "gmuxd: too many connections for this token "
                              "(max_connections_per_identity)");
        return false;
      }
      ++identity_conns_[p.identity];
    }
  } else {
    tenant = options_.TenantForPeer(p.uid, p.slurm_job);
  }
  if (!tenant.ok()) {
    // An authentication failure: worth an operator's eye (a wrong token, an unknown uid).
    spdlog::warn("refused {}: {}", p.origin, tenant.status().message());
    // A wrong token is a guess; a missing one (a client not configured for TCP) or an unknown
    // uid (rejected by policy, not guessable) is not counted against the origin.
    if (p.tcp && !token.empty()) NoteAuthFailure(p.origin);
    ReplyError(p.fd, seq, "gmuxd: " + tenant.status().message());
    return false;
  }
  p.tenant = *tenant;
  if (!operator_only) {
    auto it = tenant_ids_.find(p.tenant.name);
    if (it == tenant_ids_.end()) {
      it = tenant_ids_.emplace(p.tenant.name, static_cast<TenantId>(tenant_ids_.size())).first;
    }
    p.tenant_id = it->second;
  } else {
    p.tenant_id = std::numeric_limits<TenantId>::max();  // no tenant's: matches none
  }
  p.admin = IsAdmin(p);
  if (control) {
    p.control = true;
    p.said_hello = true;
    if (!SendHelloReply(p.fd, p.tenant.name, 0).ok()) return false;
    return true;
  }
  if (agent) return AdoptFrameAgent(p, seq, program, renderer);
  size_t sessions = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    sessions = sessions_.size();
  }
  for (const auto& q : pending_) sessions += q->waiting ? 1 : 0;
  if (sessions >= options_.max_sessions) {
    ReplyError(p.fd, seq, "gmuxd: too many sessions (max_sessions " +
                              std::to_string(options_.max_sessions) + ")");
    return false;
  }
  p.key = p.tcp ? WorkerKey{tcp_uid_, tcp_gid_, true}
                : (root_ ? WorkerKey{p.uid, p.gid, false} : WorkerKey{::geteuid(), ::getegid(), false});
  p.waiting = true;
  TopUpSpares(p.key);
  char c = 1;  // the loop hands it a worker (perhaps one already up)
  (void)!::write(wake_pipe_[1], &c, 1);
  return true;
}

void Server::ServeControl(Pending& p, uint64_t seq) {
  capnp::MallocMessageBuilder b;
  auto rep = b.initRoot<wire::Reply>();
  rep.setSeq(seq);
  rep.setStatus(CL_SUCCESS);
  auto s = rep.initStats();
  {
    std::lock_guard<std::mutex> lock(mu_);
    uint32_t mine = 0;
    for (const auto& [id, sess] : sessions_) mine += sess.tenant == p.tenant_id ? 1 : 0;
    s.setSessions(p.admin ? static_cast<uint32_t>(sessions_.size()) : mine);
  }
  s.setPendingCommands(scheduler_->Outstanding());
  s.setScheduler(p.admin ? scheduler_->Status() : scheduler_->Status(p.tenant_id));
  s.setFrames(p.admin ? frames_->StatusJson(std::nullopt) : frames_->StatusJson(p.tenant_id));
  ReplyBlocking(p.fd, b).IgnoreError();
}

void Server::ServeLease(Pending& p, uint64_t seq, const LeaseRequest& op) {
  std::string answer;
  if (op.action == "list") {
    answer = p.admin ? scheduler_->LeaseList(std::nullopt) : scheduler_->LeaseList(p.tenant_id);
  } else if (op.action == "acquire") {
    TenantId tenant = p.tenant_id;
    std::string name = p.tenant.name;
    if (op.tenant.empty() && name.empty()) {
      // An operator's token that is no tenant's: it leases for a named tenant only.
      answer = R"j({"error":"this token is an operator's, not a tenant's: name the tenant (--tenant)"})j";
    } else if (!op.tenant.empty() && op.tenant != name) {
      // Reserving a device for another tenant (a batch system ahead of a job): operators only,
      // and only for a tenant the config names.
      const auto known = std::find_if(options_.tenants.begin(), options_.tenants.end(),
                                      [&](const TenantConfig& t) { return t.name == op.tenant; });
      if (!p.admin) {
        answer = R"({"error":"only root and admin_uids may lease for another tenant"})";
      } else if (known == options_.tenants.end() && op.tenant != options_.default_tenant) {
        answer = nlohmann::json{{"error", "no tenant '" + op.tenant + "' in the config"}}.dump(
            -1, ' ', false, nlohmann::json::error_handler_t::replace);
      } else {
        name = op.tenant;
        auto it = tenant_ids_.find(name);
        if (it == tenant_ids_.end()) {
          it = tenant_ids_.emplace(name, static_cast<TenantId>(tenant_ids_.size())).first;
        }
        tenant = it->second;
      }
    }
    if (answer.empty()) {
      if (!(op.for_s >= 0 && op.for_s <= 366.0 * 86400)) {
        answer = R"({"error":"--for must be between 0 and a year"})";
      } else {
        answer = scheduler_->LeaseAcquire(tenant, name, op.for_s, op.device);
      }
    }
  } else if (op.action == "release") {
    answer = scheduler_->LeaseRelease(p.tenant_id, p.admin, op.id);
  } else {
    answer = nlohmann::json{{"error", "unknown lease action '" + op.action +
                                          "' (acquire, release, list)"}}
                   .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
  capnp::MallocMessageBuilder b;
  auto rep = b.initRoot<wire::Reply>();
  rep.setSeq(seq);
  rep.setStatus(CL_SUCCESS);
  rep.setLease(answer);
  ReplyBlocking(p.fd, b).IgnoreError();
}

bool Server::AdoptFrameAgent(Pending& p, uint64_t seq, const std::string& program,
                             const std::string& renderer) {
  if (p.tcp) {
    ReplyError(p.fd, seq, "gmuxd: frame agents connect over the Unix socket only (their times "
                          "are this host's clock)");
    return false;
  }
  if (program.size() > 256 || renderer.size() > 256) {
    ReplyError(p.fd, seq, "gmuxd: frame agent hello: program and renderer names are limited to "
                          "256 bytes");
    return false;
  }
  if (Status can = frames_->CanAdopt(p.uid); !can.ok()) {
    ReplyError(p.fd, seq, "gmuxd: " + can.message());
    return false;
  }
  // Shown in logs and tables: control characters become '?'.
  auto printable = [](std::string t) {
    for (char& c : t) {
      if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
    }
    return t;
  };
  FrameHub::AgentInfo info;
  info.tenant = p.tenant_id;
  info.tenant_name = p.tenant.name;
  info.uid = p.uid;
  info.program = printable(program);
  info.renderer = printable(renderer);
  info.fps_target = p.tenant.fps_target;
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (::getsockopt(p.fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) info.pid = cred.pid;
  // The hello reply first (blocking, bounded), then the socket belongs to the hub.
  capnp::MallocMessageBuilder b;
  auto rep = b.initRoot<wire::Reply>();
  rep.setSeq(seq);
  rep.setStatus(CL_SUCCESS);
  auto h = rep.initHello();
  h.setProtocolVersion(proto::kProtocolVersion);
  h.setTenant(p.tenant.name);
  if (!ReplyBlocking(p.fd, b).ok()) return false;
  Status adopted = frames_->Adopt(p.fd, info);  // takes the descriptor, even on error
  if (!adopted.ok()) {
    spdlog::warn("frame agent of tenant {} refused: {}", p.tenant.name.c_str(),
                 adopted.message().c_str());
  }
  p.fd = -1;  // the hub's now (or closed)
  return true;
}

void Server::ServeFrames(Pending& p, uint64_t seq, const FramesRequest& op) {
  std::string answer = frames_->Op(op.action, op.policy, op.renderer, op.tenant, op.fps, p.admin,
                                   p.tenant_id);
  capnp::MallocMessageBuilder b;
  auto rep = b.initRoot<wire::Reply>();
  rep.setSeq(seq);
  rep.setStatus(CL_SUCCESS);
  rep.setFrames(answer);
  ReplyBlocking(p.fd, b).IgnoreError();
}

Status Server::ReplyBlocking(int fd, capnp::MessageBuilder& b) {
  GMUX_ASSIGN_OR_RETURN(std::vector<uint8_t> frame,
                        proto::EncodeFrame(proto::FrameKind::kReply, b, options_.frame));
  return SendBefore(fd, frame, std::chrono::steady_clock::now() + std::chrono::seconds(2));
}

Status SendBefore(int fd, std::span<const uint8_t> bytes,
                  std::chrono::steady_clock::time_point deadline) {
  // One deadline for the whole reply: a peer that reads slowly (a few bytes a second) cannot
  // hold the sender longer, however much it lets through at a time.
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::send(fd, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
      return Unavailable(std::string("send: ") + std::strerror(errno));
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - std::chrono::steady_clock::now()).count();
    if (left <= 0) return Unavailable("the peer did not read the reply in time");
    pollfd pfd{fd, POLLOUT, 0};
    ::poll(&pfd, 1, static_cast<int>(left));
  }
  return Status::Ok();
}

void Server::ReplyError(int fd, uint64_t seq, const std::string& message) {
  capnp::MallocMessageBuilder b;
  auto rep = b.initRoot<wire::Reply>();
  rep.setSeq(seq);
  rep.setStatus(CL_INVALID_OPERATION);
  rep.setMessage(message);
  proto::WriteFrame(fd, proto::FrameKind::kReply, b, options_.frame).IgnoreError();
}

Status Server::SendHelloReply(int fd, const std::string& tenant, uint64_t session) {
  capnp::MallocMessageBuilder b;
  BuildHelloReply(b, *backend_, tenant, session, pool_mask_);
  return proto::WriteFrame(fd, proto::FrameKind::kReply, b, options_.frame);
}

std::string Server::CacheDirFor(const WorkerKey& key, uint64_t serial) {
  if (!root_) return "";
  std::error_code ec;
  std::filesystem::path base = std::filesystem::path(state_dir_) / "pocl-cache";
  std::filesystem::create_directories(base, ec);
  ::chmod(state_dir_.c_str(), 0711);
  ::chmod(base.c_str(), 0711);
  // A local tenant's compiled kernels are kept for its next session, readable by its uid only;
  // TCP tenants share one uid, so each worker of theirs gets a private cache, removed after it.
  std::filesystem::path dir =
      base / (key.tcp ? "w" + std::to_string(serial) : "uid-" + std::to_string(key.uid));
  std::filesystem::create_directories(dir, ec);
  if (::chown(dir.c_str(), key.uid, key.gid) != 0 || ::chmod(dir.c_str(), 0700) != 0) return "";
  return dir.string();
}

Result<Server::Spawned> Server::Spawn(const WorkerKey& key) {
  int fds[2];
  GMUX_RETURN_IF_ERROR(ctl::Pair(fds));
  const uint64_t serial = next_spawn_++;
  Spawned w;
  w.key = key;
  w.cache_dir = CacheDirFor(key, serial);
  // Everything the child needs is built before fork(): after it, only system calls.
  std::vector<std::string> args = {worker_path_, "--control-fd", "3"};
  if (!options_.backend.library.empty()) {
    args.push_back("--backend-library");
    args.push_back(options_.backend.library);
  }
  if (!options_.backend.vendors_dir.empty()) {
    args.push_back("--vendors-dir");
    args.push_back(options_.backend.vendors_dir);
  }
  if (!options_.backend.platform.empty()) {
    args.push_back("--platform");
    args.push_back(options_.backend.platform);
  }
  if (!options_.backend.batch_threads) {
    args.push_back("--backend-threads");
    args.push_back("normal");
  }
  const bool switch_user = root_ && key.uid != 0;
  if (switch_user) {
    // The worker takes the tenant's uid itself, after it made itself non-dumpable: dropping it
    // here, before exec, left the new program dumpable (exec resets it) until its main() ran,
    // long enough for the tenant to attach to it.
    args.insert(args.end(), {"--uid", std::to_string(key.uid), "--gid", std::to_string(key.gid)});
  }
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string_view v(*e);
    if (!w.cache_dir.empty() && (v.starts_with("POCL_CACHE_DIR=") || v.starts_with("HOME="))) {
      continue;
    }
    env.emplace_back(v);
  }
  if (!w.cache_dir.empty()) {
    env.push_back("POCL_CACHE_DIR=" + w.cache_dir);
    env.push_back("HOME=" + w.cache_dir);
  }
  std::vector<char*> argv, envp;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    return Unavailable("fork failed");
  }
  if (pid == 0) {
    if (fds[1] == 3) {
      ::fcntl(3, F_SETFD, 0);
    } else if (::dup2(fds[1], 3) < 0) {
      ::_exit(126);
    }
    // Nothing else of the daemon's crosses into a tenant's process: not other tenants' sockets,
    // not descriptors that an embedding program opened without close-on-exec.
    ::close_range(4, ~0U, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    rlimit core{0, 0};
    ::setrlimit(RLIMIT_CORE, &core);
    ::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
    ::execve(argv[0], argv.data(), envp.data());
    ::_exit(127);
  }
  ::close(fds[1]);
  w.pid = pid;
  w.ctl = fds[0];
  w.started = std::chrono::steady_clock::now();
  w.wanted = w.started;
  if (!key.tcp) w.cache_dir.clear();  // kept for the uid's next sessions
  return w;
}

void Server::TopUpSpares(const WorkerKey& key) {
  // Spares for gmuxd's own user always; for another uid only once it has a session (a uid's
  // first connection starts just the worker it needs, so a burst of new uids starts no more
  // processes than it has connections).
  bool has_session = key == WorkerKey{::geteuid(), ::getegid(), false};
  if (!has_session) {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [id, s] : sessions_) has_session = has_session || s.key == key;
  }
  size_t have = 0, want = has_session ? options_.spare_workers : 0;
  for (const auto& w : spawning_) have += w.key == key ? 1 : 0;
  for (const auto& p : pending_) want += (p->waiting && p->key == key) ? 1 : 0;
  while (have < want) {
    auto w = Spawn(key);
    if (!w.ok()) {
      spdlog::warn("cannot start a worker: {}", w.status().message().c_str());
      return;
    }
    spawning_.push_back(std::move(*w));
    ++have;
  }
}

namespace {

// A session's share of its tenant's limits: each divided among the tenant's `sessions`, so that
// together they never hold more than the tenant may (docs/policies.md).
ctl::Limits ShareOf(const TenantLimits& l, size_t sessions, uint64_t memory_capacity) {
  const uint64_t n = std::max<size_t>(sessions, 1);
  auto part = [n](uint64_t v) { return v == 0 ? 0 : std::max<uint64_t>(1, v / n); };
  ctl::Limits s;
  s.max_queued_commands = part(l.max_queued_commands);
  s.max_events = part(l.max_events);
  s.max_objects = part(l.max_objects);
  s.max_bulk_bytes = part(l.max_bulk_bytes);
  // Shared through the broker's books, not divided.
  s.memory_quota = l.memory_quota;
  s.memory_capacity = memory_capacity;
  return s;
}

}  // namespace

void Server::ShareLimits(TenantId tenant, uint64_t except) {
  std::vector<std::pair<uint64_t, TenantLimits>> mine;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [id, s] : sessions_) {
      if (s.tenant == tenant) mine.emplace_back(id, s.limits);
    }
  }
  for (const auto& [id, l] : mine) {
    if (id != except) scheduler_->SetLimits(id, ShareOf(l, mine.size(), options_.memory_bytes));
  }
}

void Server::RetireSpares() {
  const auto now = std::chrono::steady_clock::now();
  const WorkerKey own{::geteuid(), ::getegid(), false};
  std::set<WorkerKey> wanted;
  for (const auto& p : pending_) {
    if (p->waiting) wanted.insert(p->key);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [id, s] : sessions_) wanted.insert(s.key);
  }
  for (size_t i = 0; i < spawning_.size();) {
    Spawned& w = spawning_[i];
    if (w.key == own || wanted.count(w.key) != 0) {
      w.wanted = now;
      ++i;
      continue;
    }
    if (now - w.wanted < kSpareLinger) {
      ++i;
      continue;
    }
    // Its channel closes: a spare waiting for a session exits by itself; one still starting
    // (slow on a loaded host) is killed rather than waited for.
    ::close(w.ctl);
    if (!w.up) ::kill(w.pid, SIGKILL);
    reaping_.push_back({w.pid, 0, Scheduler::GoneReason::kClosed, now, !w.up});
    if (!w.cache_dir.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(w.cache_dir, ec);
    }
    spawning_.erase(spawning_.begin() + static_cast<ptrdiff_t>(i));
  }
}

void Server::Assign(std::unique_ptr<Pending> p, Spawned w) {
  const uint64_t id = next_session_++;
  ctl::Assign a;
  a.session = id;
  a.tenant = p->tenant_id;
  a.tcp = p->tcp ? 1 : 0;
  a.max_payload_bytes = options_.frame.max_payload_bytes;
  a.limits = ShareOf(p->tenant.limits, static_cast<size_t>(tenant_sessions_[p->tenant_id]) + 1,
                     options_.memory_bytes);
  a.rlimit_data = p->tenant.limits.worker_memory_bytes;
  a.rlimit_nofile = p->tenant.limits.worker_open_files;
  std::strncpy(a.tenant_name, p->tenant.name.c_str(), sizeof(a.tenant_name) - 1);
  a.pool_mask = pool_mask_;
  a.data_frames = p->data_frames ? 1 : 0;
  a.spin_us = options_.worker_spin_us;
  if (!p->tcp) {
    a.peer_pid = static_cast<uint32_t>(p->pid);
    a.probe = p->probe;
    a.probe_cookie = p->probe_cookie;
  }
  // The client's socket goes to the worker (blocking, as the worker reads it); the broker keeps
  // no copy.
  ::fcntl(p->fd, F_SETFL, ::fcntl(p->fd, F_GETFL) & ~O_NONBLOCK);
  // Counted before the worker can answer the client's hello, so that a client that has its
  // reply is always among the sessions.
  {
    std::lock_guard<std::mutex> lock(mu_);
    sessions_[id] =
        Served{id, p->tenant_id, p->tenant.name, w.pid, p->identity, w.cache_dir, w.key,
               p->tenant.limits};
  }
  Status sent = ctl::Send(w.ctl, ctl::Type::kAssign, &a, sizeof(a), 1, p->fd);
  ::close(p->fd);
  p->fd = -1;
  if (!sent.ok()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      sessions_.erase(id);
    }
    sessions_cv_.notify_all();
    ::close(w.ctl);
    ::kill(w.pid, SIGKILL);
    reaping_.push_back({w.pid, 0, Scheduler::GoneReason::kClosed, std::chrono::steady_clock::now(), true});
    ReleaseIdentity(p->identity);
    return;
  }
  if (tenant_sessions_[p->tenant_id]++ == 0) {
    scheduler_->AddTenant(p->tenant_id, p->tenant.weight, p->tenant.name,
                          std::chrono::duration_cast<Duration>(std::chrono::duration<double>(
                              p->tenant.limits.command_time_limit_s)));
    scheduler_->SetMemoryQuota(p->tenant_id, p->tenant.limits.memory_quota);
  }
  scheduler_->AddWorker(id, p->tenant_id, w.ctl, w.pid);
  // The origin, never the identity: a TCP identity is the tenant's token.
  spdlog::info("session {} of tenant '{}' started ({}{}{}{}, worker pid {})", id,
               p->tenant.name, p->origin, p->tls_subject.empty() ? "" : ", certificate ",
               p->tls_subject,
               p->slurm_job == 0 ? std::string() : ", Slurm job " + std::to_string(p->slurm_job),
               static_cast<int>(w.pid));
  ShareLimits(p->tenant_id, id);
}

void Server::OnWorkerGone(uint64_t session, pid_t pid, Scheduler::GoneReason why) {
  Served s;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sessions_.find(session);
    if (it == sessions_.end()) return;
    s = it->second;
    sessions_.erase(it);
  }
  sessions_cv_.notify_all();
  // kClosed: the worker closed its control channel, when its client left or when the client
  // broke the protocol (a malformed frame, a broken ring): the worker's own warning says which.
  static constexpr const char* kWhy[] = {("its worker ended it (the client left, or the worker's "
                                          "warning above says why)"),
                                         "a protocol violation",
                                         "the watchdog", "gmuxd stopping"};
  spdlog::info("session {} of tenant '{}' ended: {}", session, s.tenant_name,
               kWhy[std::min<size_t>(static_cast<size_t>(why), 3)]);
  ReleaseIdentity(s.identity);
  if (--tenant_sessions_[s.tenant] <= 0) {
    tenant_sessions_.erase(s.tenant);
    scheduler_->RemoveTenant(s.tenant);
  } else {
    ShareLimits(s.tenant, 0);
  }
  const bool kill_now = why != Scheduler::GoneReason::kClosed;
  if (kill_now) ::kill(pid, SIGKILL);
  reaping_.push_back({pid, session, why, std::chrono::steady_clock::now(), kill_now});
  std::lock_guard<std::mutex> lock(mu_);
  reaped_info_[pid] = s;
}

void Server::Reap() {
  const auto now = std::chrono::steady_clock::now();
  for (auto it = reaping_.begin(); it != reaping_.end();) {
    int st = 0;
    pid_t r = ::waitpid(it->pid, &st, WNOHANG);
    if (r == 0) {
      if (!it->killed && now - it->since > kWorkerExitGrace) {
        ::kill(it->pid, SIGKILL);
        it->killed = true;
      }
      ++it;
      continue;
    }
    Served s;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto info = reaped_info_.find(it->pid);
      if (info != reaped_info_.end()) {
        s = info->second;
        reaped_info_.erase(info);
      }
    }
    if (it->session != 0 && r > 0) {
      const bool watchdog = it->why == Scheduler::GoneReason::kWatchdog;
      const bool malformed = it->why == Scheduler::GoneReason::kMalformed;
      const bool signaled = WIFSIGNALED(st) && !(it->killed && WTERMSIG(st) == SIGKILL);
      const bool failed = WIFEXITED(st) && WEXITSTATUS(st) != 0;
      if (watchdog || malformed || signaled || failed) {
        std::string how = watchdog    ? "ended by the watchdog"
                          : malformed ? "ended: it broke the control protocol"
                          : signaled  ? "died of signal " + std::to_string(WTERMSIG(st)) + " (" +
                                           strsignal(WTERMSIG(st)) + ")"
                                      : "exited with status " + std::to_string(WEXITSTATUS(st));
        spdlog::info("worker pid {} of tenant '{}' (session {}) {}",
                     static_cast<int>(it->pid), s.tenant_name.c_str(),
                     static_cast<unsigned long long>(it->session), how.c_str());
        scheduler_->CountWorkerDeath(s.tenant, watchdog);
      }
      if (!s.cache_dir.empty()) {
        std::error_code ec;
        std::filesystem::remove_all(s.cache_dir, ec);
      }
    }
    it = reaping_.erase(it);
  }
}

}  // namespace gmux::daemon
