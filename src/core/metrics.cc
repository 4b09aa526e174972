#include "core/metrics.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <numeric>

namespace gmux::core {

double FairnessLambda(const std::vector<double>& weights, const std::vector<double>& throughput) {
  assert(weights.size() == throughput.size());
  double wsum = std::accumulate(weights.begin(), weights.end(), 0.0);
  double gsum = std::accumulate(throughput.begin(), throughput.end(), 0.0);
  if (gsum <= 0 || wsum <= 0) return 0;
  double lambda = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    lambda += std::abs(weights[i] / wsum - throughput[i] / gsum);
  }
  return lambda;
}

double JainIndex(const std::vector<double>& weights, const std::vector<double>& shares) {
  assert(weights.size() == shares.size());
  if (weights.empty()) return 1;
  double wsum = std::accumulate(weights.begin(), weights.end(), 0.0);
  double sum = 0, sumsq = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    double x = shares[i] / (weights[i] / wsum);
    sum += x;
    sumsq += x * x;
  }
  if (sumsq <= 0) return 1;
  return sum * sum / (static_cast<double>(weights.size()) * sumsq);
}

WindowedThroughput::WindowedThroughput(size_t tenants, Duration window, TimePoint origin)
    : tenants_(tenants), window_(window), origin_(origin) {
  assert(window.count() > 0);
}

std::vector<double>& WindowedThroughput::Row(size_t w) {
  if (w >= per_window_.size()) per_window_.resize(w + 1, std::vector<double>(tenants_, 0.0));
  return per_window_[w];
}

void WindowedThroughput::Add(size_t tenant, TimePoint start, TimePoint end, double amount) {
  assert(tenant < tenants_ && start >= origin_ && end >= start);
  const int64_t w = window_.count();
  int64_t s = (start - origin_).count();
  int64_t e = (end - origin_).count();
  if (e == s) {
    Row(static_cast<size_t>(s / w))[tenant] += amount;
    return;
  }
  const double per_ns = amount / static_cast<double>(e - s);
  while (s < e) {
    int64_t idx = s / w;
    int64_t boundary = std::min(e, (idx + 1) * w);
    Row(static_cast<size_t>(idx))[tenant] += per_ns * static_cast<double>(boundary - s);
    s = boundary;
  }
}

double WindowedThroughput::At(size_t w, size_t tenant) const {
  if (w >= per_window_.size()) return 0;
  return per_window_[w][tenant];
}

std::vector<double> WindowedThroughput::Totals() const {
  std::vector<double> out(tenants_, 0.0);
  for (const auto& row : per_window_) {
    for (size_t i = 0; i < tenants_; ++i) out[i] += row[i];
  }
  return out;
}

std::vector<double> WindowedThroughput::Lambdas(const std::vector<double>& weights, size_t first,
                                                size_t last) const {
  std::vector<double> out;
  last = std::min(last, per_window_.size());
  for (size_t w = first; w < last; ++w) {
    const auto& row = per_window_[w];
    if (std::accumulate(row.begin(), row.end(), 0.0) <= 0) continue;
    out.push_back(FairnessLambda(weights, row));
  }
  return out;
}

double WindowedThroughput::MeanLambda(const std::vector<double>& weights, size_t first,
                                      size_t last) const {
  auto l = Lambdas(weights, first, last);
  if (l.empty()) return 0;
  return std::accumulate(l.begin(), l.end(), 0.0) / static_cast<double>(l.size());
}

namespace {
double Quantile(const std::vector<double>& sorted, double q) {
  if (sorted.size() == 1) return sorted[0];
  double pos = q * static_cast<double>(sorted.size() - 1);
  size_t lo = static_cast<size_t>(std::floor(pos));
  size_t hi = std::min(lo + 1, sorted.size() - 1);
  double frac = pos - static_cast<double>(lo);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * frac;
}
}  // namespace

CompletionStats Summarize(std::vector<double> values) {
  CompletionStats s;
  s.count = values.size();
  if (values.empty()) return s;
  std::sort(values.begin(), values.end());
  s.min = values.front();
  s.max = values.back();
  s.mean = std::accumulate(values.begin(), values.end(), 0.0) / static_cast<double>(values.size());
  s.q1 = Quantile(values, 0.25);
  s.median = Quantile(values, 0.5);
  s.q3 = Quantile(values, 0.75);
  s.iqr = s.q3 - s.q1;
  s.deviation = s.mean > 0 ? (s.max - s.min) / s.mean : 0;
  double var = 0;
  for (double v : values) var += (v - s.mean) * (v - s.mean);
  s.stddev = std::sqrt(var / static_cast<double>(values.size()));
  return s;
}

}  // namespace gmux::core
