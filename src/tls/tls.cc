// TLS gateway and client relay (tls.h). Asio runs the sockets and OpenSSL's state machine; every
// Asio call uses the error_code overloads, and what can still throw (a context that cannot be
// made) is caught here, at the edge.
#include "tls/tls.h"

#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <asio.hpp>
#include <asio/ssl.hpp>
#include <atomic>
#include <chrono>
#include <map>
#include <vector>
#include <cstdlib>
#include <cstring>
#include <condition_variable>
#include <future>
#include <mutex>
#include <thread>
#include <utility>

#include "common/waiting_room.h"

namespace gmux::tls {

namespace {

using Tcp = asio::ip::tcp;
using Local = asio::local::stream_protocol;
using TlsStream = asio::ssl::stream<Tcp::socket>;
using ContextPtr = std::shared_ptr<asio::ssl::context>;

// Per direction. A TLS record carries at most 16 KiB; a larger buffer lets one write hand many
// records to the kernel at once.
constexpr size_t kRelayBytes = 128 * 1024;
// After the plaintext side closed, how long the TCP side may take to read what was sent last
// (an error reply) and close its end; then the socket is closed regardless.
constexpr auto kLinger = std::chrono::seconds(5);

// OpenSSL's reason for `ec`, with the certificate check's verdict when that is what failed.
std::string Reason(const std::error_code& ec, SSL* ssl) {
  if (ssl != nullptr) {
    const long verify = SSL_get_verify_result(ssl);
    if (verify != X509_V_OK) return X509_verify_cert_error_string(verify);
  }
  if (ec == asio::error::operation_aborted) return "handshake timed out";
  if (ec == asio::error::eof || ec == asio::ssl::error::stream_truncated) {
    return "the peer closed the connection during the handshake";
  }
  std::string m = ec.message();
  // Asio's messages carry OpenSSL's error code in parentheses after the reason.
  if (auto p = m.find(" ("); p != std::string::npos) m.resize(p);
  return m;
}

// The last OpenSSL error queued on this thread, cleared.
std::string LastOpenSslError() {
  unsigned long e = ERR_get_error();
  std::string out = "unknown error";
  if (e != 0 && ERR_SYSTEM_ERROR(e)) {
    out = std::strerror(ERR_GET_REASON(e));
  } else if (e != 0) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof(buf));
    out = ERR_reason_error_string(e) != nullptr ? ERR_reason_error_string(e) : buf;
  }
  ERR_clear_error();
  return out;
}

std::string Subject(SSL* ssl) {
  X509* cert = SSL_get1_peer_certificate(ssl);
  if (cert == nullptr) return "";
  std::string out;
  if (BIO* bio = BIO_new(BIO_s_mem()); bio != nullptr) {
    X509_NAME_print_ex(bio, X509_get_subject_name(cert), 0, XN_FLAG_RFC2253);
    char* data = nullptr;
    long n = BIO_get_mem_data(bio, &data);
    if (n > 0) out.assign(data, static_cast<size_t>(n));
    BIO_free(bio);
  }
  X509_free(cert);
  return out;
}

bool LooksLikeIp(const std::string& host) {
  std::error_code ec;
  asio::ip::make_address(host, ec);
  return !ec;
}

// Moves bytes both ways between a TLS stream and a plaintext Unix socket until either closes.
// Lives on one io_context thread (its handlers are the implicit strand); owned by its handlers.
class Relay : public std::enable_shared_from_this<Relay> {
 public:
  Relay(std::unique_ptr<TlsStream> tls, Local::socket local, ContextPtr ctx,
        std::atomic<size_t>* live, std::function<void(const std::string&)> on_error = {})
      : tls_(std::move(tls)),
        local_(std::move(local)),
        linger_(local_.get_executor()),
        ctx_(std::move(ctx)),
        live_(live),
        on_error_(std::move(on_error)) {
    if (live_ != nullptr) live_->fetch_add(1);
  }
  ~Relay() {
    if (live_ != nullptr) live_->fetch_sub(1);
  }

  void Start() {
    ToTls();
    ToLocal();
  }

