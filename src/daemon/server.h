// Server: gmuxd, the broker. It owns the listeners, the handshakes, the tenants and their
// limits, the scheduler, and the worker processes; it never calls the backend on a tenant's
// behalf (it opens the backend only to describe its devices).
//
// One broker thread runs an event loop (poll) over the listeners, the connections that have not
// said hello yet (each with a deadline and a small frame limit), and the workers starting up.
// After a valid hello it identifies the tenant (peer credentials on the Unix socket, the token
// over TCP), applies the connection limits, and hands the connection to a worker process of its
// own (gmux-worker, under the tenant's uid when gmuxd runs as root; `worker_user` for TCP
// tenants): the client's socket is passed over the worker's control channel, so its traffic
// reaches the worker with no extra hop. The scheduler thread talks to workers over their
// control channels from then on (scheduler.h). A worker that dies ends its session only: the
// broker reaps it, logs tenant, pid and signal, and counts the death for `gmux status`.
//
// Frame agents (hello with `frameAgent`, libgmux-frame.so in a GL program) are identified the
// same way and handed to the FrameHub (frame_hub.h), which runs vGASA's controllers.
//
// Control connections (hello with `control`, as `gmux status` sends) are answered by the broker
// itself: Stats with every tenant for root and the configured admins, the caller's own tenant
// otherwise. Public methods are thread-safe.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <functional>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/waiting_room.h"
#include "daemon/backend.h"
#include "daemon/config.h"
#include "daemon/frame_hub.h"
#include "daemon/ledger.h"
#include "daemon/metrics_endpoint.h"
#include "daemon/scheduler.h"
#include "tls/tls.h"

namespace gmux::daemon {

// Writes all of `bytes` to `fd` (made non-blocking) before `deadline`, or fails.
Status SendBefore(int fd, std::span<const uint8_t> bytes,
                  std::chrono::steady_clock::time_point deadline);

class Server {
 public:
  static Result<std::unique_ptr<Server>> Create(const DaemonOptions& options);
  ~Server();

  // Binds and listens on the socket (a stale socket file is replaced), starts all threads.
  Status Start();
  // Closes the listeners, kills every worker and stops; bounded in time whatever they do.
  void Stop();

  const std::string& socket_path() const { return socket_path_; }
  // The TCP port bound (the real one when the config asked for port 0); 0 without TCP.
  uint16_t tcp_port() const { return tcp_port_; }
  // The Prometheus endpoint's port (the real one for port 0); 0 when metrics are off.
  uint16_t metrics_port() const { return metrics_ ? metrics_->port() : 0; }
  const Backend& backend() const { return *backend_; }
  // Identified sessions now served by a worker.
  size_t SessionCount() const;
  // Blocks until no session is connected or `timeout` passes; true when none is left.
  bool WaitForNoSessions(std::chrono::milliseconds timeout) const;
  // SIGHUP: applies a config file read again (`file`) to the running daemon, on the broker's
  // thread, without dropping sessions: tenants (weights, limits, quotas, FPS targets, uids,
  // tokens; tenants added at run time stay unless the file now names them), [limits], admins
  // and the unknown-peer rules. An invalid result is refused whole and the running config
  // stays. Keys that need a restart are named in `restart_needed` and not applied.
  Status Reload(const DaemonOptions& file, std::vector<std::string>* restart_needed = nullptr);
  // The usage ledger (nullptr without [daemon] ledger).
  const Ledger* ledger() const { return ledger_.get(); }

 private:
  Server() = default;
  // Who a worker runs as; spare workers are kept per key.
  struct WorkerKey {
    uid_t uid = 0;
    gid_t gid = 0;
    bool tcp = false;
    auto operator<=>(const WorkerKey&) const = default;
  };
  struct Pending;  // a connection before its worker has it
  struct Spawned {
    pid_t pid = 0;
    int ctl = -1;
    WorkerKey key;
    bool up = false;
    std::chrono::steady_clock::time_point started;
    // When its key last had a session or a connection waiting (spares of other keys linger
    // only a little after their last session).
    std::chrono::steady_clock::time_point wanted;
    std::string cache_dir;  // removed when the worker is gone (TCP workers' private cache)
  };
  struct Served {  // a session as the broker knows it (its worker holds the real one)
    uint64_t id = 0;
    TenantId tenant = 0;
    std::string tenant_name;
    pid_t pid = 0;
    std::string identity;
    std::string cache_dir;
    WorkerKey key;
    TenantLimits limits;
  };

