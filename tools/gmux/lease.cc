#include "lease.h"

#include <chrono>
#include <cstdio>
#include <iomanip>
#include <iostream>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "status.h"

namespace gmux::cli {
namespace {

using nlohmann::json;

// The daemon's JSON answer, or an error message (exit 1) printed by the caller.
std::optional<json> Ask(const LeaseOptions& o, const LeaseArgs& a, std::string& error) {
  return ControlJson(o.socket, "gmux lease", a, std::nullopt, error);
}

int Fail(const std::string& what, const std::string& error) {
  std::cerr << "gmux lease " << what << ": " << error << "\n";
  return 1;
}

std::optional<uint64_t> ParseId(const std::string& text) {
  std::string t = text;
  if (!t.empty() && (t[0] == 'L' || t[0] == 'l')) t = t.substr(1);
  if (t.empty() || t.size() > 18 || t.find_first_not_of("0123456789") != std::string::npos) {
    return std::nullopt;
  }
  return std::stoull(t);
}

std::optional<json> FindLease(const json& list, const std::string& name) {
  if (!list.contains("leases") || !list["leases"].is_array()) return std::nullopt;
  for (const auto& l : list["leases"]) {
    if (l.is_object() && l.value("lease", std::string()) == name) return l;
  }
  return std::nullopt;
}

}  // namespace

std::optional<double> ParseDuration(const std::string& text) {
  if (text.empty()) return std::nullopt;
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (...) {
    return std::nullopt;
  }
  const std::string unit = text.substr(used);
  double scale = 0;
  if (unit.empty() || unit == "s") scale = 1;
  if (unit == "ms") scale = 1e-3;
  if (unit == "m" || unit == "min") scale = 60;
  if (unit == "h") scale = 3600;
  if (unit == "d") scale = 86400;
  if (scale == 0 || !(v >= 0) || v * scale > 366.0 * 86400) return std::nullopt;
  return v * scale;
}

int RunLeaseAcquire(const LeaseOptions& o) {
  LeaseArgs a;
  a.action = "acquire";
  a.tenant = o.tenant;
  a.device = o.device;
  if (!o.for_text.empty()) {
    auto f = ParseDuration(o.for_text);
    if (!f) return Fail("acquire", "bad --for '" + o.for_text + "' (e.g. 90s, 30m, 2h)");
    a.for_s = *f;
  }
  double wait_s = 0;
  if (!o.wait_text.empty()) {
    auto w = ParseDuration(o.wait_text);
    if (!w) return Fail("acquire", "bad --wait '" + o.wait_text + "' (e.g. 10s, 5m)");
    wait_s = *w;
  }
  std::string error;
  auto got = Ask(o, a, error);
  if (!got) return Fail("acquire", error);
  const std::string name = got->value("lease", std::string());
  const auto t0 = std::chrono::steady_clock::now();
  // Until the device is usable, or --wait runs out (then the request is withdrawn).
  json lease;
  for (;;) {
    LeaseArgs list;
    list.action = "list";
    auto l = Ask(o, list, error);
    if (!l) return Fail("acquire", error);
    if (auto mine = FindLease(*l, name); mine && mine->value("state", std::string()) == "ready") {
      lease = *mine;
      break;
    }
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (waited >= wait_s) {
      if (o.wait_text.empty()) {
        // No --wait: the request stays in the pool's queue.
        json out{{"lease", name}, {"state", "waiting"}, {"tenant", got->value("tenant", "")}};
        if (o.json) {
          std::cout << out.dump() << "\n";
        } else {
          std::cout << name << ": waiting for a free pool device (gmux lease list; gmux lease "
                       "release " << name << " withdraws it)\n";
        }
        return 0;
      }
      LeaseArgs cancel;
      cancel.action = "release";
      cancel.id = ParseId(name).value_or(0);
      std::string ignored;
      Ask(o, cancel, ignored);
      return Fail("acquire", "no pool device became free within " + o.wait_text +
                                 " (the request was withdrawn)");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (o.json) {
    std::cout << lease.dump() << "\n";
  } else {
    std::cout << name << ": device " << lease.value("device", 0) << " leased to tenant '"
              << lease.value("tenant", "") << "'";
    if (lease.contains("expires_in_s")) {
      std::cout << " for " << std::fixed << std::setprecision(0)
                << lease["expires_in_s"].get<double>() << " s";
    } else {
      std::cout << " until released";
    }
    std::cout << "\n";
  }
  return 0;
}

int RunLeaseRelease(const LeaseOptions& o) {
  auto id = ParseId(o.id);
  if (!id) return Fail("release", "bad lease id '" + o.id + "' (e.g. L3)");
  LeaseArgs a;
  a.action = "release";
  a.id = *id;
  std::string error;
  auto got = Ask(o, a, error);
  if (!got) return Fail("release", error);
  if (o.json) {
    std::cout << got->dump() << "\n";
  } else {
    std::cout << got->value("released", std::string()) << ": released\n";
  }
  return 0;
}

int RunLeaseList(const LeaseOptions& o) {
  LeaseArgs a;
  a.action = "list";
  std::string error;
  auto got = Ask(o, a, error);
  if (!got) return Fail("list", error);
  if (o.json) {
    std::cout << got->dump() << "\n";
    return 0;
  }
  const json& j = *got;
  if (j.value("devices", json::array()).empty()) {
    std::cout << "gmuxd has no pool devices ([[scheduler.device]] mode = \"exclusive\")\n";
    return 0;
  }
  std::cout << std::left << std::setw(8) << "DEVICE" << std::setw(11) << "STATE" << std::setw(8)
            << "LEASE" << "TENANT\n";
  for (const auto& d : j["devices"]) {
    std::cout << std::setw(8) << d.value("device", 0) << std::setw(11)
              << d.value("state", std::string()) << std::setw(8)
              << d.value("lease", std::string("-")) << d.value("tenant", std::string("-"))
              << "\n";
  }
  for (const auto& l : j.value("leases", json::array())) {
    std::cout << l.value("lease", "") << " " << l.value("kind", "") << " lease of '"
              << l.value("tenant", "") << "' on device " << l.value("device", 0) << ", "
              << l.value("state", "") << ", held " << std::fixed << std::setprecision(1)
              << l.value("held_s", 0.0) << " s";
    if (l.contains("expires_in_s")) {
      std::cout << ", expires in " << l["expires_in_s"].get<double>() << " s";
    }
    std::cout << "\n";
  }
  for (const auto& w : j.value("waiting", json::array())) {
    std::cout << "waiting: '" << w.value("tenant", "") << "' (" << w.value("lease", "") << ", "
              << w.value("kind", "") << ") for " << std::fixed << std::setprecision(1)
              << w.value("waiting_s", 0.0) << " s\n";
  }
  std::cout << "grants " << j.value("grants", 0) << ", mean grant latency " << std::setprecision(3)
            << j.value("mean_grant_latency_s", 0.0) * 1e3 << " ms, reclaimed "
            << j.value("reclaims", 0) << ", reclaim to re-acquire "
            << j.value("mean_reclaim_to_reacquire_s", 0.0) << " s, attach hooks "
            << j.value("attach_hooks", 0) << " (" << j.value("attach_hook_s", 0.0) << " s)\n";
  return 0;
}

}  // namespace gmux::cli
