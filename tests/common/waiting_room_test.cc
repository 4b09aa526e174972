#include "common/waiting_room.h"

#include <gtest/gtest.h>

namespace gmux::room {
namespace {

using std::chrono::milliseconds;

const Clock::time_point t0{};

Waiter At(const std::string& group, int ms) { return {group, t0 + milliseconds(ms)}; }

TEST(WaitingRoomTest, RoomLeftAdmitsWithoutClosingAnyone) {
  WaitingRoom room(3);
  std::vector<Waiter> w = {At("a", 0), At("b", 1)};
  EXPECT_EQ(room.Admit(w, "c", t0), kRoom);
  EXPECT_EQ(room.Admit({}, "c", t0), kRoom);
  WaitingRoom none(0);
  EXPECT_EQ(none.Admit({}, "c", t0), kRefuse);
}

TEST(WaitingRoomTest, AGroupHoldingTwoMoreLosesItsOldest) {
  std::vector<Waiter> w = {At("a", 5), At("a", 3), At("b", 1), At("a", 9)};
  {
    WaitingRoom room(4);
    // "c" holds none, "a" holds 3: a's oldest (index 1) goes, not b's older one.
    EXPECT_EQ(room.Admit(w, "c", t0), 1u);
  }
  {
    WaitingRoom room(4);
    EXPECT_EQ(room.Admit(w, "b", t0), 1u);  // 3 >= 1 + 2
  }
  {
    WaitingRoom room(4);
    EXPECT_EQ(room.Admit(w, "a", t0), kRefuse);  // the greediest cannot displace anyone
  }
}

TEST(WaitingRoomTest, ManyGroupsOfOneLoseTheirOldest) {
  // The lockout this closes: one silent connection from each of `capacity` addresses.
  WaitingRoom room(4);
  std::vector<Waiter> w = {At("x1", 30), At("x2", 10), At("x3", 20), At("x4", 40)};
  EXPECT_EQ(room.Admit(w, "me", t0 + milliseconds(50)), 1u);
  // A group holding as many as any other cannot displace: x4 holds one, so do all.
  WaitingRoom other(4);
  EXPECT_EQ(other.Admit(w, "x4", t0 + milliseconds(50)), kRefuse);
}

TEST(WaitingRoomTest, AGroupThatLostAConnectionCannotDisplaceOthersForAWhile) {
  WaitingRoom room(4);
  std::vector<Waiter> w = {At("x1", 30), At("x2", 10), At("x3", 20), At("x4", 40)};
  const Clock::time_point now = t0 + milliseconds(50);
  ASSERT_EQ(room.Admit(w, "me", now), 1u);  // x2 goes
  // x2 reopens at once: it would close x3's, then x3 x1's... and at last "me"'s. Refused.
  std::vector<Waiter> after = {At("x1", 30), At("me", 50), At("x3", 20), At("x4", 40)};
  EXPECT_EQ(room.Admit(after, "x2", now + milliseconds(1)), kRefuse);
  EXPECT_EQ(room.penalised(now), 1u);
  // Another newcomer still gets in (x3, the oldest of a group holding more than none).
  EXPECT_EQ(room.Admit(after, "you", now + milliseconds(1)), 2u);
  // While there is room, a penalised group waits like anyone.
  after.pop_back();
  EXPECT_EQ(room.Admit(after, "x2", now + milliseconds(2)), kRoom);
  // The penalty ends.
  after.push_back(At("x4", 40));
  EXPECT_EQ(room.Admit(after, "x2", now + kPenalty + milliseconds(1)), 2u);  // x3, the oldest
  EXPECT_EQ(room.penalised(now + kPenalty + milliseconds(2)), 1u);  // x3 again; x2's is over
}

TEST(WaitingRoomTest, APenalisedGroupStillTakesBackFromTheGreediest) {
  // A busy NAT "g" lost a connection to make room (penalised); a flooder "a" then holds 3 of 4.
  WaitingRoom room(4);
  std::vector<Waiter> w = {At("g", 1), At("a", 2), At("b", 3), At("d", 4)};
  ASSERT_EQ(room.Admit(w, "c", t0 + milliseconds(5)), 0u);  // g's, by rule 3
  std::vector<Waiter> flooded = {At("a", 6), At("a", 2), At("a", 3), At("b", 4)};
  EXPECT_EQ(room.Admit(flooded, "g", t0 + milliseconds(7)), 1u);  // a's oldest, by rule 1
  // Penalised and not two behind anyone: refused.
  std::vector<Waiter> even = {At("g", 8), At("a", 6), At("b", 4), At("c", 5)};
  EXPECT_EQ(room.Admit(even, "g", t0 + milliseconds(9)), kRefuse);
}

TEST(WaitingRoomTest, AmongGroupsHoldingTheMostTheOldestConnectionGoes) {
  // "a" and "b" hold two each: not the first by name, the oldest.
  std::vector<Waiter> w = {At("a", 5), At("b", 2), At("a", 7), At("b", 9)};
  WaitingRoom room(4);
  EXPECT_EQ(room.Admit(w, "c", t0 + milliseconds(10)), 1u);
}

TEST(WaitingRoomTest, Ipv6CountsAsItsSlash64AndMappedIpv4AsIpv4) {
  EXPECT_EQ(OriginGroup("address 2001:db8:1:2:aaaa::1"), "address 2001:db8:1:2::/64");
  EXPECT_EQ(OriginGroup("address 2001:db8:1:2:bbbb:cccc:dddd:eeee"), "address 2001:db8:1:2::/64");
  EXPECT_NE(OriginGroup("address 2001:db8:1:3::1"), OriginGroup("address 2001:db8:1:2::1"));
  EXPECT_EQ(OriginGroup("address ::1"), "address ::/64");
  EXPECT_EQ(OriginGroup("address ::ffff:10.1.2.3"), "address 10.1.2.3");
  EXPECT_EQ(OriginGroup("address 10.1.2.3"), "address 10.1.2.3");
  EXPECT_EQ(OriginGroup("uid 1000"), "uid 1000");
  EXPECT_EQ(OriginGroup("address ?"), "address ?");
  EXPECT_EQ(OriginGroup("address fe80::1%eth0"), "address fe80::/64");
}

}  // namespace
}  // namespace gmux::room
