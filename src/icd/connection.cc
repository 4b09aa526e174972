#include "icd/connection.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <kj/exception.h>

#include "common/bulk_copy.h"
#include "common/stage_trace.h"
#include "tls/tls.h"

#include <algorithm>
#include <atomic>
#include <chrono>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace gmux::icd {

namespace wire = proto::wire;

namespace {

// Set in the child of a fork(): the connection (its socket, its request numbers, its pooled
// shared memory, the worker's idea of whose memory it copies) is the parent's, so the child's
// calls fail instead of sending on the parent's socket, taking its replies or writing into
// shared buffers the parent still uses. Checked before the connection's own locks are taken
// (a parent's thread may have held one at the fork).
std::atomic<bool> g_forked{false};

constexpr int kConnectTimeoutMs = 2000;
// The hello is answered by the session's worker, which gmuxd may have to start first: under a
// burst of new clients on a loaded host that takes seconds. GMUX_CONNECT_TIMEOUT_S overrides.
constexpr int kHandshakeTimeoutS = 60;

int HandshakeTimeoutS() {
  if (const char* s = std::getenv("GMUX_CONNECT_TIMEOUT_S"); s != nullptr && *s != '\0') {
    char* end = nullptr;
    long v = std::strtol(s, &end, 10);
    if (end != s && *end == '\0' && v > 0 && v <= 3600) return static_cast<int>(v);
  }
  return kHandshakeTimeoutS;
}
constexpr const char* kDefaultSocket = "/run/gmux/gmuxd.sock";

// A blocking connect bounded by kConnectTimeoutMs: a Unix socket's connect never stays in
// progress, it waits (up to SO_SNDTIMEO) while the daemon's backlog is full, as under a burst of
// new clients; a non-blocking one would fail at once with EAGAIN and the application would see
// no devices.
int ConnectUnix(const std::string& path) {
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) return -1;
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  // A signal interrupts the wait (EINTR, even with SA_RESTART): tried again for what is left of
  // the timeout, so an application with a periodic timer still gives up after 2 s.
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(kConnectTimeoutMs);
  int r = -1;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::microseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    timeval tv{static_cast<time_t>(left.count() / 1000000),
               static_cast<suseconds_t>(left.count() % 1000000)};
    ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    r = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    if (r == 0 || errno != EINTR) break;
  }
  if (r != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Says on stderr, once per process, why the gmux platform has no devices although gmuxd was
// reached (an application sees only an empty platform).
void SayOnce(const std::string& why) {
  static std::atomic<bool> said{false};
  if (said.exchange(true)) return;
  // The daemon's words, possibly a remote one's: one printable line of bounded length.
  std::string line = why.substr(0, 400);
  for (char& c : line) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
  }
  std::fprintf(stderr, "gmux: %s\n", line.c_str());
}

// A failed handshake other than a timeout (an untrusted certificate, a missing client
// certificate, a plain server) fails the same way every time: not tried again by this process.
std::atomic<bool> tls_refused{false};
// Why gmuxd ended a TLS connection, as its alert said: with TLS 1.3 a client certificate gmuxd
// does not accept is refused after the client's handshake is done, so the hello finds it.
std::mutex tls_error_mu;
std::string tls_error;

// The hello failed: if TLS said why, the user hears it (once) and this process stops trying.
void ReportTlsRefusal() {
  std::lock_guard<std::mutex> lock(tls_error_mu);
  if (tls_error.empty()) return;
  std::fprintf(stderr, "gmux: %s (GMUX_TLS_CERT and GMUX_TLS_KEY name a client certificate)\n",
               tls_error.c_str());
  tls_error.clear();
  tls_refused = true;
}

// GMUX_ADDRESS (tls::Dial: TLS unless "tcp://"), with GMUX_TLS_* from the environment. Returns
// the descriptor the ICD speaks on, or -1 (for a TLS failure, said once on stderr).
int ConnectRemote(const std::string& address) {
  const bool plain = address.rfind("tcp://", 0) == 0;
  if (!plain && tls_refused) return -1;
  tls::ClientOptions o = tls::ClientOptionsFromEnvironment();
  o.timeout_ms = HandshakeTimeoutS() * 1000;
  o.on_error = [address](const std::string& why) {
    std::lock_guard<std::mutex> lock(tls_error_mu);
    tls_error = address + ": gmuxd ended the TLS connection: " + why;
  };
  auto fd = tls::Dial(address, o, kConnectTimeoutMs);
  if (!fd.ok()) {
    // Not reachable (no daemon yet) is silent, as for the Unix socket: "no devices".
    if (fd.status().message().rfind("cannot connect", 0) != 0) {
      if (fd.status().message().find("timed out") == std::string::npos) tls_refused = true;
      // The application sees only an empty platform: say why, where its user will look.
      std::fprintf(stderr, "gmux: %s: %s\n", address.c_str(), fd.status().message().c_str());
    }
    return -1;
  }
  return *fd;
}

// The remote-copy probe (wire::Hello): 8 bytes the worker must read back from this process.
uint64_t remote_probe = 0;

// Offers remote copy at hello: fills the probe, and under Yama's ptrace_scope 1 names gmuxd
// (the socket's peer, whose children the workers are) as a process that may read this one.
// GMUX_REMOTE_COPY=0 keeps every transfer on the shared-memory path.
bool OfferRemoteCopy(int fd) {
  if (const char* e = std::getenv("GMUX_REMOTE_COPY"); e != nullptr && std::strcmp(e, "0") == 0) {
    return false;
  }
  if (remote_probe == 0) {
    uint64_t v = 0;
    if (::getrandom(&v, sizeof(v), 0) != static_cast<ssize_t>(sizeof(v))) return false;
    remote_probe = v | 1;  // never 0
  }
  if (FILE* f = std::fopen("/proc/sys/kernel/yama/ptrace_scope", "r")) {
    int scope = 0;
    const bool one = std::fscanf(f, "%d", &scope) == 1 && scope == 1;
    std::fclose(f);
    ucred cred{};
    socklen_t len = sizeof(cred);
    if (one && ::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 && cred.pid > 0) {
      ::prctl(PR_SET_PTRACER, static_cast<unsigned long>(cred.pid), 0, 0, 0);
    }
  }
  return true;
}

