// The broker's operator requests: `gmux usage` (the ledger), `gmux tenant` (tenants at run
// time), and SIGHUP's reload. All of it runs on the broker thread, which owns options_.
#include <unistd.h>

#include <future>
#include <thread>
#include <nlohmann/json.hpp>

#include <spdlog/spdlog.h>

#include "daemon/server.h"
#include "daemon/server_pending.h"
#include "daemon/slurm.h"

namespace gmux::daemon {
namespace {

namespace wire = proto::wire;

// Invalid UTF-8 in a tenant's text (a name from a config) must not make json::dump throw.
constexpr auto kReplaceBadUtf8 = nlohmann::json::error_handler_t::replace;

Duration SecondsToDuration(double s) {
  return std::chrono::duration_cast<Duration>(std::chrono::duration<double>(s));
}

Result<double> NumberArg(const nlohmann::json& args, const char* key, double fallback) {
  auto it = args.find(key);
  if (it == args.end() || it->is_null()) return fallback;
  if (!it->is_number()) return InvalidArgument(std::string("'") + key + "' must be a number");
  return it->get<double>();
}

Result<std::string> StringArg(const nlohmann::json& args, const char* key) {
  auto it = args.find(key);
  if (it == args.end() || it->is_null()) return std::string();
  if (!it->is_string()) return InvalidArgument(std::string("'") + key + "' must be a string");
  return it->get<std::string>();
}

// The answer to an admin request, sent by a thread of its own, which then closes `fd`: the JSON
// on success, else CL_INVALID_OPERATION and "gmuxd: " with the message.
void SendAdminAnswer(int fd, uint64_t seq, const Result<std::string>& answer,
                     const proto::FrameLimits& limits,
                     std::chrono::steady_clock::time_point deadline) {
  capnp::MallocMessageBuilder b;
  auto rep = b.initRoot<wire::Reply>();
  rep.setSeq(seq);
  if (answer.ok()) {
    rep.setStatus(CL_SUCCESS);
    rep.setAdmin(*answer);
  } else {
    rep.setStatus(CL_INVALID_OPERATION);
    rep.setMessage("gmuxd: " + answer.status().message());
  }
  auto frame = proto::EncodeFrame(proto::FrameKind::kReply, b, limits);
  if (frame.ok()) SendBefore(fd, *frame, deadline).IgnoreError();
  ::close(fd);
}

}  // namespace

void Server::ServeAdmin(Pending& p, uint64_t seq, const std::string& command,
                        const std::string& args) {
  Result<std::string> answer = InvalidArgument("unknown request '" + command +
                                               "' (expected usage, tenant or slurm-comment)");
  if (command == "usage") {
    // The query and the reply run on a thread of their own: a big ledger or a slow reader must
    // not hold the broker (every handshake waits for it).
    Result<LedgerQuery> q = UsageQuery(p, args);
    if (q.ok()) {
      if (usage_queries_->fetch_add(1) >= kMaxUsageQueries) {
        usage_queries_->fetch_sub(1);
        q = ResourceExhausted("usage: too many usage queries at once; try again");
      }
    }
    if (!q.ok()) {
      ReplyError(p.fd, seq, "gmuxd: " + q.status().message());
      return;
    }
    std::thread(RunUsageQuery, p.fd, seq, *q, ledger_->path(), options_.ledger_interval_s,
                options_.frame, usage_queries_)
        .detach();
    p.fd = -1;  // the query thread's now
    return;
  }
  if (command == "slurm-comment") {
    ServeSlurmComment(p, seq, args);
    return;
  }
  if (command == "tenant") answer = AdminTenant(p, args);
  if (!answer.ok()) {
    ReplyError(p.fd, seq, "gmuxd: " + answer.status().message());
    return;
  }
  capnp::MallocMessageBuilder b;
  auto rep = b.initRoot<wire::Reply>();
  rep.setSeq(seq);
  rep.setStatus(CL_SUCCESS);
  rep.setAdmin(*answer);
  ReplyBlocking(p.fd, b).IgnoreError();
}

Result<LedgerQuery> Server::UsageQuery(const Pending& p, const std::string& text) const {
  if (!ledger_) {
    return FailedPrecondition("this gmuxd keeps no usage ledger (set [daemon] ledger in its "
                              "config)");
  }
  nlohmann::json args = nlohmann::json::parse(text, nullptr, false);
  if (args.is_discarded() || !args.is_object()) {
    return InvalidArgument("usage: the arguments are not a JSON object");
  }
  LedgerQuery q;
  GMUX_ASSIGN_OR_RETURN(q.since, NumberArg(args, "since", 0));
  GMUX_ASSIGN_OR_RETURN(q.until, NumberArg(args, "until", 0));
  GMUX_ASSIGN_OR_RETURN(std::string tenant, StringArg(args, "tenant"));
  // Rows per answer: a tenant's own at most 10,000 (a day at 10 s intervals), an operator's
  // 100,000; the reply must also fit one frame (checked when it is built).
  const double cap = p.admin ? 100000 : 10000;
  GMUX_ASSIGN_OR_RETURN(double max_rows, NumberArg(args, "max_rows", cap));
  q.max_rows = static_cast<uint64_t>(std::clamp(max_rows, 1.0, cap));
  auto rows = args.find("rows");
  q.rows = rows != args.end() && rows->is_boolean() && rows->get<bool>();
  if (!p.admin) {
    // A tenant sees its own books only.
    if (!tenant.empty() && tenant != p.tenant.name) {
      return PermissionDenied("usage: only operators (root, admin_uids, admin_tokens) see "
                              "another tenant's usage");
    }
    tenant = p.tenant.name;
  }
  if (!tenant.empty()) q.tenant = tenant;
  return q;
}

void Server::RunUsageQuery(int fd, uint64_t seq, LedgerQuery q, std::string path,
                           double interval_s, proto::FrameLimits limits,
                           std::shared_ptr<std::atomic<int>> running) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  Result<std::vector<LedgerEntry>> entries = Ledger::Query(path, q);
  Result<std::string> answer = entries.status();
  if (entries.ok()) {
    nlohmann::json out = {{"ledger", path},
                          {"interval_s", interval_s},
                          {"since", q.since},
                          {"until", q.until},
                          {"rows", q.rows},
                          {"tenant", q.tenant ? nlohmann::json(*q.tenant) : nlohmann::json()}};
    nlohmann::json list = nlohmann::json::array();
    for (const LedgerEntry& e : *entries) list.push_back(LedgerEntryJson(e));
    out["entries"] = std::move(list);
    answer = out.dump(-1, ' ', false, kReplaceBadUtf8);
    if (answer->size() + 4096 > limits.max_payload_bytes) {
      answer = InvalidArgument("usage: the answer is larger than one frame; narrow "
                               "--since/--until or --tenant, or read the file with --ledger");
    }
  }
  SendAdminAnswer(fd, seq, answer, limits, deadline);
  running->fetch_sub(1);
}

