// The room for connections that have not yet identified themselves (a TLS handshake in the
// gateway, a hello in the broker), and who must leave when it is full.
//
// Pure but for its memory of penalties: the caller lists who is waiting, and since when. Both
// gmuxd's TLS gateway and its broker apply this one rule (docs/policies.md, "Operations:
// connections that say nothing").
#pragma once

#include <chrono>
#include <cstddef>
#include <limits>
#include <map>
#include <string>
#include <vector>

namespace gmux::room {

using Clock = std::chrono::steady_clock;

struct Waiter {
  std::string group;  // OriginGroup() of where it came from
  Clock::time_point since;
};

inline constexpr size_t kRoom = std::numeric_limits<size_t>::max();        // admit, nobody goes
inline constexpr size_t kRefuse = std::numeric_limits<size_t>::max() - 1;  // the newcomer goes

// A group one of whose connections was closed to make room may not close others' for a while.
inline constexpr Clock::duration kPenalty = std::chrono::seconds(10);

class WaitingRoom {
 public:
  explicit WaitingRoom(size_t capacity) : capacity_(capacity) {}
  void set_capacity(size_t capacity) { capacity_ = capacity; }
  size_t capacity() const { return capacity_; }

  // Decides for a newcomer from `group`: kRoom, kRefuse, or the index in `waiting` of the one
  // to close so that the newcomer may wait in its place. While there is room, anyone waits.
  // When full:
  //  1. if the groups holding the most hold at least two more than the newcomer's, the oldest
  //     connection among them goes (one address cannot keep the others out by opening
  //     connections and saying nothing);
  //  2. else a group that lost a connection to make room within kPenalty is refused (so a peer
  //     that reopens each connection closed under it cannot in turn close someone else's by
  //     rule 3, and so on until the newcomer's own is closed);
  //  3. else the oldest connection of any group holding more than the newcomer's goes (so many
  //     addresses holding one silent connection each cannot keep anyone out either);
  //  4. else (the newcomer's group holds as many as any) it is refused.
  // The group whose connection goes is penalised (rule 2).
  size_t Admit(const std::vector<Waiter>& waiting, const std::string& group,
               Clock::time_point now);

  // Groups under penalty now (bounded memory: expired ones are forgotten).
  size_t penalised(Clock::time_point now);

 private:
  size_t capacity_;
  std::map<std::string, Clock::time_point> penalty_until_;
};

// The group an origin counts in: itself, except that an IPv6 address counts as its /64 (one
// host is commonly given a whole /64, so single addresses cost an attacker nothing) and an
// IPv4-mapped IPv6 address as the IPv4 address. Origins look like "address 2001:db8::1" or
// "uid 1000"; anything else is its own group.
std::string OriginGroup(const std::string& origin);

}  // namespace gmux::room