// Reader limits for the daemon's replies: bounded, like every decode, but generous, since the
// daemon is trusted and a legitimate large reply must never fail while being read.
proto::FrameLimits ReplyLimits() {
  proto::FrameLimits limits;
  limits.traversal_factor = 64;
  return limits;
}

}  // namespace

Connection* Connection::Get() {
  static std::mutex mu;
  static Connection* conn = nullptr;  // never destroyed: the receiver may outlive main()
  std::lock_guard<std::mutex> lock(mu);
  if (conn == nullptr) conn = Connect();
  return conn;
}

Connection* Connection::Connect() {
  // Before the socket exists, so no fork can come between the two.
  static std::once_flag atfork;
  std::call_once(atfork, [] { ::pthread_atfork(nullptr, nullptr, [] { g_forked = true; }); });
  // GMUX_SOCKET wins, then GMUX_ADDRESS (TCP, identified by GMUX_TOKEN), then the default
  // socket.
  int fd = -1;
  bool tcp = false;
  std::string token;
  if (const char* s = std::getenv("GMUX_SOCKET"); s != nullptr && *s != '\0') {
    fd = ConnectUnix(s);
  } else if (const char* a = std::getenv("GMUX_ADDRESS"); a != nullptr && *a != '\0') {
    tcp = true;
    fd = ConnectRemote(a);
    if (const char* t = std::getenv("GMUX_TOKEN"); t != nullptr) token = t;
  } else {
    fd = ConnectUnix(kDefaultSocket);
  }
  if (fd < 0) return nullptr;
  timeval tv{HandshakeTimeoutS(), 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));

  capnp::MallocMessageBuilder b;
  auto req = b.initRoot<wire::Request>();
  req.setSeq(1);
  auto h = req.initHello();
  h.setProtocolVersion(proto::kProtocolVersion);
  h.setPid(static_cast<uint32_t>(::getpid()));
  h.setClientName("libgmux-icd");
  if (tcp) h.setToken(token);
  const char* shm_env = std::getenv("GMUX_SHM");
  const bool no_shm = shm_env != nullptr && std::strcmp(shm_env, "0") == 0;
  const char* frames_env = std::getenv("GMUX_DATA_FRAMES");
  const bool data_frames = frames_env == nullptr || std::strcmp(frames_env, "0") != 0;
  h.setDataFrames(data_frames);
  bool storage_arenas = false;  // the worker's answer
  bool reply_ring = false;      // the worker's answer
  bool request_ring = false;    // the worker's answer
  if (!tcp && !no_shm && OfferRemoteCopy(fd)) {
    h.setProbe(reinterpret_cast<uintptr_t>(&remote_probe));
    h.setProbeCookie(remote_probe);
  }
  if (!proto::WriteFrame(fd, proto::FrameKind::kRequest, b).ok()) {
    ::close(fd);
    return nullptr;
  }
  auto msg = proto::ReadFrame(fd, proto::FrameKind::kReply, ReplyLimits());
  if (!msg.ok()) {
    ::close(fd);
    if (tcp) {
      ReportTlsRefusal();
    } else {
      // gmuxd took the connection and ended it (or timed out) without an answer: its log says
      // why. The application only sees a platform without devices.
      SayOnce("gmuxd gave no answer to this process's hello (" + msg.status().message() +
              "); the daemon's log says why");
    }
    return nullptr;
  }
  auto conn = new Connection();
  bool ok = false;
  std::string refused;
  KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() {
    auto rep = msg->root<wire::Reply>();
    if (rep.getStatus() != CL_SUCCESS || !rep.isHello()) {
      if (rep.getMessage().size() != 0) {
        refused = rep.getMessage().cStr();
      } else if (rep.getStatus() != CL_SUCCESS) {
        refused = "gmuxd refused the session (status " + std::to_string(rep.getStatus()) + ")";
      } else {
        refused = "gmuxd's answer to the hello was not a hello";
      }
      return;
    }
    conn->tenant_ = rep.getHello().getTenant();
    conn->remote_copy_ = !tcp && rep.getHello().getRemoteCopy();
    conn->storage_enabled_ = !tcp && rep.getHello().getBufferStorage();
    conn->data_frames_ = data_frames && rep.getHello().getDataFrames();
    storage_arenas = rep.getHello().getStorageArenas();
    reply_ring = rep.getHello().getReplyRing();
    request_ring = rep.getHello().getRequestRing();
    conn->profiled_waits_ = rep.getHello().getProfiledWaits();
    conn->hello_pid_ = ::getpid();
    for (auto d : rep.getHello().getDevices()) {
      conn->devices_.push_back({d.getIndex(), d.getName(), d.getType()});
    }
    ok = true;
  })) {
    ok = false;
  }
  if (!ok) {
    // The daemon's reason (too many sessions, an unknown user or token, ...), where the user of
    // an application that finds no devices will look.
    if (!refused.empty()) SayOnce(refused);
    delete conn;
    ::close(fd);
    return nullptr;
  }
  // Requests, then replies, through shared memory (proto/shm_ring.h), each when the worker
  // knows it and the environment does not say no (GMUX_REQUEST_RING=0, GMUX_REPLY_RING=0;
  // GMUX_SHM=0 turns both off: every byte through the socket). The request ring is asked for
  // first, answered on the socket; every later request (the reply ring's too) goes through it.
  // The reply ring is asked for before any other request, so nothing but its answer comes on
  // the socket before the ring.
  struct RingAsk {
    bool offered;
    const char* env;
    RingOutcome (Connection::*open)(int);
    const char* what;
  };
  for (const RingAsk& ask : {RingAsk{request_ring, "GMUX_REQUEST_RING",
                                     &Connection::OpenRequestRing, "requests"},
                             RingAsk{reply_ring, "GMUX_REPLY_RING", &Connection::OpenReplyRing,
                                     "replies"}}) {
    const char* e = std::getenv(ask.env);
    if (!ask.offered || tcp || no_shm || (e != nullptr && std::strcmp(e, "0") == 0)) continue;
    if ((conn->*ask.open)(fd) == RingOutcome::kLost) {
      SayOnce(std::string("gmuxd's worker ended the session while it set up shared memory "
                          "for ") + ask.what);
      delete conn;
      ::close(fd);
      return nullptr;
    }
  }
  timeval none{0, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &none, sizeof(none));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &none, sizeof(none));
  conn->fd_ = fd;
  conn->replies_ =
      std::make_unique<proto::FrameReader>(fd, proto::FrameKind::kReply, ReplyLimits());
  // Offered in the hello: an older worker that does not know them sends none.
  if (data_frames) conn->replies_->SetDataSink(&conn->read_sink_);
  if (conn->ring_) conn->replies_->ReadFromRing(conn->ring_.get()).IgnoreError();  // unread
  // Descriptors cannot cross TCP: bulk data goes inline there.
  // GMUX_SHM=0: every byte inline in the stream (no shared memory, no remote copy either).
  if (const char* e = std::getenv("GMUX_SHM"); tcp || (e != nullptr && std::strcmp(e, "0") == 0)) {
    conn->shm_enabled_ = false;
    conn->remote_copy_ = false;
  }
  if (const char* e = std::getenv("GMUX_DIRECT_WRITES"); e != nullptr && std::strcmp(e, "0") == 0) {
    conn->direct_writes_ = false;
  }
  if (const char* e = std::getenv("GMUX_BUFFER_STORAGE");
      e != nullptr && std::strcmp(e, "0") == 0) {
    conn->storage_enabled_ = false;
  }
  if (const char* e = std::getenv("GMUX_STORAGE_ARENAS");
      !storage_arenas || (e != nullptr && std::strcmp(e, "0") == 0)) {
    conn->arenas_enabled_.store(false);
  }
  rlimit files{};
  if (::getrlimit(RLIMIT_NOFILE, &files) == 0) {
    conn->storage_fds_max_ = static_cast<int>(
        std::min<rlim_t>(files.rlim_cur == RLIM_INFINITY ? 2048 : files.rlim_cur / 8, 256));
  }
  std::thread([conn] { conn->ReceiveLoop(); }).detach();
  std::thread([conn] { conn->CallbackLoop(); }).detach();
  return conn;
}