void Server::ServeSlurmComment(Pending& p, uint64_t seq, const std::string& text) {
  // Who may ask: a process of the job itself (its cgroup says so: the job's TaskEpilog runs
  // as its user, inside it), or an operator naming the job.
  nlohmann::json args = nlohmann::json::parse(text, nullptr, false);
  uint64_t job = p.slurm_job;
  if (p.admin && args.is_object() && args.contains("job") && args["job"].is_number_unsigned()) {
    job = args["job"].get<uint64_t>();
  }
  Status why = Status::Ok();
  const TenantConfig* tenant = nullptr;
  if (job == 0) {
    why = PermissionDenied("slurm-comment: only a process of a Slurm job (for its own job) or "
                           "an operator may ask");
  } else if (!ledger_) {
    why = FailedPrecondition("slurm-comment: this gmuxd keeps no usage ledger");
  } else {
    tenant = options_.TenantForJob(job);
    if (tenant == nullptr) {
      why = NotFound("slurm-comment: job " + std::to_string(job) + " is no tenant (the gmux "
                     "prolog registers it)");
    } else {
      // One write per job at a time, and at most one a second: a job's process cannot keep
      // gmuxd booking and running scontrol.
      std::lock_guard<std::mutex> lock(slurm_comments_->mu);
      const auto now = std::chrono::steady_clock::now();
      auto last = slurm_comments_->last.find(job);
      if (slurm_comments_->jobs.count(job) != 0 ||
          (last != slurm_comments_->last.end() && now - last->second < std::chrono::seconds(1))) {
        why = ResourceExhausted("slurm-comment: job " + std::to_string(job) +
                                "'s comment was just written; try again");
      } else {
        slurm_comments_->jobs.insert(job);
        if (slurm_comments_->last.size() >= 4096) {
          std::erase_if(slurm_comments_->last, [&](const auto& e) {
            return now - e.second > std::chrono::seconds(1);
          });
        }
        slurm_comments_->last[job] = now;
      }
    }
  }
  if (!why.ok()) {
    ReplyError(p.fd, seq, "gmuxd: " + why.message());
    return;
  }
  LedgerQuery q;
  q.tenant = tenant->name;
  // Off the broker thread: the booking (it waits for the scheduler and SQLite), the query,
  // scontrol (a round trip to slurmctld), the reply. Stop() waits for these threads.
  std::thread([fd = p.fd, seq, job, q, ledger = ledger_.get(), limits = options_.frame,
               in_flight = slurm_comments_] {
    if (Status booked = ledger->BookNow(); !booked.ok()) {
      spdlog::warn("ledger: booking for job {}'s comment: {}", job, booked.message());
    }
    const Result<std::string> answer = [&]() -> Result<std::string> {
      auto entries = Ledger::Query(ledger->path(), q);
      if (!entries.ok()) return entries.status().WithPrefix("slurm-comment");
      const std::string comment = SlurmUsageComment(*entries);
      if (Status set = SetSlurmAdminComment(job, comment); !set.ok()) {
        spdlog::warn("Slurm job {}: AdminComment not set: {}", job, set.message());
        return set.WithPrefix("slurm-comment");
      }
      spdlog::info("Slurm job {}: AdminComment {}", job, comment);
      return nlohmann::json{{"job", job}, {"tenant", *q.tenant}, {"admin_comment", comment}}
          .dump(-1, ' ', false, kReplaceBadUtf8);
    }();
    SendAdminAnswer(fd, seq, answer, limits,
                    std::chrono::steady_clock::now() + std::chrono::seconds(5));
    std::lock_guard<std::mutex> lock(in_flight->mu);
    in_flight->jobs.erase(job);
    in_flight->cv.notify_all();
  }).detach();
  p.fd = -1;  // the thread's now
}

