#include "core/sla_policy.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace gmux::core {

std::string_view SlaKindName(SlaKind kind) {
  switch (kind) {
    case SlaKind::kNone: return "none";
    case SlaKind::kSa: return "sa";
    case SlaKind::kFsa: return "fsa";
    case SlaKind::kEsa: return "esa";
  }
  return "?";
}

std::optional<SlaKind> ParseSlaKind(std::string_view name) {
  for (SlaKind k : {SlaKind::kNone, SlaKind::kSa, SlaKind::kFsa, SlaKind::kEsa}) {
    if (SlaKindName(k) == name) return k;
  }
  return std::nullopt;
}

Status SlaPolicyOptions::Validate() const {
  if (!(criterion_fps > 0) || !std::isfinite(criterion_fps)) {
    return InvalidArgument("SLA policy: criterion_fps must be a finite number > 0");
  }
  if (!(target_usage > 0 && target_usage <= 1)) {
    return InvalidArgument("SLA policy: target_usage must be in (0, 1]");
  }
  if (!(fsa_headroom >= 0) || !std::isfinite(fsa_headroom)) {
    return InvalidArgument("SLA policy: fsa_headroom must be a finite number >= 0");
  }
  if (!(coef_smoothing > 0 && coef_smoothing <= 1)) {
    return InvalidArgument("SLA policy: coef_smoothing must be in (0, 1]");
  }
  return Status::Ok();
}

Result<SlaPolicy> SlaPolicy::Create(const SlaPolicyOptions& options) {
  GMUX_RETURN_IF_ERROR(options.Validate());
  return SlaPolicy(options);
}

double SlaPolicy::EsaCommonFps(std::span<const SlaTenantState> tenants, double target_usage) {
  double sum = 0;
  for (const SlaTenantState& t : tenants) {
    if (t.coef > 0) sum += t.coef;
  }
  if (sum <= 0) return kUncappedFps;
  return target_usage / sum;  // Algorithm 3, line 6 (scaled by the planned usage)
}

void SlaPolicy::Update(std::span<SlaTenantState> tenants) const {
  // CalcCoef: g_i = k_i f_i, so k_i = g_i / f_i, smoothed over periods.
  const double a = options_.coef_smoothing;
  for (SlaTenantState& t : tenants) {
    if (t.fps > 0 && t.gpu_usage > 0) {
      double k = t.gpu_usage / t.fps;
      t.coef = t.coef > 0 ? a * k + (1 - a) * t.coef : k;
    }
  }
  switch (options_.kind) {
    case SlaKind::kNone:
      for (SlaTenantState& t : tenants) t.reference_fps = kUncappedFps;
      return;
    case SlaKind::kSa:  // Algorithm 1, line 1
      for (SlaTenantState& t : tenants) t.reference_fps = CriterionOf(t);
      return;
    case SlaKind::kEsa: {  // Algorithm 3
      double f = EsaCommonFps(tenants, options_.target_usage);
      for (SlaTenantState& t : tenants) t.reference_fps = f;
      return;
    }
    case SlaKind::kFsa:
      UpdateFsa(tenants);
      return;
  }
}

namespace {

// Water-filling: amounts x_j = min(q, cap_j) with sum x_j = min(total, sum cap_j). Returns q
// (infinite when every cap is reached). `caps` is sorted ascending.
double EqualSplitLevel(const std::vector<double>& sorted_caps, double total) {
  double remaining = total;
  size_t left = sorted_caps.size();
  for (double cap : sorted_caps) {
    double even = remaining / static_cast<double>(left);
    if (cap >= even) return even;
    remaining -= cap;
    --left;
  }
  return std::numeric_limits<double>::infinity();
}

}  // namespace

double SlaPolicy::CriterionOf(const SlaTenantState& t) const {
  return t.target_fps > 0 && std::isfinite(t.target_fps) ? t.target_fps : options_.criterion_fps;
}

// Per-tenant criteria (a decision, docs/policies.md): c below is each tenant's own.
void SlaPolicy::UpdateFsa(std::span<SlaTenantState> tenants) const {
  // Algorithm 2, lines 1-3: the GPU usage that the tenants below the criterion lack
  // (CalcGPUResource: g = k f), accumulated over all of them.
  double deficit = 0;
  double used = 0;
  for (SlaTenantState& t : tenants) {
    const double c = CriterionOf(t);
    const double aim = c * (1 + options_.fsa_headroom);
    used += t.gpu_usage;
    if (t.fps < c) {
      if (t.coef > 0) deficit += t.coef * (aim - t.fps);
      // Aim the tenant being helped just above the criterion; a higher reference it already had
      // stays (it is not what holds it back).
      if (!(std::isfinite(t.reference_fps) && t.reference_fps > aim)) t.reference_fps = aim;
    }
  }
  if (deficit > 0) {
    // Lines 4-6: donors are the tenants above the criterion; each gives an equal part, but never
    // more than what keeps it at the criterion.
    std::vector<double> caps;
    for (const SlaTenantState& t : tenants) {
      const double c = CriterionOf(t);
      if (t.fps > c && t.coef > 0) caps.push_back(t.coef * (t.fps - c));
    }
    if (caps.empty()) return;
    std::sort(caps.begin(), caps.end());
    double q = EqualSplitLevel(caps, deficit);
    // Lines 7-10: calcFPS, the reverse of CalcGPUResource.
    for (SlaTenantState& t : tenants) {
      const double c = CriterionOf(t);
      if (!(t.fps > c && t.coef > 0)) continue;
      double give = std::min(q, t.coef * (t.fps - c));
      t.reference_fps = std::max(c, t.fps - give / t.coef);
    }
    return;
  }
  // Nobody below the criterion: the GPU left idle below target_usage goes back to the capped
  // tenants in equal parts (FSA "allocates maximum GPU resources to all running VMs in a fair
  // way"); half of it per period, which damps the see-saw with the deficit rule above.
  double spare = options_.target_usage - used;
  if (spare <= 0) return;
  size_t capped = 0;
  for (const SlaTenantState& t : tenants) {
    if (std::isfinite(t.reference_fps) && t.coef > 0) ++capped;
  }
  if (capped == 0) return;
  double part = 0.5 * spare / static_cast<double>(capped);
  for (SlaTenantState& t : tenants) {
    if (!(std::isfinite(t.reference_fps) && t.coef > 0)) continue;
    t.reference_fps = std::max(t.reference_fps, std::max(t.fps, CriterionOf(t)) + part / t.coef);
  }
}

}  // namespace gmux::core