Connection::RingOutcome Connection::OpenRequestRing(int fd) {
  int pass_fd = -1;
  auto ring = proto::ShmRing::CreateProducer(kRequestRingBytes, fd, &pass_fd);
  if (!ring.ok()) return RingOutcome::kRefused;  // no memfd here: requests use the socket
  capnp::MallocMessageBuilder b;
  auto req = b.initRoot<wire::Request>();
  req.setRequestRing(kRequestRingBytes);
  RingOutcome outcome = AskForRing(fd, b, pass_fd, "requests");
  if (outcome == RingOutcome::kOpen) request_ring_ = std::move(*ring);
  return outcome;
}

Connection::RingOutcome Connection::OpenReplyRing(int fd) {
  int pass_fd = -1;
  auto ring = proto::ShmRing::CreateConsumer(kReplyRingBytes, fd, &pass_fd);
  if (!ring.ok()) return RingOutcome::kRefused;  // no memfd here: replies use the socket
  capnp::MallocMessageBuilder b;
  auto req = b.initRoot<wire::Request>();
  req.setReplyRing(kReplyRingBytes);
  RingOutcome outcome = AskForRing(fd, b, pass_fd, "replies");
  if (outcome == RingOutcome::kOpen) ring_ = std::move(*ring);
  return outcome;
}

Connection::RingOutcome Connection::AskForRing(int fd, capnp::MallocMessageBuilder& b,
                                               int pass_fd, const char* what) {
  auto req = b.getRoot<wire::Request>();
  const uint64_t seq = next_seq_.fetch_add(1);
  req.setSeq(seq);
  // Through the request ring once there is one (its descriptor on the socket).
  const bool sent = proto::WriteFrame(proto::Outlet(fd, request_ring_.get()),
                                      proto::FrameKind::kRequest, b, {}, pass_fd)
                        .ok();
  ::close(pass_fd);
  if (!sent) return RingOutcome::kLost;
  // Still within the handshake's receive timeout.
  auto msg = proto::ReadFrame(fd, proto::FrameKind::kReply, ReplyLimits());
  if (!msg.ok()) return RingOutcome::kLost;
  bool open = false;
  bool lost = false;
  KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() {
    auto rep = msg->root<wire::Reply>();
    if (rep.getSeq() != seq) {  // nothing else is due before it: a broken worker
      lost = true;
      return;
    }
    open = rep.getStatus() == CL_SUCCESS;
    if (!open && rep.getMessage().size() != 0) {
      SayOnce(std::string("gmuxd's worker declined shared memory for ") + what + ": " +
              rep.getMessage().cStr());
    }
  })) {
    return RingOutcome::kLost;
  }
  if (lost) return RingOutcome::kLost;
  return open ? RingOutcome::kOpen : RingOutcome::kRefused;
}

namespace {

constexpr size_t kBatchFrameBytes = 16u << 10;  // frames up to this size may wait in the batch
constexpr size_t kBatchBytes = 64u << 10;       // the batch is sent when it reaches this size

}  // namespace

Connection::StreamHold::StreamHold(Connection* c) : c_(c) {
  c_->hold_mu_.lock();
  c_->hold_owner_.store(std::this_thread::get_id(), std::memory_order_release);
}

