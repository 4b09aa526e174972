#include "sim/kernel_sim.h"

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/fifo_policy.h"
#include "core/policy.h"
#include "sim/workloads.h"

namespace gmux::sim {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// A workload that submits a fixed list of blocks at time 0 and records completion order.
class ScriptWorkload final : public Workload {
 public:
  explicit ScriptWorkload(std::vector<BlockRequest> blocks, std::vector<uint64_t>* done = nullptr)
      : blocks_(std::move(blocks)), done_(done) {}
  std::string Describe() const override { return "script"; }
  void Start(TenantHost& host) override {
    for (const auto& b : blocks_) host.Submit(b);
  }
  void OnWake(TenantHost&, uint64_t) override {}
  void OnBlockDone(TenantHost& host, uint64_t tag) override {
    ++finished_;
    if (done_ != nullptr) done_->push_back(tag);
    host.TaskDone(Duration{0});
  }
  bool Finished() const override { return finished_ == blocks_.size(); }

 private:
  std::vector<BlockRequest> blocks_;
  std::vector<uint64_t>* done_;
  size_t finished_ = 0;
};

BlockRequest Kernel(uint64_t items, double cost_s, uint64_t tag = 0) {
  BlockRequest r;
  r.kind = core::BlockKind::kKernel;
  r.work_items = items;
  r.work_groups = items / 64;
  r.splittable = core::Splittable::kYes;
  r.cost_s = cost_s;
  r.tag = tag;
  return r;
}

// Splits every block into `parts` equal chunks; otherwise FIFO. Exercises chunked dispatch.
class ChunkingPolicy final : public core::Policy {
 public:
  explicit ChunkingPolicy(uint64_t parts) : parts_(parts) {}
  std::string_view name() const override { return "chunking"; }
  void AddTenant(const core::Tenant&, TimePoint) override {}
  void RemoveTenant(TenantId, TimePoint) override {}
  void Submit(const core::CommandBlock& b, TimePoint) override { queue_.push_back(b); }
  void Complete(const core::Completion& c, TimePoint) override {
    device_time_[c.block] += c.device_time;
  }
  void Tick(TimePoint) override {}
  std::optional<core::Dispatch> Pick(TimePoint) override {
    if (queue_.empty()) return std::nullopt;
    core::CommandBlock& b = queue_.front();
    const uint64_t step = std::max<uint64_t>(1, b.work_items / parts_);
    core::Dispatch d{b.tenant, b.id, {offset_, std::min(b.work_items, offset_ + step)}, false};
    d.last = d.range.end == b.work_items;
    offset_ = d.range.end;
    if (d.last) {
      queue_.pop_front();
      offset_ = 0;
    }
    return d;
  }
  size_t Pending(TenantId) const override { return queue_.size(); }
  std::map<BlockId, Duration> device_time_;

 private:
  uint64_t parts_;
  std::deque<core::CommandBlock> queue_;
  uint64_t offset_ = 0;
};

// Breaks per-tenant order: always serves the newest block first.
class LifoPolicy final : public core::Policy {
 public:
  std::string_view name() const override { return "lifo"; }
  void AddTenant(const core::Tenant&, TimePoint) override {}
  void RemoveTenant(TenantId, TimePoint) override {}
  void Submit(const core::CommandBlock& b, TimePoint) override { stack_.push_back(b); }
  void Complete(const core::Completion&, TimePoint) override {}
  void Tick(TimePoint) override {}
  std::optional<core::Dispatch> Pick(TimePoint) override {
    if (stack_.empty()) return std::nullopt;
    core::CommandBlock b = stack_.back();
    stack_.pop_back();
    return core::Dispatch{b.tenant, b.id, {0, b.work_items}, true};
  }
  size_t Pending(TenantId) const override { return stack_.size(); }

 private:
  std::vector<core::CommandBlock> stack_;
};

// Never dispatches anything and has no timer.
class StuckPolicy final : public core::Policy {
 public:
  std::string_view name() const override { return "stuck"; }
  void AddTenant(const core::Tenant&, TimePoint) override {}
  void RemoveTenant(TenantId, TimePoint) override {}
  void Submit(const core::CommandBlock&, TimePoint) override { ++pending_; }
  void Complete(const core::Completion&, TimePoint) override {}
  void Tick(TimePoint) override {}
  std::optional<core::Dispatch> Pick(TimePoint) override { return std::nullopt; }
  size_t Pending(TenantId) const override { return pending_; }

