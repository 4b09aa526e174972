#include "daemon/slurm.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <charconv>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

namespace gmux::daemon {
namespace {

std::vector<std::string_view> Split(std::string_view path) {
  std::vector<std::string_view> parts;
  size_t at = 0;
  while (at <= path.size()) {
    size_t slash = path.find('/', at);
    if (slash == std::string_view::npos) slash = path.size();
    if (slash > at) parts.push_back(path.substr(at, slash - at));
    at = slash + 1;
  }
  return parts;
}

// "PREFIX<digits>" → the number.
std::optional<uint64_t> Numbered(std::string_view part, std::string_view prefix) {
  if (part.substr(0, prefix.size()) != prefix || part.size() == prefix.size()) return {};
  uint64_t n = 0;
  const char* end = part.data() + part.size();
  auto [p, ec] = std::from_chars(part.data() + prefix.size(), end, n);
  if (ec != std::errc() || p != end) return {};
  return n;
}

// One line's path, or nullopt when it is not exactly a cgroup Slurm makes for a job or step.
std::optional<SlurmStep> FromPath(std::string_view path, bool v2, uid_t uid) {
  const std::vector<std::string_view> parts = Split(path);
  size_t job_at = 0;
  if (v2) {
    // /system.slice/slurmstepd.scope/job_J/step_S/... (or /slurmstepd.scope/... at the root).
    if (parts.size() >= 3 && parts[0] == "system.slice" && parts[1] == "slurmstepd.scope") {
      job_at = 2;
    } else if (parts.size() >= 2 && parts[0] == "slurmstepd.scope") {
      job_at = 1;
    } else {
      return {};
    }
  } else {
    // /slurm[_NODE]/uid_U/job_J/step_S/...
    if (parts.size() < 3 || (parts[0] != "slurm" && parts[0].substr(0, 6) != "slurm_")) return {};
    const auto u = Numbered(parts[1], "uid_");
    if (!u || *u != uid) return {};
    job_at = 2;
  }
  const auto job = Numbered(parts[job_at], "job_");
  if (!job || *job == 0) return {};
  if (parts.size() == job_at + 1) return SlurmStep{*job, ""};  // the job's own (its TaskEpilog)
  const std::string_view step = parts[job_at + 1];
  if (step.substr(0, 5) != "step_" || step.size() == 5) return {};
  // Below the step only what Slurm itself makes: v1 task_T; v2 user[/task_T] and slurm.
  const size_t below = parts.size() - job_at - 2;
  bool known = below == 0;
  if (!v2 && below == 1) known = Numbered(parts[job_at + 2], "task_").has_value();
  if (v2 && below == 1) known = parts[job_at + 2] == "user" || parts[job_at + 2] == "slurm";
  if (v2 && below == 2) {
    known = parts[job_at + 2] == "user" && Numbered(parts[job_at + 3], "task_").has_value();
  }
  if (!known) return {};
  return SlurmStep{*job, std::string(step.substr(5))};
}

}  // namespace

std::optional<SlurmStep> SlurmStepFromCgroup(std::string_view text, uid_t uid,
                                             const CgroupIsRoots& roots) {
  std::optional<SlurmStep> found;
  size_t at = 0;
  while (at < text.size()) {
    size_t nl = text.find('\n', at);
    if (nl == std::string_view::npos) nl = text.size();
    const std::string_view line = text.substr(at, nl - at);
    at = nl + 1;
    // ID:CONTROLLERS:PATH; v2's line is "0::PATH".
    const size_t c1 = line.find(':');
    const size_t c2 = c1 == std::string_view::npos ? c1 : line.find(':', c1 + 1);
    if (c2 == std::string_view::npos) continue;
    const bool v2 = line.substr(0, c1) == "0" && c2 == c1 + 1;
    auto step = FromPath(line.substr(c2 + 1), v2, uid);
    if (!step) continue;
    if (!roots(v2 ? std::string_view() : line.substr(c1 + 1, c2 - c1 - 1), line.substr(c2 + 1))) {
      return {};  // a cgroup someone other than root made, named like Slurm's: trust nothing
    }
    if (found && found->job != step->job) return {};  // two jobs: trust neither
    if (!found) found = std::move(step);
  }
  return found;
}

std::optional<SlurmStep> SlurmStepOf(pid_t pid, uid_t uid) {
  if (pid <= 0) return {};
  const std::string proc = "/proc/" + std::to_string(pid);
  std::ifstream in(proc + "/cgroup");
  if (!in) return {};
  std::stringstream ss;
  ss << in.rdbuf();
  // SO_PEERCRED's pid is the connecting process's: if it has gone and its pid was given to a
  // process of another user, that process is not the peer.
  struct stat st {};
  if (::stat(proc.c_str(), &st) != 0 || st.st_uid != uid) return {};
  auto roots = [](std::string_view controllers, std::string_view path) {
    std::string base = "/sys/fs/cgroup";
    if (!controllers.empty()) {
      std::string c(controllers);
      if (c.rfind("name=", 0) == 0) c = c.substr(5);
      base += "/" + c;
    } else if (::access("/sys/fs/cgroup/unified/cgroup.procs", F_OK) == 0) {
      base += "/unified";  // hybrid hosts mount v2 there
    }
    struct stat f {};
    return ::stat((base + std::string(path) + "/cgroup.procs").c_str(), &f) == 0 && f.st_uid == 0;
  };
  return SlurmStepFromCgroup(ss.str(), uid, roots);
}

std::string SlurmUsageComment(const std::vector<LedgerEntry>& entries) {
  double device_s = 0, memory_byte_s = 0, lease_s = 0;
  unsigned long long commands = 0, bytes = 0;
  for (const LedgerEntry& e : entries) {
    device_s += e.device_s;
    commands += e.commands;
    bytes += e.bytes;
    memory_byte_s += e.memory_byte_s;
    lease_s += e.lease_s;
  }
  char out[256];
  std::snprintf(out, sizeof(out),
                "gmux:device_s=%.6f,commands=%llu,bytes=%llu,memory_GiB_s=%.3f,lease_s=%.3f",
                device_s, commands, bytes, memory_byte_s / (1024.0 * 1024 * 1024), lease_s);
  return out;
}

Status SetSlurmAdminComment(uint64_t job, const std::string& comment) {
  int err[2];
  if (::pipe2(err, O_CLOEXEC) != 0) return Internal("pipe failed");
  const std::string id = "JobId=" + std::to_string(job);
  const std::string value = "AdminComment=" + comment;
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(err[0]);
    ::close(err[1]);
    return Internal("fork failed");
  }
  if (pid == 0) {
    // Nothing of gmuxd's reaches scontrol: not its descriptors (tenants' sockets), not its
    // blocked signals.
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    const int null = ::open("/dev/null", O_RDONLY);
    if (null >= 0) ::dup2(null, 0);
    ::dup2(err[1], 1);
    ::dup2(err[1], 2);
    ::close_range(3, ~0U, 0);
    const char* argv[] = {"scontrol", "update", id.c_str(), value.c_str(), nullptr};
    ::execvp("scontrol", const_cast<char* const*>(argv));
    static const char kMissing[] = "scontrol not found";
    (void)!::write(2, kMissing, sizeof(kMissing) - 1);
    ::_exit(127);
  }
  ::close(err[1]);
  ::fcntl(err[0], F_SETFL, O_NONBLOCK);
  std::string said;
  int status = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (;;) {
    char buf[512];
    ssize_t n;
    while ((n = ::read(err[0], buf, sizeof(buf))) > 0 && said.size() < 4096) {
      said.append(buf, static_cast<size_t>(n));
    }
    if (::waitpid(pid, &status, WNOHANG) == pid) break;
    if (std::chrono::steady_clock::now() >= deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      ::close(err[0]);
      return Unavailable("scontrol did not answer within 10 s");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::close(err[0]);
  while (!said.empty() && (said.back() == '\n' || said.back() == ' ')) said.pop_back();
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return Status::Ok();
  return Unavailable("scontrol update " + id + ": " + (said.empty() ? "failed" : said));
}

}  // namespace gmux::daemon