void Connection::StreamHold::Release() {
  if (c_ == nullptr) return;
  c_->hold_owner_.store(std::thread::id(), std::memory_order_release);
  c_->hold_mu_.unlock();
  c_ = nullptr;
}

std::unique_lock<std::mutex> Connection::WaitForHold() {
  if (hold_owner_.load(std::memory_order_acquire) == std::this_thread::get_id()) return {};
  return std::unique_lock<std::mutex>(hold_mu_);
}

cl_int Connection::SendLocked(capnp::MallocMessageBuilder& request, bool may_batch, int pass_fd,
                              StreamOrder order) {
  if (Forked()) return CL_DEVICE_NOT_AVAILABLE;
  auto hold = WaitForHold();
  std::lock_guard<std::mutex> lock(send_mu_);
  {
    std::lock_guard<std::mutex> l2(mu_);
    if (dead_) return CL_DEVICE_NOT_AVAILABLE;
  }
  // The context's count first: a Settle of this command (which subtracts) comes after both.
  if (order.in_flight != nullptr) order.in_flight->fetch_add(1, std::memory_order_acq_rel);
  if (order.counter != nullptr) *order.number = order.counter->fetch_add(1) + 1;
  {
    // Destroyed shared buffers: the daemon drops its mappings before anything later arrives.
    std::vector<uint64_t> forget;
    {
      std::lock_guard<std::mutex> l3(shm_mu_);
      forget.swap(shm_forget_);
    }
    for (uint64_t inode : forget) {
      capnp::MallocMessageBuilder f;
      auto r = f.initRoot<wire::Request>();
      r.setSeq(0);
      r.setShmForget(inode);
      auto bytes = proto::EncodeFrame(proto::FrameKind::kRequest, f);
      if (bytes.ok()) batch_.insert(batch_.end(), bytes->begin(), bytes->end());
    }
  }
  bool batched = false;
  // A small request that waits goes out in one send with the batch before it: the worker
  // wakes once for both.
  if ((may_batch || !batch_.empty()) && pass_fd < 0 &&
      capnp::computeSerializedSizeInWords(request) * sizeof(capnp::word) <= kBatchFrameBytes) {
    auto bytes = proto::EncodeFrame(proto::FrameKind::kRequest, request);
    if (!bytes.ok()) return CL_OUT_OF_RESOURCES;
    batch_.insert(batch_.end(), bytes->begin(), bytes->end());
    if (may_batch && batch_.size() < kBatchBytes) return CL_SUCCESS;
    batched = true;
  }
  // Anything batched goes first, so frames keep their order.
  if (!batch_.empty()) {
    bool ok = proto::WriteAll(out(), batch_).ok();
    batch_.clear();
    if (!ok) return CL_DEVICE_NOT_AVAILABLE;
  }
  if (batched) return CL_SUCCESS;
  Status s = proto::WriteFrame(out(), proto::FrameKind::kRequest, request, {}, pass_fd);
  if (s.ok()) return CL_SUCCESS;
  return s.code() == StatusCode::kResourceExhausted ? CL_OUT_OF_RESOURCES : CL_DEVICE_NOT_AVAILABLE;
}

cl_int Connection::Flush() {
  if (Forked()) return CL_DEVICE_NOT_AVAILABLE;
  auto hold = WaitForHold();
  std::lock_guard<std::mutex> lock(send_mu_);
  if (batch_.empty()) return CL_SUCCESS;
  bool ok = proto::WriteAll(out(), batch_).ok();
  batch_.clear();
  return ok ? CL_SUCCESS : CL_DEVICE_NOT_AVAILABLE;
}

cl_int Connection::Post(capnp::MallocMessageBuilder& request, StreamOrder order) {
  request.getRoot<wire::Request>().setSeq(0);
  return SendLocked(request, /*may_batch=*/true, -1, order);
}

uint64_t Connection::Begin(capnp::MallocMessageBuilder& request, void* dst, size_t size,
                           std::function<void(cl_int)> on_reply, ShmBuffer shm, bool keep_shm,
                           ShmBuffer release, StreamOrder order) {
  if (Forked()) {
    // Nothing is sent and nothing waited for (Wait(0) answers CL_DEVICE_NOT_AVAILABLE).
    if (on_reply) on_reply(CL_DEVICE_NOT_AVAILABLE);
    return 0;
  }
  uint64_t seq = next_seq_.fetch_add(1);
  request.getRoot<wire::Request>().setSeq(seq);
  {
    std::lock_guard<std::mutex> lock(mu_);
    Pending& p = pending_[seq];
    p.dst = static_cast<uint8_t*>(dst);
    p.size = size;
    p.on_reply = std::move(on_reply);
    if (!keep_shm && shm.valid()) {
      p.shm = shm;
      HeldInFlight(shm);
    }
    if (release.valid()) {
      p.release = release;
      HeldInFlight(release);
    }
    if (p.on_reply && ++async_pending_ == 1 && waiters_ == 0) reader_cv_.notify_one();
  }
  cl_int err = SendLocked(request, /*may_batch=*/false, shm.fd, order);
  if (err != CL_SUCCESS) {
    std::function<void(cl_int)> cb;
    {
      std::lock_guard<std::mutex> lock(mu_);
      Pending& p = pending_[seq];
      if (p.shm.valid()) {
        ReleaseShm(p.shm, /*in_flight=*/true);
        p.shm = {};
      }
      if (p.release.valid()) {
        ReleaseShm(p.release, /*in_flight=*/true);
        p.release = {};
      }
      p.done = true;
      p.status = err;
      cb = std::move(p.on_reply);
      if (cb) {
        pending_.erase(seq);
        --async_pending_;
      }
    }
    if (cb) cb(err);
  }
  return seq;
}

