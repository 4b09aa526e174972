// `gmux demo frames`: vGASA's experiment (Zhang et al., Section 4.1, Figs. 7 and 8) on real GL
// programs. Under Xvfb with Mesa's llvmpipe, three unmodified GL programs of different cost
// (glxgears, and gl_frames at a medium and a heavy load, one of them through EGL) run at once
// with libgmux-frame.so preloaded, under the SLA policies none, sa, fsa and esa of one gmuxd
// (switched with `gmux frames policy` between phases). Per program and policy: mean FPS once
// settled, frames over 34 ms and 60 ms, its device usage, and the FPS series; then a PI step
// response (one program's target changed mid-run) and the agent's overhead (a free-running
// program with and without the agent, alternated).
#pragma once

#include <string>

namespace gmux::cli {

struct DemoFramesOptions {
  bool json = false;
  std::string plot_dir;                  // per-second FPS series (CSV) and plots (gnuplot PNG)
  std::string policies = "none,sa,fsa,esa";
  double seconds = 20;                   // per policy
  double settle_s = 6;                   // statistics skip the first seconds of each phase
  double criterion_fps = 30;
  double target_usage = 0.7;             // ESA's planned share of the CPU "device"
  bool step = true;                      // the PI step-response phase
  bool overhead = true;                  // the agent-overhead phase
  double overhead_s = 3;                 // per run of the overhead phase
  int overhead_pairs = 7;                // runs without and with the agent, alternated
};

int RunDemoFrames(const DemoFramesOptions& options);

}  // namespace gmux::cli
