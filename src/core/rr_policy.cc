#include "core/rr_policy.h"

#include <algorithm>
#include <cassert>

namespace gmux::core {

void RrPolicy::AddTenant(const Tenant& tenant, TimePoint) {
  assert(channels_.count(tenant.id) == 0);
  assert(tenant.weight > 0);
  channels_[tenant.id];
}

void RrPolicy::RemoveTenant(TenantId tenant, TimePoint) {
  if (channels_.erase(tenant) == 0) return;
  std::erase(ring_, tenant);
}

void RrPolicy::Submit(const CommandBlock& block, TimePoint) {
  auto it = channels_.find(block.tenant);
  assert(it != channels_.end());
  if (it->second.empty()) ring_.push_back(block.tenant);
  it->second.push_back({block.id, block.work_items});
}

void RrPolicy::Complete(const Completion&, TimePoint) {}

std::optional<Dispatch> RrPolicy::Pick(TimePoint) {
  if (ring_.empty()) return std::nullopt;
  TenantId tenant = ring_.front();
  ring_.pop_front();
  std::deque<Entry>& channel = channels_.at(tenant);
  assert(!channel.empty());
  Entry e = channel.front();
  channel.pop_front();
  if (!channel.empty()) ring_.push_back(tenant);
  return Dispatch{tenant, e.block, WorkRange{0, e.work_items}, true};
}

std::optional<Dispatch> RrPolicy::PickTenant(TenantId tenant, TimePoint) {
  auto ch = channels_.find(tenant);
  if (ch == channels_.end() || ch->second.empty()) return std::nullopt;
  Entry e = ch->second.front();
  ch->second.pop_front();
  // Its place in the ring stays: the out-of-turn block does not cost it its turn (RR does not
  // account time; under batching the slice bounds how long others wait).
  if (ch->second.empty()) std::erase(ring_, tenant);
  return Dispatch{tenant, e.block, WorkRange{0, e.work_items}, true};
}

size_t RrPolicy::Pending(TenantId tenant) const {
  auto it = channels_.find(tenant);
  return it == channels_.end() ? 0 : it->second.size();
}

}  // namespace gmux::core
