#include "daemon/metrics_endpoint.h"

#include <httplib.h>

#include <sys/socket.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <exception>
#include <map>

#include <nlohmann/json.hpp>

#include "daemon/config.h"

namespace gmux::daemon {

namespace {

using json = nlohmann::json;
using Family = MetricsEndpoint::Family;
using Labels = std::vector<std::pair<std::string, std::string>>;

// Families by name, in first-use order of their names (the exposition is sorted by the
// serializer's caller; order does not matter to Prometheus).
class Builder {
 public:
  void Add(const std::string& name, const char* type, const std::string& help, Labels labels,
           double value) {
    auto it = index_.find(name);
    if (it == index_.end()) {
      it = index_.emplace(name, families_.size()).first;
      families_.push_back(Family{name, help, type, {}});
    }
    families_[it->second].samples.push_back({std::move(labels), value});
  }
  void Counter(const std::string& name, const std::string& help, Labels labels, double value) {
    Add(name, "counter", help, std::move(labels), value);
  }
  void Gauge(const std::string& name, const std::string& help, Labels labels, double value) {
    Add(name, "gauge", help, std::move(labels), value);
  }
  std::vector<Family> Take() { return std::move(families_); }

 private:
  std::map<std::string, size_t> index_;
  std::vector<Family> families_;
};

// A label value in the exposition format: backslash, double quote and newline escaped.
std::string Escape(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

double Num(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : 0.0;
}

}  // namespace

std::vector<Family> MetricsEndpoint::Snapshot(const Sources& sources) {
  Builder b;
  json s = json::parse(sources.scheduler ? sources.scheduler() : "{}", nullptr, false);
  if (!s.is_object()) s = json::object();
  if (sources.sessions) {
    b.Gauge("gmux_sessions", "Sessions (client processes) connected now", {},
            static_cast<double>(sources.sessions()));
  }
  b.Counter("gmux_worker_deaths_total", "Worker processes that died or were ended", {},
            Num(s, "worker_deaths"));
  const json sch = s.value("scheduler", json::object());
  b.Counter("gmux_scheduler_dispatches_total", "Dispatches the scheduler thread decided", {},
            Num(sch, "dispatches"));
  b.Counter("gmux_scheduler_busy_seconds_total", "The scheduler thread's own time", {},
            Num(sch, "busy_s"));
  b.Gauge("gmux_active_tenants", "Tenants with work pending or in flight (Kang & Yu's N)", {},
          Num(s, "active_tenants"));
  for (const auto& d : s.value("devices", json::array())) {
    const Labels l = {
        {"device", std::to_string(d.value("index", 0))},
        {"policy", d.value("policy", std::string("?"))}};
    b.Gauge("gmux_device_inflight_commands", "Commands dispatched and not finished", l,
            Num(d, "inflight"));
    b.Gauge("gmux_device_queued_commands", "Commands waiting in the device's policy", l,
            Num(d, "queued_commands"));
    b.Counter("gmux_device_dispatches_total", "Dispatches (chunks count one each)", l,
              Num(d, "dispatches"));
    b.Counter("gmux_device_busy_seconds_total", "Device time of completed dispatches", l,
              Num(d, "busy_s"));
    b.Gauge("gmux_device_memory_capacity_bytes", "Device memory gmuxd manages", l,
            Num(d, "memory_capacity"));
    b.Gauge("gmux_device_memory_used_bytes", "Device memory in use, every tenant's", l,
            Num(d, "memory_used"));
    if (d.contains("slots") && d["slots"].is_object()) {
      const auto& sl = d["slots"];
      b.Counter("gmux_device_slot_copies_total", "Slot copies (DymGPU oversubscription)", l,
                Num(sl, "slot_copies"));
      b.Counter("gmux_device_evictions_total", "Tenants' data moved off the device", l,
                Num(sl, "evictions"));
      b.Counter("gmux_device_restores_total", "Tenants' data brought back", l,
                Num(sl, "restores"));
    }
  }
  // Shares: each tenant's device time against its weight's share of the total.
  double total_time = 0, total_weight = 0;
  for (const auto& t : s.value("tenants", json::array())) {
    total_time += Num(t, "device_time_s");
    total_weight += Num(t, "weight");
  }
  for (const auto& t : s.value("tenants", json::array())) {
    const std::string name = t.value("name", std::string("?"));
    const Labels l = {{"tenant", name}};
    b.Gauge("gmux_tenant_weight", "The tenant's configured weight", l, Num(t, "weight"));
    b.Gauge("gmux_tenant_weight_share", "The tenant's weight over all tenants' weights", l,
            total_weight > 0 ? Num(t, "weight") / total_weight : 0.0);
    b.Gauge("gmux_tenant_device_share", "The tenant's device time over all tenants'", l,
            total_time > 0 ? Num(t, "device_time_s") / total_time : 0.0);
    b.Counter("gmux_tenant_device_seconds_total", "Device time of the tenant's dispatches", l,
              Num(t, "device_time_s"));
    b.Counter("gmux_tenant_commands_total", "Commands the tenant submitted", l,
              Num(t, "commands"));
    b.Counter("gmux_tenant_completed_commands_total", "Commands completed", l,
              Num(t, "completed_commands"));
    b.Counter("gmux_tenant_dispatches_total", "Dispatches (chunks count one each)", l,
              Num(t, "dispatches"));
    b.Counter("gmux_tenant_work_items_total", "Kernel work-items submitted", l,
              Num(t, "total_items"));
    b.Counter("gmux_tenant_processed_work_items_total", "Kernel work-items completed", l,
              Num(t, "processed_items"));
    b.Gauge("gmux_tenant_inflight_commands", "Commands dispatched and not finished", l,
            Num(t, "inflight"));
    b.Gauge("gmux_tenant_queued_commands", "Commands waiting in the policies", l,
            Num(t, "pending_commands"));
    b.Gauge("gmux_tenant_sessions", "Sessions connected now", l, Num(t, "sessions"));
    b.Counter("gmux_tenant_worker_deaths_total", "The tenant's workers that died or were ended",
              l, Num(t, "worker_deaths"));
    b.Counter("gmux_tenant_watchdog_kills_total", "Sessions ended by the command watchdog", l,
              Num(t, "watchdog_kills"));
    b.Counter("gmux_tenant_memory_refused_total", "Allocations refused by the memory quota", l,
              Num(t, "memory_refused"));
    const json swap = t.value("swap", json::object());
    b.Counter("gmux_tenant_swap_bytes_total", "The tenant's data moved by the slot allocator",
              {{"tenant", name}, {"direction", "out"}}, Num(swap, "bytes_out"));
    b.Counter("gmux_tenant_swap_bytes_total", "The tenant's data moved by the slot allocator",
              {{"tenant", name}, {"direction", "in"}}, Num(swap, "bytes_in"));
    for (const auto& m : t.value("memory", json::array())) {
      const Labels ml = {{"tenant", name}, {"device", std::to_string(m.value("device", 0))}};
      b.Gauge("gmux_tenant_memory_used_bytes", "Device memory the tenant holds", ml,
              Num(m, "used"));
      b.Gauge("gmux_tenant_memory_peak_bytes", "The most it held", ml, Num(m, "peak"));
      b.Gauge("gmux_tenant_memory_quota_bytes", "Its quota (0: none)", ml, Num(m, "quota"));
    }
  }
  // The device pool (BioCloud).
  if (s.contains("pool") && s["pool"].is_object()) {
    const auto& p = s["pool"];
    for (const auto& d : p.value("devices", json::array())) {
      const std::string state = d.value("state", std::string("?"));
      b.Gauge("gmux_pool_device_leased", "1 while the pool device is lent to a tenant",
              {{"device", std::to_string(d.value("device", 0))},
               {"tenant", d.value("tenant", std::string())}},
              d.contains("tenant") ? 1.0 : 0.0);
    }
    b.Gauge("gmux_pool_waiting", "Lease requests waiting for a device", {},
            static_cast<double>(p.value("waiting", json::array()).size()));
    b.Counter("gmux_pool_grants_total", "Leases granted", {}, Num(p, "grants"));
    b.Counter("gmux_pool_reclaims_total", "Idle leases reclaimed", {}, Num(p, "reclaims"));
  }
  // Frame agents (vGASA).
  json f = json::parse(sources.frames ? sources.frames() : "{}", nullptr, false);
  if (f.is_object()) {
    b.Counter("gmux_frame_agents_dropped_total", "Frame agents ended for breaking the protocol",
              {}, Num(f, "agents_dropped"));
    for (const auto& g : f.value("groups", json::array())) {
      for (const auto& a : g.value("agents", json::array())) {
        const Labels l = {
            {"tenant", a.value("tenant", std::string("?"))},
            {"pid", std::to_string(a.value("pid", 0))},
            {"program", a.value("program", std::string("?"))},
            {"renderer", g.value("renderer", std::string("?"))},
            {"policy", g.value("policy", std::string("?"))}};
        b.Gauge("gmux_frame_fps", "Frames per second over the last control period", l,
                Num(a, "fps"));
        b.Gauge("gmux_frame_target_fps", "The agent's SLA target", l, Num(a, "target_fps"));
        b.Gauge("gmux_frame_reference_fps", "The reference in force (0: uncontrolled)", l,
                Num(a, "reference_fps"));
        b.Gauge("gmux_frame_sleep_seconds", "Mean sleep before Present per frame", l,
                Num(a, "sleep_ms_per_frame") * 1e-3);
        b.Gauge("gmux_frame_usage", "Device usage over the last control period", l,
                Num(a, "usage"));
        b.Counter("gmux_frame_frames_total", "Frames presented", l, Num(a, "frames"));
      }
    }
  }
  return b.Take();
}

std::string MetricsEndpoint::Exposition(const std::vector<Family>& families) {
  std::string out;
  char num[64];
  for (const Family& f : families) {
    out += "# HELP " + f.name + " " + f.help + "\n";
    out += "# TYPE " + f.name + " " + f.type + "\n";
    for (const Sample& s : f.samples) {
      out += f.name;
      if (!s.labels.empty()) {
        out += "{";
        for (size_t i = 0; i < s.labels.size(); ++i) {
          if (i > 0) out += ",";
          out += s.labels[i].first + "=\"" + Escape(s.labels[i].second) + "\"";
        }
        out += "}";
      }
      if (std::isnan(s.value)) {
        std::snprintf(num, sizeof(num), "NaN");
      } else if (std::isinf(s.value)) {
        std::snprintf(num, sizeof(num), s.value > 0 ? "+Inf" : "-Inf");
      } else {
        std::snprintf(num, sizeof(num), "%.15g", s.value);
      }
      out += " ";
      out += num;
      out += "\n";
    }
  }
  return out;
}

Result<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(const std::string& listen,
                                                                 Sources sources) {
  GMUX_ASSIGN_OR_RETURN(ListenAddress la, ParseListenAddress(listen));
  auto e = std::unique_ptr<MetricsEndpoint>(new MetricsEndpoint());
  e->sources_ = std::move(sources);
  e->server_ = std::make_unique<httplib::Server>();
  // SO_REUSEADDR only: cpp-httplib's default adds SO_REUSEPORT, which would let a second
  // daemon bind the same port and take half the scrapes.
  e->server_->set_socket_options([](int sock) {
    int one = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  });
  MetricsEndpoint* self = e.get();
  e->server_->Get("/metrics", [self](const httplib::Request&, httplib::Response& res) {
    res.set_content(Exposition(Snapshot(self->sources_)), "text/plain; version=0.0.4");
  });
  e->server_->Get("/", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("gmuxd: metrics at /metrics\n", "text/plain");
  });
  const std::string host = la.host.empty() ? "0.0.0.0" : la.host;
  int port = la.port == 0 ? e->server_->bind_to_any_port(host)
                          : (e->server_->bind_to_port(host, la.port) ? la.port : -1);
  if (port <= 0) return Unavailable("metrics_listen " + listen + ": cannot listen there");
  e->port_ = static_cast<uint16_t>(port);
  e->thread_ = std::thread([self] {
    self->server_->listen_after_bind();
    self->done_ = true;
  });
  return e;
}

MetricsEndpoint::~MetricsEndpoint() {
  if (!thread_.joinable()) return;
  // stop() does nothing before the listener runs: wait for it to run (or to have failed).
  for (int i = 0; i < 5000 && !server_->is_running() && !done_; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  server_->stop();
  thread_.join();
}

}  // namespace gmux::daemon
