#include "common/waiting_room.h"

#include <arpa/inet.h>

#include <algorithm>
#include <array>
#include <map>

namespace gmux::room {

size_t WaitingRoom::Admit(const std::vector<Waiter>& waiting, const std::string& group,
                         Clock::time_point now) {
  if (waiting.size() < capacity_) return kRoom;
  if (waiting.empty()) return kRefuse;  // capacity 0
  std::map<std::string, size_t> held;
  for (const Waiter& w : waiting) ++held[w.group];
  const auto mine = held.find(group);
  const size_t have = mine == held.end() ? 0 : mine->second;
  size_t most = 0;
  for (const auto& [g, n] : held) most = std::max(most, n);
  // Rule 1: the groups holding the most, when that is two more than the newcomer's; else rule
  // 3, unless rule 2 says the newcomer's group lost a connection lately: any group holding more.
  size_t least = most;
  if (most < have + 2) {
    if (auto p = penalty_until_.find(group); p != penalty_until_.end() && p->second > now) {
      return kRefuse;  // rule 2
    }
    least = have + 1;
  }
  size_t out = kRefuse;
  for (size_t i = 0; i < waiting.size(); ++i) {
    const bool may_go = held[waiting[i].group] >= least;
    if (may_go && (out == kRefuse || waiting[i].since < waiting[out].since)) out = i;
  }
  if (out == kRefuse) return kRefuse;  // rule 4
  if (penalty_until_.size() >= 4096) penalised(now);
  if (penalty_until_.size() >= 4096) penalty_until_.erase(penalty_until_.begin());
  penalty_until_[waiting[out].group] = now + kPenalty;
  return out;
}

size_t WaitingRoom::penalised(Clock::time_point now) {
  std::erase_if(penalty_until_, [now](const auto& e) { return e.second <= now; });
  return penalty_until_.size();
}

std::string OriginGroup(const std::string& origin) {
  static const std::string kAddress = "address ";
  if (origin.rfind(kAddress, 0) != 0) return origin;
  std::string host = origin.substr(kAddress.size());
  host = host.substr(0, host.find('%'));  // a link-local address's zone
  std::array<unsigned char, 16> a{};
  if (host.find(':') == std::string::npos || ::inet_pton(AF_INET6, host.c_str(), a.data()) != 1) {
    return origin;
  }
  static constexpr std::array<unsigned char, 12> kMapped = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff,
                                                            0xff};
  char text[INET6_ADDRSTRLEN] = {};
  if (std::equal(kMapped.begin(), kMapped.end(), a.begin())) {
    ::inet_ntop(AF_INET, a.data() + 12, text, sizeof(text));
    return kAddress + text;
  }
  std::fill(a.begin() + 8, a.end(), 0);
  ::inet_ntop(AF_INET6, a.data(), text, sizeof(text));
  return kAddress + text + "/64";
}

}  // namespace gmux::room
