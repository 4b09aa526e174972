#include "status.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>

#include <CL/cl.h>
#include <nlohmann/json.hpp>

#include "daemon/config.h"
#include "proto/frame.h"
#include "proto/gmux.capnp.h"
#include "tls/tls.h"

namespace gmux::cli {

namespace {

namespace wire = proto::wire;

Result<proto::Message> Call(int fd, capnp::MallocMessageBuilder& b) {
  GMUX_RETURN_IF_ERROR(proto::WriteFrame(fd, proto::FrameKind::kRequest, b));
  return proto::ReadFrame(fd, proto::FrameKind::kReply);
}

}  // namespace

std::string ControlSocketPath(const std::string& socket) {
  if (!socket.empty()) return socket;
  const char* env = std::getenv("GMUX_SOCKET");
  return env != nullptr && *env != '\0' ? env : daemon::DefaultSocketPath();
}

std::optional<nlohmann::json> ControlJson(const std::string& socket, const char* client,
                                          const std::optional<LeaseArgs>& lease,
                                          const std::optional<AdminArgs>& admin,
                                          std::string& error) {
  auto r = ControlRequest(socket, client, lease, std::nullopt, admin);
  if (!r.ok()) {
    error = r.status().message();
    return std::nullopt;
  }
  nlohmann::json j = nlohmann::json::parse(*r, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    error = "gmuxd answered something that is not JSON";
    return std::nullopt;
  }
  if (j.contains("error")) {
    error = j["error"].is_string() ? j["error"].get<std::string>() : j["error"].dump();
    return std::nullopt;
  }
  return j;
}

Result<std::string> ControlRequest(const std::string& socket_arg, const char* client,
                                   const std::optional<LeaseArgs>& lease,
                                   const std::optional<FramesArgs>& frames,
                                   const std::optional<AdminArgs>& admin) {
  // Over TCP (GMUX_ADDRESS, TLS unless "tcp://") when no Unix socket is named: an operator's
  // token (admin_tokens) in GMUX_TOKEN may then manage tenants from another host.
  const char* address = std::getenv("GMUX_ADDRESS");
  const char* env_socket = std::getenv("GMUX_SOCKET");
  const bool remote = socket_arg.empty() && (env_socket == nullptr || *env_socket == '\0') &&
                      address != nullptr && *address != '\0';
  std::string token;
  int fd = -1;
  if (remote) {
    if (const char* t = std::getenv("GMUX_TOKEN"); t != nullptr) token = t;
    GMUX_ASSIGN_OR_RETURN(fd, tls::Dial(address, tls::ClientOptionsFromEnvironment()));
  } else {
    const std::string path = ControlSocketPath(socket_arg);
    sockaddr_un addr{};
    if (path.size() >= sizeof(addr.sun_path)) {
      return InvalidArgument("socket path too long: " + path);
    }
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path.c_str(), path.size());
    fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return Unavailable("cannot create a socket");
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      std::string err = std::strerror(errno);
      ::close(fd);
      return Unavailable("cannot connect to gmuxd at " + path + ": " + err);
    }
  }
  timeval tv{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  Result<std::string> out = Unavailable("no answer");
  KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() {
    capnp::MallocMessageBuilder hello;
    auto req = hello.initRoot<wire::Request>();
    req.setSeq(1);
    auto h = req.initHello();
    h.setProtocolVersion(proto::kProtocolVersion);
    h.setPid(static_cast<uint32_t>(::getpid()));
    h.setClientName(client);
    h.setControl(true);
    if (remote) h.setToken(token);
    auto r1 = Call(fd, hello);
    if (!r1.ok()) {
      out = r1.status();
      return;
    }
    if (r1->root<wire::Reply>().getStatus() != CL_SUCCESS) {
      out = PermissionDenied(std::string("gmuxd refused the connection: ") +
                             r1->root<wire::Reply>().getMessage().cStr());
      return;
    }
    capnp::MallocMessageBuilder ask;
    auto sreq = ask.initRoot<wire::Request>();
    sreq.setSeq(2);
    if (lease) {
      auto l = sreq.initLease();
      l.setAction(lease->action);
      l.setTenant(lease->tenant);
      l.setLease(lease->id);
      l.setForSeconds(lease->for_s);
      l.setDevice(lease->device);
    } else if (frames) {
      auto f = sreq.initFrames();
      f.setAction(frames->action);
      f.setPolicy(frames->policy);
      f.setRenderer(frames->renderer);
      f.setTenant(frames->tenant);
      f.setFps(frames->fps);
    } else if (admin) {
      auto a = sreq.initAdmin();
      a.setCommand(admin->command);
      a.setArgs(admin->args);
    } else {
      sreq.setStats();
    }
    auto r2 = Call(fd, ask);
    if (!r2.ok()) {
      out = r2.status();
      return;
    }
    auto rep = r2->root<wire::Reply>();
    if (rep.getStatus() != CL_SUCCESS) {
      const std::string m = rep.getMessage().cStr();
      out = FailedPrecondition(m.rfind("gmuxd: ", 0) == 0 ? m : "gmuxd: " + m);
    } else if (lease && rep.isLease()) {
      out = std::string(rep.getLease().cStr());
    } else if (frames && rep.isFrames()) {
      out = std::string(rep.getFrames().cStr());
    } else if (admin && rep.isAdmin()) {
      out = std::string(rep.getAdmin().cStr());
    } else if (!lease && !frames && !admin && rep.isStats()) {
      out = std::string(rep.getStats().getScheduler().cStr());
      // The frame agents (vGASA) beside the scheduler's state.
      std::string fr = rep.getStats().getFrames().cStr();
      if (!fr.empty() && out.ok() && !out->empty()) {
        auto j = nlohmann::json::parse(*out, nullptr, false);
        auto f = nlohmann::json::parse(fr, nullptr, false);
        if (!j.is_discarded() && !f.is_discarded() && j.is_object()) {
          j["frames"] = f;
          out = j.dump();
        }
      }
    } else {
      out = Internal("gmuxd answered the request with something else");
    }
  })) {
    out = DataLoss(std::string("malformed reply: ") + e->getDescription().cStr());
  }
  ::close(fd);
  // The relay thread ends when gmuxd has closed its side too: before this program exits.
  if (remote) tls::WaitForClientRelays(std::chrono::seconds(6));
  if (out.ok() && out->empty()) return Unimplemented("this gmuxd does not report its scheduler");
  return out;
}

