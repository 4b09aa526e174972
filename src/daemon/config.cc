#include "daemon/config.h"

#include <openssl/sha.h>

#include <fstream>
#include <iterator>
#include <set>

#include "common/toml_doc.h"
#include "core/frame_controller.h"
#include "core/slot_allocator.h"

namespace gmux::daemon {

std::string DefaultSocketPath() { return "/run/gmux/gmuxd.sock"; }

core::FrameControllerOptions FramesOptions::Controller() const {
  core::FrameControllerOptions fc;
  fc.kp = kp;
  fc.ki = ki;
  fc.gpu_history_frames = gpu_history_frames;
  fc.min_fps = min_fps;
  fc.max_fps = max_fps;
  return fc;
}

core::SlaPolicyOptions FramesOptions::Sla(core::SlaKind kind) const {
  core::SlaPolicyOptions so;
  so.kind = kind;
  so.criterion_fps = criterion_fps;
  so.target_usage = target_usage;
  so.fsa_headroom = fsa_headroom;
  so.coef_smoothing = coef_smoothing;
  return so;
}

tls::ServerOptions TlsServerOptions(const DaemonOptions& options) {
  tls::ServerOptions t;
  t.cert_file = options.tls_cert;
  t.key_file = options.tls_key;
  t.client_ca_file = options.tls_client_ca;
  t.handshake_timeout_s = options.handshake_timeout_s;
  t.max_handshakes = options.max_unidentified;
  return t;
}

Status DaemonOptions::ValidateTls(bool complete) const {
  if (plain_tcp && !tls_cert.empty()) {
    return InvalidArgument("plain_tcp = true and tls_cert contradict each other: TCP is either "
                           "TLS or plain");
  }
  if (tls_cert.empty() != tls_key.empty()) {
    return InvalidArgument("TLS needs both tls_cert and tls_key");
  }
  if (!tls_client_ca.empty() && tls_cert.empty()) {
    return InvalidArgument("tls_client_ca needs tls_cert and tls_key");
  }
  if (complete && !listen.empty() && tls_cert.empty() && !plain_tcp) {
    return InvalidArgument("listen = \"" + listen + "\" needs tls_cert and tls_key (TLS), or "
                           "plain_tcp = true to accept unencrypted TCP on a trusted network");
  }
  return Status::Ok();
}

Status DaemonOptions::Validate() const {
  if (max_sessions == 0) return InvalidArgument("max_sessions must be > 0");
  if (inflight_per_device == 0) return InvalidArgument("inflight_per_device must be > 0");
  if (!listen.empty()) GMUX_RETURN_IF_ERROR(ParseListenAddress(listen).status());
  // Whether TCP is TLS or explicitly plain is checked when the server is made (the command line
  // may still add --plain-tcp to a file's listen).
  GMUX_RETURN_IF_ERROR(ValidateTls(/*complete=*/false));
  if (!metrics_listen.empty()) GMUX_RETURN_IF_ERROR(ParseListenAddress(metrics_listen).status());
  GMUX_RETURN_IF_ERROR(frame.Validate());
  GMUX_RETURN_IF_ERROR(backend.Validate());
  std::set<std::string> names;
  std::set<uint32_t> uids;
  std::set<uint64_t> jobs;
  std::set<std::string> tokens;
  for (const auto& t : tenants) {
    for (const auto& tok : t.tokens) {
      if (tok.empty()) return InvalidArgument("tenant '" + t.name + "': empty token");
      if (tok.rfind("sha256:", 0) == 0 && !IsHashedToken(tok)) {
        return InvalidArgument("tenant '" + t.name + "': a hashed token is \"sha256:\" and 64 "
                               "lowercase hex digits (gmux token hash)");
      }
      // Plain and hashed entries of one token are the same token.
      if (!tokens.insert(CanonicalToken(tok)).second) {
        return InvalidArgument("a token is given to two tenants");
      }
    }
    if (t.name.empty()) return InvalidArgument("a tenant has an empty name");
    // Names reach terminals, logs, CSV and metric labels: printable text only.
    for (unsigned char c : t.name) {
      if (c < 0x20 || c == 0x7f) {
        return InvalidArgument("tenant name '" + t.name + "' has a control character");
      }
    }
    if (t.name.size() > 128) return InvalidArgument("tenant name longer than 128 bytes");
    // "uid-N" is the automatic tenant of uid N: a configured tenant of that name would share
    // its books and scheduling with that uid's programs.
    if (t.name.rfind("uid-", 0) == 0 && t.name.size() > 4 &&
        t.name.find_first_not_of("0123456789", 4) == std::string::npos) {
      return InvalidArgument("tenant name '" + t.name + "' is reserved for uid " +
                             t.name.substr(4) + "'s automatic tenant");
    }
    if (!(t.weight > 0)) return InvalidArgument("tenant '" + t.name + "': weight must be > 0");
    if (!names.insert(t.name).second) return InvalidArgument("tenant '" + t.name + "' twice");
    for (uint32_t u : t.uids) {
      if (!uids.insert(u).second) {
        return InvalidArgument("uid " + std::to_string(u) + " is mapped to two tenants");
      }
    }
    if (t.slurm_job != 0 && !jobs.insert(t.slurm_job).second) {
      return InvalidArgument("Slurm job " + std::to_string(t.slurm_job) +
                             " is mapped to two tenants");
    }
  }
  return Status::Ok();
}

bool ValidLogLevel(std::string_view level) {
  return level == "debug" || level == "info" || level == "warn" || level == "error";
}

const TenantConfig* DaemonOptions::TenantForJob(uint64_t job) const {
  if (job == 0) return nullptr;
  for (const auto& t : tenants) {
    if (t.slurm_job == job) return &t;
  }
  return nullptr;
}

Result<TenantConfig> DaemonOptions::TenantForPeer(uint32_t uid, uint64_t job) const {
  if (const TenantConfig* t = TenantForJob(job)) return *t;
  return TenantForUid(uid);
}

Result<TenantConfig> DaemonOptions::TenantForUid(uint32_t uid) const {
  for (const auto& t : tenants) {
    for (uint32_t u : t.uids) {
      if (u == uid) return t;
    }
  }
  switch (unknown_peers) {
    case UnknownPeers::kOwnTenant:
      return TenantConfig{"uid-" + std::to_string(uid), 1.0, limits, {uid}, {}};
    case UnknownPeers::kShared:
      for (const auto& t : tenants) {
        if (t.name == default_tenant) return t;
      }
      return TenantConfig{default_tenant, 1.0, limits, {}, {}};
    case UnknownPeers::kReject:
      break;
  }
  return PermissionDenied("uid " + std::to_string(uid) + " is not a configured tenant");
}

Result<ListenAddress> ParseListenAddress(std::string_view text) {
  size_t colon = text.rfind(':');
  if (colon == std::string_view::npos || colon == 0) {
    return InvalidArgument("listen address '" + std::string(text) + "' is not HOST:PORT");
  }
  ListenAddress a;
  std::string_view host = text.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  a.host = std::string(host);
  std::string_view port = text.substr(colon + 1);
  if (port.empty() || port.size() > 5) {
    return InvalidArgument("listen address '" + std::string(text) + "': bad port");
  }
  uint32_t p = 0;
  for (char c : port) {
    if (c < '0' || c > '9') {
      return InvalidArgument("listen address '" + std::string(text) + "': bad port");
    }
    p = p * 10 + static_cast<uint32_t>(c - '0');
  }
  if (p > 65535) return InvalidArgument("listen address '" + std::string(text) + "': bad port");
  a.port = static_cast<uint16_t>(p);
  return a;
}

std::string HashToken(std::string_view token) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(token.data()), token.size(), digest);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "sha256:";
  for (unsigned char c : digest) {
    out += kHex[c >> 4];
    out += kHex[c & 15];
  }
  return out;
}

