// DaemonOptions: everything gmuxd is configured with, and its TOML loader.
//
// Defaults (no config file at all): serve every device of the first non-gmux vendor ICD, policy
// `fifo`, socket DefaultSocketPath(), every local user its own tenant ("uid-<N>"), weight 1.
// See docs/operations.md for the file format; every key is optional. Errors name the file, the
// line and the key.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "tls/tls.h"
#include "core/frame_controller.h"
#include "core/policy.h"
#include "core/sla_policy.h"
#include "daemon/backend.h"
#include "proto/frame.h"

namespace gmux::daemon {

// What happens to a local peer whose uid no [[tenant]] lists.
enum class UnknownPeers {
  kOwnTenant,  // each uid becomes its own tenant "uid-<N>" (default)
  kShared,     // all of them share the tenant `default_tenant`
  kReject,     // the handshake fails
};

// What happens to a TCP client whose token no [[tenant]] lists.
enum class UnknownTokens {
  kReject,  // the handshake fails (default)
  kShared,  // the client gets the tenant `default_tenant`
};

// Per-tenant limits ([limits] defaults, overridden per [[tenant]]). 0: no limit.
struct TenantLimits {
  double command_time_limit_s = 60;        // watchdog: one dispatch's time on a device
  uint64_t max_queued_commands = 100000;   // per tenant: submitted, not completed
  uint64_t max_events = 100000;            // per tenant: live event ids
  uint64_t max_objects = 65536;            // per tenant: live OpenCL objects
  uint64_t max_bulk_bytes = 2ull << 30;    // per tenant: staged transfer bytes
  // Each of the tenant's worker processes (one per session), set with setrlimit before it
  // serves the session, hard and soft, so tenant code cannot raise them again:
  uint64_t worker_memory_bytes = 0;        // RLIMIT_DATA (heap, device buffers of a CPU device)
  uint64_t worker_open_files = 1024;       // RLIMIT_NOFILE
  // Device memory per device, across all of the tenant's sessions (buffers and images; the
  // tenant sees it as the device's memory). 0: no quota.
  uint64_t memory_quota = 0;
};

// The keys of [limits] and of a [[tenant]]'s limits.
inline constexpr std::string_view kTenantLimitKeys[] = {
    "command_time_limit_s", "max_queued_commands", "max_events",       "max_objects",
    "max_bulk_bytes",       "worker_memory_bytes", "worker_open_files", "memory_quota"};

struct TenantConfig {
  std::string name;
  double weight = 1.0;
  TenantLimits limits;
  std::vector<uint32_t> uids;  // local peers mapped to this tenant
  std::vector<std::string> tokens;  // TCP clients presenting one of these are this tenant
  double fps_target = 0;  // frame agents' SLA target (vGASA); 0: [frames] criterion_fps
  // A Slurm job whose processes are this tenant, whatever their uid (0: none). Known from the
  // peer's cgroup (slurm.h); registered by the prolog (docs/cluster.md).
  uint64_t slurm_job = 0;
};

// A TCP listen address "HOST:PORT" ("[V6]:PORT" for IPv6); port 0 picks a free port.
struct ListenAddress {
  std::string host;
  uint16_t port = 0;
};
// Tokens in a config may be stored hashed: "sha256:" and the hex SHA-256 of the token (`gmux
// token hash`); tokens are long random strings, so one unsalted hash suffices. HashToken gives
// that form; TokenMatches compares a configured entry (hashed or plain) with a presented
// token in time that does not depend on where they differ.
std::string HashToken(std::string_view token);
bool IsHashedToken(std::string_view configured);
bool TokenMatches(std::string_view configured, std::string_view presented);
// A configured entry in hashed form (plain entries hashed): one token given as plain text in one
// place and hashed in another compares equal.
std::string CanonicalToken(std::string_view configured);

// debug, info, warn or error.
bool ValidLogLevel(std::string_view level);

// Parses "HOST:PORT"; kInvalidArgument naming what is wrong.
Result<ListenAddress> ParseListenAddress(std::string_view text);

// A scheduling policy by name with its numeric parameters ([scheduler] or [[scheduler.device]]).
struct PolicyChoice {
  std::string name = "fifo";
  std::map<std::string, double> params;
};

// The device pool (BioCloud, docs/operations.md "Device pool"): devices with mode
// "exclusive" are lent whole, one tenant at a time, by core::LeasePool.
struct PoolOptions {
  double check_period_s = 5;  // the pool checker's period
  double idle_s = 10;         // an implicit lease with nothing queued or running this long goes
  double wait_s = 60;         // how long a context creation waits for a free device
  // Shell commands (sh -c) run when a lease is granted / given back, with GMUX_DEVICE,
  // GMUX_DEVICE_NAME, GMUX_TENANT, GMUX_LEASE and GMUX_REASON (release) in their environment;
  // a non-zero exit or a run past hook_timeout_s fails the lease. Empty: none.
  std::string attach_hook;
  std::string detach_hook;
  double hook_timeout_s = 30;
};

// Frame-rate SLAs (vGASA, docs/operations.md "Frame-rate SLAs"): the controller gmuxd runs for
// frame agents (libgmux-frame.so). Agents are grouped by their GL renderer, one SLA policy each.
struct FramesOptions {
  std::string policy = "sa";          // none, sa, fsa, esa: every renderer's default
  double criterion_fps = 30;          // the SLA criterion; a tenant's fps_target overrides it
  double control_period_s = 1.0;      // the central controller's period
  double target_usage = 1.0;          // ESA's planned usage; FSA hands idle time back up to it
  double fsa_headroom = 0.05;
  double coef_smoothing = 0.5;
  double kp = 0.1;                    // Eq. (3) gains of every agent's PI controller
  double ki = 0.5;
  int gpu_history_frames = 4;
  double min_fps = 1;                 // bounds of the PI's command F
  double max_fps = 1000;
  uint32_t max_agents = 256;          // frame agents connected at once
  // A program's device usage (the g_i of the SLA policies): "present" (its Present execution
  // times, a GPU's proxy), "process_cpu" (its CPU time over the machine's CPUs: a software
  // renderer draws on the CPU), or "auto" (process_cpu for llvmpipe/softpipe/swrast).
  std::string usage = "auto";
  // [[frames.device]]: renderers whose policy differs, as (substring of GL_RENDERER, policy).
  std::vector<std::pair<std::string, std::string>> device_policies;

