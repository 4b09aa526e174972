// TLS on gmuxd's TCP listener, on the real runtime: OpenCL tenants (forked processes through the
// gmux ICD) reach gmuxd over TLS; what crosses the wire is checked to be ciphertext by a
// recording proxy between them; the client checks the server's certificate and name; client
// certificates are required when configured; bad peers (plain TCP, garbage, a silent handshake)
// get nothing and disturb nobody; certificates are renewed with SIGHUP; an operator's token
// manages tenants from `gmux` over TLS; and gmuxd refuses to listen unencrypted unless told.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "runtime/isolation_harness.h"
#include "runtime/test_pki.h"

namespace gmux::testing {
namespace {

using namespace iso;

constexpr const char* kToken = "tls-tenant-token";
constexpr const char* kAdminToken = "tls-operator-token";
// A kernel whose name and a buffer whose bytes are easy to find on the wire if not encrypted.
constexpr const char* kMarkerSource =
    "__kernel void gmux_plaintext_marker(__global uint* a) { a[get_global_id(0)] += 7u; }";
constexpr const char* kMarkerBytes = "GMUX-PLAINTEXT-DATA-";

// A file a tenant (another uid) may write its stderr to: made here, writable by all.
std::string ErrFile(const PrivateDaemon& daemon, const std::string& name) {
  const std::string path = daemon.dir() + "/" + name;
  std::ofstream{path};
  ::chmod(path.c_str(), 0666);
  return path;
}

// True once gmuxd's log contains `text`, polled for up to `within`.
bool LogShows(const PrivateDaemon& daemon, const std::string& text,
              std::chrono::milliseconds within) {
  const auto deadline = std::chrono::steady_clock::now() + within;
  for (;;) {
    if (daemon.Log().find(text) != std::string::npos) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(50ms);
  }
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// One PKI for the whole suite (a handful of openssl runs), removed when the process that made
// it exits (not by a forked child that exits through exit()).
struct PkiDir {
  std::string path;
  pid_t owner = ::getpid();
  ~PkiDir() {
    std::error_code ec;
    if (!path.empty() && ::getpid() == owner) std::filesystem::remove_all(path, ec);
  }
};

const TestPki& Pki() {
  static TestPki pki;
  static PkiDir dir;
  static std::string error = [] {
    char tmpl[] = "/tmp/gmux-pki-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) return std::string("mkdtemp failed");
    dir.path = tmpl;
    return MakeTestPki(tmpl, &pki);
  }();
  EXPECT_EQ(error, "");
  return pki;
}

std::string TlsConfig(bool client_certs, const std::string& cert, const std::string& key) {
  std::string c = "[daemon]\ntls_cert = \"" + cert + "\"\ntls_key = \"" + key + "\"\n";
  if (client_certs) c += "tls_client_ca = \"" + Pki().ca() + "\"\n";
  c += "admin_tokens = [\"" + std::string(kAdminToken) + "\"]\n";
  c += "[[tenant]]\nname = \"remote\"\ntokens = [\"" + std::string(kToken) + "\"]\n";
  return c;
}

// The environment of a tenant reaching gmuxd at `address` over TCP.
ChildOptions Remote(const std::string& address, const std::string& ca,
                    std::vector<std::pair<std::string, std::string>> more = {}) {
  ChildOptions o;
  o.env = {{"GMUX_SOCKET", ""}, {"GMUX_ADDRESS", address}, {"GMUX_TOKEN", kToken}};
  if (!ca.empty()) o.env.push_back({"GMUX_TLS_CA", ca});
  for (auto& kv : more) o.env.push_back(std::move(kv));
  return o;
}

// A tenant that expects no gmux device: its stderr (the ICD's reason) goes to `err_file`.
// 0 when it found none.
int ExpectNoDevice(const std::string& err_file) {
  int fd = ::open(err_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0666);
  if (fd >= 0) ::dup2(fd, 2);
  GmuxDevice d;
  return OpenGmux(d) ? 1 : 0;
}

// Runs the marker kernel over a buffer filled with kMarkerBytes and checks the result: 0 when
// right.
int MarkerTenant() {
  GmuxDevice d;
  if (!OpenGmux(d)) return 50;
  cl_program p = Build(d, kMarkerSource);
  if (p == nullptr) return 51;
  cl_int err = CL_SUCCESS;
  cl_kernel k = clCreateKernel(p, "gmux_plaintext_marker", &err);
  const size_t bytes = 1 << 20;
  std::string fill;
  while (fill.size() < bytes) fill += kMarkerBytes;
  fill.resize(bytes);
  cl_mem m = clCreateBuffer(d.context, CL_MEM_READ_WRITE, bytes, nullptr, &err);
  if (k == nullptr || m == nullptr || clSetKernelArg(k, 0, sizeof(m), &m) != CL_SUCCESS) return 52;
  if (clEnqueueWriteBuffer(d.queue, m, CL_TRUE, 0, bytes, fill.data(), 0, nullptr, nullptr) !=
      CL_SUCCESS) {
    return 53;
  }
  const size_t items = bytes / 4;
  if (clEnqueueNDRangeKernel(d.queue, k, 1, nullptr, &items, nullptr, 0, nullptr, nullptr) !=
          CL_SUCCESS ||
      clFinish(d.queue) != CL_SUCCESS) {
    return 54;
  }
  std::vector<cl_uint> back(items);
  if (clEnqueueReadBuffer(d.queue, m, CL_TRUE, 0, bytes, back.data(), 0, nullptr, nullptr) !=
      CL_SUCCESS) {
    return 55;
  }
  const auto* in = reinterpret_cast<const cl_uint*>(fill.data());
  for (size_t i = 0; i < items; ++i) {
    if (back[i] != in[i] + 7u) return 56;
  }
  clReleaseMemObject(m);
  clReleaseKernel(k);
  clReleaseProgram(p);
  return 0;
}

// A TCP proxy on 127.0.0.1 in front of gmuxd's port that keeps every byte it forwards (both
// directions, appended to a file), one connection at a time. A process of its own, not a
// thread: the tests fork tenants, and ThreadSanitizer refuses threads after a threaded fork.
class RecordingProxy {
 public:
  RecordingProxy(int target_port, const std::string& capture_file) : file_(capture_file) {
    int listen_fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    if (::bind(listen_fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
        ::listen(listen_fd, 8) != 0 ||
        ::getsockname(listen_fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      ::close(listen_fd);
      return;
    }
    std::fflush(nullptr);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      Run(listen_fd, target_port);
      ::_exit(0);
    }
    ::close(listen_fd);
    if (pid_ > 0) port_ = ntohs(a.sin_port);
  }
  ~RecordingProxy() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  int port() const { return port_; }
  std::string Captured() const {
    std::ifstream in(file_, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

 private:
  void Run(int listen_fd, int target) {
    int out = ::open(file_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND, 0644);
    for (;;) {
      int client = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
      if (client < 0) continue;
      int server = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      a.sin_port = htons(static_cast<uint16_t>(target));
      if (::connect(server, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
        Pump(client, server, out);
      }
      ::close(server);
      ::close(client);
    }
  }
  static void Pump(int client, int server, int out) {
    char buf[65536];
    for (;;) {
      pollfd p[2] = {{client, POLLIN, 0}, {server, POLLIN, 0}};
      if (::poll(p, 2, 1000) <= 0) continue;
      for (int i = 0; i < 2; ++i) {
        if ((p[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
        ssize_t n = ::read(p[i].fd, buf, sizeof(buf));
        if (n <= 0) return;
        (void)!::write(out, buf, static_cast<size_t>(n));
        const int to = i == 0 ? server : client;
        for (ssize_t off = 0; off < n;) {
          ssize_t w = ::write(to, buf + off, static_cast<size_t>(n - off));
          if (w <= 0) return;
          off += w;
        }
      }
    }
  }

  std::string file_;
  pid_t pid_ = -1;
  int port_ = 0;
};

std::string Address(int port) { return "127.0.0.1:" + std::to_string(port); }

TEST(TlsTest, ProgramRunsOverTlsAndTheWireCarriesNoPlaintext) {
  PrivateDaemon daemon;
  daemon.Start(TlsConfig(false, Pki().server_cert(), Pki().server_key()), /*tcp=*/true);
  RecordingProxy proxy(daemon.tcp_port(), daemon.dir() + "/wire");
  ASSERT_GT(proxy.port(), 0);
  // Through the proxy by IP: the certificate names 127.0.0.1.
  Child c = Child::Spawn(daemon, Remote(Address(proxy.port()), Pki().ca()),
                         [](Channel&) { return MarkerTenant(); });
  Outcome out = c.Wait(90s);
  ASSERT_TRUE(out.ok()) << out.Describe() << "\n" << daemon.Log();
  const std::string wire = proxy.Captured();
  EXPECT_GT(wire.size(), size_t{2} << 20) << "the 1 MiB write and read crossed the proxy";
  EXPECT_EQ(wire.find("gmux_plaintext_marker"), std::string::npos) << "kernel source in clear";
  EXPECT_EQ(wire.find(kMarkerBytes), std::string::npos) << "buffer data in clear";
  EXPECT_EQ(wire.find(kToken), std::string::npos) << "the token in clear";
  EXPECT_NE(daemon.Log().find("tenant 'remote' started (address 127.0.0.1"), std::string::npos)
      << daemon.Log();
  // The token never reaches the log either.
  EXPECT_EQ(daemon.Log().find(kToken), std::string::npos) << daemon.Log();
}

// The proxy's own check: with plain TCP (explicitly configured) the same program's kernel and
// data are on the wire, so their absence above means encryption, not a proxy that saw nothing.
TEST(TlsTest, PlainTcpOnlyWhenConfiguredAndThenVisibleOnTheWire) {
  PrivateDaemon daemon;
  daemon.Start("[daemon]\nplain_tcp = true\n[[tenant]]\nname = \"remote\"\ntokens = [\"" +
                   std::string(kToken) + "\"]\n",
               /*tcp=*/true);
  RecordingProxy proxy(daemon.tcp_port(), daemon.dir() + "/wire");
  ASSERT_GT(proxy.port(), 0);
  Child c = Child::Spawn(daemon, Remote("tcp://" + Address(proxy.port()), ""),
                         [](Channel&) { return MarkerTenant(); });
  ASSERT_TRUE(c.Wait(90s).ok()) << daemon.Log();
  const std::string wire = proxy.Captured();
  EXPECT_NE(wire.find("gmux_plaintext_marker"), std::string::npos);
  EXPECT_NE(wire.find(kMarkerBytes), std::string::npos);

  // Listening on TCP with neither TLS nor plain_tcp: gmuxd refuses to start, and says why.
  char tmpl[] = "/tmp/gmux-tls-cfg-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  std::ofstream(dir + "/g.toml") << "[daemon]\nlisten = \"127.0.0.1:0\"\n";
  const std::string cmd = std::string(GMUXD_PATH) + " --socket " + dir + "/s.sock --config " +
                          dir + "/g.toml --exit-after 5 > " + dir + "/out 2>&1";
  const int rc = std::system(cmd.c_str());
  EXPECT_NE(rc, 0);
  EXPECT_NE(ReadFile(dir + "/out").find("needs tls_cert and tls_key"), std::string::npos)
      << ReadFile(dir + "/out");
  std::filesystem::remove_all(dir);
}

TEST(TlsTest, ClientChecksTheServersCertificateAndName) {
  PrivateDaemon daemon;
  daemon.Start(TlsConfig(false, Pki().server_cert(), Pki().server_key()), /*tcp=*/true);
  const std::string addr = Address(daemon.tcp_port());
  // A CA that did not sign gmuxd's certificate: no device, and the reason on stderr.
  const std::string err1 = ErrFile(daemon, "untrusted.err");
  Child a = Child::Spawn(daemon, Remote(addr, Pki().other_ca()),
                         [&](Channel&) { return ExpectNoDevice(err1); });
  ASSERT_TRUE(a.Wait(60s).ok());
  EXPECT_NE(ReadFile(err1).find("unable to get local issuer certificate"), std::string::npos)
      << ReadFile(err1);
  // The right CA but another name than the certificate's.
  const std::string err2 = ErrFile(daemon, "name.err");
  Child b = Child::Spawn(daemon,
                         Remote(addr, Pki().ca(), {{"GMUX_TLS_SERVER_NAME", "gpu.example"}}),
                         [&](Channel&) { return ExpectNoDevice(err2); });
  ASSERT_TRUE(b.Wait(60s).ok());
  EXPECT_NE(ReadFile(err2).find("hostname mismatch"), std::string::npos) << ReadFile(err2);
  // By name ("localhost" is in the certificate), with the right CA: served.
  Child c = Child::Spawn(daemon, Remote("localhost:" + std::to_string(daemon.tcp_port()),
                                        Pki().ca()),
                         [](Channel&) { return GoodTenant(5); });
  EXPECT_TRUE(c.Wait(90s).ok()) << daemon.Log();
  // A client that distrusts the server is no failed authentication of the client.
  EXPECT_EQ(daemon.Log().find("failed authentications"), std::string::npos) << daemon.Log();
}

TEST(TlsTest, ClientCertificatesAreRequiredWhenConfigured) {
  PrivateDaemon daemon;
  daemon.Start(TlsConfig(true, Pki().server_cert(), Pki().server_key()), /*tcp=*/true);
  const std::string addr = Address(daemon.tcp_port());
  const std::string err1 = ErrFile(daemon, "nocert.err");
  Child a = Child::Spawn(daemon, Remote(addr, Pki().ca()),
                         [&](Channel&) { return ExpectNoDevice(err1); });
  ASSERT_TRUE(a.Wait(60s).ok());
  // With TLS 1.3 the refusal comes after the client's handshake; the alert that says why reaches
  // the client's stderr most of the time but not always (a reset can overtake it), so only the
  // refusal itself is checked here; the daemon's log below names the reason.
  const std::string err2 = ErrFile(daemon, "rogue.err");
  Child b = Child::Spawn(
      daemon,
      Remote(addr, Pki().ca(), {{"GMUX_TLS_CERT", Pki().rogue_cert()},
                                {"GMUX_TLS_KEY", Pki().rogue_key()}}),
      [&](Channel&) { return ExpectNoDevice(err2); });
  ASSERT_TRUE(b.Wait(60s).ok());
  Child c = Child::Spawn(
      daemon,
      Remote(addr, Pki().ca(), {{"GMUX_TLS_CERT", Pki().client_cert()},
                                {"GMUX_TLS_KEY", Pki().client_key()}}),
      [](Channel&) { return GoodTenant(5); });
  EXPECT_TRUE(c.Wait(90s).ok()) << daemon.Log();
  const std::string log = daemon.Log();
  // No certificate: refused, not counted (like a missing token); a rejected one is counted.
  EXPECT_NE(log.find("failed: peer did not return a certificate"), std::string::npos) << log;
  EXPECT_NE(log.find("client certificate: self-signed certificate"), std::string::npos) << log;
  EXPECT_NE(log.find("certificate CN=alice,O=team"), std::string::npos) << log;
}

// Peers that do not speak TLS, or never finish: each gets nothing, the relays and handshakes
// they took are given back, and a tenant connecting meanwhile is served.
TEST(TlsTest, BadPeersDisturbNobody) {
  PrivateDaemon daemon;
  daemon.Start(TlsConfig(false, Pki().server_cert(), Pki().server_key()), /*tcp=*/true);
  // A plain-protocol hello to the TLS port.
  {
    RawConn plain(ConnectTcp(daemon.tcp_port()));
    ASSERT_GE(plain.fd(), 0);
    EXPECT_FALSE(plain.Hello(kToken).ok());
  }
  // Garbage, and a silent peer that holds a handshake open.
  int garbage = ConnectTcp(daemon.tcp_port());
  ASSERT_GE(garbage, 0);
  std::string junk(4096, '\x16');
  for (size_t i = 0; i < junk.size(); ++i) junk[i] = static_cast<char>(i * 131 + 7);
  (void)!::write(garbage, junk.data(), junk.size());
  int silent = ConnectTcp(daemon.tcp_port());
  ASSERT_GE(silent, 0);
  Child c = Child::Spawn(daemon, Remote(Address(daemon.tcp_port()), Pki().ca()),
                         [](Channel&) { return GoodTenant(10); });
  EXPECT_TRUE(c.Wait(90s).ok()) << daemon.Log();
  // The silent peer is closed by the handshake timeout (5 s).
  pollfd p{silent, POLLIN, 0};
  char b;
  EXPECT_EQ(::poll(&p, 1, 15000), 1);
  EXPECT_LE(::read(silent, &b, 1), 0);
  ::close(silent);
  ::close(garbage);
  EXPECT_TRUE(daemon.Alive());
  // Logged just after the close the peer saw.
  EXPECT_TRUE(LogShows(daemon, "handshake timed out", 5s)) << daemon.Log();
}

// A connection to 127.0.0.1:port from the loopback address `source` (another origin).
int ConnectFrom(const char* source, int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  ::inet_pton(AF_INET, source, &a.sin_addr);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  to.sin_port = htons(static_cast<uint16_t>(port));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      ::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Handshakes in progress are limited (max_unidentified), and shared fairly: an address that
// holds all of them with silent connections loses its oldest to a newcomer from elsewhere, so it
// cannot keep every other client out for as long as it likes.
TEST(TlsTest, OneAddressCannotHoldEveryHandshake) {
  PrivateDaemon daemon;
  std::string config = TlsConfig(false, Pki().server_cert(), Pki().server_key());
  config.insert(config.find("\n") + 1, "max_unidentified = 4\nhandshake_timeout_s = 60\n");
  daemon.Start(config, /*tcp=*/true);
  std::vector<int> hogs;
  for (int i = 0; i < 6; ++i) {
    int fd = ConnectFrom("127.0.0.2", daemon.tcp_port());
    ASSERT_GE(fd, 0);
    hogs.push_back(fd);
  }
  std::this_thread::sleep_for(300ms);  // accepted: four held, the rest refused
  Child c = Child::Spawn(daemon, Remote(Address(daemon.tcp_port()), Pki().ca()),
                         [](Channel&) { return GoodTenant(3); });
  EXPECT_TRUE(c.Wait(60s).ok()) << daemon.Log();
  const std::string log = daemon.Log();
  EXPECT_NE(log.find("address 127.0.0.2 failed: too many TLS handshakes"), std::string::npos)
      << log;
  EXPECT_NE(log.find("address 127.0.0.2 failed: closed to make room"), std::string::npos) << log;
  for (int fd : hogs) ::close(fd);
}

// The attack the fair share alone did not stop: one silent connection from each of many
// addresses, reopened as soon as gmuxd closes it. A process (the tests fork tenants, and
// ThreadSanitizer forbids threads before a fork); it counts the connections it opened.
class Holder {
 public:
  Holder(int port, int addresses, const std::string& count_file) : file_(count_file) {
    std::fflush(nullptr);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      Run(port, addresses);
      ::_exit(0);
    }
  }
  ~Holder() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  // Waits (up to 10 s) until the holder has opened one connection per address, and a little
  // longer for gmuxd to have accepted them; false when it did not.
  bool Holding(int addresses) const {
    const auto until = std::chrono::steady_clock::now() + 10s;
    while (Opened() < addresses && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(20ms);
    }
    std::this_thread::sleep_for(200ms);
    return Opened() >= addresses;
  }
  // Connections opened so far (written by the holder after each).
  long Opened() const {
    std::ifstream in(file_);
    long n = 0;
    in >> n;
    return n;
  }

 private:
  void Run(int port, int addresses) {
    std::vector<std::string> from;
    for (int i = 0; i < addresses; ++i) from.push_back("127.0.0." + std::to_string(2 + i));
    std::vector<pollfd> held(from.size(), pollfd{-1, POLLIN, 0});
    long opened = 0;
    for (;;) {
      for (size_t i = 0; i < held.size(); ++i) {
        if (held[i].fd >= 0) continue;
        held[i].fd = ConnectFrom(from[i].c_str(), port);
        ++opened;
        std::ofstream(file_) << opened;
      }
      if (::poll(held.data(), held.size(), 1000) <= 0) continue;
      for (pollfd& h : held) {
        char b[256];
        if (h.revents != 0 && ::read(h.fd, b, sizeof(b)) <= 0) {  // closed by gmuxd: again
          ::close(h.fd);
          h.fd = -1;
        }
      }
    }
  }
  std::string file_;
  pid_t pid_ = -1;
};

// Many addresses holding every TLS handshake the gateway allows, reopening each one it closes,
// cannot keep a client from another address out: a newcomer displaces the handshake that has said
// nothing longest once it has had its grace (min(1 s, handshake_timeout_s / 2)).
TEST(TlsTest, ManyAddressesCannotHoldEveryHandshake) {
  PrivateDaemon daemon;
  std::string config = TlsConfig(false, Pki().server_cert(), Pki().server_key());
  config.insert(config.find("\n") + 1, "max_unidentified = 4\nhandshake_timeout_s = 60\n");
  daemon.Start(config, /*tcp=*/true);
  Holder holder(daemon.tcp_port(), 4, daemon.dir() + "/held");
  ASSERT_TRUE(holder.Holding(4));
  for (int round = 0; round < 2; ++round) {
    Child c = Child::Spawn(daemon, Remote(Address(daemon.tcp_port()), Pki().ca()),
                           [](Channel&) { return GoodTenant(3); });
    EXPECT_TRUE(c.Wait(60s).ok()) << daemon.Log();
  }
  EXPECT_TRUE(LogShows(daemon, "failed: closed to make room for another handshake", 5s))
      << daemon.Log();
  EXPECT_GT(holder.Opened(), 4);  // the holder was displaced, and came back
  EXPECT_TRUE(daemon.Alive());
}

// The broker's room for connections that have not said hello: TCP connections wait in a room of
// their own, so silent TCP connections from many addresses keep no local (Unix-socket) client
// out, not even for a moment; and a TCP client gets in past them as above.
TEST(TlsTest, SilentTcpConnectionsKeepNoLocalClientOut) {
  PrivateDaemon daemon;
  daemon.Start("[daemon]\nplain_tcp = true\nmax_unidentified = 4\nhandshake_timeout_s = 60\n"
               "[[tenant]]\nname = \"remote\"\ntokens = [\"" + std::string(kToken) + "\"]\n",
               /*tcp=*/true);
  Holder holder(daemon.tcp_port(), 4, daemon.dir() + "/held");
  ASSERT_TRUE(holder.Holding(4));
  // Local control connections, at once (well within the grace): each gets its answer.
  for (int i = 0; i < 3; ++i) EXPECT_NE(StatusJson(daemon, -1), "") << daemon.Log();
  Child local = Child::Spawn(daemon, ChildOptions{}, [](Channel&) { return GoodTenant(3); });
  EXPECT_TRUE(local.Wait(60s).ok()) << daemon.Log();
  Child remote = Child::Spawn(daemon, Remote("tcp://" + Address(daemon.tcp_port()), ""),
                              [](Channel&) { return GoodTenant(3); });
  EXPECT_TRUE(remote.Wait(60s).ok()) << daemon.Log();
  EXPECT_GT(holder.Opened(), 4);
  EXPECT_TRUE(daemon.Alive());
}

// Certificates are renewed with SIGHUP: new connections get the new one, running sessions keep
// theirs; a reload with an unreadable key is refused whole and the old certificate stays.
TEST(TlsTest, SighupRenewsTheCertificate) {
  PrivateDaemon daemon;
  char tmpl[] = "/tmp/gmux-tls-renew-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  ::chmod(tmpl, 0755);
  std::filesystem::copy_file(Pki().server_cert(), dir + "/cert.pem");
  std::filesystem::copy_file(Pki().server_key(), dir + "/key.pem");
  daemon.Start(TlsConfig(false, dir + "/cert.pem", dir + "/key.pem"), /*tcp=*/true);
  const std::string addr = Address(daemon.tcp_port());
  // A session that runs across the renewal.
  Child longer = Child::Spawn(daemon, Remote(addr, Pki().ca()), [](Channel& ch) {
    GmuxDevice d;
    if (!OpenGmux(d)) return 50;
    ch.Send(1);
    if (!ch.WaitGo()) return 51;
    return GoodTenant(3) == 0 && clFinish(d.queue) == CL_SUCCESS ? 0 : 52;
  });
  ASSERT_EQ(longer.Receive(60s), std::optional<int64_t>(1));
  // Renewed in place: another CA's certificate and key, then SIGHUP.
  std::filesystem::copy_file(Pki().other_server_cert(), dir + "/cert.pem",
                             std::filesystem::copy_options::overwrite_existing);
  std::filesystem::copy_file(Pki().other_server_key(), dir + "/key.pem",
                             std::filesystem::copy_options::overwrite_existing);
  ASSERT_EQ(::kill(daemon.pid(), SIGHUP), 0);
  ASSERT_TRUE(LogShows(daemon, "reloaded", 10s)) << daemon.Log();
  Child fresh = Child::Spawn(daemon, Remote(addr, Pki().other_ca()),
                             [](Channel&) { return GoodTenant(3); });
  EXPECT_TRUE(fresh.Wait(90s).ok()) << daemon.Log();
  const std::string err = ErrFile(daemon, "old-ca.err");
  Child old_ca = Child::Spawn(daemon, Remote(addr, Pki().ca()),
                              [&](Channel&) { return ExpectNoDevice(err); });
  EXPECT_TRUE(old_ca.Wait(60s).ok());
  longer.Go();
  EXPECT_TRUE(longer.Wait(90s).ok()) << daemon.Log();
  // A key that does not match: the reload is refused, the renewed certificate stays.
  std::filesystem::copy_file(Pki().server_key(), dir + "/key.pem",
                             std::filesystem::copy_options::overwrite_existing);
  ASSERT_EQ(::kill(daemon.pid(), SIGHUP), 0);
  EXPECT_TRUE(LogShows(daemon, "reload refused, the running config stays", 10s))
      << daemon.Log();
  Child after = Child::Spawn(daemon, Remote(addr, Pki().other_ca()),
                             [](Channel&) { return GoodTenant(2); });
  EXPECT_TRUE(after.Wait(90s).ok()) << daemon.Log();
  std::filesystem::remove_all(dir);
}

// `gmux tenant` over TLS from another host's point of view (GMUX_ADDRESS): an operator's token
// may change tenants; a tenant's token may not.
TEST(TlsTest, OperatorTokenManagesTenantsOverTls) {
  PrivateDaemon daemon;
  daemon.Start(TlsConfig(false, Pki().server_cert(), Pki().server_key()), /*tcp=*/true);
  const std::string env = "env -u GMUX_SOCKET GMUX_ADDRESS=" + Address(daemon.tcp_port()) +
                          " GMUX_TLS_CA=" + Pki().ca() + " ";
  const std::string out = daemon.dir() + "/cli.out";
  auto cli = [&](const std::string& token, const std::string& args) {
    const std::string cmd = env + "GMUX_TOKEN=" + token + " " + GMUX_CLI_PATH + " " + args +
                            " > " + out + " 2>&1";
    const int rc = std::system(cmd.c_str());
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  };
  EXPECT_EQ(cli(kAdminToken, "tenant add lab --weight 3"), 0) << ReadFile(out);
  EXPECT_EQ(cli(kAdminToken, "tenant list"), 0) << ReadFile(out);
  EXPECT_NE(ReadFile(out).find("lab"), std::string::npos) << ReadFile(out);
  EXPECT_NE(cli(kToken, "tenant remove lab"), 0);
  EXPECT_NE(ReadFile(out).find("operators"), std::string::npos) << ReadFile(out);
  EXPECT_NE(cli("not-a-token", "status"), 0);
  EXPECT_EQ(cli(kAdminToken, "tenant remove lab"), 0) << ReadFile(out);
  // Plain TCP to the TLS port: refused, with the daemon serving on.
  EXPECT_EQ(cli(kAdminToken, "status"), 0) << ReadFile(out);
  const std::string plain = "env -u GMUX_SOCKET GMUX_ADDRESS=tcp://" +
                            Address(daemon.tcp_port()) + " GMUX_TOKEN=" + kAdminToken + " " +
                            GMUX_CLI_PATH + " status > " + out + " 2>&1";
  EXPECT_NE(std::system(plain.c_str()), 0);
  EXPECT_TRUE(daemon.Alive());
}

}  // namespace
}  // namespace gmux::testing
