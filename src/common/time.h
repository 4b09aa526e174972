// Time as gmux's pure layers see it: a clock with no now().
//
// `core` and `sim` never read a clock; the caller passes a TimePoint. The daemon converts its
// steady clock into this type at the edge; the simulator starts at TimePoint{} (zero).
#pragma once

#include <chrono>
#include <cstdint>

namespace gmux {

// A clock tag with no now(): time is always an argument.
struct PolicyClock {
  using rep = int64_t;
  using period = std::nano;
  using duration = std::chrono::nanoseconds;
  using time_point = std::chrono::time_point<PolicyClock>;
  static constexpr bool is_steady = true;
};

using Duration = std::chrono::nanoseconds;
using TimePoint = PolicyClock::time_point;

inline constexpr double ToSeconds(Duration d) { return static_cast<double>(d.count()) * 1e-9; }
inline constexpr double ToSeconds(TimePoint t) { return ToSeconds(t.time_since_epoch()); }
inline constexpr Duration FromSeconds(double s) {
  return Duration(static_cast<int64_t>(s * 1e9));
}
inline constexpr TimePoint AtSeconds(double s) { return TimePoint(FromSeconds(s)); }

}  // namespace gmux
