#include "core/sla_policy.h"

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include <gtest/gtest.h>

namespace gmux::core {
namespace {

SlaPolicy Make(SlaKind kind, double criterion = 30, double headroom = 0.05,
               double smoothing = 0.5) {
  SlaPolicyOptions o;
  o.kind = kind;
  o.criterion_fps = criterion;
  o.fsa_headroom = headroom;
  o.coef_smoothing = smoothing;
  auto p = SlaPolicy::Create(o);
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  return std::move(p).value();
}

SlaTenantState T(double fps, double usage) {
  SlaTenantState t;
  t.fps = fps;
  t.gpu_usage = usage;
  return t;
}

TEST(SlaPolicyTest, NamesRoundTrip) {
  for (SlaKind k : {SlaKind::kNone, SlaKind::kSa, SlaKind::kFsa, SlaKind::kEsa}) {
    EXPECT_EQ(ParseSlaKind(SlaKindName(k)), k);
  }
  EXPECT_FALSE(ParseSlaKind("fifo").has_value());
}

TEST(SlaPolicyTest, OptionsAreValidated) {
  SlaPolicyOptions o;
  o.criterion_fps = 0;
  EXPECT_FALSE(o.Validate().ok());
  o = {};
  o.target_usage = 1.5;
  EXPECT_FALSE(o.Validate().ok());
  o = {};
  o.coef_smoothing = 0;
  EXPECT_FALSE(o.Validate().ok());
  o = {};
  o.fsa_headroom = -0.1;
  EXPECT_FALSE(SlaPolicy::Create(o).ok());
}

TEST(SlaPolicyTest, SaSetsEveryReferenceToTheCriterion) {
  SlaPolicy p = Make(SlaKind::kSa, 30);
  std::vector<SlaTenantState> t = {T(25, 0.4), T(50, 0.3), T(60, 0.2)};
  p.Update(t);
  for (const auto& x : t) EXPECT_EQ(x.reference_fps, 30);
}

TEST(SlaPolicyTest, NoneUncapsEveryone) {
  SlaPolicy p = Make(SlaKind::kNone);
  std::vector<SlaTenantState> t = {T(25, 0.4), T(50, 0.3)};
  t[0].reference_fps = 30;
  p.Update(t);
  for (const auto& x : t) EXPECT_TRUE(std::isinf(x.reference_fps));
}

TEST(SlaPolicyTest, EsaSetsOneCommonFpsFromTheCoefficients) {
  // k_i = g_i / f_i: 0.4/30, 0.2/40, 0.3/50; F = 1 / sum k_i (Algorithm 3).
  SlaPolicy p = Make(SlaKind::kEsa);
  std::vector<SlaTenantState> t = {T(30, 0.4), T(40, 0.2), T(50, 0.3)};
  p.Update(t);
  double sum = 0.4 / 30 + 0.2 / 40 + 0.3 / 50;
  for (const auto& x : t) EXPECT_NEAR(x.reference_fps, 1 / sum, 1e-9);
  // At that rate the planned usages k_i F add up to 100 %.
  double planned = 0;
  for (const auto& x : t) planned += x.coef * x.reference_fps;
  EXPECT_NEAR(planned, 1.0, 1e-12);
}

TEST(SlaPolicyTest, EsaEstimatesCoefficientsFromHistory) {
  SlaPolicy p = Make(SlaKind::kEsa, 30, 0.05, /*smoothing=*/0.5);
  std::vector<SlaTenantState> t = {T(40, 0.4)};
  p.Update(t);
  EXPECT_NEAR(t[0].coef, 0.01, 1e-12);
  t[0].fps = 40;
  t[0].gpu_usage = 0.8;  // the scene got twice as heavy
  p.Update(t);
  EXPECT_NEAR(t[0].coef, 0.5 * 0.02 + 0.5 * 0.01, 1e-12);
  EXPECT_NEAR(t[0].reference_fps, 1 / 0.015, 1e-9);
  // A period without frames keeps the estimate.
  t[0].fps = 0;
  t[0].gpu_usage = 0;
  p.Update(t);
  EXPECT_NEAR(t[0].coef, 0.015, 1e-12);
}

TEST(SlaPolicyTest, EsaWithoutEstimatesLeavesTenantsUncapped) {
  std::vector<SlaTenantState> t = {T(0, 0), T(0, 0)};
  EXPECT_TRUE(std::isinf(SlaPolicy::EsaCommonFps(t, 1.0)));
}

TEST(SlaPolicyTest, FsaDonorsGiveEqualParts) {
  // Headroom 0: the tenant below is lifted to exactly the criterion.
  SlaPolicy p = Make(SlaKind::kFsa, 30, /*headroom=*/0.0, /*smoothing=*/1.0);
  // below: k = 0.01, lacks 0.01 * (30 - 25) = 0.05 of the GPU.
  // donors: k = 0.005 at 50 FPS (can give 0.1), k = 0.01 at 40 FPS (can give 0.1).
  std::vector<SlaTenantState> t = {T(25, 0.25), T(50, 0.25), T(40, 0.40)};
  p.Update(t);
  EXPECT_EQ(t[0].reference_fps, 30);
  EXPECT_NEAR(t[1].reference_fps, 50 - 0.025 / 0.005, 1e-9);  // 45
  EXPECT_NEAR(t[2].reference_fps, 40 - 0.025 / 0.01, 1e-9);   // 37.5
  // Both gave the same GPU usage.
  EXPECT_NEAR(t[1].coef * (50 - t[1].reference_fps), t[2].coef * (40 - t[2].reference_fps), 1e-12);
}

TEST(SlaPolicyTest, FsaDonorNearTheCriterionGivesOnlyWhatItHas) {
  SlaPolicy p = Make(SlaKind::kFsa, 30, 0.0, 1.0);
  // Lacks 0.01 * 10 = 0.1. Donor A can give only 0.01 * (31 - 30) = 0.01; B gives the rest.
  std::vector<SlaTenantState> t = {T(20, 0.2), T(31, 0.31), T(60, 0.3)};
  p.Update(t);
  EXPECT_NEAR(t[1].reference_fps, 30, 1e-9);
  EXPECT_NEAR(t[2].reference_fps, 60 - 0.09 / 0.005, 1e-9);
}

TEST(SlaPolicyTest, FsaNeverPushesATenantBelowTheCriterion) {
  std::mt19937_64 gen(20240607);
  auto uniform = [&](double lo, double hi) {
    return lo + (hi - lo) * static_cast<double>(gen() >> 11) * 0x1.0p-53;
  };
  for (double headroom : {0.0, 0.05, 0.2}) {
    SlaPolicy p = Make(SlaKind::kFsa, 30, headroom, 0.5);
    for (int trial = 0; trial < 300; ++trial) {
      size_t n = 1 + gen() % 12;
      std::vector<SlaTenantState> t(n);
      for (int period = 0; period < 5; ++period) {
        double total = 0;
        for (auto& x : t) {
          x.fps = uniform(5, 90);
          x.gpu_usage = uniform(0.01, 0.4);
          total += x.gpu_usage;
        }
        for (auto& x : t) x.gpu_usage /= std::max(1.0, total);
        p.Update(t);
        for (const auto& x : t) {
          EXPECT_GE(x.reference_fps, 30) << "trial " << trial << " period " << period;
        }
      }
    }
  }
}

TEST(SlaPolicyTest, FsaHandsIdleGpuBackWhenNobodyIsBelow) {
  SlaPolicy p = Make(SlaKind::kFsa, 30, 0.05, 1.0);
  std::vector<SlaTenantState> t = {T(40, 0.2), T(40, 0.2)};
  t[0].reference_fps = 40;
  t[1].reference_fps = 40;
  p.Update(t);  // 60 % idle: half of it, in equal parts of 0.15
  EXPECT_NEAR(t[0].reference_fps, 40 + 0.15 / 0.005, 1e-9);
  EXPECT_NEAR(t[1].reference_fps, 40 + 0.15 / 0.005, 1e-9);
  // Uncapped tenants stay uncapped, and a busy device hands nothing back.
  std::vector<SlaTenantState> u = {T(40, 0.5), T(40, 0.5)};
  u[1].reference_fps = 40;
  p.Update(u);
  EXPECT_TRUE(std::isinf(u[0].reference_fps));
  EXPECT_EQ(u[1].reference_fps, 40);
}

TEST(SlaPolicyTest, FsaWithoutDonorsAimsTheNeedyAtTheCriterion) {
  SlaPolicy p = Make(SlaKind::kFsa, 30, 0.0, 1.0);
  std::vector<SlaTenantState> t = {T(20, 0.5), T(25, 0.5)};
  p.Update(t);
  EXPECT_EQ(t[0].reference_fps, 30);
  EXPECT_EQ(t[1].reference_fps, 30);
}

TEST(SlaPolicyTest, SaUsesEachTenantsOwnTarget) {
  std::vector<SlaTenantState> ts = {T(90, 0.3), T(50, 0.3), T(20, 0.3)};
  ts[0].target_fps = 60;
  ts[2].target_fps = std::nan("");  // not a target: the criterion
  Make(SlaKind::kSa).Update(ts);
  EXPECT_DOUBLE_EQ(ts[0].reference_fps, 60);
  EXPECT_DOUBLE_EQ(ts[1].reference_fps, 30);
  EXPECT_DOUBLE_EQ(ts[2].reference_fps, 30);
}

TEST(SlaPolicyTest, FsaHelpsAndStopsDonorsAtTheirOwnTargets) {
  // Tenant 0 wants 60 and runs 50: it is helped (aimed at 63). Tenant 1 (target 30) at 100 FPS
  // donates; tenant 2 (target 90) at 95 FPS may give only what keeps it at 90.
  std::vector<SlaTenantState> ts = {T(50, 0.25), T(100, 0.25), T(95, 0.25)};
  ts[0].target_fps = 60;
  ts[2].target_fps = 90;
  Make(SlaKind::kFsa, 30, 0.05, 1.0).Update(ts);
  EXPECT_DOUBLE_EQ(ts[0].reference_fps, 63);
  EXPECT_GE(ts[2].reference_fps, 90);
  EXPECT_LT(ts[2].reference_fps, 95);
  EXPECT_LT(ts[1].reference_fps, 100);
  EXPECT_GE(ts[1].reference_fps, 30);
  // The deficit k0 (63 - 50) is covered by the two donors together; tenant 2 hits its target.
  EXPECT_NEAR(ts[2].reference_fps, 90, 1e-9);
  const double given = ts[1].coef * (100 - ts[1].reference_fps) +
                       ts[2].coef * (95 - ts[2].reference_fps);
  EXPECT_NEAR(given, ts[0].coef * (63 - 50), 1e-12);
}

}  // namespace
}  // namespace gmux::core
