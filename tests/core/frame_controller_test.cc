#include "core/frame_controller.h"

#include <cmath>

#include <gtest/gtest.h>

namespace gmux::core {
namespace {

// A frame loop whose Present-to-Present time is (T_cpu + T_sleep + T_gpu) * e^d: in the
// transformed domain of Eq. (5) exactly y = u + d, the plant G'_p = 1 with a constant
// disturbance d (when the sleep is not clamped).
class LogPlant {
 public:
  LogPlant(FrameController* c, double cpu_s, double gpu_s, double d)
      : c_(c), cpu_s_(cpu_s), gpu_s_(gpu_s), d_(d) {
    c_->Observe(FrameSample{t_, FromSeconds(gpu_s_)});
  }
  // Runs one frame; returns its frame rate.
  double Frame() {
    FrameDecision dec = c_->Decide(FromSeconds(cpu_s_));
    double period = (cpu_s_ + ToSeconds(dec.sleep) + gpu_s_) * std::exp(d_);
    t_ += FromSeconds(period);
    c_->Observe(FrameSample{t_, FromSeconds(gpu_s_)});
    return 1.0 / period;
  }
  void set_cpu(double s) { cpu_s_ = s; }
  void set_gpu(double s) { gpu_s_ = s; }

 private:
  FrameController* c_;
  double cpu_s_, gpu_s_, d_;
  TimePoint t_{};
};

FrameController Make(double kp, double ki) {
  FrameControllerOptions o;
  o.kp = kp;
  o.ki = ki;
  auto c = FrameController::Create(o);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return std::move(c).value();
}

TEST(FrameControllerTest, PoleFormulaGivesThePapersFig8cValues) {
  // Eq. (7) with k_p = 0.1 and k_i in {0.5, 0.1, 0.05}.
  EXPECT_NEAR(ClosedLoopPole(0.1, 0.5), 0.6875, 1e-12);
  EXPECT_NEAR(ClosedLoopPole(0.1, 0.1), 0.9167, 5e-5);
  EXPECT_NEAR(ClosedLoopPole(0.1, 0.05), 0.9565, 5e-5);
  EXPECT_NEAR(Make(0.1, 0.05).pole(), 1.1 / 1.15, 1e-12);
}

TEST(FrameControllerTest, ProportionalOnlyLoopHasNoPole) {
  // With k_i = 0, (6) reduces to k_p/(k_p+1): the (z-1) factors cancel.
  EXPECT_FALSE(ClosedLoopHasPole(0.0));
  EXPECT_TRUE(ClosedLoopHasPole(0.05));
  FrameControllerOptions o;
  o.kp = 0.5;
  o.ki = 0;
  EXPECT_TRUE(o.Validate().ok());
}

TEST(FrameControllerTest, UnstableConfigurationIsRejectedByEq8) {
  FrameControllerOptions o;
  o.kp = 0.1;
  o.ki = -0.05;  // pole 1.1 / 1.05 > 1
  Status s = o.Validate();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("Eq. (8)"), std::string::npos) << s.message();
  EXPECT_FALSE(FrameController::Create(o).ok());

