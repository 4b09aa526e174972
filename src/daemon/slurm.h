// Slurm jobs as gmuxd sees its peers: which job (if any) a process belongs to, read from the
// kernel's view of it (/proc/PID/cgroup), which the job's processes cannot change.
//
// Slurm puts every step of a job in a cgroup of its own (proctrack/cgroup), and runs the
// TaskEpilog in the job's:
//   cgroup v1: /slurm/uid_U/job_J[/step_S[/task_T]] (/slurm_NODE/... where the node's name is
//              part of it), in each controller's hierarchy (freezer at least);
//   cgroup v2: /system.slice/slurmstepd.scope/job_J[/step_S/user/task_T].
// Both are created by root; users cannot create cgroups at those places, nor move a process
// into them. Paths are read as gmuxd's cgroup namespace shows them (docs/cluster.md).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "daemon/ledger.h"

namespace gmux::daemon {

struct SlurmStep {
  uint64_t job = 0;
  std::string step;  // "batch", "extern", "0", ...; "" in the job's own cgroup (TaskEpilog)
};

// Whether the cgroup at `path` in the hierarchy of `controllers` ("freezer", "name=systemd",
// "" for cgroup v2) is root's: its cgroup.procs owned by root. Slurm gives a job's user the step
// directories under cgroup v1, so the user can make cgroups below them and move any process of
// theirs into those — but files of a cgroup the user made are the user's.
using CgroupIsRoots = std::function<bool(std::string_view controllers, std::string_view path)>;

// The job of a process whose /proc/PID/cgroup reads `text`; nullopt when none: not in a job, a
// path that is not exactly one Slurm makes (job_J, job_J/step_S, job_J/step_S/task_T under v1;
// job_J, job_J/step_S[/user[/task_T]] or /slurm under v2), a cgroup `roots` says is not root's,
// hierarchies naming different jobs, or a v1 path naming another uid than `uid`.
std::optional<SlurmStep> SlurmStepFromCgroup(std::string_view text, uid_t uid,
                                             const CgroupIsRoots& roots);

// The same for a live process, checked against the cgroup file systems under /sys/fs/cgroup;
// nullopt also when the process is gone or is no longer `uid`'s (its pid was reused).
std::optional<SlurmStep> SlurmStepOf(pid_t pid, uid_t uid);

// A job's usage (ledger entries of its tenant, summed) as one AdminComment value:
// "gmux:device_s=1.234567,commands=42,bytes=1048576,memory_GiB_s=0.500,lease_s=0.000".
std::string SlurmUsageComment(const std::vector<LedgerEntry>& entries);

// `scontrol update JobId=JOB AdminComment=COMMENT` (no shell; at most 10 s). Slurm accepts it
// while the job runs, not once it has finished: the job's TaskEpilog asks for it.
Status SetSlurmAdminComment(uint64_t job, const std::string& comment);

}  // namespace gmux::daemon