cl_int Connection::Wait(uint64_t seq) {
  if (seq == 0 || Forked()) return CL_DEVICE_NOT_AVAILABLE;
  std::unique_lock<std::mutex> lock(mu_);
  AwaitReply(lock, seq);
  auto it = pending_.find(seq);
  if (it == pending_.end()) return CL_INVALID_VALUE;
  cl_int st = it->second.status;
  pending_.erase(it);
  return st;
}

cl_int Connection::Call(capnp::MallocMessageBuilder& request, std::optional<proto::Message>* reply,
                        std::string* error_message, int pass_fd) {
  ShmBuffer pass;
  pass.fd = pass_fd;
  GMUX_STAGE(0);
  uint64_t seq = Begin(request, nullptr, 0, nullptr, pass, /*keep_shm=*/true);
  if (seq == 0) return CL_DEVICE_NOT_AVAILABLE;  // a forked child (Begin)
  std::unique_lock<std::mutex> lock(mu_);
  AwaitReply(lock, seq);
  GMUX_STAGE(7);
  Pending p = std::move(pending_[seq]);
  pending_.erase(seq);
  if (reply != nullptr && p.reply) *reply = std::move(p.reply);
  if (error_message != nullptr) *error_message = p.message;
  return p.status;
}

ShmBuffer Connection::AcquireShm(size_t size) {
  if (Forked()) return {};
  {
    std::unique_lock<std::mutex> lock(shm_mu_);
    // The smallest that fits; of equal ones the most recently released, so that a stream of
    // transfers cycles through as few buffers as it can and the worker's cache of mappings
    // (Session::MapShared, 16) keeps them: mapping one afresh costs more than its copy.
    auto take = [&]() -> std::optional<ShmBuffer> {
      size_t best = shm_pool_.size();
      for (size_t i = 0; i < shm_pool_.size(); ++i) {
        if (shm_pool_[i].capacity >= size &&
            (best == shm_pool_.size() || shm_pool_[i].capacity <= shm_pool_[best].capacity)) {
          best = i;
        }
      }
      if (best == shm_pool_.size()) return std::nullopt;
      ShmBuffer b = shm_pool_[best];
      shm_pool_.erase(shm_pool_.begin() + static_cast<ptrdiff_t>(best));
      return b;
    };
    if (auto b = take()) return *b;
    // None free: wait for one in flight that would fit and come back to the pool (see the
    // header), as long as creating one would take, or eight times that (5 ms to 2 s) with
    // kShmInFlightMax in flight.
    const auto start = std::chrono::steady_clock::now();
    const auto create = std::chrono::nanoseconds(
        static_cast<int64_t>(shm_create_ns_per_byte_ * static_cast<double>(size)));
    auto fitting = [&] {
      auto from = shm_in_flight_.lower_bound(size);
      return from != shm_in_flight_.end() && *from <= kShmKeepOneBytes && !dead_.load();
    };
    while (fitting()) {
      auto wait = create;
      if (shm_in_flight_.size() >= kShmInFlightMax) {
        wait = std::clamp<std::chrono::nanoseconds>(8 * create, std::chrono::milliseconds(5),
                                                    std::chrono::seconds(2));
      }
      if (shm_cv_.wait_until(lock, start + wait) == std::cv_status::timeout) break;
      if (auto b = take()) return *b;
    }
    if (auto b = take()) return *b;
  }
  const auto created = std::chrono::steady_clock::now();
  ShmBuffer made = CreateShm(size);
  if (made.valid()) {
    const double ns = static_cast<double>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                              std::chrono::steady_clock::now() - created)
                                              .count());
    std::lock_guard<std::mutex> lock(shm_mu_);
    shm_create_ns_per_byte_ = ns / static_cast<double>(made.capacity);
  }
  return made;
}

void Connection::HeldInFlight(const ShmBuffer& buffer) {
  std::lock_guard<std::mutex> lock(shm_mu_);
  shm_in_flight_.insert(buffer.capacity);
}

