// The executor on the real backend (PoCL through its dispatch table, no daemon): a completion
// callback that fires after the executor's owner stopped waiting for it and closed it is
// dropped, never delivered to the freed executor.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "daemon/backend.h"
#include "daemon/cl_ref.h"
#include "daemon/command.h"
#include "daemon/executor.h"

namespace gmux::daemon {
namespace {

TEST(ExecutorTest, ACallbackFiringAfterTheExecutorClosedIsDropped) {
  auto b = Backend::Open(BackendOptions{});
  if (!b.ok()) GTEST_SKIP() << "no OpenCL backend";
  std::unique_ptr<Backend> backend = std::move(b).value();
  const cl_icd_dispatch& cl = backend->cl();
  cl_device_id dev = backend->devices()[0];
  cl_int err = CL_SUCCESS;
  Ref<cl_context> ctx = Adopt(cl.clCreateContext(nullptr, 1, &dev, nullptr, nullptr, &err));
  ASSERT_EQ(err, CL_SUCCESS);
  Ref<cl_command_queue> q = Adopt(cl.clCreateCommandQueue(ctx->h, dev, 0, &err));
  ASSERT_EQ(err, CL_SUCCESS);
  std::atomic<int> posted{0}, delivered{0};
  auto executor = [&] {
    return std::make_unique<Executor>(
        0, [&](Mailbox::Task t) {
          ++posted;
          t();
        },
        [&](uint32_t, const std::vector<core::Completion>&) { ++delivered; });
  };
  // A command held behind `user` (a user event): its completion callback stays outstanding.
  auto held_marker = [&](cl_event user, uint64_t id) {
    auto c = std::make_shared<Command>();
    c->queue = q;
    c->event = std::make_shared<EventRecord>(id, /*user=*/false, 0);
    c->run = [&cl, user](cl_command_queue cq, const std::vector<cl_event>&, cl_event* out) {
      return cl.clEnqueueMarkerWithWaitList(cq, 1, &user, out);
    };
    return c;
  };

  cl_event gate = cl.clCreateUserEvent(ctx->h, &err);
  ASSERT_EQ(err, CL_SUCCESS);
  auto ex = executor();
  auto cmd = held_marker(gate, 1);
  std::vector<Job> jobs(1);
  jobs[0].cmd = cmd;
  ex->Run(jobs);
  EXPECT_FALSE(ex->Idle());
  EXPECT_TRUE(ex->Running());  // the device has work: a spinning session thread yields
  // The owner gives up on it (WorkerQueue::Stop's timeout) and goes.
  ex->Close();
  ex.reset();
  ASSERT_TRUE(cmd->event->backend());
  ASSERT_GT(cmd.use_count(), 1);  // the callback's reference to its entry holds the command
  ASSERT_EQ(cl.clSetUserEventStatus(gate, CL_COMPLETE), CL_SUCCESS);
  ASSERT_EQ(cl.clFinish(q->h), CL_SUCCESS);
  // The callback ran (and dropped its entry, the command's last holder but this test) once the
  // command is ours alone.
  for (int i = 0; i < 1000 && cmd.use_count() > 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(cmd.use_count(), 1) << "the backend never ran the callback";
  EXPECT_EQ(posted.load(), 0);
  EXPECT_EQ(delivered.load(), 0);
  cl.clReleaseEvent(gate);

  // An open executor delivers a like command's completion.
  cl_event gate2 = cl.clCreateUserEvent(ctx->h, &err);
  ASSERT_EQ(err, CL_SUCCESS);
  auto ex2 = executor();
  auto cmd2 = held_marker(gate2, 2);
  jobs.resize(1);
  jobs[0].cmd = cmd2;
  ex2->Run(jobs);
  ASSERT_EQ(cl.clSetUserEventStatus(gate2, CL_COMPLETE), CL_SUCCESS);
  ASSERT_EQ(cl.clFinish(q->h), CL_SUCCESS);
  for (int i = 0; i < 1000 && delivered.load() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  // Closing waits for the callback still passing (delivery runs inside it here), so what it
  // did is complete and seen from this thread afterwards.
  ex2->Close();
  EXPECT_EQ(delivered.load(), 1);
  EXPECT_TRUE(cmd2->event->done());
  EXPECT_TRUE(ex2->Idle());
  EXPECT_FALSE(ex2->Running());
  cl.clReleaseEvent(gate2);
}

}  // namespace
}  // namespace gmux::daemon