Result<std::string> QuerySchedulerStatus(const std::string& socket) {
  return ControlRequest(socket, "gmux status", std::nullopt);
}

int RunStatus(const std::string& socket, bool json) {
  auto s = QuerySchedulerStatus(socket);
  if (!s.ok()) {
    std::cerr << "gmux status: " << s.status().message() << "\n";
    return 1;
  }
  nlohmann::json j = nlohmann::json::parse(*s, nullptr, false);
  if (j.is_discarded()) {
    std::cerr << "gmux status: the daemon sent malformed JSON\n";
    return 1;
  }
  if (json) {
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  for (const auto& d : j.value("devices", nlohmann::json::array())) {
    std::string express;
    std::string sessions;
    int holders = 0;
    for (const auto& id : d.value("express_sessions", nlohmann::json::array())) {
      if (!id.is_number()) continue;
      sessions += (holders++ == 0 ? "" : ", ") + std::to_string(id.get<uint64_t>());
    }
    if (holders > 0) {
      express = (holders > 1 ? ", express: sessions " : ", express: session ") + sessions;
    } else if (d.contains("express_session") && d["express_session"].is_number()) {
      express = ", express: session " + std::to_string(d["express_session"].get<uint64_t>());
    }
    std::printf("device %d: policy %s, %d in flight (limit %d), %d queued, %llu dispatches%s\n",
                d.value("index", 0), d.value("policy", std::string("?")).c_str(),
                d.value("inflight", 0), j.value("inflight_per_device", 0),
                d.value("queued_commands", 0),
                static_cast<unsigned long long>(d.value("dispatches", uint64_t{0})),
                express.c_str());
    // Oversubscribed memory (docs/operations.md, "Oversubscription").
    if (d.contains("slots") && d["slots"].is_object()) {
      const auto& sl = d["slots"];
      const double gib = 1024.0 * 1024.0 * 1024.0;
      std::printf("  memory slots: %s, %d x %.0f MiB; %lld slot copies; %lld evictions, %lld "
                  "restores; %.2f GiB out, %.2f GiB in, %.2f s moving\n",
                  sl.value("policy", std::string("?")).c_str(), sl.value("slots", 0),
                  static_cast<double>(sl.value("slot_bytes", uint64_t{0})) / (1024.0 * 1024.0),
                  static_cast<long long>(sl.value("slot_copies", int64_t{0})),
                  static_cast<long long>(sl.value("evictions", int64_t{0})),
                  static_cast<long long>(sl.value("restores", int64_t{0})),
                  static_cast<double>(sl.value("bytes_out", uint64_t{0})) / gib,
                  static_cast<double>(sl.value("bytes_in", uint64_t{0})) / gib,
                  sl.value("swap_out_s", 0.0) + sl.value("swap_in_s", 0.0));
    }
  }
  // The device pool (docs/operations.md, "Device pool"): each exclusive device's state and holder.
  if (j.contains("pool") && j["pool"].is_object()) {
    const auto& p = j["pool"];
    for (const auto& d : p.value("devices", nlohmann::json::array())) {
      std::string holder;
      if (d.contains("tenant")) {
        holder = ", " + d.value("lease", std::string()) + " of '" +
                 d.value("tenant", std::string()) + "'";
      }
      std::printf("pool device %d: %s%s\n", d.value("device", 0),
                  d.value("state", std::string("?")).c_str(), holder.c_str());
    }
    std::printf("pool: %zu waiting, %llu grants, %llu reclaimed (gmux lease list for more)\n",
                p.value("waiting", nlohmann::json::array()).size(),
                static_cast<unsigned long long>(p.value("grants", uint64_t{0})),
                static_cast<unsigned long long>(p.value("reclaims", uint64_t{0})));
  }
  std::printf("active tenants: %d\n", j.value("active_tenants", 0));
  // unsplit_s: device time of kernels that could not be cut into chunks (docs/operations.md).
  std::printf("%-16s %7s %12s %12s %12s %9s %10s %10s %9s %9s\n", "tenant", "weight",
              "total_items", "processed", "remaining", "commands", "dispatches", "device_s",
              "unsplit_s", "usage_s");
  for (const auto& t : j.value("tenants", nlohmann::json::array())) {
    std::printf("%-16s %7.2f %12llu %12llu %12llu %9llu %10llu %10.3f %9.3f %9.3f\n",
                t.value("name", std::string("?")).c_str(), t.value("weight", 0.0),
                static_cast<unsigned long long>(t.value("total_items", uint64_t{0})),
                static_cast<unsigned long long>(t.value("processed_items", uint64_t{0})),
                static_cast<unsigned long long>(t.value("remaining_items", uint64_t{0})),
                static_cast<unsigned long long>(t.value("completed_commands", uint64_t{0})),
                static_cast<unsigned long long>(t.value("dispatches", uint64_t{0})),
                t.value("device_time_s", 0.0), t.value("unsplit_kernel_s", 0.0),
                t.value("usage_s", 0.0));
  }
  // Device memory (docs/operations.md, "Device memory"): tenants that hold, held or may hold.
  auto mib = [](uint64_t b) { return static_cast<double>(b) / (1024.0 * 1024.0); };
  bool header = false;
  for (const auto& t : j.value("tenants", nlohmann::json::array())) {
    for (const auto& m : t.value("memory", nlohmann::json::array())) {
      const uint64_t used = m.value("used", uint64_t{0}), peak = m.value("peak", uint64_t{0});
      const uint64_t quota = m.value("quota", uint64_t{0});
      if (used == 0 && peak == 0 && quota == 0) continue;
      if (!header) {
        std::printf("%-16s %6s %12s %12s %12s %8s\n", "memory (MiB)", "device", "used", "peak",
                    "quota", "refused");
        header = true;
      }
      char q[32] = "none";
      if (quota != 0) std::snprintf(q, sizeof(q), "%.1f", mib(quota));
      std::printf("%-16s %6d %12.1f %12.1f %12s %8llu\n", t.value("name", std::string("?")).c_str(),
                  m.value("device", 0), mib(used), mib(peak), q,
                  static_cast<unsigned long long>(t.value("memory_refused", uint64_t{0})));
    }
  }
  if (j.contains("frames") && j["frames"].is_object()) PrintFrames(j["frames"]);
  const auto sch = j.value("scheduler", nlohmann::json::object());
  std::printf("scheduler thread: %.0f ns per dispatch over %llu dispatches\n",
              sch.value("ns_per_dispatch", 0.0),
              static_cast<unsigned long long>(sch.value("dispatches", uint64_t{0})));
  return 0;
}

void PrintFrames(const nlohmann::json& f) {
  const auto groups = f.value("groups", nlohmann::json::array());
  if (groups.empty()) {
    std::printf("frame agents: none (SLA policy %s, criterion %.0f FPS)\n",
                f.value("policy", std::string("?")).c_str(), f.value("criterion_fps", 0.0));
    return;
  }
  for (const auto& g : groups) {
    std::printf("frames on '%s': policy %s\n", g.value("renderer", std::string("?")).c_str(),
                g.value("policy", std::string("?")).c_str());
    std::printf("  %-14s %7s %-14s %7s %7s %7s %9s %9s %6s %9s\n", "tenant", "pid", "program",
                "target", "ref", "fps", "sleep_ms", "present", "share", "frames");
    for (const auto& a : g.value("agents", nlohmann::json::array())) {
      char ref[16] = "-";
      if (a.value("controlled", false)) {
        std::snprintf(ref, sizeof(ref), "%.1f", a.value("reference_fps", 0.0));
      }
      std::printf("  %-14s %7d %-14s %7.1f %7s %7.1f %9.2f %9.2f %6.2f %9llu\n",
                  a.value("tenant", std::string("?")).c_str(), a.value("pid", 0),
                  a.value("program", std::string("?")).substr(0, 14).c_str(),
                  a.value("target_fps", 0.0), ref, a.value("fps", 0.0),
                  a.value("sleep_ms_per_frame", 0.0), a.value("present_ms_per_frame", 0.0),
                  a.value("share", 0.0),
                  static_cast<unsigned long long>(a.value("frames", uint64_t{0})));
    }
  }
}

int RunFrames(const std::string& socket, const FramesArgs& args, bool json) {
  auto s = ControlRequest(socket, "gmux frames", std::nullopt, args);
  if (!s.ok()) {
    std::cerr << "gmux frames: " << s.status().message() << "\n";
    return 1;
  }
  nlohmann::json j = nlohmann::json::parse(*s, nullptr, false);
  if (j.is_discarded()) {
    std::cerr << "gmux frames: the daemon sent malformed JSON\n";
    return 1;
  }
  if (j.contains("error")) {
    std::cerr << "gmux frames: " << j["error"].get<std::string>() << "\n";
    return 1;
  }
  if (json) {
    std::cout << j.dump(2) << "\n";
  } else if (args.action == "list") {
    PrintFrames(j);
  } else if (args.action == "policy") {
    std::printf("frame-rate policy %s for %s (%d group(s) now)\n", args.policy.c_str(),
                args.renderer.empty() ? "every renderer" : ("'" + args.renderer + "'").c_str(),
                j.value("groups_changed", 0));
  } else {
    std::printf("tenant %s: FPS target %.1f%s (%d agent(s) now)\n", args.tenant.c_str(), args.fps,
                args.fps == 0 ? " (the criterion)" : "", j.value("agents", 0));
  }
  return 0;
}

}  // namespace gmux::cli
