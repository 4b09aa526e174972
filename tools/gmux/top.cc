#include "top.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <clocale>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <iostream>
#include <thread>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "status.h"
#include "top_frame.h"

// curses last, and without its macros: `erase`, `move`, `clear`, `timeout` would otherwise
// replace the standard library's and this file's names of the same spelling.
#define NCURSES_NOMACROS
#include <curses.h>

namespace gmux::cli {

namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

// The signal that asked the view to stop (0: none). The handler only records it: the loop
// sees it within one key wait, restores the terminal, then raises the signal again.
volatile sig_atomic_t g_stop_signal = 0;

void OnStopSignal(int sig) { g_stop_signal = sig; }

constexpr int kStopSignals[] = {SIGINT, SIGTERM, SIGHUP};

// The longest a key wait lasts, so a stop signal is seen soon even while paused.
constexpr int kMaxKeyWaitMs = 200;

// One Stats reply, or why there is none.
Result<json> Poll(const std::string& socket) {
  auto reply = ControlRequest(socket, "gmux top", std::nullopt);
  if (!reply.ok()) return reply.status();
  json j = json::parse(*reply, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return DataLoss("gmuxd sent malformed JSON");
  return j;
}

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::string WallClock() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  char buf[16] = "";
  if (::localtime_r(&now, &tm) != nullptr) std::strftime(buf, sizeof(buf), "%H:%M:%S", &tm);
  return buf;
}

int RunOnce(const TopOptions& o, TopSort sort) {
  TopHistory history(o.window_s);
  const auto start = Clock::now();
  // Two polls one interval apart: a share needs a difference of the daemon's counters.
  for (int i = 0; i < 2; ++i) {
    if (i > 0) {
      std::this_thread::sleep_until(start + std::chrono::duration_cast<Clock::duration>(
                                                std::chrono::duration<double>(o.interval_s)));
    }
    auto stats = Poll(o.socket);
    if (!stats.ok()) {
      std::cerr << "gmux top: gmuxd not reachable: " << stats.status().message() << "\n";
      return 1;
    }
    history.Add(SecondsSince(start), std::move(stats).value());
  }
  if (o.json) {
    std::cout << TopJson(history, sort).dump(2) << "\n";
    return 0;
  }
  const TopView view{ControlSocketPath(o.socket), WallClock(), o.interval_s, sort, false, ""};
  for (const auto& line : RenderTopFrame(history, view).lines) std::cout << line << "\n";
  return 0;
}

// The curses screen for the life of the object: the terminal is restored (endwin) on every
// way out of the view, signals included, since they only set a flag the loop reads.
class Screen {
 public:
  Screen() : screen_(::newterm(nullptr, stdout, stdin)) {
    if (screen_ == nullptr) return;
    ::set_term(screen_);
    ::cbreak();
    ::noecho();
    ::keypad(stdscr, TRUE);
    ::curs_set(0);
  }
  ~Screen() {
    if (screen_ == nullptr) return;
    ::endwin();
    ::delscreen(screen_);
  }
  Screen(const Screen&) = delete;
  Screen& operator=(const Screen&) = delete;
  bool ok() const { return screen_ != nullptr; }