 private:
  void ToTls() {
    local_.async_read_some(asio::buffer(to_tls_),
                           [self = shared_from_this()](std::error_code ec, size_t n) {
                             if (ec) {
                               self->LocalClosed();
                               return;
                             }
                             asio::async_write(*self->tls_, asio::buffer(self->to_tls_.data(), n),
                                               [self](std::error_code wec, size_t) {
                                                 // The read side closes: it hears the peer's
                                                 // alert (why), which must reach on_error first.
                                                 if (wec) return;
                                                 self->ToTls();
                                               });
                           });
  }

  void ToLocal() {
    tls_->async_read_some(asio::buffer(to_local_),
                          [self = shared_from_this()](std::error_code ec, size_t n) {
                            if (ec) {
                              if (self->on_error_ && ec != asio::error::eof &&
                                  ec != asio::ssl::error::stream_truncated &&
                                  ec != asio::error::operation_aborted) {
                                self->on_error_(Reason(ec, nullptr));
                              }
                              self->Close();
                              return;
                            }
                            if (self->local_closed_) {  // nobody to give it to; keep draining
                              self->ToLocal();
                              return;
                            }
                            asio::async_write(self->local_,
                                              asio::buffer(self->to_local_.data(), n),
                                              [self](std::error_code wec, size_t) {
                                                // Nobody reads the plaintext side any more:
                                                // the TCP side gets the linger and then goes,
                                                // whether or not its peer reads.
                                                if (wec) self->LocalClosed();
                                                self->ToLocal();
                                              });
                          });
  }

  // The plaintext side is done: what it wrote has been sent; tell the TCP peer (FIN) and give it
  // kLinger to read that and close, so closing does not reset a connection with a reply unread.
  void LocalClosed() {
    if (local_closed_ || closed_) return;  // once; and never after Close (no timer holds us)
    local_closed_ = true;
    std::error_code ec;
    local_.close(ec);
    tls_->lowest_layer().shutdown(Tcp::socket::shutdown_send, ec);
    linger_.expires_after(kLinger);
    linger_.async_wait([self = shared_from_this()](std::error_code wec) {
      if (!wec) self->Close();
    });
  }

  void Close() {
    closed_ = true;
    std::error_code ec;
    linger_.cancel();
    tls_->lowest_layer().close(ec);
    local_.close(ec);
  }

  std::unique_ptr<TlsStream> tls_;
  Local::socket local_;
  asio::steady_timer linger_;
  ContextPtr ctx_;  // the SSL_CTX the stream was made from outlives it
  std::atomic<size_t>* live_;
  std::function<void(const std::string&)> on_error_;
  bool local_closed_ = false;
  bool closed_ = false;
  std::array<char, kRelayBytes> to_tls_{};
  std::array<char, kRelayBytes> to_local_{};
};

// A socketpair: [0] for the relay, [1] for the caller.
Result<std::pair<int, int>> Pair() {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    return Unavailable(std::string("socketpair: ") + std::strerror(errno));
  }
  return std::make_pair(sv[0], sv[1]);
}

