#include "daemon/slurm.h"

#include <gtest/gtest.h>
#include <unistd.h>

namespace gmux::daemon {
namespace {

// Every cgroup root's (the live checks are SlurmStepOf's).
std::optional<SlurmStep> Step(std::string_view text, uid_t uid) {
  return SlurmStepFromCgroup(text, uid, [](std::string_view, std::string_view) { return true; });
}

// As read on a development host with cgroup v1 (and an empty unified line), in a batch step.
constexpr const char* kV1 =
    "9:name=systemd:/\n8:pids:/\n7:blkio:/\n6:freezer:/slurm_vm/uid_1000/job_17/step_batch\n"
    "5:devices:/\n4:memory:/process_api/abc\n3:cpuset:/\n2:cpuacct:/\n1:cpu:/\n0::/\n";

TEST(SlurmTest, CgroupV1BatchStepOfTheNodesHierarchy) {
  auto s = Step(kV1, 1000);
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->job, 17u);
  EXPECT_EQ(s->step, "batch");
}

TEST(SlurmTest, CgroupV1PlainSlurmRootWithTasksInEveryController) {
  auto s = Step(
      "12:freezer:/slurm/uid_0/job_4242/step_0/task_1\n"
      "4:memory:/slurm/uid_0/job_4242/step_0/task_1\n3:cpuset:/slurm/uid_0/job_4242/step_0\n",
      0);
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->job, 4242u);
  EXPECT_EQ(s->step, "0");
}

TEST(SlurmTest, CgroupV2StepUnderSlurmstepdScope) {
  auto s = Step("0::/system.slice/slurmstepd.scope/job_9/step_extern/user/task_0\n",
                               1000);
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->job, 9u);
  EXPECT_EQ(s->step, "extern");
  auto root = Step("0::/slurmstepd.scope/job_12/step_3/user/task_0\n", 5);
  ASSERT_TRUE(root.has_value());
  EXPECT_EQ(root->job, 12u);
}

TEST(SlurmTest, NotAJob) {
  EXPECT_FALSE(Step("", 0));
  EXPECT_FALSE(Step("0::/user.slice/user-1000.slice/session-3.scope\n", 1000));
  EXPECT_FALSE(Step("6:freezer:/\n0::/\n", 1000));
  // slurmstepd's own cgroup, not a step's.
  EXPECT_FALSE(Step("0::/system.slice/slurmstepd.scope/system\n", 0));
  EXPECT_FALSE(Step("6:freezer:/slurm/uid_1000/job_17/notastep\n", 1000));
}

TEST(SlurmTest, TheJobsOwnCgroupWhereTheTaskEpilogRuns) {
  auto v1 = Step("6:freezer:/slurm_vm/uid_65534/job_1\n0::/\n", 65534);
  ASSERT_TRUE(v1.has_value());
  EXPECT_EQ(v1->job, 1u);
  EXPECT_EQ(v1->step, "");
  auto v2 = Step("0::/system.slice/slurmstepd.scope/job_8\n", 0);
  ASSERT_TRUE(v2.has_value());
  EXPECT_EQ(v2->job, 8u);
}

TEST(SlurmTest, PathsAUserCouldMakeAreNotJobs) {
  // A user's delegated cgroup v2 subtree, named like Slurm's.
  EXPECT_FALSE(Step(
      "0::/user.slice/user-1000.slice/user@1000.service/app.slice/slurmstepd.scope/job_5/step_0"
      "\n",
      1000));
  EXPECT_FALSE(Step(
      "0::/user.slice/user-1000.slice/user@1000.service/system.slice/slurmstepd.scope/job_5/"
      "step_0\n",
      1000));
  // Not under the hierarchy's slurm root.
  EXPECT_FALSE(Step("6:freezer:/mine/slurm/uid_1000/job_5/step_0\n", 1000));
  // Another uid's job path (v1 names the uid): not this peer's.
  EXPECT_FALSE(Step("6:freezer:/slurm/uid_1001/job_5/step_0\n", 1000));
  // Malformed numbers.
  EXPECT_FALSE(Step("6:freezer:/slurm/uid_1000/job_5x/step_0\n", 1000));
  EXPECT_FALSE(Step("6:freezer:/slurm/uid_1000/job_/step_0\n", 1000));
  EXPECT_FALSE(Step("6:freezer:/slurm/uid_1000/job_0/step_0\n", 1000));
  EXPECT_FALSE(Step(
      "6:freezer:/slurm/uid_1000/job_99999999999999999999999/step_0\n", 1000));
}

