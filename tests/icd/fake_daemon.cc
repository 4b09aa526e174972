#include "icd/fake_daemon.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <kj/exception.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace gmux::testing {

namespace wire = proto::wire;

Status FakeDaemonOptions::Validate() const {
  for (const auto& d : devices) {
    if (d.name.empty()) return InvalidArgument("a fake device needs a name");
  }
  return Status::Ok();
}

wire::Reply::Builder Response::AddReply(uint64_t seq) {
  Item item;
  item.reply = std::make_unique<capnp::MallocMessageBuilder>();
  auto rep = item.reply->initRoot<wire::Reply>();
  rep.setSeq(seq);
  rep.setStatus(CL_SUCCESS);
  rep.setNone();
  items_.push_back(std::move(item));
  return rep;
}

void Response::AddRaw(std::vector<uint8_t> bytes) {
  Item item;
  item.raw = std::move(bytes);
  items_.push_back(std::move(item));
}

Response Response::WithStatus(uint64_t seq, cl_int status) {
  Response r;
  r.AddReply(seq).setStatus(status);
  return r;
}

Response Response::WithInfo(uint64_t seq, const std::vector<uint8_t>& bytes) {
  Response r;
  r.AddReply(seq).setInfo(kj::arrayPtr(bytes.data(), bytes.size()));
  return r;
}

Result<std::unique_ptr<FakeDaemon>> FakeDaemon::Start(FakeDaemonOptions options) {
  GMUX_RETURN_IF_ERROR(options.Validate());
  std::unique_ptr<FakeDaemon> d(new FakeDaemon());
  d->options_ = std::move(options);
  char tmpl[] = "/tmp/gmux-fake-daemon-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) return Unavailable("mkdtemp: " + std::string(strerror(errno)));
  d->dir_ = tmpl;
  d->socket_path_ = d->dir_ + "/gmuxd.sock";
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (d->socket_path_.size() >= sizeof(addr.sun_path)) {
    return InvalidArgument("socket path too long: " + d->socket_path_);
  }
  std::strncpy(addr.sun_path, d->socket_path_.c_str(), sizeof(addr.sun_path) - 1);
  d->listen_fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (d->listen_fd_ < 0) return Unavailable("socket: " + std::string(strerror(errno)));
  if (::bind(d->listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::listen(d->listen_fd_, 8) != 0) {
    return Unavailable("bind/listen " + d->socket_path_ + ": " + strerror(errno));
  }
  d->thread_ = std::thread([raw = d.get()] { raw->Serve(); });
  return d;
}

FakeDaemon::~FakeDaemon() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    // Wakes a ReadFrame blocked on the client; the serving thread closes the descriptor.
    if (conn_fd_ >= 0) ::shutdown(conn_fd_, SHUT_RDWR);
  }
  // Wakes accept() (Linux returns EINVAL from accept on a listening socket shut down).
  if (listen_fd_ >= 0) ::shutdown(listen_fd_, SHUT_RDWR);
  if (thread_.joinable()) thread_.join();
  if (listen_fd_ >= 0) ::close(listen_fd_);
  if (!socket_path_.empty()) ::unlink(socket_path_.c_str());
  if (!dir_.empty()) ::rmdir(dir_.c_str());
}

void FakeDaemon::SetHandler(Handler handler) {
  std::lock_guard<std::mutex> lock(handler_mu_);
  handler_ = std::move(handler);
}

std::vector<SeenRequest> FakeDaemon::Seen() const {
  std::lock_guard<std::mutex> lock(mu_);
  return seen_;
}

size_t FakeDaemon::Count(wire::Request::Which which) const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (const auto& s : seen_) n += s.which == which ? 1 : 0;
  return n;
}

size_t FakeDaemon::CountInfo(wire::ObjectKind kind, uint32_t param) const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (const auto& s : seen_) {
    n += s.which == wire::Request::GET_INFO && s.info_kind == kind && s.info_param == param;
  }
  return n;
}