  Status StartTcp();
  void Loop();
  void Accept(int listen_fd, bool tcp);
  // A connection accepted (by Accept, or by the TLS gateway: AdmitTls) joins pending_, unless
  // its origin is blocked or has too many connections waiting.
  void Admit(std::unique_ptr<Pending> p);
  void AdmitTls(tls::Accepted a);
  // Room for one more connection before hello: true when there is (perhaps by closing another
  // that has said nothing, room::WaitingRoom's rule), false when the newcomer must go.
  bool MakeRoomForUnidentified(const Pending& newcomer);
  void OnReadable(Pending& p);
  // The hello (or a control connection's request) is in: act on it. False: drop the connection.
  bool OnFrame(Pending& p);
  void ServeControl(Pending& p, uint64_t seq);
  struct LeaseRequest {  // `gmux lease` (a control connection's LeaseOp)
    std::string action, tenant;
    uint64_t id = 0;
    double for_s = 0;
    int device = -1;
  };
  void ServeLease(Pending& p, uint64_t seq, const LeaseRequest& op);
  struct FramesRequest {  // `gmux frames` (a control connection's FramesOp)
    std::string action, policy, renderer, tenant;
    double fps = 0;
  };
  void ServeFrames(Pending& p, uint64_t seq, const FramesRequest& op);
  // `gmux usage` / `gmux tenant` (an AdminOp): JSON arguments in, JSON answer out.
  void ServeAdmin(Pending& p, uint64_t seq, const std::string& command, const std::string& args);
  // `gmux usage`: the caller's query (its own tenant's unless it is an admin), then answered on
  // a thread of its own that owns `fd` (at most kMaxUsageQueries at once).
  Result<LedgerQuery> UsageQuery(const Pending& p, const std::string& args) const;
  static void RunUsageQuery(int fd, uint64_t seq, LedgerQuery q, std::string path,
                            double interval_s, proto::FrameLimits limits,
                            std::shared_ptr<std::atomic<int>> running);
  static constexpr int kMaxUsageQueries = 4;
  std::shared_ptr<std::atomic<int>> usage_queries_ = std::make_shared<std::atomic<int>>(0);
  Result<std::string> AdminTenant(const Pending& p, const std::string& args);
  // A Slurm job's usage so far into its AdminComment (slurm.h), asked by the job's TaskEpilog.
  void ServeSlurmComment(Pending& p, uint64_t seq, const std::string& args);
  struct JobsInFlight {
    std::mutex mu;
    std::condition_variable cv;  // a write ended
    std::set<uint64_t> jobs;     // GUARDED_BY(mu): being written
    std::map<uint64_t, std::chrono::steady_clock::time_point> last;  // GUARDED_BY(mu)
  };
  // Jobs whose comment is being written (shared with the writing threads).
  std::shared_ptr<JobsInFlight> slurm_comments_ = std::make_shared<JobsInFlight>();
  // Makes `next` the running options (validated first; nothing changes on an error): the
  // weights, limits, quotas and FPS targets of connected tenants change in place.
  Status ApplyOptions(DaemonOptions next);
  nlohmann::json TenantJson(const TenantConfig& t) const;
  // Runs `fn` on the broker thread and waits for it (at most 10 s).
  Status OnBroker(std::function<Status()> fn);
  void RunBrokerTasks();
  // A frame agent's hello: its socket goes to the frame controller. False: drop it.
  bool AdoptFrameAgent(Pending& p, uint64_t seq, const std::string& program,
                       const std::string& renderer);
  void ReplyError(int fd, uint64_t seq, const std::string& message);
  // Writes `b` to a control or agent connection blocking, at most 2 s (the peer waits for it).
  Status ReplyBlocking(int fd, capnp::MessageBuilder& b);
  Status SendHelloReply(int fd, const std::string& tenant, uint64_t session);
  // Starts a worker for `key`; its WorkerUp arrives on its control channel.
  Result<Spawned> Spawn(const WorkerKey& key);
  void OnWorkerUp(Spawned& w);
  void Assign(std::unique_ptr<Pending> p, Spawned w);
  void TopUpSpares(const WorkerKey& key);
  // Ends spare workers whose key has had no session nor connection for a while.
  void RetireSpares();
  void OnWorkerGone(uint64_t session, pid_t pid, Scheduler::GoneReason why);
  // Sends each session of `tenant` (but `except`) its share of the tenant's limits.
  void ShareLimits(TenantId tenant, uint64_t except);
  void Reap();
  std::string CacheDirFor(const WorkerKey& key, uint64_t serial);
  bool IsAdmin(const Pending& p) const;
  bool IsAdminToken(const std::string& token) const;
  // Failed authentications per origin (a TCP peer's address, a local uid): `auth_failures`
  // within auth_block_s block the origin's connections for auth_block_s.
  void NoteAuthFailure(const std::string& origin);
  double AuthBlockedFor(const std::string& origin) const;  // seconds left; <= 0: not blocked
  // One connection or session of `identity` ended (no-op for an empty identity).
  void ReleaseIdentity(const std::string& identity);

