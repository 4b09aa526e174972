// Server: gmuxd's listener and the owner of every daemon component.
//
// Create() opens the backend platform and builds the scheduler (one policy per device);
// Start() binds the Unix socket (and the TCP listener when `listen` is configured) and starts
// the accept thread. Each accepted connection gets a session thread that performs the handshake
// (protocol version; the tenant from the peer's credentials on the Unix socket, from the hello's
// token over TCP, both through the config) and then serves the session until the client leaves; its
// objects are released then. Stop() closes the listener, disconnects every session and joins
// all threads. Public methods are thread-safe.
#pragma once

#include <atomic>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "daemon/backend.h"
#include "daemon/config.h"
#include "daemon/scheduler.h"
#include "daemon/session.h"

namespace gmux::daemon {

class Server {
 public:
  static Result<std::unique_ptr<Server>> Create(const DaemonOptions& options);
  ~Server();

  // Binds and listens on the socket (a stale socket file is replaced), starts all threads.
  Status Start();
  void Stop();

  const std::string& socket_path() const { return socket_path_; }
  // The TCP port bound (the real one when the config asked for port 0); 0 without TCP.
  uint16_t tcp_port() const { return tcp_port_; }
  const Backend& backend() const { return *backend_; }
  size_t SessionCount() const;
  // Blocks until no session is connected or `timeout` passes; true when none is left.
  bool WaitForNoSessions(std::chrono::milliseconds timeout) const;

 private:
  Server() = default;
  struct Conn {
    std::shared_ptr<SessionCore> core;
    std::thread thread;
    std::atomic<bool> finished{false};
  };
  Status StartTcp();
  void AcceptLoop();
  void Accept(int listen_fd, bool tcp);
  void Serve(Conn* conn);
  Result<TenantId> Handshake(SessionCore& core, bool tcp, std::string& error);
  void ReapFinished();

  DaemonOptions options_;
  std::string socket_path_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Scheduler> scheduler_;
  int listen_fd_ = -1;
  int tcp_fd_ = -1;
  uint16_t tcp_port_ = 0;
  int wake_pipe_[2] = {-1, -1};
  std::thread accept_thread_;
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> next_session_{1};

  mutable std::mutex mu_;  // guards conns_, tenants_, tenant_sessions_
  mutable std::condition_variable sessions_cv_;
  std::list<std::unique_ptr<Conn>> conns_;
  std::map<std::string, TenantId> tenants_;      // name -> dense id, for the policy
  std::map<TenantId, int> tenant_sessions_;      // connected sessions per tenant
};

}  // namespace gmux::daemon