void FakeDaemon::ClearSeen() {
  std::lock_guard<std::mutex> lock(mu_);
  seen_.clear();
}

int FakeDaemon::connections() const {
  std::lock_guard<std::mutex> lock(mu_);
  return connections_;
}

Response FakeDaemon::Default(wire::Request::Reader request) {
  const uint64_t seq = request.getSeq();
  if (seq == 0) return {};
  Response r;
  auto rep = r.AddReply(seq);
  switch (request.which()) {
    case wire::Request::GET_INFO: {
      auto gi = request.getGetInfo();
      if (gi.getKind() == wire::ObjectKind::PLATFORM && gi.getParam() == CL_PLATFORM_VERSION) {
        static constexpr char kVersion[] = "OpenCL 3.0 fake";
        rep.setInfo(kj::arrayPtr(reinterpret_cast<const kj::byte*>(kVersion), sizeof(kVersion)));
      } else {
        rep.setStatus(CL_INVALID_VALUE);
        rep.setMessage("the fake daemon has no value for this parameter");
      }
      break;
    }
    case wire::Request::CREATE_KERNEL: rep.initKernel().setNumArgs(0); break;
    default: break;
  }
  return r;
}

void FakeDaemon::Serve() {
  for (;;) {
    int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR) continue;
      return;  // shut down by the destructor
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) {
        ::close(fd);
        return;
      }
      conn_fd_ = fd;
      ++connections_;
    }
    ServeConnection(fd);
    {
      std::lock_guard<std::mutex> lock(mu_);
      conn_fd_ = -1;
    }
    ::close(fd);
  }
}

void FakeDaemon::ServeConnection(int fd) {
  for (;;) {
    int passed_fd = -1;
    auto msg = proto::ReadFrame(fd, proto::FrameKind::kRequest, {}, nullptr, &passed_fd);
    // The descriptor only needs to have arrived; the fake never reads shared memory.
    if (passed_fd >= 0) ::close(passed_fd);
    if (!msg.ok()) return;
    bool keep_serving = false;
    KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() {
      auto request = msg->root<wire::Request>();
      SeenRequest seen;
      seen.which = request.which();
      seen.seq = request.getSeq();
      seen.passed_fd = passed_fd >= 0;
      if (request.isGetInfo()) {
        seen.info_kind = request.getGetInfo().getKind();
        seen.info_param = request.getGetInfo().getParam();
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        seen_.push_back(seen);
      }
      keep_serving = Answer(fd, request);
    })) {
      return;  // a request the schema cannot read: gmuxd drops such a client too
    }
    if (!keep_serving) return;
  }
}

bool FakeDaemon::Answer(int fd, wire::Request::Reader request) {
  Response response;
  if (request.isHello()) {
    auto rep = response.AddReply(request.getSeq());
    auto h = rep.initHello();
    h.setProtocolVersion(proto::kProtocolVersion);
    h.setTenant(options_.tenant);
    h.setSession(1);
    h.setProfiledWaits(options_.profiled_waits);
    auto list = h.initDevices(static_cast<unsigned>(options_.devices.size()));
    for (unsigned i = 0; i < list.size(); ++i) {
      list[i].setIndex(i);
      list[i].setName(options_.devices[i].name);
      list[i].setType(options_.devices[i].type);
    }
  } else {
    std::lock_guard<std::mutex> lock(handler_mu_);
    response = handler_ ? handler_(request) : Default(request);
  }
  return Send(fd, response).ok() && !response.close_after_;
}

Status FakeDaemon::Send(int fd, Response& response) {
  for (auto& item : response.items_) {
    Status s = item.reply ? proto::WriteFrame(fd, proto::FrameKind::kReply, *item.reply)
                          : proto::WriteAll(fd, item.raw);
    GMUX_RETURN_IF_ERROR(s);
  }
  return Status::Ok();
}

}  // namespace gmux::testing