bool IsHashedToken(std::string_view configured) {
  if (configured.size() != 7 + 64 || configured.substr(0, 7) != "sha256:") return false;
  return configured.find_first_not_of("0123456789abcdef", 7) == std::string_view::npos;
}

std::string CanonicalToken(std::string_view configured) {
  return IsHashedToken(configured) ? std::string(configured) : HashToken(configured);
}

bool TokenMatches(std::string_view configured, std::string_view presented) {
  if (presented.empty()) return false;
  // A hashed entry is compared with the presented token's hash; a plain one with the token.
  // Every byte is compared, so the time taken does not tell how much of one matched.
  const std::string hashed = IsHashedToken(configured) ? HashToken(presented) : std::string();
  const std::string_view want = hashed.empty() ? presented : std::string_view(hashed);
  unsigned char diff = configured.size() == want.size() ? 0 : 1;
  for (size_t i = 0; i < configured.size(); ++i) {
    diff |= static_cast<unsigned char>(configured[i] ^ (i < want.size() ? want[i] : 0));
  }
  return diff == 0;
}

Result<TenantConfig> DaemonOptions::TenantForToken(const std::string& token) const {
  // Every entry is compared (no early exit), as TokenMatches compares every byte.
  const TenantConfig* found = nullptr;
  for (const auto& t : tenants) {
    for (const auto& tok : t.tokens) {
      if (TokenMatches(tok, token)) found = &t;
    }
  }
  if (found != nullptr) return *found;
  if (unknown_tokens == UnknownTokens::kShared) {
    for (const auto& t : tenants) {
      if (t.name == default_tenant) return t;
    }
    return TenantConfig{default_tenant, 1.0, limits, {}, {}};
  }
  return PermissionDenied(token.empty() ? "a TCP client must present a token (GMUX_TOKEN)"
                                        : "unknown token");
}