 private:
  SCREEN* screen_;
};

void DrawLine(int y, const std::string& text, attr_t attr) {
  ::attrset(attr);
  ::mvaddnstr(y, 0, text.c_str(), COLS);
  ::attrset(A_NORMAL);
  ::clrtoeol();
}

// Draws the frame (or the help) within the terminal's current size; the last row shows the keys.
void Draw(const TopHistory& history, const TopView& view, bool help) {
  ::erase();
  const int body = std::max(LINES - 1, 0);
  TopFrame frame;
  if (help) {
    frame.lines = TopHelpLines();
  } else {
    frame = RenderTopFrame(history, view);
  }
  const int n = static_cast<int>(frame.lines.size());
  // A frame taller than the terminal ends with a line that says so, in place of its last row.
  const int shown = n > body ? std::max(body - 1, 0) : n;
  for (int y = 0; y < shown; ++y) {
    attr_t attr = A_NORMAL;
    if (y == 0 || y == frame.error_line) attr = A_BOLD;
    if (std::find(frame.header_lines.begin(), frame.header_lines.end(), y) !=
        frame.header_lines.end()) {
      attr = A_REVERSE;
    }
    DrawLine(y, frame.lines[static_cast<size_t>(y)], attr);
  }
  if (shown < n && body > 0) {
    DrawLine(shown, "... " + std::to_string(n - shown) + " more lines: enlarge the terminal",
             A_BOLD);
  }
  if (!help && frame.tenant_header >= 0 && frame.tenant_header < shown &&
      static_cast<int>(frame.sort_begin) < COLS) {
    ::mvchgat(frame.tenant_header, static_cast<int>(frame.sort_begin),
              static_cast<int>(frame.sort_len), A_REVERSE | A_BOLD | A_UNDERLINE, 0, nullptr);
  }
  if (LINES > 0) {
    std::string keys = " q quit  s/S sort: " + std::string(TopSortName(view.sort)) +
                       "  p " + (view.paused ? "resume" : "pause") + "  h help";
    keys.resize(static_cast<size_t>(std::max(COLS, 0)), ' ');
    DrawLine(LINES - 1, keys, A_REVERSE);
  }
  ::refresh();
}

int RunLive(const TopOptions& o, TopSort sort) {
  if (::isatty(STDIN_FILENO) == 0 || ::isatty(STDOUT_FILENO) == 0) {
    std::cerr << "gmux top: the live view needs a terminal; --once prints one frame for "
                 "scripts\n";
    return 2;
  }
  // Before curses starts: it installs its own SIGINT/SIGTERM handlers only where none is set,
  // and those would exit without returning here.
  struct sigaction sa{};
  sa.sa_handler = OnStopSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART: a signal ends the key wait at once
  for (int sig : kStopSignals) ::sigaction(sig, &sa, nullptr);
  std::setlocale(LC_ALL, "");  // UTF-8 names through ncursesw

  TopHistory history(o.window_s);
  TopView view{ControlSocketPath(o.socket), "", o.interval_s, sort, false, ""};
  {
    Screen screen;
    if (!screen.ok()) {
      const char* term = std::getenv("TERM");
      std::cerr << "gmux top: curses cannot drive this terminal (TERM=" << (term ? term : "")
                << "); --once prints one frame\n";
      return 2;
    }
    const auto start = Clock::now();
    const auto interval = std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double>(o.interval_s));
    auto next_poll = start;
    bool help = false, dirty = true, quit = false;
    while (!quit && g_stop_signal == 0) {
      if (!view.paused && Clock::now() >= next_poll) {
        auto stats = Poll(o.socket);
        if (stats.ok()) {
          view.error.clear();
          history.Add(SecondsSince(start), std::move(stats).value());
        } else {
          // Keep retrying; a daemon that comes back may have started its counters again.
          view.error = stats.status().message();
          history.Clear();
        }
        view.clock = WallClock();
        next_poll += interval;
        if (next_poll <= Clock::now()) next_poll = Clock::now() + interval;
        dirty = true;
      }
      if (dirty) Draw(history, view, help);
      dirty = false;
      const auto until_poll = std::chrono::duration_cast<std::chrono::milliseconds>(
                                  next_poll - Clock::now()).count();
      ::timeout(view.paused ? kMaxKeyWaitMs
                            : static_cast<int>(std::clamp<long long>(until_poll, 1,
                                                                     kMaxKeyWaitMs)));
      const int key = ::getch();
      if (key == ERR) continue;
      dirty = true;
      if (key == KEY_RESIZE) continue;  // curses has the new size; the redraw uses it
      if (help) {
        help = false;  // any key returns from the help
        continue;
      }
      switch (key) {
        case 'q':
        case 'Q':
          quit = true;
          break;
        case 's':
          view.sort = CycleTopSort(view.sort, 1);
          break;
        case 'S':
          view.sort = CycleTopSort(view.sort, -1);
          break;
        case 'p':
        case 'P':
          view.paused = !view.paused;
          if (!view.paused) next_poll = Clock::now();
          break;
        case 'h':
        case 'H':
        case '?':
          help = true;
          break;
        case 'L' & 0x1f:  // Ctrl-L: repaint everything, e.g. after another program wrote
          ::clearok(curscr, TRUE);
          break;
        default:
          dirty = false;
      }
    }
  }
  if (g_stop_signal != 0) {
    // The terminal is back; the signal's own disposition now ends the process, so a shell
    // or a supervisor sees how it ended.
    const int sig = g_stop_signal;
    ::signal(sig, SIG_DFL);
    ::raise(sig);
  }
  return 0;
}

}  // namespace

