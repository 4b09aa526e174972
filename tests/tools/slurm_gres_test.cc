#include "gmux/slurm_gres.h"

#include <gtest/gtest.h>

namespace gmux::cli {
namespace {

// As `scontrol show job -d` printed it on the test bed (Slurm 22.05), trimmed.
constexpr const char* kJob =
    "JobId=2 JobName=wrap\n"
    "   UserId=nobody(65534) GroupId=nogroup(65534) MCS_label=N/A\n"
    "   JobState=RUNNING Reason=None Dependency=(null)\n"
    "   NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:*\n"
    "   JOB_GRES=shard:2\n"
    "     Nodes=vm CPU_IDs=0 Mem=0 GRES=shard:2(IDX:0)\n"
    "   TresPerNode=gres:shard:2\n";

TEST(SlurmGresTest, ShardsOfAJobOnItsNode) {
  const SlurmGres g = ParseJobGres(kJob, "vm");
  EXPECT_EQ(g.shards, 2u);
  EXPECT_EQ(g.gpus, 0u);
  // Another node's name: the only Nodes= line still tells.
  EXPECT_EQ(ParseJobGres(kJob, "other").shards, 2u);
}

TEST(SlurmGresTest, AMultiNodeJobCountsThisNodesLine) {
  const char* job =
      "   JOB_GRES=gpu:3\n"
      "     Nodes=n1 CPU_IDs=0-3 Mem=0 GRES=gpu:a100:2(IDX:0-1)\n"
      "     Nodes=n2 CPU_IDs=0 Mem=0 GRES=gpu:a100:1(IDX:0)\n";
  EXPECT_EQ(ParseJobGres(job, "n1").gpus, 2u);
  EXPECT_EQ(ParseJobGres(job, "n2").gpus, 1u);
  EXPECT_EQ(ParseJobGres(job, "n3").gpus, 3u);  // not named: the job's total
}

TEST(SlurmGresTest, NodeListsAsSlurmPrintsThem) {
  EXPECT_TRUE(InHostlist("vm", "vm"));
  EXPECT_TRUE(InHostlist("n[01-04,07]", "n03"));
  EXPECT_TRUE(InHostlist("n[01-04,07]", "n07"));
  EXPECT_FALSE(InHostlist("n[01-04,07]", "n05"));
  EXPECT_FALSE(InHostlist("n[01-04]", "n3"));  // padded ranges name padded nodes
  EXPECT_TRUE(InHostlist("a1,gpu[8-12]-ib,z", "gpu10-ib"));
  EXPECT_FALSE(InHostlist("gpu[8-12]-ib", "gpu10"));
  EXPECT_FALSE(InHostlist("n[x-y]", "n1"));
  EXPECT_FALSE(InHostlist("", "n1"));
  // A multi-node job: its lines name node lists.
  const char* job =
      "   JOB_GRES=shard:6\n"
      "     Nodes=n[01-02] CPU_IDs=0 Mem=0 GRES=shard:2(IDX:0)\n"
      "     Nodes=n03 CPU_IDs=0 Mem=0 GRES=\n"
      "     Nodes=n04 CPU_IDs=0 Mem=0 GRES=shard:4(IDX:0)\n";
  EXPECT_EQ(ParseJobGres(job, "n02").shards, 2u);
  EXPECT_EQ(ParseJobGres(job, "n03").shards, 0u);  // none here, not the job's total
  EXPECT_EQ(ParseJobGres(job, "n04").shards, 4u);
}

TEST(SlurmGresTest, NodeGresAndLists) {
  const SlurmGres n = ParseNodeGres(
      "NodeName=vm Arch=x86_64 CoresPerSocket=2\n   CPUAlloc=0 CPUEfctv=2 CPUTot=2\n"
      "   Gres=gpu:1,shard:8\n   NodeAddr=127.0.0.1 NodeHostName=vm\n");
  EXPECT_EQ(n.gpus, 1u);
  EXPECT_EQ(n.shards, 8u);
  const SlurmGres typed = ParseGresList("gpu:a100:2(S:0-1),shard:a100:16(S:0-1),nic:1");
  EXPECT_EQ(typed.gpus, 2u);
  EXPECT_EQ(typed.shards, 16u);
  EXPECT_EQ(ParseGresList("gpu").gpus, 1u);
  EXPECT_EQ(ParseGresList("(null)").gpus, 0u);
  EXPECT_EQ(ParseGresList("").shards, 0u);
  EXPECT_EQ(ParseGresList("shard:x").shards, 0u);
  EXPECT_EQ(ParseGresList("shard:99999999999999999999").shards, 0u);
  EXPECT_EQ(ParseNodeGres("NodeName=vm\n").gpus, 0u);
}

}  // namespace
}  // namespace gmux::cli
