// Fairness and consistency metrics shared by the simulator, the daemon and the benchmarks.
//
//   VMCG (Section 6):   λ = Σ_i |w_i − w'_i|, w_i the normalised configured weight, w'_i = G_i/G
//                       the measured share of throughput over an interval [t1, t2]. The paper
//                       reports λ over time intervals; MeanWindowedLambda averages it over
//                       consecutive windows of a run.
//   Jain's index:       J = (Σ x_i)² / (n Σ x_i²) with x_i = share_i / weight_i; 1 is perfectly fair.
//   Kang & Yu (Fig. 3, 8): completion times of repeated tasks summarised by mean, min, max,
//                       quartiles and the deviation (max − min) / mean.
//
// Pure functions and a small accumulator; no clocks.
#pragma once

#include <cstddef>
#include <vector>

#include "common/time.h"

namespace gmux::core {

// λ for one interval. `weights` are configured weights (any positive scale; normalised here),
// `throughput` the amount each tenant got in the interval (same order). Returns 0 when the total
// throughput is 0. Precondition: equal sizes, weights > 0.
double FairnessLambda(const std::vector<double>& weights, const std::vector<double>& throughput);

// Jain's fairness index over x_i = share_i / normalised weight_i; 1 when every tenant got exactly
// its weighted share. Returns 1 for empty input or all-zero shares.
double JainIndex(const std::vector<double>& weights, const std::vector<double>& shares);

// Accumulates per-tenant amounts (device seconds, blocks, work-items) into fixed windows of
// simulated or real time, then reports λ per window and its mean.
class WindowedThroughput {
 public:
  // `tenants` tenants indexed 0..tenants-1; windows of `window` starting at `origin`.
  WindowedThroughput(size_t tenants, Duration window, TimePoint origin = TimePoint{});

  // Adds `amount` spread uniformly over [start, end) (an instant when start == end).
  // Precondition: tenant < tenants, start >= origin, end >= start.
  void Add(size_t tenant, TimePoint start, TimePoint end, double amount);

  size_t windows() const { return per_window_.size(); }
  Duration window() const { return window_; }
  // Amount of `tenant` in window `w` (0 for windows never touched).
  double At(size_t w, size_t tenant) const;
  // Total per tenant over all windows.
  std::vector<double> Totals() const;

  // λ of each window in [first, last) whose total is > 0 (windows with no throughput at all are
  // skipped: there is nothing to be unfair about).
  std::vector<double> Lambdas(const std::vector<double>& weights, size_t first = 0,
                              size_t last = static_cast<size_t>(-1)) const;
  // Mean of Lambdas(); 0 when no window had throughput.
  double MeanLambda(const std::vector<double>& weights, size_t first = 0,
                    size_t last = static_cast<size_t>(-1)) const;

 private:
  std::vector<double>& Row(size_t w);

  size_t tenants_;
  Duration window_;
  TimePoint origin_;
  std::vector<std::vector<double>> per_window_;
};

// Summary of repeated completion times (seconds).
struct CompletionStats {
  size_t count = 0;
  double mean = 0, min = 0, max = 0;
  double q1 = 0, median = 0, q3 = 0, iqr = 0;
  double deviation = 0;  // (max − min) / mean, Kang & Yu's performance deviation; 0 if mean == 0
  double stddev = 0;
};

// Quartiles by linear interpolation between closest ranks (type 7, as numpy and R default).
CompletionStats Summarize(std::vector<double> values);

}  // namespace gmux::core
