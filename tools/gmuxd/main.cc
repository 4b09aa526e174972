// gmuxd: the gmux daemon. Owns the backend OpenCL devices and serves them to tenants through the
// gmux ICD. See docs/operations.md.
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <string>

#include <CLI/CLI.hpp>

#include "daemon/config.h"
#include "daemon/server.h"

int main(int argc, char** argv) {
  CLI::App app{"gmuxd: shares OpenCL devices among tenants"};
  std::string config_path, socket_path, backend_library;
  double exit_after_s = 0;
  app.add_option("--config", config_path, "TOML config file (every key optional)");
  app.add_option("--socket", socket_path, "Unix socket to listen on (overrides the config)");
  app.add_option("--backend-library", backend_library,
                 "vendor ICD library to serve (overrides the config)");
  app.add_option("--exit-after", exit_after_s,
                 "stop by itself after this many seconds (tests, demos); 0: run until signalled")
      ->check(CLI::NonNegativeNumber);
  CLI11_PARSE(app, argc, argv);

  gmux::daemon::DaemonOptions options;
  if (!config_path.empty()) {
    auto loaded = gmux::daemon::LoadDaemonConfig(config_path);
    if (!loaded.ok()) {
      std::fprintf(stderr, "gmuxd: %s\n", loaded.status().message().c_str());
      return 2;
    }
    options = std::move(loaded).value();
  }
  if (!socket_path.empty()) options.socket_path = socket_path;
  if (!backend_library.empty()) options.backend.library = backend_library;

  // Signals are taken synchronously by this thread; block them before any thread starts.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);

  auto server = gmux::daemon::Server::Create(options);
  if (!server.ok()) {
    std::fprintf(stderr, "gmuxd: %s\n", server.status().ToString().c_str());
    return 1;
  }
  gmux::Status started = (*server)->Start();
  if (!started.ok()) {
    std::fprintf(stderr, "gmuxd: %s\n", started.ToString().c_str());
    return 1;
  }
  const auto& backend = (*server)->backend();
  std::fprintf(stderr, "gmuxd: serving %zu device(s) of '%s' (%s) on %s, policy %s\n",
               backend.devices().size(), backend.PlatformName().c_str(), backend.library().c_str(),
               (*server)->socket_path().c_str(), options.policy.c_str());

  timespec ts{};
  timespec* timeout = nullptr;
  if (exit_after_s > 0) {
    ts.tv_sec = static_cast<time_t>(exit_after_s);
    ts.tv_nsec = static_cast<long>((exit_after_s - static_cast<double>(ts.tv_sec)) * 1e9);
    timeout = &ts;
  }
  int sig = sigtimedwait(&set, nullptr, timeout);
  std::fprintf(stderr, "gmuxd: stopping (%s)\n", sig > 0 ? "signal" : "exit-after elapsed");
  (*server)->Stop();
  return 0;
}