namespace {

// A table's limit keys over `base` (the [limits] defaults for a [[tenant]]).
Status ReadLimits(const TomlDoc& doc, const toml::table& t, const TenantLimits& base,
                  TenantLimits& out) {
  GMUX_ASSIGN_OR_RETURN(out.command_time_limit_s,
                        doc.Number(t, "command_time_limit_s", base.command_time_limit_s, 0));
  auto count = [&](const char* key, uint64_t def, uint64_t& v) -> Status {
    GMUX_ASSIGN_OR_RETURN(int64_t x, doc.Integer(t, key, static_cast<int64_t>(def), 0,
                                                 INT64_MAX));
    v = static_cast<uint64_t>(x);
    return Status::Ok();
  };
  GMUX_RETURN_IF_ERROR(count("max_queued_commands", base.max_queued_commands,
                             out.max_queued_commands));
  GMUX_RETURN_IF_ERROR(count("max_events", base.max_events, out.max_events));
  GMUX_RETURN_IF_ERROR(count("max_objects", base.max_objects, out.max_objects));
  GMUX_RETURN_IF_ERROR(count("max_bulk_bytes", base.max_bulk_bytes, out.max_bulk_bytes));
  if (out.max_bulk_bytes != 0 && out.max_bulk_bytes < (1u << 20)) {
    return doc.Error(t.get("max_bulk_bytes"), "max_bulk_bytes", "must be at least 1 MiB");
  }
  GMUX_RETURN_IF_ERROR(count("worker_memory_bytes", base.worker_memory_bytes,
                             out.worker_memory_bytes));
  // Below these a worker cannot even open the backend (PoCL and LLVM need about 100 MiB and
  // a few dozen descriptors before any tenant work).
  if (out.worker_memory_bytes != 0 && out.worker_memory_bytes < (256u << 20)) {
    return doc.Error(t.get("worker_memory_bytes"), "worker_memory_bytes",
                     "must be 0 (no limit) or at least 256 MiB");
  }
  GMUX_RETURN_IF_ERROR(count("worker_open_files", base.worker_open_files,
                             out.worker_open_files));
  GMUX_ASSIGN_OR_RETURN(out.memory_quota, doc.Bytes(t, "memory_quota", base.memory_quota));
  if (out.worker_open_files != 0 && out.worker_open_files < 64) {
    return doc.Error(t.get("worker_open_files"), "worker_open_files",
                     "must be 0 (no limit) or at least 64");
  }
  return Status::Ok();
}

// A [[tenant]] table over `base` (keys it does not name keep base's values).
Result<TenantConfig> ReadTenant(const TomlDoc& doc, const toml::table* tt,
                                const TenantConfig& base) {
  std::vector<std::string_view> tenant_keys = {"name", "weight", "uids", "tokens",
                                               "fps_target", "slurm_job"};
  tenant_keys.insert(tenant_keys.end(), std::begin(kTenantLimitKeys), std::end(kTenantLimitKeys));
  GMUX_RETURN_IF_ERROR(doc.OnlyKeys(*tt, tenant_keys));
  TenantConfig tc = base;
  GMUX_RETURN_IF_ERROR(ReadLimits(doc, *tt, base.limits, tc.limits));
  GMUX_ASSIGN_OR_RETURN(tc.name, doc.String(*tt, "name",
                                            base.name.empty() ? std::optional<std::string>()
                                                              : std::optional(base.name)));
  GMUX_ASSIGN_OR_RETURN(tc.weight, doc.Number(*tt, "weight", base.weight, 1e-9));
  GMUX_ASSIGN_OR_RETURN(tc.fps_target, doc.Number(*tt, "fps_target", base.fps_target, 0));
  if (tc.fps_target > 1000) {
    return doc.Error(tt->get("fps_target"), "fps_target", "must be at most 1000");
  }
  if (tt->get("uids") != nullptr) tc.uids.clear();
  GMUX_ASSIGN_OR_RETURN(std::vector<double> uids,
                        doc.Numbers(*tt, "uids", std::vector<double>{}));
  for (double u : uids) {
    if (u < 0 || u > 4294967295.0 || u != static_cast<double>(static_cast<uint32_t>(u))) {
      return doc.Error(tt->get("uids"), "uids", "expected non-negative integer uids");
    }
    tc.uids.push_back(static_cast<uint32_t>(u));
  }
  GMUX_ASSIGN_OR_RETURN(tc.tokens, doc.Strings(*tt, "tokens", base.tokens));
  GMUX_ASSIGN_OR_RETURN(int64_t job,
                        doc.Integer(*tt, "slurm_job", static_cast<int64_t>(base.slurm_job), 0));
  tc.slurm_job = static_cast<uint64_t>(job);
  return tc;
}

}  // namespace