nlohmann::json Server::TenantJson(const TenantConfig& t) const {
  const TenantLimits& l = t.limits;
  auto id = tenant_ids_.find(t.name);
  int sessions = 0;
  if (id != tenant_ids_.end()) {
    auto n = tenant_sessions_.find(id->second);
    if (n != tenant_sessions_.end()) sessions = n->second;
  }
  return {{"name", t.name},
          {"weight", t.weight},
          {"uids", t.uids},
          {"tokens", t.tokens.size()},  // never the tokens themselves
          {"fps_target", t.fps_target},
          {"slurm_job", t.slurm_job},
          {"origin", runtime_tenants_.count(t.name) != 0 ? "run-time" : "config"},
          {"sessions", sessions},
          {"limits",
           {{"command_time_limit_s", l.command_time_limit_s},
            {"max_queued_commands", l.max_queued_commands},
            {"max_events", l.max_events},
            {"max_objects", l.max_objects},
            {"max_bulk_bytes", l.max_bulk_bytes},
            {"worker_memory_bytes", l.worker_memory_bytes},
            {"worker_open_files", l.worker_open_files},
            {"memory_quota", l.memory_quota}}}};
}

Result<std::string> Server::AdminTenant(const Pending& p, const std::string& text) {
  nlohmann::json args = nlohmann::json::parse(text, nullptr, false);
  if (args.is_discarded() || !args.is_object()) {
    return InvalidArgument("tenant: the arguments are not a JSON object");
  }
  GMUX_ASSIGN_OR_RETURN(std::string action, StringArg(args, "action"));
  GMUX_ASSIGN_OR_RETURN(std::string name, StringArg(args, "name"));
  GMUX_ASSIGN_OR_RETURN(std::string table, StringArg(args, "toml"));
  if (action == "list") {
    nlohmann::json list = nlohmann::json::array();
    for (const TenantConfig& t : options_.tenants) {
      if (p.admin || t.name == p.tenant.name) list.push_back(TenantJson(t));
    }
    nlohmann::json out = {{"tenants", std::move(list)}};
    if (!p.admin) out["note"] = "a tenant sees its own entry only";
    return out.dump(-1, ' ', false, kReplaceBadUtf8);
  }
  if (action != "add" && action != "set" && action != "remove") {
    return InvalidArgument("tenant: unknown action '" + action +
                           "' (expected list, add, set or remove)");
  }
  if (!p.admin) {
    return PermissionDenied("tenant " + action + ": changing tenants is for operators (root, "
                            "[daemon] admin_uids or admin_tokens)");
  }
  if (name.empty()) return InvalidArgument("tenant " + action + ": name a tenant");
  auto at = std::find_if(options_.tenants.begin(), options_.tenants.end(),
                         [&](const TenantConfig& t) { return t.name == name; });
  DaemonOptions next = options_;
  auto next_at = next.tenants.begin() + (at - options_.tenants.begin());
  TenantConfig changed;
  const std::string origin = "gmux tenant " + action;
  if (action == "add") {
    if (at != options_.tenants.end()) {
      return AlreadyExists("tenant add: '" + name + "' exists (use gmux tenant set)");
    }
    TenantConfig base;
    base.name = name;
    base.limits = options_.limits;
    GMUX_ASSIGN_OR_RETURN(changed, ParseTenantTable(table, origin, base));
    if (changed.name != name) return InvalidArgument(origin + ": the table names another tenant");
    next.tenants.push_back(changed);
  } else if (at == options_.tenants.end()) {
    return NotFound("tenant " + action + ": no tenant '" + name + "'");
  } else if (action == "set") {
    GMUX_ASSIGN_OR_RETURN(changed, ParseTenantTable(table, origin, *at));
    if (changed.name != name) {
      return InvalidArgument(origin + ": a tenant cannot be renamed (remove it and add it)");
    }
    *next_at = changed;
  } else {
    changed = *at;
    next.tenants.erase(next_at);
  }
  GMUX_RETURN_IF_ERROR(ApplyOptions(std::move(next)));
  if (action == "add") runtime_tenants_.insert(name);
  // The answer shows the tenant as it was (a removed run-time tenant is still "run-time").
  nlohmann::json shown = TenantJson(changed);
  if (action == "remove") runtime_tenants_.erase(name);
  spdlog::info("tenant '{}' {} by {} (weight {})", name.c_str(),
               action == "add" ? "added" : action == "set" ? "changed" : "removed",
               p.tcp ? "an admin token" : ("uid " + std::to_string(p.uid)).c_str(),
               changed.weight);
  nlohmann::json out = {{"ok", true}, {"action", action}, {"tenant", std::move(shown)}};
  if (action == "remove") {
    out["note"] = "sessions already connected keep running with the tenant's last settings";
    // Its books so far are closed now (a Slurm epilog reads them at once: docs/cluster.md).
    if (ledger_) {
      if (Status booked = ledger_->BookNow(); !booked.ok()) {
        spdlog::warn("ledger: booking at the removal of tenant '{}': {}", name,
                     booked.message());
      }
    }
  }
  return out.dump(-1, ' ', false, kReplaceBadUtf8);
}