TEST(SlurmTest, CgroupsAUserMadeBelowTheirStepAreNotTheJobs) {
  // Slurm (cgroup v1) gives the user the step's directory: they can make cgroups below it and
  // move any process of theirs there. Only the shapes Slurm makes count...
  EXPECT_FALSE(Step("6:freezer:/slurm/uid_1000/job_5/step_0/mine\n", 1000));
  EXPECT_FALSE(Step("6:freezer:/slurm/uid_1000/job_5/step_0/task_1/deeper\n", 1000));
  EXPECT_FALSE(Step("0::/system.slice/slurmstepd.scope/job_5/step_0/user/task_0/x\n", 1000));
  EXPECT_FALSE(Step("0::/system.slice/slurmstepd.scope/job_5/step_0/mine\n", 1000));
  EXPECT_FALSE(Step("6:freezer:/slurm/uid_1000/job_5/step_\n", 1000));
  EXPECT_TRUE(Step("0::/system.slice/slurmstepd.scope/job_5/step_0/slurm\n", 1000));
  EXPECT_TRUE(Step("0::/system.slice/slurmstepd.scope/job_5/step_0/user\n", 1000));
  // ...and a cgroup of the right shape that root did not make (a user's "task_9") is refused,
  // with the hierarchy it was found in.
  std::string seen_controllers, seen_path;
  auto not_roots = [&](std::string_view c, std::string_view p) {
    seen_controllers = c;
    seen_path = p;
    return false;
  };
  EXPECT_FALSE(SlurmStepFromCgroup("6:freezer:/slurm/uid_1000/job_5/step_0/task_9\n", 1000,
                                   not_roots));
  EXPECT_EQ(seen_controllers, "freezer");
  EXPECT_EQ(seen_path, "/slurm/uid_1000/job_5/step_0/task_9");
  EXPECT_FALSE(SlurmStepFromCgroup("0::/system.slice/slurmstepd.scope/job_5/step_0\n", 1000,
                                   not_roots));
  EXPECT_EQ(seen_controllers, "");
}

TEST(SlurmTest, HierarchiesThatDisagreeAreTrustedNeither) {
  EXPECT_FALSE(Step(
      "6:freezer:/slurm/uid_1000/job_5/step_0\n4:memory:/slurm/uid_1000/job_6/step_0\n", 1000));
}

TEST(SlurmTest, UsageCommentSumsTheJobsEntries) {
  LedgerEntry a, b;
  a.device_s = 1.5;
  a.commands = 10;
  a.bytes = 1024;
  a.memory_byte_s = 1024.0 * 1024 * 1024;
  b.device_s = 0.25;
  b.commands = 5;
  b.lease_s = 2;
  EXPECT_EQ(SlurmUsageComment({a, b}),
            "gmux:device_s=1.750000,commands=15,bytes=1024,memory_GiB_s=1.000,lease_s=2.000");
  EXPECT_EQ(SlurmUsageComment({}),
            "gmux:device_s=0.000000,commands=0,bytes=0,memory_GiB_s=0.000,lease_s=0.000");
}

TEST(SlurmTest, ThisProcessIsNoJob) {
  // The test runs outside Slurm (CI); a live process's file parses.
  EXPECT_FALSE(SlurmStepOf(::getpid(), ::getuid()).has_value() &&
               std::getenv("SLURM_JOB_ID") == nullptr);
  EXPECT_FALSE(SlurmStepOf(-1, 0).has_value());
}

}  // namespace
}  // namespace gmux::daemon