 private:
  size_t pending_ = 0;
};

// FIFO that records the CPU-time reports it receives.
class RecordingFifo final : public core::Policy {
 public:
  std::string_view name() const override { return "fifo"; }
  void AddTenant(const core::Tenant& t, TimePoint now) override { fifo_.AddTenant(t, now); }
  void RemoveTenant(TenantId t, TimePoint now) override { fifo_.RemoveTenant(t, now); }
  void Submit(const core::CommandBlock& b, TimePoint now) override { fifo_.Submit(b, now); }
  void Complete(const core::Completion& c, TimePoint now) override { fifo_.Complete(c, now); }
  void Tick(TimePoint now) override { fifo_.Tick(now); }
  std::optional<core::Dispatch> Pick(TimePoint now) override { return fifo_.Pick(now); }
  size_t Pending(TenantId t) const override { return fifo_.Pending(t); }
  void ReportCpuTime(TenantId t, Duration cpu, TimePoint) override { cpu_[t] = cpu; }
  std::map<TenantId, Duration> cpu_;

 private:
  core::FifoPolicy fifo_;
};

std::unique_ptr<Workload> Kernels(const KernelLoopOptions& o) { return MakeKernelLoop(o).value(); }
std::unique_ptr<Workload> Frames(const FrameLoopOptions& o) { return MakeFrameLoop(o).value(); }

KernelSimOptions Options(Duration duration = Duration{0}) {
  KernelSimOptions o;
  o.duration = duration;
  o.seed = 7;
  return o;
}

TEST(KernelSimTest, WholeBlocksTakeTheirCostAndRunOneAtATime) {
  core::FifoPolicy fifo;
  KernelSim sim(Options(), fifo);
  std::vector<uint64_t> order;
  ASSERT_TRUE(sim.AddTenant("a", 1, std::make_unique<ScriptWorkload>(
                                        std::vector<BlockRequest>{Kernel(640, 0.5, 1),
                                                                  Kernel(640, 0.25, 2)},
                                        &order))
                  .ok());
  auto r = sim.Run();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(order, (std::vector<uint64_t>{1, 2}));
  EXPECT_DOUBLE_EQ(r->makespan_s, 0.75);
  EXPECT_DOUBLE_EQ(r->tenants[0].device_time_s, 0.75);
  EXPECT_EQ(r->tenants[0].commands, 2u);
  EXPECT_EQ(r->tenants[0].dispatches, 2u);
  EXPECT_DOUBLE_EQ(r->busy_s, 0.75);
}

TEST(KernelSimTest, ChunkCostsItsFractionPlusOverhead) {
  ChunkingPolicy policy(4);
  KernelSimOptions o = Options();
  o.dispatch_overhead = milliseconds(1);
  KernelSim sim(o, policy);
  ASSERT_TRUE(sim.AddTenant("a", 1, std::make_unique<ScriptWorkload>(
                                        std::vector<BlockRequest>{Kernel(1024, 0.4)}))
                  .ok());
  auto r = sim.Run();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->tenants[0].dispatches, 4u);
  EXPECT_EQ(r->tenants[0].commands, 1u);
  EXPECT_EQ(r->tenants[0].work_items, 1024u);
  // 4 chunks of 0.1 s plus 1 ms each; the policy was told each chunk's device time.
  EXPECT_NEAR(r->tenants[0].device_time_s, 0.404, 1e-9);
  ASSERT_EQ(policy.device_time_.size(), 1u);
  EXPECT_NEAR(ToSeconds(policy.device_time_.begin()->second), 0.404, 1e-9);
}