Status Server::ApplyOptions(DaemonOptions next) {
  GMUX_RETURN_IF_ERROR(next.Validate());
  std::map<std::string, double> targets;
  for (const TenantConfig& t : next.tenants) {
    targets[t.name] = t.fps_target;
    auto id = tenant_ids_.find(t.name);
    if (id == tenant_ids_.end()) continue;  // never connected: nothing runs to change
    scheduler_->SetTenant(id->second, t.weight,
                          SecondsToDuration(t.limits.command_time_limit_s));
    scheduler_->SetMemoryQuota(id->second, t.limits.memory_quota);
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& [sid, s] : sessions_) {
        if (s.tenant == id->second) s.limits = t.limits;
      }
    }
    ShareLimits(id->second, 0);
  }
  frames_->SetTenantTargets(targets);
  options_ = std::move(next);
  return Status::Ok();
}

Status Server::OnBroker(std::function<Status()> fn) {
  if (!thread_.joinable() || stopping_) return fn();  // nothing else runs on options_
  struct Shared {
    std::promise<Status> done;
    std::atomic<bool> claimed{false};  // by the task (it runs) or by the waiter (it gave up)
  };
  auto shared = std::make_shared<Shared>();
  std::future<Status> f = shared->done.get_future();
  {
    std::lock_guard<std::mutex> lock(tasks_mu_);
    tasks_.push_back([fn = std::move(fn), shared] {
      if (shared->claimed.exchange(true)) return;  // the caller gave up: not applied at all
      shared->done.set_value(fn());
    });
  }
  char c = 1;
  (void)!::write(wake_pipe_[1], &c, 1);
  if (f.wait_for(std::chrono::seconds(10)) == std::future_status::ready) return f.get();
  if (!shared->claimed.exchange(true)) {
    return Unavailable("gmuxd's broker did not take the change within 10 s; nothing changed");
  }
  return f.get();  // it started just now: its result is the answer
}

