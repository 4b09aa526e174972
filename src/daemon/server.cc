#include "daemon/server.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <kj/exception.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

namespace gmux::daemon {

namespace wire = proto::wire;

namespace {

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

}  // namespace

Result<std::unique_ptr<Server>> Server::Create(const DaemonOptions& options) {
  GMUX_RETURN_IF_ERROR(options.Validate());
  auto s = std::unique_ptr<Server>(new Server());
  s->options_ = options;
  s->socket_path_ = options.socket_path.empty() ? DefaultSocketPath() : options.socket_path;
  GMUX_ASSIGN_OR_RETURN(s->backend_, Backend::Open(options.backend));
  std::vector<core::DeviceInfo> devices;
  for (cl_device_id d : s->backend_->devices()) devices.push_back(DescribeDevice(*s->backend_, d));
  core::PolicySpec spec{options.policy, options.policy_params, {}};
  GMUX_ASSIGN_OR_RETURN(s->scheduler_,
                        Scheduler::Create(spec, devices, options.inflight_per_device,
                                          DevicePolicySpecs(options)));
  return s;
}

Server::~Server() { Stop(); }

Status Server::Start() {
  sockaddr_un addr{};
  if (socket_path_.size() >= sizeof(addr.sun_path)) {
    return InvalidArgument("socket path too long: " + socket_path_);
  }
  std::error_code ec;
  auto parent = std::filesystem::path(socket_path_).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Unavailable(std::string("socket: ") + std::strerror(errno));
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, socket_path_.c_str(), sizeof(addr.sun_path) - 1);
  // Replace a stale socket file, but never steal the socket of a daemon that is running.
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    ::close(fd);
    return FailedPrecondition("another gmuxd is serving " + socket_path_);
  }
  ::close(fd);
  fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ::unlink(socket_path_.c_str());
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    int e = errno;
    ::close(fd);
    return Unavailable("bind " + socket_path_ + ": " + std::strerror(e));
  }
  ::chmod(socket_path_.c_str(), options_.socket_mode);
  if (::listen(fd, 64) != 0) {
    int e = errno;
    ::close(fd);
    return Unavailable(std::string("listen: ") + std::strerror(e));
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
  if (::pipe2(wake_pipe_, O_CLOEXEC) != 0) return Unavailable("pipe failed");
  scheduler_->Start();
  accept_thread_ = std::thread([this] { AcceptLoop(); });
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
  if (accept_thread_.joinable()) {
    char c = 1;
    (void)!::write(wake_pipe_[1], &c, 1);
    accept_thread_.join();
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& c : conns_) ::shutdown(c->core->fd, SHUT_RDWR);
  }
  for (;;) {
    std::unique_ptr<Conn> c;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (conns_.empty()) break;
      c = std::move(conns_.front());
      conns_.pop_front();
    }
    if (c->thread.joinable()) c->thread.join();
  }
  if (scheduler_) scheduler_->Stop();
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
  size_t n = 0;
  for (const auto& c : conns_) n += c->finished ? 0 : 1;
  return n;
}

bool Server::WaitForNoSessions(std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(mu_);
  return sessions_cv_.wait_for(lock, timeout, [&] {
    for (const auto& c : conns_) {
      if (!c->finished) return false;
    }
    return true;
  });
}

void Server::ReapFinished() {
  std::list<std::unique_ptr<Conn>> done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = conns_.begin(); it != conns_.end();) {
      if ((*it)->finished) {
        done.push_back(std::move(*it));
        it = conns_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& c : done) c->thread.join();
}

void Server::AcceptLoop() {
  for (;;) {
    pollfd fds[3] = {{wake_pipe_[0], POLLIN, 0}, {listen_fd_, POLLIN, 0}, {tcp_fd_, POLLIN, 0}};
    int n = ::poll(fds, tcp_fd_ >= 0 ? 3 : 2, 1000);
    if (stopping_) return;
    ReapFinished();
    if (n <= 0) continue;
    for (int which = 1; which <= 2; ++which) {
      if ((fds[which].revents & POLLIN) != 0) Accept(fds[which].fd, /*tcp=*/which == 2);
    }
  }
}