TEST(KernelSimTest, CopiesTakeBytesOverBandwidth) {
  core::FifoPolicy fifo;
  KernelSimOptions o = Options();
  o.device.bus_bytes_per_s = 1e9;
  KernelSim sim(o, fifo);
  BlockRequest copy;
  copy.kind = core::BlockKind::kCopy;
  copy.bytes = 500'000'000;
  ASSERT_TRUE(
      sim.AddTenant("a", 1, std::make_unique<ScriptWorkload>(std::vector<BlockRequest>{copy})).ok());
  auto r = sim.Run();
  ASSERT_TRUE(r.ok());
  EXPECT_NEAR(r->makespan_s, 0.5, 1e-9);
}

TEST(KernelSimTest, OrderViolationIsReportedAsContractBreach) {
  LifoPolicy lifo;
  KernelSim sim(Options(), lifo);
  ASSERT_TRUE(sim.AddTenant("a", 1, std::make_unique<ScriptWorkload>(std::vector<BlockRequest>{
                                        Kernel(64, 0.1), Kernel(64, 0.1)}))
                  .ok());
  auto r = sim.Run();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInternal);
  EXPECT_NE(r.status().message().find("oldest undispatched"), std::string::npos)
      << r.status().message();
}

TEST(KernelSimTest, HeldBackWorkWithoutTimerIsADeadlock) {
  StuckPolicy stuck;
  KernelSim sim(Options(), stuck);
  ASSERT_TRUE(sim.AddTenant("a", 1, std::make_unique<ScriptWorkload>(
                                        std::vector<BlockRequest>{Kernel(64, 0.1)}))
                  .ok());
  auto r = sim.Run();
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("deadlock"), std::string::npos) << r.status().message();
}

TEST(KernelSimTest, BoundedRunHasOneWindowPerSecondAndCountsPartialDispatches) {
  core::FifoPolicy fifo;
  KernelSim sim(Options(seconds(3)), fifo);
  KernelLoopOptions k;
  k.kernel_cost_s = 0.7;  // dispatches straddle window boundaries and the end
  k.cpu_per_kernel_s = 0;
  ASSERT_TRUE(sim.AddTenant("a", 1, Kernels(k)).ok());
  auto r = sim.Run();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_DOUBLE_EQ(r->end_s, 3.0);
  ASSERT_EQ(r->device_time_windows.size(), 3u);
  for (const auto& w : r->device_time_windows) EXPECT_NEAR(w[0], 1.0, 1e-9);
  EXPECT_NEAR(r->tenants[0].device_time_s, 3.0, 1e-9);
  EXPECT_EQ(r->tenants[0].commands, 4u);  // ends at 0.7, 1.4, 2.1, 2.8
}

TEST(KernelSimTest, WorkloadsReportCpuTimeToThePolicy) {
  RecordingFifo policy;
  KernelSim sim(Options(seconds(1)), policy);
  FrameLoopOptions f;
  f.cpu_per_frame_s = 1e-3;
  f.cpu_per_block_s = 0;
  ASSERT_TRUE(sim.AddTenant("a", 1, Frames(f)).ok());
  auto r = sim.Run();
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(policy.cpu_.count(0), 1u);
  EXPECT_GT(ToSeconds(policy.cpu_[0]), 0.1);
  EXPECT_NEAR(ToSeconds(policy.cpu_[0]), r->tenants[0].cpu_time_s, 1e-12);
  EXPECT_GT(r->tenants[0].tasks, 100u);
}