void Server::RunBrokerTasks() {
  for (;;) {
    std::function<void()> task;
    {
      std::lock_guard<std::mutex> lock(tasks_mu_);
      if (tasks_.empty()) return;
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();
  }
}

Status Server::Reload(const DaemonOptions& file, std::vector<std::string>* restart_needed) {
  auto restart = std::make_shared<std::vector<std::string>>();
  Status s = OnBroker([this, file, restart]() -> Status {
    const DaemonOptions& o = options_;
    // What a running daemon cannot change: named, left as it is.
    auto differs = [&](const char* key, bool changed) {
      if (changed) restart->push_back(key);
    };
    differs("daemon.socket", file.socket_path != o.socket_path);
    differs("daemon.listen", file.listen != o.listen);
    differs("daemon.metrics_listen", file.metrics_listen != o.metrics_listen);
    // TLS on or off, or plain TCP: a restart; new certificates and CAs: applied (below).
    differs("daemon.plain_tcp", file.plain_tcp != o.plain_tcp);
    differs("daemon.tls_cert", file.tls_cert.empty() != o.tls_cert.empty());
    differs("daemon.ledger", file.ledger != o.ledger ||
                                 file.ledger_interval_s != o.ledger_interval_s);
    differs("daemon.worker_path", file.worker_path != o.worker_path);
    differs("daemon.worker_user", file.worker_user != o.worker_user);
    differs("daemon.memory_slots", file.memory_slots != o.memory_slots ||
                                       file.slot_bytes != o.slot_bytes ||
                                       file.memory_bytes != o.memory_bytes);
    differs("daemon.inflight_per_device", file.inflight_per_device != o.inflight_per_device);
    differs("daemon.max_sessions", file.max_sessions != o.max_sessions);
    differs("backend", file.backend.library != o.backend.library);
    differs("scheduler.policy", file.policy != o.policy || file.policy_params != o.policy_params);
    differs("scheduler.device", file.exclusive_devices != o.exclusive_devices);
    differs("frames", file.frames.policy != o.frames.policy ||
                          file.frames.criterion_fps != o.frames.criterion_fps);
    DaemonOptions next = options_;
    next.limits = file.limits;
    next.admin_uids = file.admin_uids;
    next.admin_tokens = file.admin_tokens;
    next.unknown_peers = file.unknown_peers;
    next.unknown_tokens = file.unknown_tokens;
    next.default_tenant = file.default_tenant;
    next.handshake_timeout_s = file.handshake_timeout_s;
    next.max_unidentified = file.max_unidentified;
    next.max_connections_per_identity = file.max_connections_per_identity;
    next.log_level = file.log_level;
    next.auth_failures = file.auth_failures;
    next.auth_block_s = file.auth_block_s;
    // The file's tenants, and those added at run time that the file does not name.
    next.tenants = file.tenants;
    std::set<std::string> taken_over;
    for (const std::string& name : runtime_tenants_) {
      auto in_file = std::find_if(file.tenants.begin(), file.tenants.end(),
                                  [&](const TenantConfig& t) { return t.name == name; });
      if (in_file != file.tenants.end()) {
        taken_over.insert(name);
        continue;
      }
      for (const TenantConfig& t : options_.tenants) {
        if (t.name == name) next.tenants.push_back(t);
      }
    }
    // A run-time tenant (a job's, say) holding a uid or token the file now gives another
    // tenant: named, so the operator knows which of the two to change.
    for (const std::string& name : runtime_tenants_) {
      if (taken_over.count(name) != 0) continue;
      const TenantConfig* rt = nullptr;
      for (const TenantConfig& t : options_.tenants) rt = t.name == name ? &t : rt;
      if (rt == nullptr) continue;
      for (const TenantConfig& ft : file.tenants) {
        for (uint32_t u : rt->uids) {
          if (std::find(ft.uids.begin(), ft.uids.end(), u) != ft.uids.end()) {
            return InvalidArgument("uid " + std::to_string(u) + " is the file's tenant '" +
                                   ft.name + "' and the run-time tenant '" + name +
                                   "' (gmux tenant remove " + name + ", or change the file)");
          }
        }
        for (const std::string& tok : rt->tokens) {
          for (const std::string& ftok : ft.tokens) {
            if (CanonicalToken(tok) == CanonicalToken(ftok)) {
              return InvalidArgument("a token is the file's tenant '" + ft.name +
                                     "' and the run-time tenant '" + name + "'");
            }
          }
        }
      }
    }
    // Certificates are read again (renewed in place, or new paths): for connections accepted
    // from now on. A file that does not load refuses the whole reload.
    const bool tls_reload = tls_ && !file.tls_cert.empty();
    if (tls_reload) {
      GMUX_RETURN_IF_ERROR(TlsServerOptions(file).Validate());
      next.tls_cert = file.tls_cert;
      next.tls_key = file.tls_key;
      next.tls_client_ca = file.tls_client_ca;
    }
    GMUX_RETURN_IF_ERROR(ApplyOptions(std::move(next)));
    if (tls_reload) {
      if (Status t = tls_->Reload(TlsServerOptions(options_)); !t.ok()) {
        spdlog::error("TLS certificates not reloaded: {}", t.message());
      }
    }
    for (const std::string& name : taken_over) runtime_tenants_.erase(name);
    return Status::Ok();
  });
  if (restart_needed != nullptr) *restart_needed = *restart;
  return s;
}

}  // namespace gmux::daemon