ShmBuffer Connection::CreateShm(size_t size) {
  // Round up so buffers are reused across nearby sizes: to a power of two up to 64 MiB, then to
  // a multiple of 64 MiB. (Powers of two all the way wasted up to half of a large buffer, and
  // the whole buffer is populated: a 2.3 GB transfer took 4 GiB of shared memory.)
  constexpr size_t kStep = 64u << 20;
  size_t cap = kShmMinBytes;
  while (cap < size && cap < kStep) cap *= 2;
  if (cap < size) cap = (size + kStep - 1) / kStep * kStep;
  int fd = ::memfd_create("gmux-bulk", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return {};
  struct stat st{};
  if (::ftruncate(fd, static_cast<off_t>(cap)) != 0 ||
      ::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) != 0 || ::fstat(fd, &st) != 0) {
    ::close(fd);
    return {};
  }
  void* p = ::mmap(nullptr, cap, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (p == MAP_FAILED) {
    ::close(fd);
    return {};
  }
  return {fd, p, cap, static_cast<uint64_t>(st.st_ino)};
}

ShmBuffer Connection::CreateStorage(size_t size) {
  int fd = ::memfd_create("gmux-buffer", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return {};
  // Sealed against shrinking, so the worker's mapping can never fault.
  if (::ftruncate(fd, static_cast<off_t>(size)) != 0 ||
      ::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    ::close(fd);
    return {};
  }
  // Not populated: the pages are faulted in where they are first touched, as a fresh
  // allocation's are.
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    ::close(fd);
    return {};
  }
  return {fd, p, size, 0};
}

namespace {
size_t ArenaClass(size_t size) {
  size_t k = 0;
  while ((Connection::kArenaSlotMin << k) < size) ++k;
  return k;
}
}  // namespace

Connection::ArenaSlot Connection::TakeArenaSlot(size_t size) {
  if (Forked() || !UseArena(size)) return {};
  const size_t k = ArenaClass(size);
  const size_t slot = kArenaSlotMin << k;
  std::lock_guard<std::mutex> lock(arena_mu_);
  auto& free = arena_free_[k];
  if (free.empty()) {
    // A new block of slots, from the last arena or a new one.
    if (arenas_.empty() || arenas_.back().carved + kArenaBlock > kArenaBytes) {
      if (arenas_.size() >= kArenaMax) return {};
      ShmBuffer made = CreateStorage(kArenaBytes);
      if (!made.valid()) return {};
      arenas_.push_back({made.fd, static_cast<uint8_t*>(made.map), 0});
    }
    Arena& a = arenas_.back();
    const auto number = static_cast<uint32_t>(arenas_.size());
    // Handed out from the block's start (reversed, so the lowest offset goes first).
    for (size_t at = kArenaBlock; at >= slot; at -= slot) {
      free.emplace_back(number, a.carved + at - slot);
    }
    a.carved += kArenaBlock;
  }
  auto [number, offset] = free.back();
  free.pop_back();
  const Arena& a = arenas_[number - 1];
  ArenaSlot s{number, offset, a.map + offset, -1};
  if (a.fd >= 0) {
    s.pass_fd = ::fcntl(a.fd, F_DUPFD_CLOEXEC, 0);
    if (s.pass_fd < 0) {
      free.emplace_back(number, offset);
      return {};
    }
  }
  return s;
}

void Connection::ArenaTaken(uint32_t arena) {
  std::lock_guard<std::mutex> lock(arena_mu_);
  if (arena == 0 || arena > arenas_.size()) return;
  Arena& a = arenas_[arena - 1];
  if (a.fd >= 0) ::close(a.fd);
  a.fd = -1;
}

void Connection::FreeArenaSlot(uint32_t arena, uint64_t offset, size_t size, bool last) {
  if (Forked() || arena == 0 || size == 0 || size >= kStorageMinBytes) return;
  std::lock_guard<std::mutex> lock(arena_mu_);
  auto& free = arena_free_[ArenaClass(size)];
  if (last) {
    free.emplace(free.begin(), arena, offset);
  } else {
    free.emplace_back(arena, offset);
  }
}

ShmBuffer Connection::TakeStorage(size_t size) {
  if (Forked()) return {};
  std::lock_guard<std::mutex> lock(storage_mu_);
  for (auto it = storage_pool_.rbegin(); it != storage_pool_.rend(); ++it) {
    if (it->capacity == size) {
      ShmBuffer b = *it;
      storage_pool_.erase(std::next(it).base());
      return b;
    }
  }
  return {};
}

bool Connection::PoolStorage(ShmBuffer storage) {
  if (Forked() || Lost() || storage.capacity > kStoragePoolMaxBytes) return false;
  std::vector<ShmBuffer> dropped;
  {
    std::lock_guard<std::mutex> lock(storage_mu_);
    size_t total = storage.capacity;
    for (const ShmBuffer& b : storage_pool_) total += b.capacity;
    size_t drop = 0;
    while (drop < storage_pool_.size() &&
           (total > kStoragePoolBytes || storage_pool_.size() - drop >= kStoragePoolEntries)) {
      total -= storage_pool_[drop].capacity;
      dropped.push_back(storage_pool_[drop++]);
    }
    storage_pool_.erase(storage_pool_.begin(), storage_pool_.begin() + static_cast<long>(drop));
    storage_pool_.push_back(storage);
  }
  for (const ShmBuffer& b : dropped) {
    ::munmap(b.map, b.capacity);
    ::close(b.fd);
  }
  return true;
}

bool Connection::KeepStorageFd(size_t size) {
  if (size > kStoragePoolMaxBytes) return false;
  int was = storage_fds_.load(std::memory_order_relaxed);
  while (was < storage_fds_max_) {
    if (storage_fds_.compare_exchange_weak(was, was + 1, std::memory_order_relaxed)) return true;
  }
  return false;
}

void Connection::DropStorageFd() { storage_fds_.fetch_sub(1, std::memory_order_relaxed); }

void Connection::DestroyShmLocked(ShmBuffer buffer) {
  ::munmap(buffer.map, buffer.capacity);
  ::close(buffer.fd);
  shm_forget_.push_back(buffer.inode);
}

void Connection::ReleaseShm(ShmBuffer buffer, bool in_flight) {
  if (Forked()) return;  // the pool is the parent's too
  if (!buffer.valid()) return;
  std::lock_guard<std::mutex> lock(shm_mu_);
  if (in_flight) {
    if (auto it = shm_in_flight_.find(buffer.capacity); it != shm_in_flight_.end()) {
      shm_in_flight_.erase(it);
    }
  }
  shm_cv_.notify_all();
  if (buffer.capacity > kShmKeepOneBytes) {
    DestroyShmLocked(buffer);
    return;
  }
  // Keep this one; drop the oldest pooled ones until the pool fits its budget (which one
  // buffer larger than the budget may exceed alone).
  size_t pooled = buffer.capacity;
  for (const auto& b : shm_pool_) pooled += b.capacity;
  size_t budget = std::max(kShmPoolBytes, buffer.capacity);
  auto it = shm_pool_.begin();
  while (pooled > budget && it != shm_pool_.end()) {
    pooled -= it->capacity;
    DestroyShmLocked(*it);
    it = shm_pool_.erase(it);
  }
  shm_pool_.push_back(buffer);
}

uint64_t Connection::SendBulk(const void* data, size_t size, ShmBuffer* held, uint64_t dest_mem,
                              uint64_t dest_offset) {
  if (Forked()) return 0;
  uint64_t token = NextId();
  *held = {};
  if (UseShm(size)) {
    ShmBuffer buf = AcquireShm(size);
    if (buf.valid()) {
      CopyBytes(buf.map, data, size);
      token = SendShm(buf, size);
      if (token == 0) {
        ReleaseShm(buf);
        return 0;
      }
      *held = buf;
      return token;
    }
    // No memfd (old kernel, limits): fall back to inline data.
  }
  {
    capnp::MallocMessageBuilder b;
    auto r = b.initRoot<wire::Request>();
    auto bb = r.initBulkBegin();
    bb.setToken(token);
    bb.setSize(size);
    bb.setDestMem(dest_mem);
    bb.setDestOffset(dest_offset);
    if (Post(b) != CL_SUCCESS) return 0;
  }
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t at = 0; at < size; at += proto::kBulkChunkBytes) {
    size_t n = std::min(proto::kBulkChunkBytes, size - at);
    if (data_frames_) {
      // Raw, from the application's memory: the worker receives it into its staging buffer.
      if (PostData(token, at, p + at, n) != CL_SUCCESS) return 0;
      continue;
    }
    capnp::MallocMessageBuilder b;
    auto bd = b.initRoot<wire::Request>().initBulkData();
    bd.setToken(token);
    bd.setOffset(at);
    if (reinterpret_cast<uintptr_t>(p + at) % sizeof(capnp::word) == 0 &&
        n % sizeof(capnp::word) == 0) {
      // Aligned: the application's memory becomes a segment of the message and is sent from
      // where it is, without a copy.
      bd.adoptData(b.getOrphanage().referenceExternalData(capnp::Data::Reader(p + at, n)));
    } else {
      bd.setData(kj::arrayPtr(p + at, n));
    }
    if (Post(b) != CL_SUCCESS) return 0;
  }
  return token;
}

