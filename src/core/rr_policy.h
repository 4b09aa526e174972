// RrPolicy: round robin over the tenants that have pending work, one whole block per turn.
//
// The second baseline (ARCHITECTURE.md, "Baselines"). Every tenant owns a V-channel (FIFO of its
// pending blocks). Tenants with at least one pending block sit in a ring in the order they last
// became backlogged; Pick() takes the tenant at the front of the ring, dispatches the head block
// of its V-channel whole, and moves the tenant to the back of the ring if it still has blocks.
// Weights are ignored and block sizes are not measured: every backlogged tenant gets one block per
// round, so a tenant with large blocks gets proportionally more device time (which is what the
// credit policy corrects).
//
// Invariants:
//   - ring_ holds exactly the tenants whose V-channel is non-empty, each once.
//   - Blocks of one tenant are dispatched in Submit() order (the V-channel is a FIFO).
//   - A backlogged tenant waits at most (ring size − 1) dispatches for its next turn: no starvation.
//
// Not thread-safe: the single owner (simulator or daemon scheduler thread) calls it.
#pragma once

#include <deque>
#include <unordered_map>

#include "core/policy.h"

namespace gmux::core {

class RrPolicy final : public Policy {
 public:
  std::string_view name() const override { return "rr"; }
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
    BlockId block;
    uint64_t work_items;
  };
  std::unordered_map<TenantId, std::deque<Entry>> channels_;  // V-channel per tenant
  std::deque<TenantId> ring_;                                 // backlogged tenants, next first
};

}  // namespace gmux::core
