// EventQueue: the deterministic heart of the discrete-event simulator.
//
// Events are ordered by (time, insertion sequence), so two events at the same instant run in the
// order they were scheduled and a run is reproducible byte for byte. Single-threaded.
#pragma once

#include <cstdint>
#include <functional>
#include <queue>
#include <vector>

#include "common/time.h"

namespace gmux::sim {

class EventQueue {
 public:
  using Action = std::function<void()>;

  // Schedules `action` at `at`. Precondition: at >= now().
  void At(TimePoint at, Action action) {
    heap_.push(Event{at, seq_++, std::move(action)});
  }
  void After(Duration d, Action action) { At(now_ + d, std::move(action)); }

  // Runs events until none is left or the next one is later than `until`; now() ends at
  // min(until, time of the last event run). Returns the number of events run.
  uint64_t RunUntil(TimePoint until) {
    uint64_t n = 0;
    while (!heap_.empty() && heap_.top().at <= until) {
      // Move the action out before popping: the action may schedule more events.
      Event e = std::move(const_cast<Event&>(heap_.top()));
      heap_.pop();
      now_ = e.at;
      e.action();
      ++n;
    }
    if (heap_.empty() || until < heap_.top().at) now_ = std::max(now_, until);
    return n;
  }

  TimePoint now() const { return now_; }
  bool empty() const { return heap_.empty(); }
  size_t size() const { return heap_.size(); }

 private:
  struct Event {
    TimePoint at;
    uint64_t seq;
    Action action;
    bool operator>(const Event& o) const { return at != o.at ? at > o.at : seq > o.seq; }
  };
  std::priority_queue<Event, std::vector<Event>, std::greater<>> heap_;
  TimePoint now_{};
  uint64_t seq_ = 0;
};

}  // namespace gmux::sim
