// gmux bench: plain OpenCL workloads, written the way ordinary programs write them (blocking
// calls, a std::vector on the host), natively and through gmux in one run, with the ratios.
#pragma once

#include <string>
#include <vector>

namespace gmux::cli {

struct BenchOptions {
  std::string socket;           // a running gmuxd; empty: $GMUX_SOCKET, else start one
  std::string address;          // a gmuxd over TCP instead (GMUX_ADDRESS form; TLS by default)
  std::string native;           // the native platform's name (substring); empty: the first other
  std::vector<std::string> sizes{"4K", "64K", "1M", "16M", "256M"};  // transfer sizes
  int clients = 8;              // processes in the many-clients run (0: none)
  int repeat = 3;               // runs of each workload per platform (the median is reported)
  bool quick = false;           // fewer iterations, small sizes (a check, not a measurement)
  bool json = false;
};

int RunBench(const BenchOptions& o);

}  // namespace gmux::cli
