#include "core/fifo_policy.h"

#include <algorithm>
#include <cassert>

namespace gmux::core {

void FifoPolicy::AddTenant(const Tenant& tenant, TimePoint) {
  assert(pending_.count(tenant.id) == 0);
  pending_[tenant.id] = 0;
}

void FifoPolicy::RemoveTenant(TenantId tenant, TimePoint) {
  std::erase_if(queue_, [tenant](const Entry& e) { return e.tenant == tenant; });
  pending_.erase(tenant);
}

void FifoPolicy::Submit(const CommandBlock& block, TimePoint) {
  auto it = pending_.find(block.tenant);
  assert(it != pending_.end());
  queue_.push_back({block.tenant, block.id, block.work_items});
  ++it->second;
}

void FifoPolicy::Complete(const Completion&, TimePoint) {}

std::optional<Dispatch> FifoPolicy::Pick(TimePoint) {
  if (queue_.empty()) return std::nullopt;
  Entry e = queue_.front();
  queue_.pop_front();
  --pending_[e.tenant];
  return Dispatch{e.tenant, e.block, WorkRange{0, e.work_items}, true};
}

std::optional<Dispatch> FifoPolicy::PickTenant(TenantId tenant, TimePoint) {
  // The tenant's oldest block, ahead of older blocks of others.
  auto it = std::find_if(queue_.begin(), queue_.end(),
                         [tenant](const Entry& e) { return e.tenant == tenant; });
  if (it == queue_.end()) return std::nullopt;
  Entry e = *it;
  queue_.erase(it);
  --pending_[e.tenant];
  return Dispatch{e.tenant, e.block, WorkRange{0, e.work_items}, true};
}

size_t FifoPolicy::Pending(TenantId tenant) const {
  auto it = pending_.find(tenant);
  return it == pending_.end() ? 0 : it->second;
}

}  // namespace gmux::core