cl_int Connection::PostData(uint64_t token, uint64_t offset, const uint8_t* data, size_t n) {
  if (Forked()) return CL_DEVICE_NOT_AVAILABLE;
  auto hold = WaitForHold();
  std::lock_guard<std::mutex> lock(send_mu_);
  if (dead_.load()) return CL_DEVICE_NOT_AVAILABLE;
  // Anything batched goes first, so frames keep their order.
  if (!batch_.empty()) {
    bool ok = proto::WriteAll(out(), batch_).ok();
    batch_.clear();
    if (!ok) return CL_DEVICE_NOT_AVAILABLE;
  }
  Status s = proto::WriteDataFrame(out(), {token, offset, static_cast<uint32_t>(n), false}, data);
  return s.ok() ? CL_SUCCESS : CL_DEVICE_NOT_AVAILABLE;
}

uint64_t Connection::SendShm(const ShmBuffer& buffer, size_t size) {
  if (!buffer.valid() || size > buffer.capacity) return 0;
  uint64_t token = NextId();
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<wire::Request>();
  r.setSeq(0);
  auto bb = r.initBulkBegin();
  bb.setToken(token);
  bb.setSize(size);
  bb.setShm(true);
  return SendLocked(b, /*may_batch=*/false, buffer.fd) == CL_SUCCESS ? token : 0;
}

bool Connection::Forked() { return g_forked.load(std::memory_order_relaxed); }

bool Connection::StillRemote() {
  if (!Forked() && ::getpid() == hello_pid_ && ::prctl(PR_GET_DUMPABLE, 0, 0, 0, 0) == 1) {
    return true;
  }
  DisableRemote();
  return false;
}

cl_int Connection::TakeAsyncError() {
  std::lock_guard<std::mutex> lock(mu_);
  cl_int e = async_error_;
  async_error_ = CL_SUCCESS;
  return e;
}

uint8_t* Connection::ReadSink::Place(const proto::DataFrame& f) {
  Connection& c = *c_;
  std::function<void(cl_int)> cb;
  cl_int cb_status = CL_SUCCESS;
  {
    std::lock_guard<std::mutex> lock(c.mu_);
    auto it = c.pending_.find(f.id);
    if (it == c.pending_.end() || it->second.done) return nullptr;  // nobody waits for it
    Pending& p = it->second;
    // Never trust the daemon's offsets either.
    if (p.dst != nullptr && f.offset <= p.size && f.bytes <= p.size - f.offset) {
      p.receiving = true;
      return p.dst + f.offset;
    }
    p.status = CL_OUT_OF_RESOURCES;
    if (f.last) c.CompleteLocked(it, &cb, &cb_status);
  }
  if (cb) c.Deliver(std::move(cb), cb_status);
  return nullptr;  // the bytes are dropped
}

void Connection::ReadSink::Placed(const proto::DataFrame& f, bool complete) {
  Connection& c = *c_;
  std::function<void(cl_int)> cb;
  cl_int cb_status = CL_SUCCESS;
  {
    std::lock_guard<std::mutex> lock(c.mu_);
    auto it = c.pending_.find(f.id);
    if (it == c.pending_.end()) return;
    it->second.receiving = false;
    // Incomplete: the reader goes on to Disconnected(), which answers every waiter.
    if (complete && f.last) {
      c.CompleteLocked(it, &cb, &cb_status);
    } else if (c.waiters_ > 1 || (c.waiters_ == 1 && !c.reader_is_waiter_)) {
      c.cv_.notify_all();  // a waiter may be waiting for the bytes to be in
    }
  }
  if (cb) c.Deliver(std::move(cb), cb_status);
}

void Connection::CompleteLocked(std::map<uint64_t, Pending>::iterator it,
                                std::function<void(cl_int)>* cb, cl_int* cb_status) {
  Pending& p = it->second;
  if (p.release.valid()) {
    ReleaseShm(p.release, /*in_flight=*/true);
    p.release = {};
  }
  p.done = true;
  if (p.on_reply) {
    *cb = std::move(p.on_reply);
    *cb_status = p.status;
    pending_.erase(it);
    --async_pending_;
  }
  // A waiter other than the reader: woken for its reply.
  if (waiters_ > 1 || (waiters_ == 1 && !reader_is_waiter_)) cv_.notify_all();
}

void Connection::Deliver(std::function<void(cl_int)> cb, cl_int status) {
  std::lock_guard<std::mutex> lock(mu_);
  callbacks_.push_back([cb = std::move(cb), status] { cb(status); });
  callbacks_cv_.notify_one();
}

