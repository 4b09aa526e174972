// gmuxd: the gmux daemon. Owns the backend OpenCL devices and serves them to tenants through the
// gmux ICD. See docs/operations.md.
#include <signal.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include "daemon/config.h"
#include "daemon/log.h"
#include "daemon/server.h"

namespace {

// SIGHUP: the config file read again and applied; an invalid file changes nothing.
void Reload(gmux::daemon::Server& server, const std::string& config_path,
            const std::function<void(gmux::daemon::DaemonOptions&)>& overrides,
            const std::string& cli_log_level) {
  if (config_path.empty()) {
    spdlog::info("SIGHUP: started without --config, nothing to re-read");
    return;
  }
  auto loaded = gmux::daemon::LoadDaemonConfig(config_path);
  if (!loaded.ok()) {
    spdlog::warn("reload refused, the running config stays: {}",
                 loaded.status().message().c_str());
    return;
  }
  overrides(*loaded);
  std::vector<std::string> restart;
  gmux::Status s = server.Reload(*loaded, &restart);
  if (!s.ok()) {
    spdlog::warn("reload refused, the running config stays: {}: {}",
                 config_path.c_str(), s.message().c_str());
    return;
  }
  // --log-level on the command line wins over the file, as at start.
  gmux::daemon::InitLog("gmuxd", cli_log_level.empty() ? loaded->log_level : cli_log_level);
  std::string keys;
  for (const std::string& k : restart) keys += (keys.empty() ? "" : ", ") + k;
  spdlog::info("reloaded {} ({} tenants){}{}", config_path.c_str(),
               loaded->tenants.size(), keys.empty() ? "" : "; changed but needing a restart: ",
               keys.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"gmuxd: shares OpenCL devices among tenants"};
  std::string config_path, socket_path, backend_library, listen, port_file;
  double exit_after_s = 0;
  app.add_option("--config", config_path, "TOML config file (every key optional)");
  app.add_option("--socket", socket_path, "Unix socket to listen on (overrides the config)");
  app.add_option("--listen", listen,
                 "also listen on TCP at HOST:PORT (overrides the config; port 0 picks one)");
  bool plain_tcp = false;
  app.add_flag("--plain-tcp", plain_tcp,
               "accept unencrypted TCP on --listen (a trusted network only; otherwise configure "
               "tls_cert and tls_key)");
  app.add_option("--port-file", port_file,
                 "write the TCP port bound to this file once listening (with --listen port 0)");
  app.add_option("--backend-library", backend_library,
                 "vendor ICD library to serve (overrides the config)");
  app.add_option("--exit-after", exit_after_s,
                 "stop by itself after this many seconds (tests, demos); 0: run until signalled")
      ->check(CLI::NonNegativeNumber);
  std::string log_level;
  app.add_option("--log-level", log_level,
                 "debug, info, warn or error (overrides [daemon] log_level; default info)")
      ->check(CLI::IsMember({"debug", "info", "warn", "error"}));
  CLI11_PARSE(app, argc, argv);
  gmux::daemon::InitLog("gmuxd", log_level.empty() ? "info" : log_level);

  gmux::daemon::DaemonOptions options;
  if (!config_path.empty()) {
    auto loaded = gmux::daemon::LoadDaemonConfig(config_path);
    if (!loaded.ok()) {
      spdlog::error("{}", loaded.status().message());
      return 2;
    }
    options = std::move(loaded).value();
  }
  // The command line overrides the file, at start and at each reload.
  auto overrides = [&](gmux::daemon::DaemonOptions& o) {
    if (!socket_path.empty()) o.socket_path = socket_path;
    if (!listen.empty()) o.listen = listen;
    if (plain_tcp) o.plain_tcp = true;
    if (!backend_library.empty()) o.backend.library = backend_library;
  };
  overrides(options);
  gmux::daemon::InitLog("gmuxd", log_level.empty() ? options.log_level : log_level);
  // Tokens kept in plain text in the config: readable by whoever reads the file.
  size_t plain = 0;
  for (const auto& t : options.tenants) {
    for (const auto& tok : t.tokens) plain += gmux::daemon::IsHashedToken(tok) ? 0 : 1;
  }
  for (const auto& tok : options.admin_tokens) plain += gmux::daemon::IsHashedToken(tok) ? 0 : 1;
  if (plain > 0) {
    spdlog::warn("{} token(s) in the config are stored in plain text; store them hashed "
                 "(gmux token hash)", plain);
  }

  // Signals are taken synchronously by this thread; block them before any thread starts.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGHUP);  // re-read the config file
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);

  auto server = gmux::daemon::Server::Create(options);
  if (!server.ok()) {
    spdlog::error("{}", server.status().ToString());
    return 1;
  }
  gmux::Status started = (*server)->Start();
  if (!started.ok()) {
    spdlog::error("{}", started.ToString());
    return 1;
  }
  const auto& backend = (*server)->backend();
  spdlog::info("serving {} device(s) of '{}' ({}) on {}, policy {}",
               backend.devices().size(), backend.PlatformName().c_str(), backend.library().c_str(),
               (*server)->socket_path().c_str(), options.policy.c_str());
  if ((*server)->tcp_port() != 0) {
    spdlog::info("listening on TCP {}, port {}, {}", options.listen.c_str(),
                 static_cast<unsigned>((*server)->tcp_port()),
                 options.plain_tcp ? "plain (unencrypted)"
                 : options.tls_client_ca.empty() ? "TLS"
                                                 : "TLS with client certificates");
  }
  if ((*server)->metrics_port() != 0) {
    spdlog::info("Prometheus metrics at {} (port {}), path /metrics",
                 options.metrics_listen.c_str(), static_cast<unsigned>((*server)->metrics_port()));
  }
  if (!port_file.empty()) {
    // Written to a temporary name and renamed, so a reader never sees a partial port.
    std::string tmp = port_file + ".tmp";
    FILE* f = std::fopen(tmp.c_str(), "w");
    if (f == nullptr || std::fprintf(f, "%u\n", static_cast<unsigned>((*server)->tcp_port())) < 0 ||
        std::fclose(f) != 0 || std::rename(tmp.c_str(), port_file.c_str()) != 0) {
      spdlog::error("cannot write the port file {}", port_file);
      (*server)->Stop();
      return 1;
    }
  }

  timespec ts{};
  timespec* timeout = nullptr;
  if (exit_after_s > 0) {
    ts.tv_sec = static_cast<time_t>(exit_after_s);
    ts.tv_nsec = static_cast<long>((exit_after_s - static_cast<double>(ts.tv_sec)) * 1e9);
    timeout = &ts;
  }
  // Only SIGINT/SIGTERM or the deadline end the wait (a child's SIGCHLD may interrupt it).
  auto until = std::chrono::steady_clock::now() +
               std::chrono::nanoseconds(static_cast<int64_t>(exit_after_s * 1e9));
  int sig = -1;
  for (;;) {
    sig = sigtimedwait(&set, nullptr, timeout);
    if (sig == SIGHUP) {
      Reload(**server, config_path, overrides, log_level);
      sig = -1;
      errno = EINTR;
    }
    if (sig > 0 || errno != EINTR) break;
    if (timeout != nullptr) {
      auto left = until - std::chrono::steady_clock::now();
      if (left <= std::chrono::nanoseconds(0)) break;
      auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
      ts.tv_sec = static_cast<time_t>(ns / 1000000000);
      ts.tv_nsec = static_cast<long>(ns % 1000000000);
    }
  }
  spdlog::info("stopping ({})", sig > 0 ? "signal" : "exit-after elapsed");
  (*server)->Stop();
  return 0;
}
