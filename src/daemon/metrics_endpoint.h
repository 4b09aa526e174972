// MetricsEndpoint: gmuxd's Prometheus endpoint (`[daemon] metrics_listen`, off by default).
//
// An HTTP listener (cpp-httplib, one thread) serving GET /metrics in Prometheus's text
// exposition format (version 0.0.4). Nothing is counted for it on the dispatch path: at each
// scrape it takes a snapshot of the state `gmux status --json` shows (the scheduler's and the
// frame controller's JSON) and turns it into metric families, so a scrape costs what one
// `gmux status` costs and an unscraped endpoint costs nothing. The metric names and labels are
// listed in docs/operations.md ("Metrics"); counters are monotonic for the daemon's lifetime
// (they restart at zero with gmuxd, as Prometheus expects of a process's counters).
//
// The endpoint shows every tenant's usage: bind it to loopback or a network only operators
// reach. Thread-safe; the snapshot sources are called from the listener's thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/status.h"

namespace httplib {
class Server;
}  // namespace httplib

namespace gmux::daemon {

class MetricsEndpoint {
 public:
  struct Sources {
    std::function<std::string()> scheduler;  // Scheduler::Status() JSON (every tenant)
    std::function<std::string()> frames;     // FrameHub::StatusJson(nullopt)
    std::function<uint64_t()> sessions;      // identified sessions now
  };

  // Listens on `listen` ("HOST:PORT"; port 0 picks a free one). kUnavailable when it cannot.
  static Result<std::unique_ptr<MetricsEndpoint>> Start(const std::string& listen,
                                                        Sources sources);
  ~MetricsEndpoint();

  uint16_t port() const { return port_; }

  struct Sample {
    std::vector<std::pair<std::string, std::string>> labels;
    double value = 0;
  };
  struct Family {
    std::string name, help, type;  // type: "counter" or "gauge"
    std::vector<Sample> samples;
  };
  // The metric families of one snapshot, and their text exposition (what a scrape returns).
  static std::vector<Family> Snapshot(const Sources& sources);
  static std::string Exposition(const std::vector<Family>& families);

 private:
  MetricsEndpoint() = default;
  Sources sources_;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  std::atomic<bool> done_{false};  // the listener returned
  uint16_t port_ = 0;
};

}  // namespace gmux::daemon