Result<DaemonOptions> ParseDaemonConfig(std::string_view text, const std::string& path) {
  GMUX_ASSIGN_OR_RETURN(TomlDoc doc, TomlDoc::Parse(text, path));
  DaemonOptions o;
  const toml::table& root = doc.root();
  GMUX_RETURN_IF_ERROR(
      doc.OnlyKeys(root, {"daemon", "backend", "scheduler", "tenants", "tenant", "limits",
                          "pool", "frames"}));
  GMUX_ASSIGN_OR_RETURN(const toml::table* lt, doc.Table(root, "limits", false));
  if (lt != nullptr) {
    GMUX_RETURN_IF_ERROR(doc.OnlyKeys(*lt, kTenantLimitKeys));
    GMUX_RETURN_IF_ERROR(ReadLimits(doc, *lt, o.limits, o.limits));
  }

  GMUX_ASSIGN_OR_RETURN(const toml::table* d, doc.Table(root, "daemon", false));
  if (d != nullptr) {
    GMUX_RETURN_IF_ERROR(doc.OnlyKeys(
        *d, {"socket", "socket_mode", "listen", "max_sessions", "max_bulk_bytes_per_session",
             "inflight_per_device", "max_frame_bytes", "handshake_timeout_s", "max_unidentified",
             "max_connections_per_identity", "admin_uids", "admin_tokens", "worker_path",
             "worker_user", "spare_workers", "worker_spin_us", "state_dir", "express_dispatch",
             "memory_bytes", "memory_slots", "slot_bytes", "memory_idle_s", "swap_batch",
             "metrics_listen", "ledger", "ledger_interval_s", "log_level", "auth_failures",
             "auth_block_s", "tls_cert", "tls_key", "tls_client_ca", "plain_tcp"}));
    GMUX_ASSIGN_OR_RETURN(int64_t af, doc.Integer(*d, "auth_failures", 5, 0, 1000000));
    o.auth_failures = static_cast<uint32_t>(af);
    GMUX_ASSIGN_OR_RETURN(o.auth_block_s, doc.Number(*d, "auth_block_s", 60.0, 0.01));
    GMUX_ASSIGN_OR_RETURN(o.ledger, doc.String(*d, "ledger", ""));
    GMUX_ASSIGN_OR_RETURN(o.ledger_interval_s, doc.Number(*d, "ledger_interval_s", 10.0, 0.05));
    if (o.ledger_interval_s > 86400) {
      return doc.Error(d->get("ledger_interval_s"), "ledger_interval_s",
                       "must be at most 86400 (one day)");
    }
    GMUX_ASSIGN_OR_RETURN(o.log_level, doc.String(*d, "log_level", "info"));
    if (!ValidLogLevel(o.log_level)) {
      return doc.Error(d->get("log_level"), "log_level",
                       "expected \"debug\", \"info\", \"warn\" or \"error\"");
    }
    GMUX_ASSIGN_OR_RETURN(o.metrics_listen, doc.String(*d, "metrics_listen", ""));
    if (!o.metrics_listen.empty()) {
      auto ml = ParseListenAddress(o.metrics_listen);
      if (!ml.ok()) {
        return doc.Error(d->get("metrics_listen"), "metrics_listen", ml.status().message());
      }
    }
    GMUX_ASSIGN_OR_RETURN(o.memory_bytes, doc.Bytes(*d, "memory_bytes", 0));
    GMUX_ASSIGN_OR_RETURN(o.memory_slots, doc.String(*d, "memory_slots", "off"));
    if (o.memory_slots != "off" && !core::ParseSlotPolicy(o.memory_slots).ok()) {
      return doc.Error(d->get("memory_slots"), "memory_slots",
                       "expected \"off\", \"baseline\", \"size\" or \"utilization\"");
    }
    GMUX_ASSIGN_OR_RETURN(o.slot_bytes, doc.Bytes(*d, "slot_bytes", 64ull << 20));
    if (o.slot_bytes < (1u << 20)) {
      return doc.Error(d->get("slot_bytes"), "slot_bytes", "must be at least 1 MiB");
    }
    GMUX_ASSIGN_OR_RETURN(o.memory_idle_s, doc.Number(*d, "memory_idle_s", 20.0, 0.01));
    GMUX_ASSIGN_OR_RETURN(o.swap_batch, doc.Number(*d, "swap_batch", 2.0, 0));
    if (o.swap_batch > 100) {
      return doc.Error(d->get("swap_batch"), "swap_batch", "must be at most 100");
    }
    GMUX_ASSIGN_OR_RETURN(o.handshake_timeout_s, doc.Number(*d, "handshake_timeout_s", 5.0, 0.01));
    GMUX_ASSIGN_OR_RETURN(int64_t mu, doc.Integer(*d, "max_unidentified", 64, 1, 1 << 20));
    o.max_unidentified = static_cast<uint32_t>(mu);
    GMUX_ASSIGN_OR_RETURN(int64_t mc,
                          doc.Integer(*d, "max_connections_per_identity", 64, 1, 1 << 20));
    o.max_connections_per_identity = static_cast<uint32_t>(mc);
    GMUX_ASSIGN_OR_RETURN(std::vector<double> au,
                          doc.Numbers(*d, "admin_uids", std::vector<double>{}));
    for (double u : au) {
      if (u < 0 || u > 4294967295.0 || u != static_cast<double>(static_cast<uint32_t>(u))) {
        return doc.Error(d->get("admin_uids"), "admin_uids", "expected non-negative integer uids");
      }
      o.admin_uids.push_back(static_cast<uint32_t>(u));
    }
    GMUX_ASSIGN_OR_RETURN(o.admin_tokens,
                          doc.Strings(*d, "admin_tokens", std::vector<std::string>{}));
    GMUX_ASSIGN_OR_RETURN(o.worker_path, doc.String(*d, "worker_path", ""));
    GMUX_ASSIGN_OR_RETURN(o.worker_user, doc.String(*d, "worker_user", "nobody"));
    GMUX_ASSIGN_OR_RETURN(int64_t sw, doc.Integer(*d, "spare_workers", 1, 0, 64));
    o.spare_workers = static_cast<uint32_t>(sw);
    GMUX_ASSIGN_OR_RETURN(int64_t spin, doc.Integer(*d, "worker_spin_us", 100, 0, 10000));
    o.worker_spin_us = static_cast<uint32_t>(spin);
    GMUX_ASSIGN_OR_RETURN(o.state_dir, doc.String(*d, "state_dir", ""));
    GMUX_ASSIGN_OR_RETURN(o.socket_path, doc.String(*d, "socket", ""));
    GMUX_ASSIGN_OR_RETURN(o.listen, doc.String(*d, "listen", ""));
    if (!o.listen.empty()) {
      auto la = ParseListenAddress(o.listen);
      if (!la.ok()) return doc.Error(d->get("listen"), "listen", la.status().message());
    }
    GMUX_ASSIGN_OR_RETURN(o.tls_cert, doc.String(*d, "tls_cert", ""));
    GMUX_ASSIGN_OR_RETURN(o.tls_key, doc.String(*d, "tls_key", ""));
    GMUX_ASSIGN_OR_RETURN(o.tls_client_ca, doc.String(*d, "tls_client_ca", ""));
    GMUX_ASSIGN_OR_RETURN(o.plain_tcp, doc.Bool(*d, "plain_tcp", false));
    if (Status t = o.ValidateTls(/*complete=*/false); !t.ok()) {
      const char* key = d->get("plain_tcp") != nullptr && o.plain_tcp ? "plain_tcp"
                        : d->get("tls_cert") != nullptr                ? "tls_cert"
                                                                       : "listen";
      return doc.Error(d->get(key), key, t.message());
    }
    GMUX_ASSIGN_OR_RETURN(int64_t mode, doc.Integer(*d, "socket_mode", 0666, 0, 0777));
    o.socket_mode = static_cast<uint32_t>(mode);
    GMUX_ASSIGN_OR_RETURN(int64_t ms, doc.Integer(*d, "max_sessions", 256, 1, 1 << 20));
    o.max_sessions = static_cast<uint32_t>(ms);
    GMUX_ASSIGN_OR_RETURN(int64_t mb, doc.Integer(*d, "max_bulk_bytes_per_session",
                                                  static_cast<int64_t>(2ull << 30), 1 << 20,
                                                  INT64_MAX));
    o.max_bulk_bytes_per_session = static_cast<uint64_t>(mb);
    if (d->get("max_bulk_bytes_per_session") != nullptr) {
      o.limits.max_bulk_bytes = o.max_bulk_bytes_per_session;
    }
    GMUX_ASSIGN_OR_RETURN(o.express_dispatch, doc.Bool(*d, "express_dispatch", true));
    GMUX_ASSIGN_OR_RETURN(int64_t inf, doc.Integer(*d, "inflight_per_device", 32, 1, 1024));
    o.inflight_per_device = static_cast<uint32_t>(inf);
    GMUX_ASSIGN_OR_RETURN(int64_t mf, doc.Integer(*d, "max_frame_bytes",
                                                  proto::kDefaultMaxPayloadBytes,
                                                  2 * proto::kBulkChunkBytes, 1u << 30));
    if (mf % 8 != 0) {
      return doc.Error(d->get("max_frame_bytes"), "max_frame_bytes", "must be a multiple of 8");
    }
    o.frame.max_payload_bytes = static_cast<uint32_t>(mf);
  }

  GMUX_ASSIGN_OR_RETURN(const toml::table* b, doc.Table(root, "backend", false));
  if (b != nullptr) {
    GMUX_RETURN_IF_ERROR(doc.OnlyKeys(*b, {"library", "vendors_dir", "platform", "threads"}));
    GMUX_ASSIGN_OR_RETURN(o.backend.library, doc.String(*b, "library", ""));
    GMUX_ASSIGN_OR_RETURN(o.backend.vendors_dir,
                          doc.String(*b, "vendors_dir", "/etc/OpenCL/vendors"));
    GMUX_ASSIGN_OR_RETURN(o.backend.platform, doc.String(*b, "platform", ""));
    GMUX_ASSIGN_OR_RETURN(std::string threads,
                          doc.Choice(*b, "threads", "batch", {"batch", "normal"}));
    o.backend.batch_threads = threads == "batch";
  }

  GMUX_ASSIGN_OR_RETURN(const toml::table* s, doc.Table(root, "scheduler", false));
  if (s != nullptr) {
    GMUX_RETURN_IF_ERROR(doc.OnlyKeys(*s, {"policy", "params", "device"}));
    // One policy choice: `policy` and `params` of table `t`, checked by building the policy so
    // that a bad name or parameter is reported at its line.
    auto choice = [&doc](const toml::table& t, const std::string& fallback,
                         PolicyChoice& out) -> Status {
      GMUX_ASSIGN_OR_RETURN(out.name, doc.String(t, "policy", fallback));
      GMUX_ASSIGN_OR_RETURN(const toml::table* p, doc.Table(t, "params", false));
      if (p != nullptr) {
        for (const auto& [k, v] : *p) {
          std::string key(k.str());
          GMUX_ASSIGN_OR_RETURN(double x, doc.Number(*p, key, std::nullopt));
          out.params[key] = x;
        }
      }
      core::PolicySpec spec{out.name, out.params, {}};
      auto made = core::MakePolicy(spec);
      if (!made.ok()) {
        const bool param_error = p != nullptr && made.status().message().find("param") !=
                                                     std::string::npos;
        if (param_error) {
          for (const auto& [k, v] : *p) {
            if (made.status().message().find("'" + std::string(k.str()) + "'") !=
                std::string::npos) {
              return doc.Error(&v, "params." + std::string(k.str()), made.status().message());
            }
          }
          return doc.Error(t.get("params"), "params", made.status().message());
        }
        return doc.Error(t.get("policy"), "policy", made.status().message());
      }
      return Status::Ok();
    };
    PolicyChoice main_choice;
    GMUX_RETURN_IF_ERROR(choice(*s, "fifo", main_choice));
    o.policy = main_choice.name;
    o.policy_params = main_choice.params;
    GMUX_ASSIGN_OR_RETURN(auto device_tables, doc.Tables(*s, "device", false));
    for (const toml::table* dt : device_tables) {
      GMUX_RETURN_IF_ERROR(doc.OnlyKeys(*dt, {"index", "policy", "params", "mode"}));
      GMUX_ASSIGN_OR_RETURN(int64_t index, doc.Integer(*dt, "index", std::nullopt, 0, 1023));
      if (o.device_policies.count(static_cast<uint32_t>(index)) != 0) {
        return doc.Error(dt->get("index"), "index", "device " + std::to_string(index) +
                                                       " has two [[scheduler.device]] tables");
      }
      GMUX_ASSIGN_OR_RETURN(std::string mode,
                            doc.Choice(*dt, "mode", "shared", {"shared", "exclusive"}));
      if (mode == "exclusive") o.exclusive_devices.push_back(static_cast<uint32_t>(index));
      PolicyChoice c;
      GMUX_RETURN_IF_ERROR(choice(*dt, o.policy, c));
      if (dt->get("params") == nullptr && c.name == o.policy) c.params = o.policy_params;
      o.device_policies[static_cast<uint32_t>(index)] = std::move(c);
    }
  }

  GMUX_ASSIGN_OR_RETURN(const toml::table* pt, doc.Table(root, "pool", false));
  if (pt != nullptr) {
    GMUX_RETURN_IF_ERROR(doc.OnlyKeys(*pt, {"check_period_s", "idle_s", "wait_s", "attach_hook",
                                            "detach_hook", "hook_timeout_s"}));
    GMUX_ASSIGN_OR_RETURN(o.pool.check_period_s, doc.Number(*pt, "check_period_s", 5.0, 0.01));
    GMUX_ASSIGN_OR_RETURN(o.pool.idle_s, doc.Number(*pt, "idle_s", 10.0, 0));
    GMUX_ASSIGN_OR_RETURN(o.pool.wait_s, doc.Number(*pt, "wait_s", 60.0, 0));
    GMUX_ASSIGN_OR_RETURN(o.pool.hook_timeout_s, doc.Number(*pt, "hook_timeout_s", 30.0, 0.01));
    GMUX_ASSIGN_OR_RETURN(o.pool.attach_hook, doc.String(*pt, "attach_hook", ""));
    GMUX_ASSIGN_OR_RETURN(o.pool.detach_hook, doc.String(*pt, "detach_hook", ""));
    for (const char* k : {"check_period_s", "idle_s", "wait_s", "hook_timeout_s"}) {
      GMUX_ASSIGN_OR_RETURN(double v, doc.Number(*pt, k, 0.0, 0));
      if (v > 86400) return doc.Error(pt->get(k), k, "must be at most 86400 (a day)");
    }
  }

  GMUX_ASSIGN_OR_RETURN(const toml::table* ft, doc.Table(root, "frames", false));
  if (ft != nullptr) {
    FramesOptions& f = o.frames;
    GMUX_RETURN_IF_ERROR(doc.OnlyKeys(
        *ft, {"policy", "criterion_fps", "control_period_s", "target_usage", "fsa_headroom",
              "coef_smoothing", "kp", "ki", "gpu_history_frames", "min_fps", "max_fps",
              "max_agents", "usage", "device"}));
    GMUX_ASSIGN_OR_RETURN(f.usage, doc.Choice(*ft, "usage", "auto",
                                              {"auto", "present", "process_cpu"}));
    GMUX_ASSIGN_OR_RETURN(f.policy, doc.Choice(*ft, "policy", "sa", {"none", "sa", "fsa", "esa"}));
    GMUX_ASSIGN_OR_RETURN(f.criterion_fps, doc.Number(*ft, "criterion_fps", 30.0, 0.01));
    GMUX_ASSIGN_OR_RETURN(f.control_period_s, doc.Number(*ft, "control_period_s", 1.0, 0.01));
    if (f.control_period_s > 3600) {
      return doc.Error(ft->get("control_period_s"), "control_period_s", "must be at most 3600");
    }
    GMUX_ASSIGN_OR_RETURN(f.target_usage, doc.Number(*ft, "target_usage", 1.0, 0.01));
    if (f.target_usage > 1) {
      return doc.Error(ft->get("target_usage"), "target_usage", "must be in (0, 1]");
    }
    GMUX_ASSIGN_OR_RETURN(f.fsa_headroom, doc.Number(*ft, "fsa_headroom", 0.05, 0));
    GMUX_ASSIGN_OR_RETURN(f.coef_smoothing, doc.Number(*ft, "coef_smoothing", 0.5, 0.001));
    if (f.coef_smoothing > 1) {
      return doc.Error(ft->get("coef_smoothing"), "coef_smoothing", "must be in (0, 1]");
    }
    GMUX_ASSIGN_OR_RETURN(f.kp, doc.Number(*ft, "kp", 0.1));
    GMUX_ASSIGN_OR_RETURN(f.ki, doc.Number(*ft, "ki", 0.5));
    GMUX_ASSIGN_OR_RETURN(int64_t hist, doc.Integer(*ft, "gpu_history_frames", 4, 1, 1000));
    f.gpu_history_frames = static_cast<int>(hist);
    GMUX_ASSIGN_OR_RETURN(f.min_fps, doc.Number(*ft, "min_fps", 1.0, 0.01));
    GMUX_ASSIGN_OR_RETURN(f.max_fps, doc.Number(*ft, "max_fps", 1000.0, 0.01));
    GMUX_ASSIGN_OR_RETURN(int64_t agents, doc.Integer(*ft, "max_agents", 256, 1, 65536));
    f.max_agents = static_cast<uint32_t>(agents);
    if (Status st = f.Controller().Validate(); !st.ok()) {
      const char* key = f.min_fps >= f.max_fps ? "max_fps" : "ki";
      return doc.Error(ft->get(key) != nullptr ? ft->get(key) : ft->get("kp"), key, st.message());
    }
    GMUX_ASSIGN_OR_RETURN(auto dev_tables, doc.Tables(*ft, "device", false));
    for (const toml::table* dt : dev_tables) {
      GMUX_RETURN_IF_ERROR(doc.OnlyKeys(*dt, {"renderer", "policy"}));
      GMUX_ASSIGN_OR_RETURN(std::string renderer, doc.String(*dt, "renderer", std::nullopt));
      if (renderer.empty()) {
        return doc.Error(dt->get("renderer"), "renderer", "must not be empty");
      }
      GMUX_ASSIGN_OR_RETURN(std::string pol,
                            doc.Choice(*dt, "policy", std::nullopt, {"none", "sa", "fsa", "esa"}));
      f.device_policies.emplace_back(renderer, pol);
    }
  }

  GMUX_ASSIGN_OR_RETURN(const toml::table* t, doc.Table(root, "tenants", false));
  if (t != nullptr) {
    GMUX_RETURN_IF_ERROR(doc.OnlyKeys(*t, {"unknown_peers", "unknown_tokens", "default_tenant"}));
    GMUX_ASSIGN_OR_RETURN(std::string up, doc.Choice(*t, "unknown_peers", "own-tenant",
                                                     {"own-tenant", "shared", "reject"}));
    o.unknown_peers = up == "own-tenant" ? UnknownPeers::kOwnTenant
                      : up == "shared"   ? UnknownPeers::kShared
                                         : UnknownPeers::kReject;
    GMUX_ASSIGN_OR_RETURN(std::string ut, doc.Choice(*t, "unknown_tokens", "reject",
                                                     {"reject", "shared"}));
    o.unknown_tokens = ut == "reject" ? UnknownTokens::kReject : UnknownTokens::kShared;
    GMUX_ASSIGN_OR_RETURN(o.default_tenant, doc.String(*t, "default_tenant", "default"));
  }

  GMUX_ASSIGN_OR_RETURN(auto tenant_tables, doc.Tables(root, "tenant", false));
  for (const toml::table* tt : tenant_tables) {
    TenantConfig base;
    base.limits = o.limits;
    GMUX_ASSIGN_OR_RETURN(TenantConfig tc, ReadTenant(doc, tt, base));
    o.tenants.push_back(std::move(tc));
  }
  Status v = o.Validate();
  if (!v.ok()) return InvalidArgument(path + ": " + v.message());
  return o;
}

Result<TenantConfig> ParseTenantTable(std::string_view text, const std::string& origin,
                                      const TenantConfig& base) {
  GMUX_ASSIGN_OR_RETURN(TomlDoc doc, TomlDoc::Parse(text, origin));
  GMUX_RETURN_IF_ERROR(doc.OnlyKeys(doc.root(), {"tenant"}));
  GMUX_ASSIGN_OR_RETURN(auto tables, doc.Tables(doc.root(), "tenant", true));
  if (tables.size() != 1) return InvalidArgument(origin + ": expected one [[tenant]] table");
  return ReadTenant(doc, tables[0], base);
}

Result<DaemonOptions> LoadDaemonConfig(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound("cannot open config file '" + path + "'");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return ParseDaemonConfig(text, path);
}

}  // namespace gmux::daemon

namespace gmux::daemon {

std::map<uint32_t, core::PolicySpec> DevicePolicySpecs(const DaemonOptions& options) {
  std::map<uint32_t, core::PolicySpec> out;
  for (const auto& [index, c] : options.device_policies) out[index] = {c.name, c.params, {}};
  return out;
}

}  // namespace gmux::daemon