  o.kp = -3;  // pole (-2) / (-1) = 2
  o.ki = 1;
  EXPECT_FALSE(o.Validate().ok());
  o.kp = -0.5;  // k_p + k_i + 1 = 0
  o.ki = -0.5;
  EXPECT_FALSE(o.Validate().ok());
  o.kp = std::nan("");
  o.ki = 0.1;
  EXPECT_FALSE(o.Validate().ok());
  o.kp = 0.1;
  o.gpu_history_frames = 0;
  EXPECT_FALSE(o.Validate().ok());
}

TEST(FrameControllerTest, PapersConfigurationsAreStable) {
  for (auto [kp, ki] : {std::pair{0.5, 0.0}, {0.25, 0.0}, {0.1, 0.0}, {0.1, 0.5}, {0.1, 0.1},
                        {0.1, 0.05}}) {
    FrameControllerOptions o;
    o.kp = kp;
    o.ki = ki;
    EXPECT_TRUE(o.Validate().ok()) << kp << " " << ki;
  }
}

TEST(FrameControllerTest, SleepTimeFollowsEq1) {
  // 1000/30 - 5 - 10 = 18.333 ms.
  Duration s = SleepTime(30, std::chrono::milliseconds(5), std::chrono::milliseconds(10));
  EXPECT_NEAR(ToSeconds(s), 1.0 / 30 - 0.015, 1e-9);
  // A frame already longer than 1/F does not sleep.
  EXPECT_EQ(SleepTime(60, std::chrono::milliseconds(10), std::chrono::milliseconds(10)),
            Duration(0));
  EXPECT_EQ(SleepTime(kUncappedFps, Duration(0), Duration(0)), Duration(0));
}

TEST(FrameControllerTest, UncappedReferenceNeverSleeps) {
  FrameController c = Make(0.1, 0.5);
  LogPlant plant(&c, 0.001, 0.002, 0.1);
  for (int k = 0; k < 20; ++k) {
    FrameDecision d = c.Decide(FromSeconds(0.001));
    EXPECT_FALSE(d.controlled);
    EXPECT_EQ(d.sleep, Duration(0));
    plant.Frame();
  }
  EXPECT_EQ(c.integral(), 0);
}

TEST(FrameControllerTest, WithoutDisturbanceEq1HitsTheReferenceAtOnce) {
  FrameController c = Make(0.1, 0.05);
  c.SetReference(60);
  LogPlant plant(&c, 0.001, 0.002, 0.0);
  // (to the nanosecond resolution of the clock)
  EXPECT_NEAR(plant.Frame(), 60, 1e-4);
  EXPECT_NEAR(plant.Frame(), 60, 1e-4);
}

TEST(FrameControllerTest, ErrorDecaysAtThePoleOfEq7) {
  for (double ki : {0.5, 0.1, 0.05}) {
    FrameController c = Make(0.1, ki);
    c.SetReference(60);
    const double d = 0.06;  // frames 6 % longer than Eq. (1) plans
    LogPlant plant(&c, 0.001, 0.002, d);
    const double y_r = -std::log(60.0);
    double prev = 0;
    // While the error is well above the nanosecond rounding of the simulated clock.
    for (int k = 0; k < 12; ++k) {
      double fps = plant.Frame();
      double err = -std::log(fps) - y_r;  // y - y_r
      if (k >= 2) {
        EXPECT_NEAR(err / prev, c.pole(), 1e-3) << "ki " << ki << " frame " << k;
      }
      prev = err;
    }
  }
}

TEST(FrameControllerTest, IntegralActionRemovesTheSteadyStateError) {
  FrameController c = Make(0.1, 0.5);
  c.SetReference(60);
  LogPlant plant(&c, 0.001, 0.002, 0.06);
  double fps = 0;
  for (int k = 0; k < 100; ++k) fps = plant.Frame();
  EXPECT_NEAR(fps, 60, 1e-4);
}

TEST(FrameControllerTest, ProportionalOnlyLeavesTheErrorOfTc1) {
  // k_i = 0: y - y_r settles at d / (1 + k_p), the static gain k_p/(k_p+1) of Eq. (6).
  for (double kp : {0.5, 0.25, 0.1}) {
    FrameController c = Make(kp, 0);
    c.SetReference(60);
    const double d = 0.06;
    LogPlant plant(&c, 0.001, 0.002, d);
    double fps = 0;
    for (int k = 0; k < 20; ++k) fps = plant.Frame();
    EXPECT_NEAR(-std::log(fps) + std::log(60.0), d / (1 + kp), 1e-6) << kp;
  }
}

TEST(FrameControllerTest, TracksAReferenceChange) {
  FrameController c = Make(0.1, 0.5);
  c.SetReference(60);
  LogPlant plant(&c, 0.001, 0.002, 0.03);
  for (int k = 0; k < 60; ++k) plant.Frame();
  c.SetReference(40);
  double fps = 0;
  for (int k = 0; k < 60; ++k) fps = plant.Frame();
  EXPECT_NEAR(fps, 40, 1e-3);
}

TEST(FrameControllerTest, SaturationDoesNotWindUp) {
  FrameController c = Make(0.1, 0.5);
  c.SetReference(60);
  // A heavy scene: 25 ms of work, the reference (16.7 ms) is out of reach.
  LogPlant plant(&c, 0.010, 0.015, 0.0);
  for (int k = 0; k < 500; ++k) {
    double fps = plant.Frame();
    EXPECT_NEAR(fps, 40, 1e-6);  // no sleep at all
  }
  EXPECT_GE(c.integral(), -1e-9);  // nothing integrated while the loop could not act
  // The scene lightens: the agent must be back on the reference within a few frames.
  plant.set_cpu(0.001);
  plant.set_gpu(0.002);
  double fps = 0;
  int frames = 0;
  for (; frames < 50; ++frames) {
    fps = plant.Frame();
    if (std::abs(fps - 60) < 0.6 && frames > 4) break;
  }
  EXPECT_LT(frames, 20);
  EXPECT_NEAR(fps, 60, 0.6);
}

TEST(FrameControllerTest, PredictsGpuTimeFromRecentPresents) {
  FrameControllerOptions o;
  o.gpu_history_frames = 2;
  auto c = FrameController::Create(o);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->PredictedGpuTime(), Duration(0));
  c->Observe({AtSeconds(0.01), std::chrono::milliseconds(4)});
  EXPECT_NEAR(ToSeconds(c->PredictedGpuTime()), 0.004, 1e-9);
  c->Observe({AtSeconds(0.02), std::chrono::milliseconds(8)});
  EXPECT_NEAR(ToSeconds(c->PredictedGpuTime()), 0.006, 1e-9);
  c->Observe({AtSeconds(0.03), std::chrono::milliseconds(10)});  // 4 ms falls out
  EXPECT_NEAR(ToSeconds(c->PredictedGpuTime()), 0.009, 1e-9);
  EXPECT_NEAR(c->last_fps(), 100, 1e-6);
  EXPECT_EQ(c->frames(), 3u);
}

TEST(FrameControllerTest, CommandStaysWithinBounds) {
  FrameControllerOptions o;
  o.max_fps = 100;
  auto c = FrameController::Create(o);
  ASSERT_TRUE(c.ok());
  c->SetReference(500);
  c->Observe({AtSeconds(0), Duration(0)});
  FrameDecision d = c->Decide(Duration(0));
  EXPECT_LE(d.command_fps, 100 + 1e-9);
  EXPECT_TRUE(d.saturated);
  EXPECT_GE(d.sleep, Duration(0));
}

}  // namespace
}  // namespace gmux::core