  DaemonOptions options_;
  uint64_t pool_mask_ = 0;  // exclusive devices (bit i: device i)
  std::string socket_path_;
  std::string worker_path_;
  std::string state_dir_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<FrameHub> frames_;  // frame agents (vGASA)
  std::unique_ptr<MetricsEndpoint> metrics_;  // [daemon] metrics_listen
  std::unique_ptr<Ledger> ledger_;            // [daemon] ledger
  std::unique_ptr<tls::Gateway> tls_;         // [daemon] listen with tls_cert: owns the listener
  // Tenants added with `gmux tenant add` (not in the config file): kept across SIGHUP.
  std::set<std::string> runtime_tenants_;
  std::mutex tasks_mu_;
  std::deque<std::function<void()>> tasks_;   // for the broker thread (OnBroker)
  int listen_fd_ = -1;
  int tcp_fd_ = -1;
  uint16_t tcp_port_ = 0;
  int wake_pipe_[2] = {-1, -1};
  std::thread thread_;
  std::atomic<bool> stopping_{false};
  bool root_ = false;
  uid_t tcp_uid_ = 0;
  gid_t tcp_gid_ = 0;

  // Broker-thread state.
  std::vector<std::unique_ptr<Pending>> pending_;
  room::WaitingRoom local_room_{64}, tcp_room_{64};  // for pending_ not yet identified
  std::vector<Spawned> spawning_;               // started, or up and spare
  std::map<std::string, TenantId> tenant_ids_;  // name -> dense id, for the policy
  std::map<TenantId, int> tenant_sessions_;     // sessions per tenant
  std::map<std::string, int> identity_conns_;   // per uid/token: pending + sessions
  struct AuthFailures {
    std::deque<std::chrono::steady_clock::time_point> times;  // within the window
    std::chrono::steady_clock::time_point blocked_until{};
  };
  std::map<std::string, AuthFailures> auth_failures_;
  uint64_t next_session_ = 1;
  uint64_t next_spawn_ = 1;
  struct Reaping {
    pid_t pid;
    uint64_t session;
    Scheduler::GoneReason why;
    std::chrono::steady_clock::time_point since;
    bool killed;
  };
  std::vector<Reaping> reaping_;

  mutable std::mutex mu_;  // guards sessions_, gone_
  mutable std::condition_variable sessions_cv_;
  std::map<uint64_t, Served> sessions_;
  std::map<pid_t, Served> reaped_info_;  // sessions whose worker is being reaped
  std::deque<std::tuple<uint64_t, pid_t, Scheduler::GoneReason>> gone_;  // from the scheduler
};

}  // namespace gmux::daemon