Status TopOptions::Validate() const {
  if (!(interval_s >= 0.05 && interval_s <= 3600)) {
    return InvalidArgument("--interval must be between 0.05 and 3600 seconds");
  }
  if (!(window_s >= interval_s)) {
    char text[64];
    std::snprintf(text, sizeof(text), "--window must be at least --interval (%g s)", interval_s);
    return InvalidArgument(text);
  }
  if (!ParseTopSort(sort)) {
    return InvalidArgument("--sort '" + sort +
                           "': one of name, share, weight, queue, memory, time");
  }
  if (json && !once) return InvalidArgument("--json needs --once");
  return Status::Ok();
}

CLI::App* AddTopSubcommand(CLI::App& app, TopOptions& o) {
  CLI::App* top = app.add_subcommand(
      "top", "Live view of a running gmuxd: devices, tenants' shares, queues, memory, leases, "
             "FPS");
  top->add_option("--socket", o.socket,
                  "gmuxd's Unix socket (default: $GMUX_SOCKET, else /run/gmux/gmuxd.sock)")
      ->type_name("PATH");
  top->add_option("--interval", o.interval_s, "Seconds between refreshes (the SHARE column's span)")
      ->capture_default_str()
      ->check(CLI::Range(0.05, 3600.0))
      ->type_name("S");
  top->add_option("--window", o.window_s,
                  "Seconds the WINDOW column looks back (at least --interval)")
      ->capture_default_str()
      ->check(CLI::Range(0.05, 86400.0))
      ->type_name("S");
  top->add_option("--sort", o.sort, "The tenants' order: name, share, weight, queue, memory, time")
      ->capture_default_str()
      ->check(CLI::IsMember({"name", "share", "weight", "queue", "memory", "time"}));
  CLI::Option* once = top->add_flag(
      "--once", o.once,
      "No curses: print one frame (two polls, --interval apart) and exit");
  top->add_flag("--json", o.json, "With --once: the frame's figures as one JSON object")
      ->needs(once);
  top->footer(
      "Keys: q quits, s/S sorts by the next/previous column, p pauses, h or ? shows help.\n"
      "Tenants: WEIGHT, W.SHARE (its weight over the busy tenants' weights), SHARE (its part of\n"
      "all tenants' device time over the last interval), WINDOW (the same over --window),\n"
      "DEVICE_S (device time since gmuxd started), QUEUED, INFL, MEM_MiB, QUOTA, SESS.\n"
      "Devices: commands in flight and queued, BUSY (device time per second). The device pool's\n"
      "leases and frame agents' FPS follow when gmuxd has them. When gmuxd is not reachable the\n"
      "view says why and keeps retrying. Exit status: 0; 1 when --once cannot reach gmuxd; 2 for\n"
      "bad options. A tenant that is not root or an admin sees only its own row.");
  return top;
}

int RunTop(const TopOptions& o) {
  if (Status s = o.Validate(); !s.ok()) {
    std::cerr << "gmux top: " << s.message() << "\n";
    return 2;
  }
  const TopSort sort = *ParseTopSort(o.sort);
  return o.once ? RunOnce(o, sort) : RunLive(o, sort);
}

}  // namespace gmux::cli