  // Every agent's PI controller, and a group's SLA policy of `kind`, as these options say.
  core::FrameControllerOptions Controller() const;
  core::SlaPolicyOptions Sla(core::SlaKind kind) const;
};

struct DaemonOptions {
  std::string socket_path;                      // empty: DefaultSocketPath()
  std::string listen;                           // TCP "HOST:PORT"; empty: no TCP listener
  // TCP is TLS (docs/operations.md "TLS"): the server's certificate chain and key (PEM), and
  // optionally the CAs whose client certificates it requires. Plain TCP only with plain_tcp.
  std::string tls_cert;
  std::string tls_key;
  std::string tls_client_ca;
  bool plain_tcp = false;  // accept unencrypted TCP (a trusted network only)
  // Prometheus endpoint "HOST:PORT" (GET /metrics; docs/operations.md "Metrics"); empty: off.
  std::string metrics_listen;
  // Usage ledger (docs/operations.md "Usage ledger"): an SQLite file; empty: off. One row per
  // tenant, device and interval of ledger_interval_s.
  std::string ledger;
  double ledger_interval_s = 10;
  std::string log_level = "info";               // debug, info, warn, error
  // This many wrong tokens presented over TCP from one address within auth_block_s refuse its
  // connections for auth_block_s (0: never).
  uint32_t auth_failures = 5;
  double auth_block_s = 60;
  uint32_t socket_mode = 0666;                  // permissions of the socket file
  uint32_t max_sessions = 256;                  // identified sessions only
  double handshake_timeout_s = 5;               // a connection must say hello by then
  uint32_t max_unidentified = 64;               // connections that have not said hello yet
  uint32_t max_connections_per_identity = 64;   // per uid (Unix) or token (TCP)
  std::vector<uint32_t> admin_uids;             // see every tenant in Stats (root always)
  std::vector<std::string> admin_tokens;
  std::string worker_path;                      // empty: gmux-worker beside gmuxd
  std::string worker_user = "nobody";           // TCP tenants' workers (when run as root)
  uint32_t spare_workers = 1;                   // started ahead, per uid, for fast connects
  // How long a worker's session thread stays awake for its client's next request after it
  // answered a blocking call, in µs (proto/spin_wait.h); 0: it sleeps at once.
  uint32_t worker_spin_us = 100;
  std::string state_dir;                        // empty: "gmux-state" beside the socket
  TenantLimits limits;                          // [limits]: every tenant's defaults
  uint64_t max_bulk_bytes_per_session = 2ull << 30;  // staged upload bytes one session may hold
  uint32_t inflight_per_device = 32;            // dispatched, unfinished commands per device
  // Device memory gmuxd manages per device: every tenant's buffers and images together (0: the
  // backend's CL_DEVICE_GLOBAL_MEM_SIZE).
  uint64_t memory_bytes = 0;
  // Oversubscription (DymGPU): "off" (tenants together fit memory_bytes), or the slot placement
  // policy "baseline", "size" or "utilization"; slots of slot_bytes; a tenant that used no
  // device for memory_idle_s is idle (its data leaves the device).
  std::string memory_slots = "off";
  uint64_t slot_bytes = 64ull << 20;
  double memory_idle_s = 20;
  // Under memory_slots: a tenant whose data was just brought in keeps the device for
  // swap_batch × what that move cost, its commands picked out of turn (0: every pick as the
  // policy says, however many moves it costs).
  double swap_batch = 2;
  // A tenant alone on a device starts its commands without the scheduler's round trip
  // (docs/policies.md, "Express dispatch"); only for policies that would not hold it back.
  bool express_dispatch = true;
  proto::FrameLimits frame;
  BackendOptions backend;
  std::string policy = "fifo";
  std::map<std::string, double> policy_params;
  // Devices whose policy differs from `policy` ([[scheduler.device]] tables), by device index.
  std::map<uint32_t, PolicyChoice> device_policies;
  // Devices lent whole from the pool ([[scheduler.device]] mode = "exclusive"), by index.
  std::vector<uint32_t> exclusive_devices;
  PoolOptions pool;
  FramesOptions frames;
  UnknownPeers unknown_peers = UnknownPeers::kOwnTenant;
  UnknownTokens unknown_tokens = UnknownTokens::kReject;
  std::string default_tenant = "default";
  std::vector<TenantConfig> tenants;

