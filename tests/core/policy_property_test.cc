// Property tests over seeded random workloads for every policy MakePolicy knows.
//
// A small deterministic driver plays the simulator's part: tenants submit bursts of kernels
// (some splittable), copies and markers; a device with one or two slots runs dispatches for a
// synthetic device time; the driver calls Tick at NextTimer(); some runs add a tenant late and
// remove one early. After every dispatch and at the end it checks the Policy contract:
//   - every block is dispatched exactly once: its chunks are contiguous, ascending, and cover
//     [0, work_items) exactly (a copy or marker once, as [0, 0));
//   - per-tenant order: a block starts only after every earlier block of its tenant finished
//     dispatching, and no block of a removed tenant is dispatched after the removal;
//   - Pending() counts the blocks not yet fully dispatched;
//   - no starvation: the run drains (no stall with work pending and nothing to wait for), and no
//     tenant waits longer than a bound with work pending while the device works for others.
// Each failure names the policy and the seed.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "core/policy.h"

namespace gmux::core {
namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;

// SplitMix64: the tests' only source of randomness.
struct Rng {
  uint64_t s;
  uint64_t Next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  uint64_t Below(uint64_t n) { return Next() % n; }
  double Uniform() { return static_cast<double>(Next() >> 11) / static_cast<double>(1ULL << 53); }
};

struct BlockState {
  CommandBlock block;
  uint64_t dispatched_end = 0;  // next expected range.begin
  bool started = false;
  bool done = false;  // last chunk dispatched
};

struct Arrival {
  TimePoint at;
  CommandBlock block;
};

struct Workload {
  std::vector<Tenant> tenants;
  std::vector<Arrival> arrivals;  // sorted by time, then by submission order
  std::vector<double> ns_per_item;
  TenantId late_tenant = kNoTenant;  // added at late_at
  TimePoint late_at{};
  TenantId removed_tenant = kNoTenant;  // removed at remove_at
  TimePoint remove_at{};
  int slots = 1;
};

Workload MakeWorkload(uint64_t seed) {
  Rng rng{seed};
  Workload w;
  const int n = 1 + static_cast<int>(rng.Below(6));
  w.slots = 1 + static_cast<int>(rng.Below(2));
  for (int i = 0; i < n; ++i) {
    w.tenants.push_back({TenantId(10 + i), "t" + std::to_string(i), 1.0 + double(rng.Below(4))});
    w.ns_per_item.push_back(50.0 + rng.Uniform() * 1950.0);  // 50 ns .. 2 µs per work-item
  }
  if (n >= 2 && rng.Below(3) == 0) {
    w.late_tenant = w.tenants.back().id;
    w.late_at = TimePoint{} + milliseconds(100 + rng.Below(400));
  }
  if (n >= 2 && rng.Below(3) == 0) {
    w.removed_tenant = w.tenants.front().id;
    w.remove_at = TimePoint{} + milliseconds(200 + rng.Below(600));
  }
  BlockId id = 1;
  for (int i = 0; i < n; ++i) {
    TimePoint t = TimePoint{} + microseconds(rng.Below(5000));
    if (w.tenants[i].id == w.late_tenant) t = w.late_at;
    const int bursts = 3 + static_cast<int>(rng.Below(10));
    for (int b = 0; b < bursts; ++b) {
      const int size = 1 + static_cast<int>(rng.Below(8));
      for (int k = 0; k < size; ++k) {
        CommandBlock blk;
        blk.id = id++;
        blk.tenant = w.tenants[i].id;
        blk.arrival = t;
        const uint64_t kind = rng.Below(10);
        if (kind < 7) {
          const uint64_t local = 64ULL << rng.Below(3);  // 64, 128 or 256
          blk.work_groups = 1 + rng.Below(64);
          blk.work_items = blk.work_groups * local;
          blk.splittable = rng.Below(2) == 0 ? Splittable::kYes : Splittable::kNo;
        } else if (kind < 9) {
          blk.kind = BlockKind::kCopy;
          blk.bytes = 4096 * (1 + rng.Below(256));
        } else {
          blk.kind = BlockKind::kMarker;
        }
        w.arrivals.push_back({t, blk});
      }
      t += microseconds(rng.Below(12000));  // bursts overlap: the device is contended
    }
  }
  std::stable_sort(w.arrivals.begin(), w.arrivals.end(),
                   [](const Arrival& a, const Arrival& b) { return a.at < b.at; });
  return w;
}

Duration DeviceTime(const Workload& w, size_t tenant_index, const CommandBlock& b,
                    const WorkRange& r, Rng& rng) {
  const double noise = 0.8 + 0.4 * rng.Uniform();
  double ns = 10000;  // markers
  if (b.kind == BlockKind::kKernel) {
    ns = 5000 + static_cast<double>(r.size()) * w.ns_per_item[tenant_index];
  } else if (b.kind == BlockKind::kCopy) {
    ns = 2000 + static_cast<double>(b.bytes);  // 1 GB/s
  }
  return Duration(static_cast<int64_t>(ns * noise));
}

struct InFlight {
  TimePoint end;
  Completion done;
};

// Runs one workload through one policy; returns a description of the first violated property
// (empty when all hold).
std::string RunAndCheck(const std::string& name, uint64_t seed) {
  Workload w = MakeWorkload(seed);
  PolicySpec spec{name, {}, {}};
  spec.device.compute_units = 8;
  spec.device.wavefront_width = 64;
  spec.device.memory_bytes = 1ULL << 30;
  spec.device.bus_bytes_per_s = 1e9;
  auto made = MakePolicy(spec);
  if (!made.ok()) return "MakePolicy failed: " + made.status().ToString();
  Policy& p = **made;
  Rng rng{seed ^ 0xABCDEFULL};

  std::map<TenantId, size_t> index;
  for (size_t i = 0; i < w.tenants.size(); ++i) index[w.tenants[i].id] = i;
  std::map<BlockId, BlockState> blocks;
  std::map<TenantId, std::vector<BlockId>> order;  // submission order per tenant
  std::map<TenantId, size_t> next_unfinished;      // index into order[tenant]
  std::map<TenantId, bool> present;
  std::map<TenantId, TimePoint> waiting_since;     // has pending work and no dispatch since
  std::vector<InFlight> running;
  Duration longest_wait{0};
  const Duration kWaitBound = std::chrono::seconds(5);

  TimePoint now{};
  for (const Tenant& t : w.tenants) {
    if (t.id == w.late_tenant) continue;
    p.AddTenant(t, now);
    present[t.id] = true;
  }
  size_t next_arrival = 0;
  bool late_added = w.late_tenant == kNoTenant;
  bool removed = w.removed_tenant == kNoTenant;
  uint64_t cpu_tick = 0;

  auto pending_of = [&](TenantId t) {
    size_t n = 0;
    for (size_t i = next_unfinished[t]; i < order[t].size(); ++i) n += blocks[order[t][i]].done ? 0 : 1;
    return n;
  };

  for (int step = 0; step < 200000; ++step) {
    // Events due now, in a fixed order: membership changes, completions, arrivals.
    if (!late_added && w.late_at <= now) {
      p.AddTenant(w.tenants[index[w.late_tenant]], now);
      present[w.late_tenant] = true;
      late_added = true;
    }
    if (!removed && w.remove_at <= now) {
      p.RemoveTenant(w.removed_tenant, now);
      present[w.removed_tenant] = false;
      waiting_since.erase(w.removed_tenant);
      removed = true;
    }
    for (size_t i = 0; i < running.size();) {
      if (running[i].end <= now) {
        p.Complete(running[i].done, now);
        running.erase(running.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        ++i;
      }
    }
    while (next_arrival < w.arrivals.size() && w.arrivals[next_arrival].at <= now) {
      const CommandBlock& b = w.arrivals[next_arrival++].block;
      if (!present[b.tenant]) continue;  // a removed (or not yet added) tenant submits nothing
      p.Submit(b, now);
      blocks[b.id] = BlockState{b};
      order[b.tenant].push_back(b.id);
      waiting_since.emplace(b.tenant, now);
      if (rng.Below(4) == 0) {
        p.ReportCpuTime(b.tenant, microseconds(++cpu_tick * (1 + rng.Below(500))), now);
        p.ReportMemory(b.tenant, 1ULL << (20 + rng.Below(8)), now);
      }
    }
    // Fill the device.
    while (static_cast<int>(running.size()) < w.slots) {
      std::optional<Dispatch> d = p.Pick(now);
      if (!d) break;
      auto it = blocks.find(d->block);
      if (it == blocks.end()) return "dispatched unknown block " + std::to_string(d->block);
      BlockState& bs = it->second;
      const CommandBlock& b = bs.block;
      if (d->tenant != b.tenant) return "dispatch names the wrong tenant for a block";
      if (!present[b.tenant]) return "dispatched a block of a removed tenant";
      if (bs.done) return "block " + std::to_string(b.id) + " dispatched twice";
      // Per-tenant order: this block must be the tenant's earliest unfinished one.
      size_t& first = next_unfinished[b.tenant];
      if (order[b.tenant][first] != b.id) {
        return "tenant " + std::to_string(b.tenant) + ": block " + std::to_string(b.id) +
               " dispatched before block " + std::to_string(order[b.tenant][first]);
      }
      if (d->range.begin != bs.dispatched_end) return "chunk not contiguous with the previous";
      if (b.work_items == 0) {
        if (d->range != (WorkRange{0, 0}) || !d->last) return "copy/marker not dispatched whole";
      } else {
        if (d->range.end <= d->range.begin) return "empty chunk of a kernel";
        if (d->range.end > b.work_items) return "chunk past the end of the block";
        if (b.splittable == Splittable::kNo && d->range != (WorkRange{0, b.work_items})) {
          return "unsplittable block was split";
        }
        if (d->last != (d->range.end == b.work_items)) return "`last` does not match the range";
      }
      bs.started = true;
      bs.dispatched_end = d->range.end;
      if (d->last) {
        bs.done = true;
        while (first < order[b.tenant].size() && blocks[order[b.tenant][first]].done) ++first;
      }
      // Starvation bookkeeping: the tenant was served.
      if (auto ws = waiting_since.find(b.tenant); ws != waiting_since.end()) {
        longest_wait = std::max(longest_wait, now - ws->second);
        waiting_since.erase(ws);
      }
      if (pending_of(b.tenant) > 0) waiting_since[b.tenant] = now;
      Duration dt = DeviceTime(w, index[b.tenant], b, d->range, rng);
      running.push_back({now + dt, Completion{d->tenant, d->block, d->range, dt, d->last}});
    }
    // Pending() matches the driver's count.
    for (const auto& [tenant, here] : present) {
      if (here && p.Pending(tenant) != pending_of(tenant)) {
        return "Pending(" + std::to_string(tenant) + ") = " + std::to_string(p.Pending(tenant)) +
               ", expected " + std::to_string(pending_of(tenant));
      }
    }
    for (const auto& [tenant, since] : waiting_since) {
      if (now - since > kWaitBound) {
        return "tenant " + std::to_string(tenant) + " starved for " +
               std::to_string(ToSeconds(now - since)) + " s";
      }
    }
    // Advance to the next event.
    std::optional<TimePoint> next;
    auto consider = [&](TimePoint t) {
      if (t > now && (!next || t < *next)) next = t;
    };
    for (const InFlight& f : running) consider(f.end);
    if (next_arrival < w.arrivals.size()) consider(w.arrivals[next_arrival].at);
    if (!late_added) consider(w.late_at);
    if (!removed) consider(w.remove_at);
    if (auto timer = p.NextTimer()) consider(*timer);
    if (!next) break;  // nothing left to happen
    now = *next;
    p.Tick(now);
  }
  // Exactly once: every block of a tenant still present was dispatched completely.
  for (const auto& [id, bs] : blocks) {
    if (present[bs.block.tenant] && !bs.done) {
      return "block " + std::to_string(id) + " of tenant " + std::to_string(bs.block.tenant) +
             " never finished dispatching (stall or starvation)";
    }
  }
  if (!running.empty()) return "driver stopped with work in flight";
  return "";
}

TEST(PolicyPropertyTest, EveryKnownPolicyKeepsTheContractOnRandomWorkloads) {
  int policies_run = 0;
  for (const std::string name : {"fifo", "rr", "credit", "split"}) {
    auto probe = MakePolicy({name, {}, {}});
    if (!probe.ok()) {
      // Only a policy that is not registered yet may be skipped.
      ASSERT_NE(probe.status().message().find("unknown policy"), std::string::npos)
          << name << ": " << probe.status().ToString();
      continue;
    }
    ++policies_run;
    for (uint64_t seed = 1; seed <= 40; ++seed) {
      std::string failure = RunAndCheck(name, seed);
      EXPECT_EQ(failure, "") << "policy " << name << ", seed " << seed;
    }
  }
  EXPECT_GE(policies_run, 3);  // fifo, rr and credit at least
}

TEST(PolicyPropertyTest, SameSeedSameDispatchSequence) {
  // Determinism, which the simulator relies on: two runs of one seed agree exactly.
  for (const std::string name : {"fifo", "rr", "credit", "split"}) {
    auto a = MakePolicy({name, {}, {}});
    if (!a.ok()) continue;
    auto b = MakePolicy({name, {}, {}});
    ASSERT_TRUE(b.ok());
    Workload w = MakeWorkload(99);
    std::vector<std::pair<BlockId, uint64_t>> seq[2];
    int k = 0;
    for (Policy* p : {a->get(), b->get()}) {
      TimePoint now{};
      for (const Tenant& t : w.tenants) p->AddTenant(t, now);
      for (const Arrival& arr : w.arrivals) {
        now = std::max(now, arr.at);
        p->Submit(arr.block, now);
        if (auto d = p->Pick(now)) {
          seq[k].emplace_back(d->block, d->range.end);
          now += microseconds(300);
          p->Complete({d->tenant, d->block, d->range, microseconds(300), d->last}, now);
        }
      }
      ++k;
    }
    EXPECT_EQ(seq[0], seq[1]) << name;
    EXPECT_FALSE(seq[0].empty()) << name;
  }
}

}  // namespace
}  // namespace gmux::core