Result<ContextPtr> ServerContext(const ServerOptions& o) {
  ContextPtr ctx;
  try {
    ctx = std::make_shared<asio::ssl::context>(asio::ssl::context::tls_server);
  } catch (const std::exception& e) {
    return Internal(std::string("TLS: cannot make a context: ") + e.what());
  }
  SSL_CTX* c = ctx->native_handle();
  SSL_CTX_set_min_proto_version(c, TLS1_2_VERSION);
  SSL_CTX_set_options(c, SSL_OP_NO_COMPRESSION | SSL_OP_NO_RENEGOTIATION |
                             SSL_OP_CIPHER_SERVER_PREFERENCE);
  ERR_clear_error();
  if (SSL_CTX_use_certificate_chain_file(c, o.cert_file.c_str()) != 1) {
    return InvalidArgument("tls_cert '" + o.cert_file + "': " + LastOpenSslError());
  }
  if (SSL_CTX_use_PrivateKey_file(c, o.key_file.c_str(), SSL_FILETYPE_PEM) != 1) {
    const bool mismatch = ERR_GET_REASON(ERR_peek_last_error()) == X509_R_KEY_VALUES_MISMATCH;
    const std::string why = LastOpenSslError();
    if (!mismatch) return InvalidArgument("tls_key '" + o.key_file + "': " + why);
  }
  if (SSL_CTX_check_private_key(c) != 1) {
    return InvalidArgument("tls_key '" + o.key_file + "' is not the key of tls_cert '" +
                           o.cert_file + "'");
  }
  if (!o.client_ca_file.empty()) {
    if (SSL_CTX_load_verify_locations(c, o.client_ca_file.c_str(), nullptr) != 1) {
      return InvalidArgument("tls_client_ca '" + o.client_ca_file + "': " + LastOpenSslError());
    }
    // The names of the CAs go to the client, so it knows which certificate to present.
    STACK_OF(X509_NAME)* names = SSL_load_client_CA_file(o.client_ca_file.c_str());
    if (names == nullptr) {
      return InvalidArgument("tls_client_ca '" + o.client_ca_file + "': no certificates in it");
    }
    SSL_CTX_set_client_CA_list(c, names);
    SSL_CTX_set_verify(c, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
    // Resumed sessions with client certificates need a context id (else OpenSSL refuses them).
    static const unsigned char kId[] = "gmuxd";
    SSL_CTX_set_session_id_context(c, kId, sizeof(kId) - 1);
  }
  ERR_clear_error();
  return ctx;
}

}  // namespace

Status ServerOptions::Validate() const {
  if (cert_file.empty() || key_file.empty()) {
    return InvalidArgument("TLS needs both tls_cert and tls_key");
  }
  if (!(handshake_timeout_s > 0)) return InvalidArgument("TLS handshake timeout must be > 0");
  return ServerContext(*this).status();
}

struct Gateway::Impl {
  // Before `io`: relays still owned by its handlers count themselves out of it when `io` is
  // destroyed.
  std::atomic<size_t> live{0};
  asio::io_context io{1};
  Tcp::acceptor acceptor{io};
  asio::steady_timer retry{io};
  std::thread thread;
  ServerOptions options;  // handshake limits (the files' contents are in ctx)
  std::mutex mu;
  ContextPtr ctx;  // GUARDED_BY(mu): for connections accepted from now on
  Handoff handoff;
  std::function<void(Failure)> on_failure;
  struct Pending;
  std::vector<std::weak_ptr<Pending>> pending;  // handshakes in progress; io thread only
  room::WaitingRoom waiting_room{64};            // io thread only

  ContextPtr Context() {
    std::lock_guard<std::mutex> lock(mu);
    return ctx;
  }

  void Fail(const std::string& origin, const std::string& why, bool credential = false) {
    if (on_failure) on_failure(Failure{origin, why, credential});
  }

  void Accept() {
    acceptor.async_accept([this](std::error_code ec, Tcp::socket sock) {
      if (ec == asio::error::operation_aborted) return;
      if (ec) {
        // Out of descriptors or memory for a moment: try again shortly, not in a tight loop.
        retry.expires_after(std::chrono::milliseconds(100));
        retry.async_wait([this](std::error_code wec) {
          if (!wec) Accept();
        });
        return;
      }
      Accept();
      Handshake(std::move(sock));
    });
  }

  // A handshake in progress. `why_closed` says who closed it before it finished.
  struct Pending {
    std::unique_ptr<TlsStream> stream;
    std::string origin;
    room::Clock::time_point since;
    const char* why_closed = nullptr;
  };

  // Closes a handshake in progress; its handler then runs with operation_aborted.
  static void Abort(Pending& p, const char* why) {
    if (p.stream == nullptr || p.why_closed != nullptr) return;
    p.why_closed = why;
    std::error_code ec;
    p.stream->lowest_layer().close(ec);
  }