  Status Validate() const;
  // The TLS keys agree with each other and, with `listen`, TCP is either TLS or plain_tcp.
  // `complete`: the options are final (a file's own check passes false: the command line may
  // still add --listen or --plain-tcp).
  Status ValidateTls(bool complete = true) const;
  // The configured tenant for a local uid, or the default rule's answer (kPermissionDenied when
  // unknown peers are rejected).
  Result<TenantConfig> TenantForUid(uint32_t uid) const;
  // The tenant whose slurm_job is `job` (nullptr when none, and for 0).
  const TenantConfig* TenantForJob(uint64_t job) const;
  // A local peer in Slurm job `job` (0: none): TenantForJob's, else as TenantForUid.
  Result<TenantConfig> TenantForPeer(uint32_t uid, uint64_t job) const;
  // The tenant a TCP client's token names, or `default_tenant` when unknown tokens are shared
  // (kPermissionDenied when they are rejected, and for an empty token then).
  Result<TenantConfig> TenantForToken(const std::string& token) const;
};

// The TLS gateway's options from [daemon] tls_cert, tls_key, tls_client_ca and the handshake
// limits.
tls::ServerOptions TlsServerOptions(const DaemonOptions& options);

// The per-device policy overrides as specs for Scheduler::Create (device facts left empty).
std::map<uint32_t, core::PolicySpec> DevicePolicySpecs(const DaemonOptions& options);

// The socket clients use when neither GMUX_SOCKET nor a config names one.
std::string DefaultSocketPath();

// Parses a config file. kNotFound for a missing file, kInvalidArgument "FILE:LINE: key 'K': ...".
Result<DaemonOptions> LoadDaemonConfig(const std::string& path);
// One [[tenant]] table (`gmux tenant add|set`): the keys it names over `base` (for a new tenant,
// base has the [limits] defaults). Errors as for a config file, with `origin` as the file name.
Result<TenantConfig> ParseTenantTable(std::string_view text, const std::string& origin,
                                      const TenantConfig& base);
Result<DaemonOptions> ParseDaemonConfig(std::string_view text, const std::string& path);

}  // namespace gmux::daemon