// Seeded random workloads through every registered policy: each block is dispatched exactly once
// (the engine rejects any repeat, gap or order violation) and every submitted block completes.
TEST(KernelSimTest, EveryBlockDispatchedExactlyOnceUnderEveryPolicy) {
  for (const char* name : {"fifo", "rr", "credit", "split"}) {
    for (uint64_t seed = 1; seed <= 5; ++seed) {
      core::PolicySpec spec{name, {}, core::DeviceInfo{8, 64, 1ULL << 30, 8e9}};
      auto policy = core::MakePolicy(spec);
      if (!policy.ok()) {
        ADD_FAILURE() << name << ": " << policy.status().ToString();
        continue;
      }
      KernelSimOptions o = Options();
      o.seed = seed;
      o.devices = 1 + seed % 2;
      o.dispatch_overhead = std::chrono::microseconds(5);
      KernelSim sim(o, **policy);
      Rng rng(seed);
      const int tenants = 2 + static_cast<int>(seed % 4);
      for (int t = 0; t < tenants; ++t) {
        std::unique_ptr<Workload> w;
        if (rng.Bernoulli(0.5)) {
          KernelLoopOptions k = MatmulKernel(64 * (1 + rng.NextU64() % 8));
          k.tasks = 1 + rng.NextU64() % 5;
          k.kernels_per_task = 1 + static_cast<uint32_t>(rng.NextU64() % 3);
          k.upload_bytes = rng.NextU64() % 100000;
          k.interference = {1e-4, 0.3, 2, 1, 0, 0.5, 1e-4, 1e-3};
          w = Kernels(k);
        } else {
          FrameLoopOptions f;
          f.frames = 5 + rng.NextU64() % 40;
          f.interference = {1e-4, 0.2, 3, 2, 1, 0.3, 0, 1e-3};
          w = Frames(f);
        }
        ASSERT_TRUE(sim.AddTenant("t" + std::to_string(t), 1 + t % 3, std::move(w)).ok());
      }
      auto r = sim.Run();
      ASSERT_TRUE(r.ok()) << name << " seed " << seed << ": " << r.status().ToString();
      for (const auto& t : r->tenants) {
        EXPECT_EQ(t.commands, t.submitted) << name << " seed " << seed << " tenant " << t.name;
        EXPECT_GE(t.dispatches, t.commands);
      }
    }
  }
}

TEST(KernelSimTest, SameSeedSameResultDifferentSeedDifferentResult) {
  auto run = [](uint64_t seed) {
    core::FifoPolicy fifo;
    KernelSimOptions o = Options(seconds(2));
    o.seed = seed;
    KernelSim sim(o, fifo);
    for (int t = 0; t < 3; ++t) {
      FrameLoopOptions f;
      f.interference.jitter_s = 3e-4;
      f.interference.cost_cv = 0.3;
      EXPECT_TRUE(sim.AddTenant("t" + std::to_string(t), 1, Frames(f)).ok());
    }
    auto r = sim.Run();
    EXPECT_TRUE(r.ok());
    std::vector<double> out;
    for (const auto& t : r->tenants) {
      out.push_back(t.device_time_s);
      out.push_back(static_cast<double>(t.commands));
      out.insert(out.end(), t.completions_s.begin(), t.completions_s.end());
    }
    return out;
  };
  EXPECT_EQ(run(11), run(11));
  EXPECT_NE(run(11), run(12));
}

TEST(KernelSimTest, RejectsBadOptionsAndTenants) {
  core::FifoPolicy fifo;
  KernelSimOptions o = Options();
  o.window = Duration{0};
  KernelSim sim(o, fifo);
  EXPECT_FALSE(sim.AddTenant("a", 0, Frames({})).ok());
  EXPECT_FALSE(sim.AddTenant("a", 1, nullptr).ok());
  ASSERT_TRUE(sim.AddTenant("a", 1, Frames({})).ok());
  EXPECT_FALSE(sim.Run().ok());
  KernelLoopOptions k;
  k.work_items = 0;
  EXPECT_FALSE(MakeKernelLoop(k).ok());
}

TEST(WorkloadsTest, PresetsFollowTheirCostModels) {
  KernelLoopOptions m = MatmulKernel(9000);
  EXPECT_NEAR(m.kernel_cost_s, kMatmulSecondsPerN3 * 9000.0 * 9000.0 * 9000.0, 1e-9);
  EXPECT_EQ(m.work_items % m.local_size, 0u);
  EXPECT_NEAR(MatmulKernel(18000).kernel_cost_s / m.kernel_cost_s, 8.0, 1e-9);
  EXPECT_NEAR(SobelKernel(8192, 8192).kernel_cost_s / SobelKernel(4096, 4096).kernel_cost_s, 4.0,
              1e-9);
  EXPECT_NEAR(BinomialKernel(20'000'000).kernel_cost_s / BinomialKernel(5'000'000).kernel_cost_s,
              4.0, 1e-9);
  EXPECT_EQ(BinomialKernel(1000).work_items, 1024u);
}

}  // namespace
}  // namespace gmux::sim
