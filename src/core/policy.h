// Policy: the interface every command-block scheduler in gmux implements.
//
// A Policy owns one V-channel (FIFO of pending blocks) per tenant and decides which tenant's
// head block (or which chunk of it) the device runs next. It is pure: no I/O, no threads, no
// clock reads; every call receives the current time. The same object is driven by the simulator
// (sim/) and by the daemon's scheduler thread, which is its only caller (not thread-safe).
//
// Contract, for every implementation:
//   - Per-tenant order: blocks of one tenant are dispatched in Submit() order; a split block's
//     chunks are dispatched in ascending, contiguous ranges, and no later block of that tenant is
//     dispatched before the block's last chunk.
//   - Every submitted block is dispatched exactly once in total (all its chunks cover
//     [0, work_items) exactly), unless its tenant is removed first.
//   - Pick() returning nullopt while work is pending means the policy is deliberately holding
//     work back (credits exhausted, a throttled round); the driver calls Pick() again after the
//     next event or at NextTimer().
//   - The driver calls Pick() only when the device can accept work; a returned Dispatch is
//     committed (the policy counts it in flight until Complete()).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "common/status.h"
#include "core/model.h"

namespace gmux::core {

class Policy {
 public:
  virtual ~Policy() = default;

  // Short name as used in configs and JSON ("fifo", "rr", "credit", "split").
  virtual std::string_view name() const = 0;

  // A tenant joins. Precondition: id not present. Weight must be > 0.
  virtual void AddTenant(const Tenant& tenant, TimePoint now) = 0;

  // A tenant leaves; its pending blocks are dropped (in-flight ones may still Complete()).
  virtual void RemoveTenant(TenantId tenant, TimePoint now) = 0;

  // A tenant's weight changes at run time (an operator's `gmux tenant set`); its queued blocks
  // stay. Policies that ignore weights ignore it. Unknown tenants are ignored. Weight > 0.
  virtual void SetWeight(TenantId /*tenant*/, double /*weight*/, TimePoint /*now*/) {}

  // A block arrives on its tenant's V-channel. Precondition: the tenant was added; block.id
  // unique. Blocks of one tenant arrive in that tenant's order.
  virtual void Submit(const CommandBlock& block, TimePoint now) = 0;

  // A dispatch (a whole block or one chunk) finished with the measured device time.
  virtual void Complete(const Completion& done, TimePoint now) = 0;

  // Periodic call so time-driven rules (replenishment intervals) can act without an event.
  virtual void Tick(TimePoint now) = 0;

  // The next thing to run, or nullopt (nothing pending, or holding back by design).
  virtual std::optional<Dispatch> Pick(TimePoint now) = 0;

  // When the policy next wants Tick() even if nothing else happens (nullopt: no timer).
  virtual std::optional<TimePoint> NextTimer() const { return std::nullopt; }

  // Optional resource reports (VMCG): CPU time the tenant consumed so far (cumulative), and the
  // device memory it currently holds. Policies that do not use them ignore them.
  virtual void ReportCpuTime(TenantId /*tenant*/, Duration /*cumulative_cpu*/, TimePoint /*now*/) {}
  virtual void ReportMemory(TenantId /*tenant*/, uint64_t /*bytes*/, TimePoint /*now*/) {}

  // Blocks submitted by `tenant` and not yet fully dispatched.
  virtual size_t Pending(TenantId tenant) const = 0;

  // Swap batching (docs/policies.md, "Device memory"): the driver asks for `tenant`'s next
  // dispatch out of turn, to keep running a tenant whose data is on the device instead of paying
  // to move another tenant's data in. The policy accounts it as it would its own pick (credit
  // charged by device time, chunks as usual), so the tenant pays for it out of its later turns
  // and the weights hold over time. nullopt: nothing pending for `tenant`, or the policy does not
  // take out-of-turn picks (the default; the driver then switches as Pick() says).
  virtual std::optional<Dispatch> PickTenant(TenantId /*tenant*/, TimePoint /*now*/) {
    return std::nullopt;
  }
  // Whether PickTenant() can return anything (false: the driver does not batch for it).
  virtual bool PicksOutOfTurn() const { return false; }

  // Express dispatch (docs/policies.md, "Express dispatch"). While one tenant has had a device
  // to itself, the driver may let that tenant's commands start without a Pick() and account them
  // afterwards, which saves the driver's round trip when there is nobody to be fair to.
  // ExpressOk(): with no other tenant's work pending or in flight, this policy would dispatch
  // every block `tenant` submits whole, in order, as soon as the device has room (no holding
  // back, no splitting). Policies that may hold back or split a lone tenant keep the default.
  virtual bool ExpressOk(TenantId /*tenant*/, TimePoint /*now*/) const { return false; }
  // Whether Express() stays exact while the tenant has other blocks pending or expressed, so
  // that several drivers' channels of one tenant (a tenant's sessions) may hold express at once.
  virtual bool ExpressSharedOk() const { return false; }
  // Whether, while the device has room, this policy dispatches every tenant's ready blocks at
  // once whatever the others do (no weights, credits or turns to keep): then different tenants
  // may hold express at once too, each with a share of the device's slots.
  virtual bool ExpressAcrossTenantsOk() const { return false; }
  // Accounts one block the driver dispatched whole by express, as if Submit() had queued it and
  // Pick() had chosen it; it is in flight until Complete(). Precondition: ExpressOk() held when
  // the driver granted express, and `block.tenant` has no block pending in this policy.
  virtual void Express(const CommandBlock& block, TimePoint now) {
    Submit(block, now);
    (void)Pick(now);
  }
};

// A policy by name with numeric parameters, as written in a scenario or daemon config.
struct PolicySpec {
  std::string name;                       // "fifo", "rr", "credit", "split"
  std::map<std::string, double> params;   // policy-specific; unknown keys are an error
  DeviceInfo device;
};

// Builds a policy. Errors (kInvalidArgument) name the policy and the offending parameter.
Result<std::unique_ptr<Policy>> MakePolicy(const PolicySpec& spec);

// Names MakePolicy accepts, for --help and error messages.
std::string_view KnownPolicyNames();

}  // namespace gmux::core