  // Room for one more handshake from `origin`: true when there is (perhaps by closing another,
  // room::WaitingRoom's rule, which the broker applies to connections that have not said
  // hello), false when the newcomer must go.
  bool MakeRoom(const std::string& origin, room::Clock::time_point now) {
    std::vector<room::Waiter> waiting;
    std::vector<std::shared_ptr<Pending>> who;
    for (const auto& w : pending) {
      auto p = w.lock();
      if (p == nullptr || p->why_closed != nullptr) continue;
      waiting.push_back({room::OriginGroup(p->origin), p->since});
      who.push_back(std::move(p));
    }
    waiting_room.set_capacity(options.max_handshakes);
    const size_t out = waiting_room.Admit(waiting, room::OriginGroup(origin), now);
    if (out == room::kRoom) return true;
    if (out == room::kRefuse) return false;
    Abort(*who[out], "closed to make room for another handshake (max_unidentified)");
    return true;
  }

  void Forget(const std::shared_ptr<Pending>& p) {
    std::erase_if(pending, [&](const std::weak_ptr<Pending>& w) {
      auto q = w.lock();
      return q == nullptr || q == p;
    });
  }

  // After a failed handshake the socket may still hold the client's first records, unread:
  // closing it then would send a reset, and the client could lose the alert that says why. So
  // the sending half is shut, and what arrives is read and dropped until the client closes
  // (or 2 s pass).
  void Linger(std::unique_ptr<TlsStream> s) {
    struct Drain {
      std::unique_ptr<TlsStream> stream;
      asio::steady_timer timer;
      std::array<char, 4096> buf{};
    };
    auto d = std::make_shared<Drain>(Drain{std::move(s), asio::steady_timer(io), {}});
    std::error_code ec;
    d->stream->lowest_layer().shutdown(Tcp::socket::shutdown_send, ec);
    d->timer.expires_after(std::chrono::seconds(2));
    d->timer.async_wait([d](std::error_code) {
      std::error_code cec;
      d->stream->lowest_layer().close(cec);
    });
    auto read = std::make_shared<std::function<void()>>();
    *read = [d, read]() {
      d->stream->next_layer().async_read_some(
          asio::buffer(d->buf), [d, read](std::error_code rec, size_t) {
            if (rec) {
              d->timer.cancel();
              *read = nullptr;  // breaks the cycle
              return;
            }
            (*read)();
          });
    };
    (*read)();
  }

  void Handshake(Tcp::socket sock) {
    std::error_code ec;
    const auto peer = sock.remote_endpoint(ec);
    const std::string origin =
        "address " + (ec ? std::string("?") : peer.address().to_string());
    const auto now = room::Clock::now();
    if (!MakeRoom(origin, now)) {
      sock.close(ec);
      Fail(origin, "too many TLS handshakes in progress (max_unidentified)");
      return;
    }
    sock.set_option(Tcp::no_delay(true), ec);
    // Asio's accept leaves the descriptor inheritable: no hook or worker gmuxd forks may keep it.
    ::fcntl(sock.native_handle(), F_SETFD, FD_CLOEXEC);
    ContextPtr current = Context();
    auto hs = std::make_shared<Pending>();
    hs->stream = std::make_unique<TlsStream>(std::move(sock), *current);
    hs->origin = origin;
    hs->since = now;
    pending.push_back(hs);
    auto timer = std::make_shared<asio::steady_timer>(io);
    timer->expires_after(std::chrono::milliseconds(
        static_cast<int64_t>(options.handshake_timeout_s * 1e3)));
    timer->async_wait([hs](std::error_code wec) {
      if (!wec) Abort(*hs, "handshake timed out (handshake_timeout_s)");
    });
    hs->stream->async_handshake(
        asio::ssl::stream_base::server,
        [this, hs, timer, current, origin](std::error_code hec) {
          timer->cancel();
          Forget(hs);
          std::unique_ptr<TlsStream> s = std::move(hs->stream);
          if (hs->why_closed != nullptr) {
            Fail(origin, hs->why_closed);
            return;
          }
          if (hec) {
            SSL* ssl = s->native_handle();
            // A certificate shown and rejected is a failed authentication; none shown is like a
            // missing token (a client not set up, a probe): refused, not counted.
            const bool credential = SSL_get_verify_result(ssl) != X509_V_OK;
            Fail(origin, Reason(hec, ssl), credential);
            Linger(std::move(s));
            return;
          }
          auto pair = Pair();
          if (!pair.ok()) {
            Fail(origin, pair.status().message());
            return;
          }
          Local::socket local(io);
          std::error_code aec;
          local.assign(Local(), pair->first, aec);
          if (aec) {
            ::close(pair->first);
            ::close(pair->second);
            Fail(origin, "socketpair: " + aec.message());
            return;
          }
          Accepted a{pair->second, origin, Subject(s->native_handle())};
          std::make_shared<Relay>(std::move(s), std::move(local), current, &live)->Start();
          handoff(std::move(a));
        });
  }
};

