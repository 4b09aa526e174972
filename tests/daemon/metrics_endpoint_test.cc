// The Prometheus endpoint: the snapshot's families from the daemon's state (shares, memory,
// pool, frame agents, label escaping) and a real scrape over HTTP of a running gmuxd, whose
// exposition is parsed line by line as Prometheus's text format 0.0.4 defines it.
#include "daemon/metrics_endpoint.h"

#include <httplib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <set>
#include <sstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "daemon/server.h"
#include "proto/frame.h"

namespace gmux::daemon {
namespace {

namespace wire = proto::wire;

struct Parsed {
  std::map<std::string, std::string> types;         // family -> counter|gauge
  std::map<std::string, double> values;             // "name{labels}" -> value
  std::vector<std::string> errors;
};

bool NameStart(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool NameChar(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// One sample line, "name{l="v",...} value", checked character by character (no std::regex:
// GCC 12 warns inside <regex> under the sanitizers, and the warnings are errors). The
// "name{labels}" part goes to `key`; false for anything the format does not allow.
bool ParseSample(const std::string& line, std::string* name, std::string* key, double* value) {
  size_t i = 0;
  if (i >= line.size() || !(NameStart(line[i]) || line[i] == ':')) return false;
  while (i < line.size() && (NameChar(line[i]) || line[i] == ':')) ++i;
  *name = line.substr(0, i);
  if (i < line.size() && line[i] == '{') {
    ++i;
    for (bool first = true;; first = false) {
      if (i < line.size() && line[i] == '}' && !first) break;
      if (!first) {
        if (i >= line.size() || line[i] != ',') return false;
        ++i;
      }
      if (i >= line.size() || !NameStart(line[i])) return false;
      while (i < line.size() && NameChar(line[i])) ++i;
      if (line.compare(i, 2, "=\"") != 0) return false;
      i += 2;
      while (i < line.size() && line[i] != '"') {
        if (line[i] == '\\') {
          if (i + 1 >= line.size() || std::string("\\\"n").find(line[i + 1]) == std::string::npos) {
            return false;
          }
          ++i;
        }
        ++i;
      }
      if (i >= line.size()) return false;
      ++i;  // the closing quote
    }
    ++i;  // '}'
  }
  *key = line.substr(0, i);
  if (i >= line.size() || line[i] != ' ') return false;
  const std::string v = line.substr(i + 1);
  if (v == "NaN" || v == "+Inf" || v == "-Inf") {
    *value = v == "NaN" ? std::nan("") : (v[0] == '+' ? HUGE_VAL : -HUGE_VAL);
    return true;
  }
  char* end = nullptr;
  *value = std::strtod(v.c_str(), &end);
  return !v.empty() && end == v.c_str() + v.size();
}

// Prometheus text format: "# HELP name text", "# TYPE name type", "name{l="v",...} value".
Parsed Parse(const std::string& text) {
  Parsed p;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("# HELP ", 0) == 0) continue;
    if (line.rfind("# TYPE ", 0) == 0) {
      std::istringstream t(line.substr(7));
      std::string name, type;
      t >> name >> type;
      if (type != "counter" && type != "gauge") p.errors.push_back("bad type: " + line);
      p.types[name] = type;
      continue;
    }
    std::string name, key;
    double value = 0;
    if (!ParseSample(line, &name, &key, &value)) {
      p.errors.push_back("bad line: " + line);
      continue;
    }
    if (p.types.count(name) == 0) p.errors.push_back("no TYPE before: " + line);
    p.values[key] = value;
  }
  return p;
}

TEST(MetricsEndpointTest, SnapshotTurnsTheDaemonsStateIntoFamilies) {
  MetricsEndpoint::Sources src;
  src.scheduler = [] {
    return nlohmann::json{
        {"worker_deaths", 2},
        {"active_tenants", 1},
        {"devices", {{{"index", 0}, {"policy", "credit"}, {"inflight", 3}, {"dispatches", 40},
                      {"busy_s", 1.5}, {"memory_capacity", 1000}, {"memory_used", 300}}}},
        {"tenants",
         {{{"name", "a"}, {"weight", 3.0}, {"device_time_s", 3.0}, {"commands", 10},
           {"memory", {{{"device", 0}, {"used", 100}, {"peak", 200}, {"quota", 500}}}}},
          {{"name", "b \"quoted\""}, {"weight", 1.0}, {"device_time_s", 1.0}}}},
        {"pool", {{"devices", {{{"device", 1}, {"state", "leased"}, {"tenant", "a"}}}},
                  {"grants", 4}, {"reclaims", 1}, {"waiting", nlohmann::json::array()}}}}
        .dump();
  };
  src.frames = [] {
    return nlohmann::json{{"agents_dropped", 1},
                          {"groups",
                           {{{"renderer", "llvmpipe"},
                             {"policy", "sa"},
                             {"agents",
                              {{{"tenant", "a"}, {"pid", 7}, {"program", "glxgears"},
                                {"fps", 29.5}, {"target_fps", 30}, {"reference_fps", 30},
                                {"sleep_ms_per_frame", 20.0}, {"frames", 100}}}}}}}}
        .dump();
  };
  src.sessions = [] { return uint64_t{5}; };
  const std::string text = MetricsEndpoint::Exposition(MetricsEndpoint::Snapshot(src));
  Parsed p = Parse(text);
  EXPECT_TRUE(p.errors.empty()) << p.errors.front() << "\n" << text;
  EXPECT_EQ(p.types["gmux_tenant_device_seconds_total"], "counter");
  EXPECT_EQ(p.types["gmux_tenant_device_share"], "gauge");
  EXPECT_EQ(p.values["gmux_sessions"], 5);
  EXPECT_EQ(p.values["gmux_worker_deaths_total"], 2);
  EXPECT_EQ(p.values[R"(gmux_device_busy_seconds_total{device="0",policy="credit"})"], 1.5);
  EXPECT_EQ(p.values[R"(gmux_tenant_device_share{tenant="a"})"], 0.75);
  EXPECT_EQ(p.values[R"(gmux_tenant_weight_share{tenant="a"})"], 0.75);
  EXPECT_EQ(p.values[R"(gmux_tenant_weight{tenant="b \"quoted\""})"], 1.0);
  EXPECT_EQ(p.values[R"(gmux_tenant_memory_quota_bytes{tenant="a",device="0"})"], 500);
  EXPECT_EQ(p.values[R"(gmux_pool_device_leased{device="1",tenant="a"})"], 1);
  EXPECT_EQ(p.values["gmux_pool_grants_total"], 4);
  EXPECT_EQ(p.values[R"(gmux_frame_sleep_seconds{tenant="a",pid="7",program="glxgears",)"
                     R"(renderer="llvmpipe",policy="sa"})"],
            0.02);
  EXPECT_EQ(p.values["gmux_frame_agents_dropped_total"], 1);
  // The checker itself refuses what the format does not allow.
  for (const char* bad : {"# TYPE x gauge\nx{a=1} 2", "# TYPE x gauge\nx{a=\"1} 2",
                          "# TYPE x gauge\nx 2 3", "# TYPE x gauge\n1x 2",
                          "# TYPE x gauge\nx{a=\"\\q\"} 2", "y 1"}) {
    EXPECT_FALSE(Parse(bad).errors.empty()) << bad;
  }
  EXPECT_TRUE(Parse("# TYPE x gauge\nx{a=\"q\\\"\",b=\"\"} -Inf").errors.empty());
  // Every counter's name ends in _total; every family has HELP and TYPE.
  for (const auto& [name, type] : p.types) {
    if (type == "counter") {
      EXPECT_EQ(name.substr(name.size() - 6), "_total") << name;
    }
    EXPECT_NE(text.find("# HELP " + name + " "), std::string::npos) << name;
  }
}

TEST(MetricsEndpointTest, ARunningDaemonIsScrapedOverHttp) {
  char tmpl[] = "/tmp/gmux-metrics-test-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  DaemonOptions o;
  o.socket_path = dir + "/gmuxd.sock";
  o.spare_workers = 0;
  o.metrics_listen = "127.0.0.1:0";
  auto s = Server::Create(o);
  if (!s.ok() && s.status().code() != StatusCode::kInvalidArgument) {
    GTEST_SKIP() << "no OpenCL backend: " << s.status().ToString();
  }
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ASSERT_TRUE((*s)->Start().ok());
  ASSERT_NE((*s)->metrics_port(), 0);
  // A frame agent, so that the scrape has one.
  int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::strncpy(a.sun_path, o.socket_path.c_str(), sizeof(a.sun_path) - 1);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<wire::Request>();
  r.setSeq(1);
  r.initHello().setProtocolVersion(proto::kProtocolVersion);
  r.getHello().setFrameAgent(true);
  r.getHello().setProgram("scraped");
  r.getHello().setRenderer("Fake");
  ASSERT_TRUE(proto::WriteFrame(fd, proto::FrameKind::kRequest, b).ok());
  ASSERT_TRUE(proto::ReadFrame(fd, proto::FrameKind::kReply).ok());

  httplib::Client client("127.0.0.1", (*s)->metrics_port());
  client.set_read_timeout(10, 0);
  std::string body;
  for (int i = 0; i < 50 && body.find("scraped") == std::string::npos; ++i) {
    auto res = client.Get("/metrics");
    ASSERT_TRUE(res) << "no answer from the metrics endpoint";
    ASSERT_EQ(res->status, 200);
    EXPECT_NE(res->get_header_value("Content-Type").find("text/plain"), std::string::npos);
    body = res->body;
  }
  Parsed p = Parse(body);
  EXPECT_TRUE(p.errors.empty()) << p.errors.front();
  EXPECT_EQ(p.types["gmux_device_dispatches_total"], "counter");
  EXPECT_NE(body.find(R"(program="scraped")"), std::string::npos) << body;
  EXPECT_EQ(client.Get("/nothing")->status, 404);
  ::close(fd);
  (*s)->Stop();
  // A port already taken fails the start with a clear error.
  DaemonOptions o2 = o;
  o2.socket_path = dir + "/other.sock";
  auto s2 = Server::Create(o2);
  ASSERT_TRUE(s2.ok());
  httplib::Server squatter;
  int port = squatter.bind_to_any_port("127.0.0.1");
  ASSERT_GT(port, 0);
  (*s2)->Stop();
  DaemonOptions o3 = o;
  o3.socket_path = dir + "/third.sock";
  o3.metrics_listen = "127.0.0.1:" + std::to_string(port);
  auto s3 = Server::Create(o3);
  ASSERT_TRUE(s3.ok());
  Status st = (*s3)->Start();
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("metrics_listen"), std::string::npos) << st.message();
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

}  // namespace
}  // namespace gmux::daemon
