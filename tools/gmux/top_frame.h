// The pure half of `gmux top`: a short history of gmuxd's Stats replies, the figures derived
// from it (each tenant's share of device time over the last refresh interval and over a longer
// window, its weight's share, each device's busy time per second) and one frame of plain text.
//
// No sockets, no curses and no clock: the caller stamps each sample with a monotonic time, so a
// test drives it with made-up replies. Not thread-safe; `gmux top` uses it from one thread.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace gmux::cli {

// The tenants table's sort column. Names ascend; every other column descends (largest first);
// ties go by name.
enum class TopSort { kName, kShare, kWeight, kQueue, kMemory, kDeviceTime };

// "name", "share", "weight", "queue", "memory", "time".
std::string_view TopSortName(TopSort sort);
// The column named `name` (one of TopSortName's), or nullopt.
std::optional<TopSort> ParseTopSort(std::string_view name);
// The next column in the order above (`step` 1) or the previous one (`step` -1), wrapping.
TopSort CycleTopSort(TopSort sort, int step);

// One tenant as shown. Shares are fractions in [0, 1]; nullopt where there is nothing to divide
// (fewer than two samples, or no tenant used the device over that span).
struct TopTenant {
  std::string name;
  double weight = 0;
  // The tenant's weight over the weights of the busy tenants (those that used the device over
  // the window or have commands queued or in flight): what a weighted policy aims to give it.
  // nullopt for a tenant that is not busy.
  std::optional<double> weight_share;
  std::optional<double> share_now;     // of device time over the last refresh interval
  std::optional<double> share_window;  // of device time over the window
  double device_time_s = 0;            // since gmuxd started
  uint64_t queued = 0;                 // commands waiting in the policies
  uint64_t inflight = 0;               // commands on a device
  uint64_t sessions = 0;
  uint64_t memory_bytes = 0;  // device memory held now, all devices together
  uint64_t memory_quota = 0;  // per device; 0: none
};

struct TopDevice {
  int index = 0;
  std::string policy;
  uint64_t inflight = 0, inflight_limit = 0, queued = 0, held = 0, dispatches = 0;
  // Device time of completed dispatches per wall second over the last interval (can pass 1
  // when several commands run at once); nullopt with fewer than two samples.
  std::optional<double> busy_now;
  uint64_t memory_used = 0, memory_capacity = 0;
  std::optional<uint64_t> express_session;
};

// The samples of the last window. Each sample is one Stats reply (`gmux status --json`).
class TopHistory {
 public:
  // `window_s` > 0: the span of the window share.
  explicit TopHistory(double window_s) : window_s_(window_s) {}

  // Adds a reply taken at `t_s` (seconds on a monotonic clock, later than the last sample's).
  // A reply that is not a JSON object counts as an empty one. Samples that fall out of the
  // window go, except the newest of them, which is where the window's differences start.
  void Add(double t_s, nlohmann::json stats);
  // Forgets every sample: after the daemon went away, its counters may start again from zero.
  void Clear() { samples_.clear(); }

  bool empty() const { return samples_.empty(); }
  // The newest reply; an empty object when there is none.
  const nlohmann::json& latest() const;
  double window_s() const { return window_s_; }
  // Seconds between the last two samples (the "now" of share_now); 0 with fewer than two.
  double interval_s() const;
  // Seconds the window share covers: window_s() once enough samples are in, less before.
  double window_span_s() const;

  std::vector<TopTenant> Tenants(TopSort sort) const;
  std::vector<TopDevice> Devices() const;

 private:
  struct Sample {
    double t_s;
    nlohmann::json stats;
  };
  double window_s_;
  std::deque<Sample> samples_;
};

// What a frame shows besides the daemon's figures.
struct TopView {
  std::string daemon;        // the socket, for the title
  std::string clock;         // wall-clock time for the title, e.g. "12:34:56"; may be empty
  double refresh_s = 1;      // the polling interval asked for
  TopSort sort = TopSort::kShare;
  bool paused = false;
  std::string error;         // non-empty: the daemon was not reachable, and why
};

// One frame as plain-text lines, no longer than 100 columns except for names the daemon sent.
struct TopFrame {
  std::vector<std::string> lines;
  std::vector<int> header_lines;  // the tables' column titles (shown reversed)
  int tenant_header = -1;         // the tenants' column titles: a line index, or -1
  size_t sort_begin = 0, sort_len = 0;  // the sort column's title within that line
  int error_line = -1;
};

// The title, a state line (paused, or why the daemon is not reachable), then devices,
// tenants, the device pool's leases and frame agents where the daemon reports them.
TopFrame RenderTopFrame(const TopHistory& history, const TopView& view);

// The figures of a frame as JSON (`gmux top --once --json`): interval_s, window_s,
// window_span_s, sort, devices, tenants (sorted; absent shares are null), and the daemon's own
// `pool` and `frames` objects where it sent them.
nlohmann::json TopJson(const TopHistory& history, TopSort sort);

// The help screen's lines (keys and columns).
std::vector<std::string> TopHelpLines();

}  // namespace gmux::cli
