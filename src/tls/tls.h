// TLS for gmux's TCP transport (OpenSSL through Asio).
//
// gmuxd hands each client's connection to a worker process by descriptor, and TLS state cannot
// follow a descriptor into another process. So TLS ends in gmuxd, in a Gateway thread: it accepts
// on the TCP listener, does the handshake (and checks the client's certificate when the config
// names a client CA), and gives the broker one end of a socketpair as if it were the accepted
// connection. The Gateway relays between the TLS connection and the other end until either side
// closes. The broker, the session's worker and the protocol do not know TLS is there. The
// server's private key never leaves gmuxd; a tenant's worker sees only its own plaintext.
//
// The ICD does the mirror image (ClientConnect): a TLS connection to gmuxd and a relay thread,
// with the ICD's usual code on the socketpair's other end.
//
// Both relays copy through fixed buffers, one read and one write outstanding per direction, so a
// slow reader slows its own peer only. A side that closes ends the relay; the peer sees the
// other side close (no close_notify is sent: gmux's frames carry their lengths, so a truncated
// stream is detected by the frame reader, never taken for a short message).
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "common/status.h"

namespace gmux::tls {

// The server's side ([daemon] tls_cert, tls_key, tls_client_ca).
struct ServerOptions {
  std::string cert_file;       // PEM: the server's certificate, then its chain
  std::string key_file;        // PEM: its private key
  std::string client_ca_file;  // PEM CAs; non-empty: clients must present a certificate they sign
  double handshake_timeout_s = 5;
  size_t max_handshakes = 64;  // handshakes in progress at once; more connections are closed

  // Files are readable and the key matches the certificate (kInvalidArgument with the file).
  Status Validate() const;
};

// One accepted, authenticated TLS connection, as the broker gets it.
struct Accepted {
  int fd = -1;           // the broker's end of the socketpair (close-on-exec, blocking)
  std::string origin;    // "address A.B.C.D" (the TCP peer), as for a plain TCP connection
  std::string subject;   // the client certificate's subject ("CN=alice,O=team"); empty: none
};

// Accepts TLS connections on a listening TCP socket and relays them. Runs its own thread; every
// public method may be called from any thread.
class Gateway {
 public:
  using Handoff = std::function<void(Accepted)>;

  // Takes ownership of `listen_fd` (bound and listening). `handoff` runs on the gateway's thread
  // for each connection whose handshake succeeded; it owns Accepted::fd from then on.
  // `on_failure` (may be empty) hears of each failed handshake, on the gateway's thread.
  struct Failure {
    std::string origin;
    std::string why;
    // The client presented no certificate, or one the client CAs do not vouch for: a failed
    // authentication (the rest — a plain-TCP client, a client that does not trust the server, a
    // timeout — are misconfigurations or noise).
    bool credential_rejected = false;
  };
  static Result<std::unique_ptr<Gateway>> Start(int listen_fd, const ServerOptions& options,
                                                Handoff handoff,
                                                std::function<void(Failure)> on_failure = {});
  // Stops accepting and ends every relay.
  ~Gateway();

  // New certificate, key and client CA for connections accepted from now on (SIGHUP); the
  // running ones keep theirs. On error nothing changes.
  Status Reload(const ServerOptions& options);

  // Connections relayed now (handshakes in progress not counted).
  size_t relays() const;

  Gateway(const Gateway&) = delete;
  Gateway& operator=(const Gateway&) = delete;

  struct Impl;

 private:
  explicit Gateway(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The client's side (the ICD: GMUX_TLS_CA, GMUX_TLS_CERT, GMUX_TLS_KEY).
struct ClientOptions {
  std::string server_name;  // checked against the server's certificate (a host name or an IP)
  std::string ca_file;      // PEM CAs to trust; empty: the system's store
  std::string cert_file;    // PEM client certificate (with key_file), when the server asks
  std::string key_file;
  int timeout_ms = 10000;   // the handshake's limit
  // Called on the relay's thread when the server ends the connection with an error (an alert:
  // "certificate required", "unknown ca"), before the caller's end sees it close. May be empty.
  std::function<void(const std::string&)> on_error;
};

// Waits until every relay ClientConnect started has ended (its descriptor closed and the server's
// side closed, or the linger passed); false when `timeout` passed first. A program about to exit
// calls it so that no relay thread is inside OpenSSL while the process's statics go away.
bool WaitForClientRelays(std::chrono::milliseconds timeout);

// GMUX_TLS_CA, GMUX_TLS_CERT, GMUX_TLS_KEY and GMUX_TLS_SERVER_NAME (clients' environment).
ClientOptions ClientOptionsFromEnvironment();

// Connects to gmuxd's TCP address as clients name it (GMUX_ADDRESS): "HOST:PORT" ("[V6]:PORT")
// or "tls://HOST:PORT" is TLS, checked for HOST unless options.server_name is set;
// "tcp://HOST:PORT" is plain TCP (a daemon with plain_tcp). Returns the descriptor to speak the
// protocol on (blocking, close-on-exec; with TLS the relay's end). Errors: kInvalidArgument for a
// malformed address, kUnavailable when it cannot connect (with the reason).
Result<int> Dial(std::string address, ClientOptions options, int connect_timeout_ms = 2000);

// Does a TLS handshake over `tcp_fd` (connected; ownership passes here, closed on error) and
// starts a relay thread. Returns the caller's end of a socketpair (close-on-exec, blocking) that
// carries the plaintext. Errors: kUnavailable with OpenSSL's reason ("certificate verify failed",
// "handshake timed out") and what to check.
Result<int> ClientConnect(int tcp_fd, const ClientOptions& options);

}  // namespace gmux::tls
