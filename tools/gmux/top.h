// `gmux top`: a live terminal view (curses) of a running gmuxd, refreshed from its Stats reply
// (the JSON of `gmux status --json`): devices, tenants with their weight, share of device time
// now and over a window, queues and memory, the device pool's leases and frame agents' FPS.
// `--once` prints one frame as text (or JSON) for scripts. The figures and the frame's text are
// in top_frame.h; this file polls the daemon and drives the terminal.
#pragma once

#include <string>

#include "common/status.h"

namespace CLI {
class App;
}

namespace gmux::cli {

struct TopOptions {
  std::string socket;          // gmuxd's socket; empty: $GMUX_SOCKET, else the default
  double interval_s = 1.0;     // seconds between polls, in [0.05, 3600]
  double window_s = 10.0;      // the WINDOW share's span in seconds; at least interval_s
  std::string sort = "share";  // the tenants' sort column (TopSortName)
  bool once = false;           // print one frame, taken over one interval, and exit
  bool json = false;           // with `once`: the frame's figures as JSON
  // InvalidArgument naming the option that is out of range or does not fit with another.
  Status Validate() const;
};

// Adds `gmux top` with its options (stored in `options`) and help text to `app`.
CLI::App* AddTopSubcommand(CLI::App& app, TopOptions& options);

// Runs the view until q, SIGINT, SIGTERM or SIGHUP (the terminal is restored in every case; a
// signal is raised again once it is, so the exit status tells it); with `once`, prints one
// frame. The exit status: 0, 1 when gmuxd could not be reached (with `once` only; the live view
// keeps retrying), 2 for bad options or when stdout is not a terminal for the live view.
int RunTop(const TopOptions& options);

}  // namespace gmux::cli
