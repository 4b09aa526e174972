// SlaPolicy: vGASA's central scheduling controller (Zhang et al., Section 3.2), which sets the
// reference frame rate of every tenant's FrameController once per control period.
//
//   none  no control: every reference is kUncappedFps (the agents never sleep).
//   SA    Algorithm 1: every reference is the SLA criterion c (30 FPS in the paper), or the
//         tenant's own target where it has one (SlaTenantState::target_fps).
//   FSA   Algorithm 2: starts without control. Each period, every tenant below c is aimed at
//         a = c (1 + fsa_headroom) (its reference becomes a, unless it already had a higher one),
//         and the GPU usage they lack,
//           D = sum_{f_i < c} k_i (a - f_i)     (CalcGPUResource, g = k f, accumulated),
//         is taken from the tenants above c in equal parts, each donor's new reference being
//           r_j = f_j - q_j / k_j               (calcFPS, the reverse of CalcGPUResource).
//         A donor never gives so much that r_j < c; the part it cannot give is split equally
//         among the donors that still can (water-filling), so the equal-parts rule holds for
//         every donor the criterion does not stop. When nobody is below c, half of the GPU left
//         idle below target_usage is handed back to the capped tenants, again in equal parts
//         (FSA "allocates maximum GPU resources to all running VMs in a fair way"; the paper
//         leaves this step implicit, see docs/policies.md).
//   ESA   Algorithm 3: one common reference F = target_usage / sum_i k_i for every tenant
//         (target_usage = 1: "the sum of all the VMs' GPU usage is 100% theoretically").
//
// k_i = g_i / f_i (GPU usage per frame per second, i.e. GPU seconds per frame) is estimated from
// history: an exponentially weighted mean over control periods (CalcCoef).
//
// Invariants: FSA never sets a finite reference below the criterion; SA sets exactly the
// criterion; ESA sets one value for every tenant with an estimate. References are > 0.
//
// Pure and stateless apart from its options: the per-tenant state (k_i, reference) lives in the
// SlaTenantState the caller owns, so tenants can join and leave between periods. Update costs
// O(n) for none/SA/ESA and O(n log n) for FSA.
#pragma once

#include <optional>
#include <span>
#include <string_view>

#include "common/status.h"
#include "core/frame_controller.h"

namespace gmux::core {

enum class SlaKind { kNone, kSa, kFsa, kEsa };

// "none", "sa", "fsa", "esa".
std::string_view SlaKindName(SlaKind kind);
std::optional<SlaKind> ParseSlaKind(std::string_view name);

struct SlaPolicyOptions {
  SlaKind kind = SlaKind::kSa;
  // The SLA criterion c in frames per second (Algorithms 1 and 2). > 0.
  double criterion_fps = 30.0;
  // The total GPU usage ESA plans for (Algorithm 3 uses 1.0), and the level up to which FSA
  // hands idle GPU back. In (0, 1].
  double target_usage = 1.0;
  // FSA aims a tenant it helps at criterion_fps * (1 + fsa_headroom), so that frame-to-frame
  // noise around its reference does not drop it straight back below the criterion. >= 0.
  double fsa_headroom = 0.05;
  // Weight of the newest control period in the running estimate of k_i. In (0, 1]; 1 uses the
  // last period only.
  double coef_smoothing = 0.5;

  Status Validate() const;
};

// One tenant as the central controller sees it.
struct SlaTenantState {
  // The tenant's own SLA criterion (gmuxd's per-tenant fps_target); 0: the policy's
  // criterion_fps. SA and FSA use it in place of c; ESA's common rate ignores it.
  double target_fps = 0;
  // Measured by the caller over the last control period:
  double fps = 0;          // frames presented per second
  double gpu_usage = 0;    // fraction of the device's time used, in [0, 1]
  // Carried across periods and updated by SlaPolicy::Update:
  double coef = 0;                        // k_i = g_i / f_i; 0 until first estimated
  double reference_fps = kUncappedFps;    // what the tenant's FrameController should follow
};

class SlaPolicy {
 public:
  // kInvalidArgument when `options` fail Validate().
  static Result<SlaPolicy> Create(const SlaPolicyOptions& options);

  const SlaPolicyOptions& options() const { return options_; }

  // One control period: refreshes every tenant's k_i from its fps and gpu_usage, then sets every
  // reference_fps by the policy.
  void Update(std::span<SlaTenantState> tenants) const;

  // Algorithm 3: F = target_usage / sum k_i over the positive coefficients; kUncappedFps when
  // there are none.
  static double EsaCommonFps(std::span<const SlaTenantState> tenants, double target_usage);

 private:
  explicit SlaPolicy(const SlaPolicyOptions& options) : options_(options) {}

  void UpdateFsa(std::span<SlaTenantState> tenants) const;
  // The tenant's criterion: its target_fps when set, else options_.criterion_fps.
  double CriterionOf(const SlaTenantState& t) const;

  SlaPolicyOptions options_;
};

}  // namespace gmux::core