Gateway::Gateway(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Result<std::unique_ptr<Gateway>> Gateway::Start(int listen_fd, const ServerOptions& options,
                                                 Handoff handoff,
                                                 std::function<void(Failure)> on_failure) {
  auto impl = std::make_unique<Impl>();
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (::getsockname(listen_fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    ::close(listen_fd);
    return Unavailable(std::string("TLS listener: ") + std::strerror(errno));
  }
  auto ctx = ServerContext(options);
  if (!ctx.ok()) {
    ::close(listen_fd);
    return ctx.status();
  }
  impl->ctx = *ctx;
  impl->options = options;
  impl->handoff = std::move(handoff);
  impl->on_failure = std::move(on_failure);
  std::error_code ec;
  impl->acceptor.assign(addr.ss_family == AF_INET6 ? Tcp::v6() : Tcp::v4(), listen_fd, ec);
  if (ec) {
    ::close(listen_fd);
    return Unavailable("TLS listener: " + ec.message());
  }
  Impl* raw = impl.get();
  raw->Accept();
  raw->thread = std::thread([raw] { raw->io.run(); });
  return std::unique_ptr<Gateway>(new Gateway(std::move(impl)));
}

Gateway::~Gateway() {
  impl_->io.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

Status Gateway::Reload(const ServerOptions& options) {
  GMUX_ASSIGN_OR_RETURN(ContextPtr ctx, ServerContext(options));
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->ctx = std::move(ctx);
  }
  // The handshake limits (handshake_timeout_s, max_unidentified) belong to the gateway's thread.
  Impl* impl = impl_.get();
  asio::post(impl->io, [impl, options] {
    impl->options.handshake_timeout_s = options.handshake_timeout_s;
    impl->options.max_handshakes = options.max_handshakes;
  });
  return Status::Ok();
}

size_t Gateway::relays() const { return impl_->live.load(); }

namespace {

// ClientConnect's thread: every OpenSSL object of the connection is made, used and freed on it
// (ThreadSanitizer cannot see OpenSSL's internal ordering when one thread frees what another
// made). `ready` gets the caller's descriptor or the error; then the relay runs here.
// The count of running ClientThreads. Never destroyed: a relay thread may still be running
// (or just finishing) while the process's static destructors run at exit.
struct ClientRelays {
  std::mutex mu;
  std::condition_variable cv;
  int running = 0;  // GUARDED_BY(mu)
};
ClientRelays& Relays() {
  static auto* relays = new ClientRelays;
  return *relays;
}

void ClientThread(int tcp_fd, ClientOptions o, std::promise<Result<int>> ready) {
  auto io = std::make_shared<asio::io_context>(1);
  auto fd = [&]() -> Result<int> {
  // The relay thread outlives main() (the ICD's connection is never torn down, the CLI exits
  // while its relay drains): OpenSSL must not free its global state from an atexit handler while
  // that thread may be inside it.
  static const bool initialized = OPENSSL_init_ssl(OPENSSL_INIT_NO_ATEXIT, nullptr) == 1;
  (void)initialized;
  ContextPtr ctx;
  try {
    ctx = std::make_shared<asio::ssl::context>(asio::ssl::context::tls_client);
  } catch (const std::exception& e) {
    ::close(tcp_fd);
    return Internal(std::string("TLS: cannot make a context: ") + e.what());
  }
  SSL_CTX* c = ctx->native_handle();
  SSL_CTX_set_min_proto_version(c, TLS1_2_VERSION);
  SSL_CTX_set_options(c, SSL_OP_NO_COMPRESSION | SSL_OP_NO_RENEGOTIATION);
  ERR_clear_error();
  auto fail = [&](Status s) {
    ::close(tcp_fd);
    return s;
  };
  if (!o.ca_file.empty()) {
    if (SSL_CTX_load_verify_locations(c, o.ca_file.c_str(), nullptr) != 1) {
      return fail(InvalidArgument("GMUX_TLS_CA '" + o.ca_file + "': " + LastOpenSslError()));
    }
  } else if (SSL_CTX_set_default_verify_paths(c) != 1) {
    return fail(InvalidArgument("TLS: the system's CA store cannot be read: " +
                                LastOpenSslError() + " (set GMUX_TLS_CA)"));
  }
  SSL_CTX_set_verify(c, SSL_VERIFY_PEER, nullptr);
  if (!o.cert_file.empty() || !o.key_file.empty()) {
    if (o.cert_file.empty() || o.key_file.empty()) {
      return fail(InvalidArgument("TLS: a client certificate needs both GMUX_TLS_CERT and "
                                  "GMUX_TLS_KEY"));
    }
    if (SSL_CTX_use_certificate_chain_file(c, o.cert_file.c_str()) != 1) {
      return fail(InvalidArgument("GMUX_TLS_CERT '" + o.cert_file + "': " +
                                  LastOpenSslError()));
    }
    if (SSL_CTX_use_PrivateKey_file(c, o.key_file.c_str(), SSL_FILETYPE_PEM) != 1 ||
        SSL_CTX_check_private_key(c) != 1) {
      return fail(InvalidArgument("GMUX_TLS_KEY '" + o.key_file + "': " + LastOpenSslError()));
    }
  }
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (::getsockname(tcp_fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    return fail(Unavailable(std::string("TLS: ") + std::strerror(errno)));
  }
  Tcp::socket sock(*io);
  std::error_code ec;
  sock.assign(addr.ss_family == AF_INET6 ? Tcp::v6() : Tcp::v4(), tcp_fd, ec);
  if (ec) return fail(Unavailable("TLS: " + ec.message()));
  auto stream = std::make_unique<TlsStream>(std::move(sock), *ctx);  // owns tcp_fd now
  SSL* ssl = stream->native_handle();
  if (LooksLikeIp(o.server_name)) {
    X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), o.server_name.c_str());
  } else {
    SSL_set_tlsext_host_name(ssl, o.server_name.c_str());
    SSL_set1_host(ssl, o.server_name.c_str());
  }
  std::error_code hec = asio::error::operation_aborted;
  bool done = false;
  stream->async_handshake(asio::ssl::stream_base::client, [&](std::error_code e) {
    hec = e;
    done = true;
  });
  io->run_for(std::chrono::milliseconds(o.timeout_ms));
  if (!done) {
    stream->lowest_layer().close(ec);
    io->restart();
    io->run();  // the handshake's handler runs, aborted
    return Unavailable("TLS handshake with " + o.server_name + " timed out");
  }
  if (hec) {
    return Unavailable("TLS handshake with " + o.server_name + " failed: " + Reason(hec, ssl) +
                       " (GMUX_TLS_CA names the CA that signed gmuxd's certificate; "
                       "GMUX_TLS_CERT/GMUX_TLS_KEY a client certificate if gmuxd asks for one)");
  }
  io->restart();
  GMUX_ASSIGN_OR_RETURN(auto pair, Pair());
  Local::socket local(*io);
  local.assign(Local(), pair.first, ec);
  if (ec) {
    ::close(pair.first);
    ::close(pair.second);
    return Unavailable("TLS: socketpair: " + ec.message());
  }
  std::make_shared<Relay>(std::move(stream), std::move(local), ctx, nullptr, o.on_error)
      ->Start();
  return pair.second;
  }();
  const bool ok = fd.ok();
  if (ok) {
    std::lock_guard<std::mutex> lock(Relays().mu);
    ++Relays().running;
  }
  ready.set_value(std::move(fd));
  if (!ok) return;
  io->run();
  io.reset();
  // OpenSSL's per-thread state is freed now, not by a thread-exit handler after the count below
  // lets main() return (at exit, OpenSSL's own cleanup would free the locks that handler uses).
  OPENSSL_thread_stop();
  std::lock_guard<std::mutex> lock(Relays().mu);
  --Relays().running;
  Relays().cv.notify_all();
}

}  // namespace

bool WaitForClientRelays(std::chrono::milliseconds timeout) {
  ClientRelays& r = Relays();
  std::unique_lock<std::mutex> lock(r.mu);
  return r.cv.wait_for(lock, timeout, [&r] { return r.running == 0; });
}

Result<int> ClientConnect(int tcp_fd, const ClientOptions& o) {
  std::promise<Result<int>> ready;
  std::future<Result<int>> result = ready.get_future();
  std::thread(ClientThread, tcp_fd, o, std::move(ready)).detach();
  return result.get();
}

ClientOptions ClientOptionsFromEnvironment() {
  auto env = [](const char* name) {
    const char* v = std::getenv(name);
    return std::string(v != nullptr ? v : "");
  };
  ClientOptions o;
  o.server_name = env("GMUX_TLS_SERVER_NAME");
  o.ca_file = env("GMUX_TLS_CA");
  o.cert_file = env("GMUX_TLS_CERT");
  o.key_file = env("GMUX_TLS_KEY");
  return o;
}

namespace {

// "HOST:PORT" ("[V6]:PORT") as host and port; false when it is not that.
bool SplitAddress(const std::string& address, std::string* host, std::string* port) {
  size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size()) return false;
  *host = address.substr(0, colon);
  *port = address.substr(colon + 1);
  if (host->size() >= 2 && host->front() == '[' && host->back() == ']') {
    *host = host->substr(1, host->size() - 2);
  }
  return true;
}

// Waits for a non-blocking connect to finish; 0 when it succeeded, else the errno.
int FinishConnect(int fd, int r, int timeout_ms) {
  if (r == 0) return 0;
  if (errno != EAGAIN && errno != EINPROGRESS) return errno;
  pollfd p{fd, POLLOUT, 0};
  int err = 0;
  socklen_t len = sizeof(err);
  if (::poll(&p, 1, timeout_ms) != 1) return ETIMEDOUT;
  if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) return errno;
  return err;
}

}  // namespace

