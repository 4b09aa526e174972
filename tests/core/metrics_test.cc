#include "core/metrics.h"

#include <gtest/gtest.h>

namespace gmux::core {
namespace {

TEST(FairnessLambdaTest, MatchesVmcgWorkedExample) {
  // VMCG Section 6.1: gVirt (199, 227, 248) with weights 1:1:1 gives λ = 0.09 in the paper,
  // which first rounds w' to (0.29, 0.34, 0.37); unrounded it is 0.0762. VMCG
  // (240.6, 237.1, 237.0) gives λ ≈ 0.01.
  EXPECT_NEAR(FairnessLambda({1, 1, 1}, {199, 227, 248}), 0.0762, 0.0005);
  EXPECT_NEAR(FairnessLambda({1, 1, 1}, {0.29, 0.34, 0.37}), 0.09, 0.005);
  EXPECT_NEAR(FairnessLambda({1, 1, 1}, {240.6, 237.1, 237.0}), 0.01, 0.005);
  EXPECT_DOUBLE_EQ(FairnessLambda({1, 1}, {0, 0}), 0);
  EXPECT_NEAR(FairnessLambda({4, 2, 1}, {4, 2, 1}), 0, 1e-12);
  EXPECT_NEAR(FairnessLambda({1, 1}, {1, 0}), 1.0, 1e-12);
}

TEST(JainIndexTest, OneWhenSharesMatchWeights) {
  EXPECT_NEAR(JainIndex({4, 2, 1}, {4.0 / 7, 2.0 / 7, 1.0 / 7}), 1.0, 1e-12);
  EXPECT_NEAR(JainIndex({1, 1}, {1.0, 0.0}), 0.5, 1e-12);
}

TEST(WindowedThroughputTest, SpreadsAmountsAcrossWindowBoundaries) {
  WindowedThroughput w(2, FromSeconds(1.0));
  w.Add(0, AtSeconds(0.5), AtSeconds(1.5), 1.0);  // half in window 0, half in window 1
  w.Add(1, AtSeconds(1.0), AtSeconds(1.0), 2.0);  // instant, window 1
  ASSERT_EQ(w.windows(), 2u);
  EXPECT_NEAR(w.At(0, 0), 0.5, 1e-9);
  EXPECT_NEAR(w.At(1, 0), 0.5, 1e-9);
  EXPECT_NEAR(w.At(1, 1), 2.0, 1e-9);
  auto l = w.Lambdas({1, 1});
  ASSERT_EQ(l.size(), 2u);
  EXPECT_NEAR(l[0], 1.0, 1e-9);   // only tenant 0 ran in window 0
  EXPECT_NEAR(l[1], 0.6, 1e-9);   // shares 0.2/0.8 vs 0.5/0.5
  EXPECT_NEAR(w.MeanLambda({1, 1}), 0.8, 1e-9);
}

TEST(SummarizeTest, QuartilesAndDeviation) {
  CompletionStats s = Summarize({4, 1, 3, 2, 5});
  EXPECT_EQ(s.count, 5u);
  EXPECT_DOUBLE_EQ(s.mean, 3);
  EXPECT_DOUBLE_EQ(s.min, 1);
  EXPECT_DOUBLE_EQ(s.max, 5);
  EXPECT_DOUBLE_EQ(s.q1, 2);
  EXPECT_DOUBLE_EQ(s.median, 3);
  EXPECT_DOUBLE_EQ(s.q3, 4);
  EXPECT_DOUBLE_EQ(s.iqr, 2);
  EXPECT_NEAR(s.deviation, 4.0 / 3.0, 1e-12);
}

}  // namespace
}  // namespace gmux::core