void Server::Accept(int listen_fd, bool tcp) {
  int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
  if (fd < 0) return;
  if (tcp) {
    // Requests and replies are small frames that must leave at once.
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  }
  auto conn = std::make_unique<Conn>();
  conn->core = std::make_shared<SessionCore>();
  conn->core->fd = fd;
  conn->core->id = next_session_++;
  conn->core->limits = options_.frame;
  conn->core->tcp = tcp;
  Conn* raw = conn.get();
  {
    std::lock_guard<std::mutex> lock(mu_);
    conns_.push_back(std::move(conn));
  }
  raw->thread = std::thread([this, raw] { Serve(raw); });
}

Result<TenantId> Server::Handshake(SessionCore& core, bool tcp, std::string& error) {
  proto::FrameHeader header;
  auto msg = proto::ReadFrame(core.fd, proto::FrameKind::kRequest, core.limits, &header);
  if (!msg.ok()) {
    error = msg.status().message();
    return msg.status();
  }
  uint32_t version = 0;
  bool is_hello = false;
  std::string token;
  KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() {
    auto req = msg->root<wire::Request>();
    is_hello = req.isHello();
    if (is_hello) {
      version = req.getHello().getProtocolVersion();
      token = req.getHello().getToken();
    }
  })) {
    error = "malformed hello";
    return DataLoss(error);
  }
  if (!is_hello) {
    error = "the first request must be hello";
    return InvalidArgument(error);
  }
  if (version != proto::kProtocolVersion) {
    error = "client speaks protocol version " + std::to_string(version) + ", gmuxd speaks " +
            std::to_string(proto::kProtocolVersion);
    return FailedPrecondition(error);
  }
  Result<TenantConfig> tenant = PermissionDenied("no identity");
  if (tcp) {
    tenant = options_.TenantForToken(token);
  } else {
    ucred cred{};
    socklen_t len = sizeof(cred);
    if (::getsockopt(core.fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
      error = "cannot read peer credentials";
      return PermissionDenied(error);
    }
    tenant = options_.TenantForUid(cred.uid);
  }
  if (!tenant.ok()) {
    error = tenant.status().message();
    return tenant.status();
  }
  TenantId id;
  bool first = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    size_t active = 0;
    for (const auto& c : conns_) active += c->finished ? 0 : 1;
    if (active > options_.max_sessions) {
      error = "too many sessions";
      return ResourceExhausted(error);
    }
    auto it = tenants_.find(tenant->name);
    if (it == tenants_.end()) it = tenants_.emplace(tenant->name, static_cast<TenantId>(tenants_.size())).first;
    id = it->second;
    first = tenant_sessions_[id]++ == 0;
  }
  if (first) scheduler_->AddTenant(id, tenant->weight, tenant->name);
  core.tenant = id;
  core.tenant_name = tenant->name;
  return id;
}

void Server::Serve(Conn* conn) {
  SessionCore& core = *conn->core;
  std::string error;
  auto tenant = Handshake(core, core.tcp, error);
  capnp::MallocMessageBuilder b;
  auto rep = b.initRoot<wire::Reply>();
  rep.setSeq(1);
  if (!tenant.ok()) {
    rep.setStatus(CL_INVALID_OPERATION);
    rep.setMessage("gmuxd: " + error);
    core.Send(b);
  } else {
    rep.setStatus(CL_SUCCESS);
    auto h = rep.initHello();
    h.setProtocolVersion(proto::kProtocolVersion);
    h.setTenant(core.tenant_name);
    h.setSession(core.id);
    const auto& devs = backend_->devices();
    auto list = h.initDevices(static_cast<unsigned>(devs.size()));
    for (unsigned i = 0; i < devs.size(); ++i) {
      list[i].setIndex(i);
      list[i].setName(backend_->DeviceName(i));
      cl_device_type type = 0;
      backend_->cl().clGetDeviceInfo(devs[i], CL_DEVICE_TYPE, sizeof(type), &type, nullptr);
      list[i].setType(type);
    }
    core.Send(b);
    {
      Session session(conn->core, *backend_, *scheduler_, options_);
      session.Serve().IgnoreError();
      core.closed = true;
    }  // the session's tables, and so its backend objects, go here
    bool last = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      last = --tenant_sessions_[*tenant] == 0;
    }
    if (last) scheduler_->RemoveTenant(*tenant);
  }
  core.Close();
  {
    std::lock_guard<std::mutex> lock(mu_);
    conn->finished = true;
  }
  sessions_cv_.notify_all();
}

}  // namespace gmux::daemon
