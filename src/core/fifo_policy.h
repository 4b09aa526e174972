// FifoPolicy: one queue shared by all tenants, served in arrival order.
//
// The baseline VMCG measures for gVirt (Section 2): every tenant's command blocks are
// aggregated into one request queue in Dom0 and dispatched first come, first served, so a tenant
// that submits more or larger blocks gets more of the device. Blocks are never split.
//
// Invariants: the queue holds blocks in Submit() order, which keeps per-tenant order.
#pragma once

#include <deque>
#include <unordered_map>

#include "core/policy.h"

namespace gmux::core {

class FifoPolicy final : public Policy {
 public:
  std::string_view name() const override { return "fifo"; }
  void AddTenant(const Tenant& tenant, TimePoint now) override;
  void RemoveTenant(TenantId tenant, TimePoint now) override;
  void Submit(const CommandBlock& block, TimePoint now) override;
  void Complete(const Completion& done, TimePoint now) override;
  void Tick(TimePoint) override {}
  std::optional<Dispatch> Pick(TimePoint now) override;
  std::optional<Dispatch> PickTenant(TenantId tenant, TimePoint now) override;
  bool PicksOutOfTurn() const override { return true; }
  size_t Pending(TenantId tenant) const override;
  // Neither holds back nor splits: a lone tenant's blocks go out whole, in order.
  bool ExpressOk(TenantId, TimePoint) const override { return true; }
  bool ExpressSharedOk() const override { return true; }  // Express() records nothing
  bool ExpressAcrossTenantsOk() const override { return true; }
  // Nothing to account: the policy keeps no state for dispatched blocks.
  void Express(const CommandBlock&, TimePoint) override {}

 private:
  struct Entry {
    TenantId tenant;
    BlockId block;
    uint64_t work_items;
  };
  std::deque<Entry> queue_;
  std::unordered_map<TenantId, size_t> pending_;  // per-tenant count of entries in queue_
};

}  // namespace gmux::core