Result<int> Dial(std::string address, ClientOptions options, int connect_timeout_ms) {
  bool plain = false;
  if (address.rfind("tcp://", 0) == 0) {
    plain = true;
    address = address.substr(6);
  } else if (address.rfind("tls://", 0) == 0) {
    address = address.substr(6);
  }
  std::string host, port;
  if (!SplitAddress(address, &host, &port)) {
    return InvalidArgument("gmuxd's address '" + address + "' is not HOST:PORT");
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* res = nullptr;
  if (int gai = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &res); gai != 0) {
    return Unavailable("cannot resolve " + address + ": " + ::gai_strerror(gai));
  }
  int fd = -1;
  int err = 0;
  for (addrinfo* ai = res; ai != nullptr && fd < 0; ai = ai->ai_next) {
    fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
    if (fd < 0) continue;
    err = FinishConnect(fd, ::connect(fd, ai->ai_addr, ai->ai_addrlen), connect_timeout_ms);
    if (err != 0) {
      ::close(fd);
      fd = -1;
    }
  }
  ::freeaddrinfo(res);
  if (fd < 0) {
    return Unavailable("cannot connect to gmuxd at " + address + ": " +
                       (err != 0 ? std::strerror(err) : "no address"));
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  // Small requests (a batch, a blocking call) must leave at once, not wait for Nagle.
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  if (plain) return fd;
  if (options.server_name.empty()) options.server_name = host;
  return ClientConnect(fd, options);
}

}  // namespace gmux::tls