bool Connection::ReadOne() {
  auto next = replies_->NextOrData(nullptr);
  if (!next.ok()) {
    Disconnected();
    return false;
  }
  if (!next->has_value()) return true;  // a data frame: its sink has done the rest
  proto::Message* msg = &**next;
  std::function<void(cl_int)> cb;
  cl_int cb_status = CL_SUCCESS;
  bool bad = false;
  KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() {
    auto rep = msg->root<wire::Reply>();
    uint64_t seq = rep.getSeq();
    std::lock_guard<std::mutex> lock(mu_);
    if (seq == 0) {
      if (async_error_ == CL_SUCCESS) async_error_ = rep.getStatus();
      return;
    }
    auto it = pending_.find(seq);
    if (it == pending_.end()) return;  // nobody waits (a caller that gave up)
    Pending& p = it->second;
    // Anything after the reply that completed the call is ignored: the caller may have
    // returned, and its buffer is the application's again.
    if (p.done) return;
    bool complete = true;
    if (rep.isReadData()) {
      auto rd = rep.getReadData();
      auto data = rd.getData();
      // Never trust the daemon's offsets either.
      if (p.dst == nullptr || rd.getOffset() > p.size || data.size() > p.size - rd.getOffset()) {
        p.status = CL_OUT_OF_RESOURCES;
      } else {
        std::memcpy(p.dst + rd.getOffset(), data.begin(), data.size());
      }
      complete = rd.getLast();
    } else {
      p.status = rep.getStatus();
      p.message = rep.getMessage();
      if (p.shm.valid()) {
        if (p.status == CL_SUCCESS && p.dst != nullptr) CopyBytes(p.dst, p.shm.map, p.size);
        ReleaseShm(p.shm, /*in_flight=*/true);
        p.shm = {};
      }
    }
    if (p.release.valid()) {
      ReleaseShm(p.release, /*in_flight=*/true);
      p.release = {};
    }
    if (!complete) return;
    if (!p.on_reply && !rep.isReadData() && !rep.isNone()) p.reply = std::move(*msg);
    CompleteLocked(it, &cb, &cb_status);
  })) {
    bad = true;
  }
  if (bad) {
    Disconnected();
    return false;
  }
  if (cb) Deliver(std::move(cb), cb_status);
  return true;
}

void Connection::Disconnected() {
  ::shutdown(fd_, SHUT_RDWR);  // a half-read frame leaves the stream unusable for everyone
  if (request_ring_) request_ring_->Close();  // a sender waiting for room stops
  std::vector<std::function<void(cl_int)>> orphans;
  {
    std::lock_guard<std::mutex> lock(mu_);
    dead_ = true;
    for (auto it = pending_.begin(); it != pending_.end();) {
      Pending& p = it->second;
      if (!p.done) {
        p.done = true;
        p.status = CL_DEVICE_NOT_AVAILABLE;
        // No answer will come: the buffers go back (a read's data is not copied).
        for (ShmBuffer* b : {&p.shm, &p.release}) {
          if (b->valid()) ReleaseShm(*b, /*in_flight=*/true);
          *b = {};
        }
        if (p.on_reply) {
          orphans.push_back(std::move(p.on_reply));
          it = pending_.erase(it);
          --async_pending_;
          continue;
        }
      }
      ++it;
    }
    for (auto& o : orphans) {
      callbacks_.push_back([o] { o(CL_DEVICE_NOT_AVAILABLE); });
    }
  }
  callbacks_cv_.notify_one();
  cv_.notify_all();
  reader_cv_.notify_all();
}

void Connection::AwaitReply(std::unique_lock<std::mutex>& lock, uint64_t seq) {
  // Never in a forked child (Wait and Call refuse first): reading would take the parent's
  // replies. The waiting thread reads the socket itself when nobody else does: its reply then
  // wakes it straight from the kernel, not through another thread (a wake-up less per blocking
  // call).
  ++waiters_;
  for (;;) {
    auto it = pending_.find(seq);
    if (it == pending_.end() || (it->second.done && !it->second.receiving)) break;
    if (!reading_ && !dead_) {
      reading_ = true;
      reader_is_waiter_ = true;
      lock.unlock();
      // A reply due soon is taken without sleeping (proto/spin_wait.h); one read already is not
      // waited for.
      if (!replies_->HasFrame()) {
        if (ring_) {
          spin_.WaitFor([this] { return ring_->Readable(); });
        } else {
          spin_.Wait(fd_);
        }
      }
      ReadOne();
      spin_.Arrived();
      lock.lock();
      reading_ = false;
      reader_is_waiter_ = false;
      continue;
    }
    cv_.wait(lock);
  }
  --waiters_;
  // Someone else may read now: another waiter, or the background reader for callbacks.
  if (waiters_ > 0) {
    cv_.notify_all();
  } else if (async_pending_ > 0) {
    reader_cv_.notify_one();
  }
}

void Connection::ReceiveLoop() {
  // Reads for replies nobody waits for in a call: callbacks of non-blocking requests.
  std::unique_lock<std::mutex> lock(mu_);
  while (!dead_) {
    if (reading_ || waiters_ > 0 || async_pending_ == 0) {
      reader_cv_.wait(lock);
      continue;
    }
    reading_ = true;
    lock.unlock();
    ReadOne();
    lock.lock();
    reading_ = false;
    if (waiters_ > 0) cv_.notify_all();  // a waiter may take over the reading
  }
}

void Connection::CallbackLoop() {
  for (;;) {
    std::vector<std::function<void()>> run;
    {
      std::unique_lock<std::mutex> lock(mu_);
      callbacks_cv_.wait(lock, [&] { return !callbacks_.empty(); });
      run.swap(callbacks_);
    }
    for (auto& f : run) {
      // An exception from a callback (the ICD's own or the application's) must not end this
      // thread, and with it the process.
      try {
        f();
      } catch (...) {
      }
    }
  }
}

}  // namespace gmux::icd
