#include "slurm.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <sstream>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "admin.h"
#include "slurm_gres.h"
#include "status.h"

namespace gmux::cli {
namespace {

using nlohmann::json;

int Fail(const std::string& action, const std::string& message) {
  std::cerr << "gmux slurm " << action << ": " << message << "\n";
  return 1;
}

// Node names and job ids reach a command line: only what Slurm itself allows in them.
bool SafeWord(const std::string& s) {
  if (s.empty() || s.size() > 255) return false;
  for (char c : s) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '-' || c == '_' || c == '.';
    if (!ok) return false;
  }
  return true;
}

// stdout of `command` (run by /bin/sh; its words are SafeWord-checked by the callers), nullopt
// when it could not run or exited non-zero.
std::optional<std::string> Capture(const std::string& command) {
  FILE* p = ::popen((command + " 2>/dev/null").c_str(), "r");
  if (p == nullptr) return std::nullopt;
  std::string out;
  char buf[4096];
  size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int rc = ::pclose(p);
  if (rc != 0) return std::nullopt;
  return out;
}

std::optional<json> AskJson(const std::string& socket, const std::optional<LeaseArgs>& lease,
                            const std::optional<AdminArgs>& admin, std::string& error) {
  return ControlJson(socket, "gmux slurm", lease, admin, error);
}

std::optional<json> Tenants(const std::string& socket, std::string& error) {
  return AskJson(socket, std::nullopt,
                 AdminArgs{"tenant", json{{"action", "list"}, {"name", ""}}.dump()}, error);
}

std::string TenantName(uint64_t job) { return "job-" + std::to_string(job); }

std::chrono::steady_clock::time_point WaitDeadline(const SlurmOptions& o) {
  return std::chrono::steady_clock::now() +
         std::chrono::duration_cast<std::chrono::steady_clock::duration>(
             std::chrono::duration<double>(o.wait_s));
}

// Waits (until o.wait_s has passed) for the job's tenant to have no sessions: whether gmuxd
// knows the tenant; nullopt, with `error`, when gmuxd could not be asked.
std::optional<bool> WaitForNoSessions(const SlurmOptions& o, std::string& error) {
  const std::string name = TenantName(o.job);
  const auto deadline = WaitDeadline(o);
  for (;;) {
    auto list = Tenants(o.socket, error);
    if (!list) return std::nullopt;
    bool known = false;
    int sessions = 0;
    for (const auto& t : list->value("tenants", json::array())) {
      if (t.value("name", std::string()) == name) {
        known = true;
        sessions = t.value("sessions", 0);
      }
    }
    if (!known || sessions == 0 || std::chrono::steady_clock::now() >= deadline) return known;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

}  // namespace

namespace {

int Prolog(const SlurmOptions& o) {
  const std::string name = TenantName(o.job);
  const auto job_text = Capture("scontrol show job -d " + std::to_string(o.job));
  if (!job_text) return Fail("prolog", "scontrol show job -d " + std::to_string(o.job) + " failed");
  const SlurmGres job = ParseJobGres(*job_text, o.node);
  if (job.gpus == 0 && job.shards == 0) {
    std::cout << "gmux slurm prolog: job " << o.job << " asks for no gpu or shard: not a tenant\n";
    return 0;
  }
  const auto node_text = Capture("scontrol show node " + o.node);
  const SlurmGres node = node_text ? ParseNodeGres(*node_text) : SlurmGres{};
  std::string error;
  // A whole GPU weighs as much as all its shards.
  const uint64_t per_gpu = node.gpus > 0 && node.shards > 0 ? node.shards / node.gpus : 1;
  const uint64_t weight = job.shards > 0 ? job.shards : job.gpus * per_gpu;
  TenantOptions t;
  t.socket = o.socket;
  t.name = name;
  t.weight = static_cast<double>(weight);
  t.slurm_job = static_cast<int64_t>(o.job);
  if (o.fps_target > 0) t.fps_target = o.fps_target;
  if (job.shards > 0 && node.shards > 0) {
    // Memory: the job's shards' part of the smallest device's.
    const auto status = ControlRequest(o.socket, "gmux slurm", std::nullopt);
    if (status.ok()) {
      json s = json::parse(*status, nullptr, false);
      uint64_t capacity = 0;
      if (s.is_object()) {
        for (const auto& d : s.value("devices", json::array())) {
          const uint64_t c = d.value("memory_capacity", uint64_t{0});
          if (c > 0 && (capacity == 0 || c < capacity)) capacity = c;
        }
      }
      if (capacity > 0) {
        // gmuxd applies a quota per device: the job's shards against one GPU's.
        const uint64_t gpu_shards = node.gpus > 0 ? node.shards / node.gpus : node.shards;
        const double share = static_cast<double>(std::min(job.shards, gpu_shards)) /
                             static_cast<double>(std::max<uint64_t>(gpu_shards, 1));
        t.memory_quota = std::to_string(static_cast<uint64_t>(share * static_cast<double>(capacity)));
      }
    }
  }
  if (RunTenant("add", t) != 0) {
    // A requeued job's prolog runs again: its tenant may still be there.
    if (RunTenant("set", t) != 0) return Fail("prolog", "cannot register tenant " + name);
  }
  if (job.gpus > 0) {
    // An exclusive device for the job's lifetime, where gmuxd has a pool.
    LeaseArgs a;
    a.action = "acquire";
    a.tenant = name;
    auto lease = AskJson(o.socket, a, std::nullopt, error);
    if (lease) {
      std::cout << "gmux slurm prolog: job " << o.job << " leases " << lease->dump() << "\n";
    } else {
      std::cout << "gmux slurm prolog: job " << o.job << " shares the device (no lease: "
                << error << ")\n";
    }
  }
  return 0;
}

int Epilog(const SlurmOptions& o) {
  const std::string name = TenantName(o.job);
  std::string error;
  // The job's processes are gone; their sessions end as gmuxd notices.
  const std::optional<bool> known = WaitForNoSessions(o, error);
  if (!known) return Fail("epilog", error);
  if (!*known) {
    std::cout << "gmux slurm epilog: job " << o.job << " was no tenant\n";
    return 0;
  }
  // Its lease, if any.
  LeaseArgs list_args;
  list_args.action = "list";
  if (auto leases = AskJson(o.socket, list_args, std::nullopt, error)) {
    for (const auto& l : leases->value("leases", json::array())) {
      if (l.value("tenant", std::string()) != name) continue;
      const std::string id = l.value("lease", std::string());
      LeaseArgs rel;
      rel.action = "release";
      if (id.size() > 1) rel.id = std::strtoull(id.c_str() + 1, nullptr, 10);
      if (!AskJson(o.socket, rel, std::nullopt, error)) {
        std::cerr << "gmux slurm epilog: releasing " << id << ": " << error << "\n";
      }
    }
  }
  TenantOptions t;
  t.socket = o.socket;
  t.name = name;
  if (RunTenant("remove", t) != 0) return Fail("epilog", "cannot remove tenant " + name);
  // The books are closed at the removal: the job's usage, to where Slurm users look.
  auto usage = AskJson(o.socket, std::nullopt,
                       AdminArgs{"usage", json{{"tenant", name}, {"rows", false}}.dump()}, error);
  if (!usage) {
    std::cerr << "gmux slurm epilog: no usage for " << name << ": " << error << "\n";
    return 0;
  }
  double device_s = 0;
  uint64_t commands = 0;
  for (const auto& e : usage->value("entries", json::array())) {
    device_s += e.value("device_s", 0.0);
    commands += e.value("commands", uint64_t{0});
  }
  std::cout << "gmux slurm epilog: job " << o.job << " used " << device_s << " s of device time in "
            << commands << " commands (gmux usage --job " << o.job << ")\n";
  return 0;
}

}  // namespace

// Run as the job's user inside the job (its cgroup is the proof): once the job's sessions have
// ended, gmuxd writes the job's usage so far into its AdminComment (Slurm takes it only while
// the job runs, so the root Epilog cannot).
int TaskEpilog(const SlurmOptions& o) {
  std::string error;
  const auto deadline = WaitDeadline(o);
  if (!WaitForNoSessions(o, error)) return Fail("taskepilog", error);
  // The tasks of one step end together: a write refused as too soon is tried again (the last
  // one must carry the job's total).
  for (;;) {
    auto answer = AskJson(o.socket, std::nullopt,
                          AdminArgs{"slurm-comment", json{{"job", o.job}}.dump()}, error);
    if (answer) return 0;
    if (error.find("try again") == std::string::npos ||
        std::chrono::steady_clock::now() >= deadline + std::chrono::seconds(5)) {
      return Fail("taskepilog", error);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }
}

int RunSlurm(const SlurmOptions& in) {
  SlurmOptions o = in;
  if (o.job == 0) {
    const char* id = std::getenv("SLURM_JOB_ID");
    if (id != nullptr && *id != '\0') o.job = std::strtoull(id, nullptr, 10);
  }
  if (o.action != "taskprolog" && o.job == 0) {
    return Fail(o.action, "no job: run by Slurm (SLURM_JOB_ID) or give --job");
  }
  if (o.node.empty()) {
    const char* n = std::getenv("SLURMD_NODENAME");
    if (n != nullptr && *n != '\0') {
      o.node = n;
    } else {
      char host[256] = {};
      ::gethostname(host, sizeof(host) - 1);
      o.node = host;
      o.node = o.node.substr(0, o.node.find('.'));
    }
  }
  if (!SafeWord(o.node)) return Fail(o.action, "node name '" + o.node + "' is not one Slurm uses");
  if (o.action == "prolog") return Prolog(o);
  if (o.action == "epilog") return Epilog(o);
  if (o.action == "taskepilog") return TaskEpilog(o);
  if (o.action == "taskprolog") {
    // Read by slurmstepd: "export NAME=VALUE" lines join the task's environment.
    if (!o.icd_vendors.empty()) std::cout << "export OCL_ICD_VENDORS=" << o.icd_vendors << "\n";
    std::cout << "export GMUX_SOCKET=" << ControlSocketPath(o.socket) << "\n";
    return 0;
  }
  return Fail(o.action, "unknown action (prolog, epilog, taskprolog, taskepilog)");
}

}  // namespace gmux::cli
