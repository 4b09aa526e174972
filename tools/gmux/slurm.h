// `gmux slurm prolog|epilog|taskprolog|taskepilog`: what Slurm runs on a node around each job so that the
// job is a gmux tenant (docs/cluster.md). The scripts in packaging/slurm/ call these.
//
//   prolog (root, before the job): reads the job's GRES on this node (`scontrol show job -d`);
//     a job with `shard`s becomes tenant job-J with weight = its shards and a memory quota of
//     its shards / one GPU's shards of a device's memory (gmuxd applies quotas per device); a
//     job with whole `gpu`s becomes tenant job-J with the weight of all its GPUs' shards and,
//     where gmuxd has a device pool, an exclusive lease of one device for the job's lifetime.
//     A job with neither is left alone.
//   epilog (root, after the job): waits (briefly) for the job's sessions to end, releases its
//     lease, and removes the tenant (gmuxd books its usage then: `gmux usage --job J`).
//   taskprolog (the user, before each task): prints the environment that sends an unmodified
//     OpenCL program to gmux (OCL_ICD_VENDORS, GMUX_SOCKET).
//   taskepilog (the user, inside the job, after each task): once the job's sessions have ended,
//     has gmuxd write the job's usage so far into its AdminComment (Slurm refuses that once the
//     job has finished, so the epilog cannot).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace gmux::cli {

struct SlurmOptions {
  std::string action;  // prolog, epilog, taskprolog
  std::string socket;  // gmuxd's socket (default: $GMUX_SOCKET, else the default path)
  uint64_t job = 0;    // default: $SLURM_JOB_ID
  std::string node;    // default: $SLURMD_NODENAME, else the host name
  std::string icd_vendors;  // taskprolog: the directory with gmux.icd
  double fps_target = 0;    // prolog: the tenant's FPS target (0: gmuxd's default)
  double wait_s = 10;       // epilog: how long to wait for the job's sessions to end
};

int RunSlurm(const SlurmOptions& o);

}  // namespace gmux::cli
