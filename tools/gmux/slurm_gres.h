// Slurm's GRES as `scontrol show job -d` and `scontrol show node` print them: the counts of
// `gpu` and `shard` that `gmux slurm prolog` turns into a tenant's weight and memory quota.
// Pure text parsing (tested in tests/tools/slurm_gres_test.cc).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace gmux::cli {

struct SlurmGres {
  uint64_t gpus = 0;
  uint64_t shards = 0;
};

// GRES counts in a Slurm GRES list ("gpu:1,shard:8", "gpu:a100:2(S:0-1),shard:16",
// "shard:2(IDX:0)"); other GRES are ignored.
SlurmGres ParseGresList(std::string_view list);
// Whether `node` is in a Slurm node list ("n01,gpu[01-04,07]").
bool InHostlist(std::string_view list, std::string_view node);
// The job's GRES on `node` from `scontrol show job -d` (the "Nodes=... GRES=..." line whose node
// list holds the node, or the only one; else JOB_GRES).
SlurmGres ParseJobGres(std::string_view scontrol_job, const std::string& node);
// The node's configured GRES from `scontrol show node` ("Gres=...").
SlurmGres ParseNodeGres(std::string_view scontrol_node);

}  // namespace gmux::cli
