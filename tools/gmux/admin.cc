#include "admin.h"

#include <cstdio>
#include <ctime>
#include <fstream>
#include <iostream>
#include <sstream>

#include <nlohmann/json.hpp>
#include <toml++/toml.h>

#include "daemon/config.h"
#include "daemon/ledger.h"
#include "lease.h"
#include "status.h"

namespace gmux::cli {
namespace {

using nlohmann::json;

double WallNow() { return static_cast<double>(std::time(nullptr)); }

std::string Bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), u == 0 ? "%.0f %s" : "%.1f %s", b, units[u]);
  return buf;
}

std::string LocalTime(double t) {
  const time_t s = static_cast<time_t>(t);
  std::tm tm{};
  localtime_r(&s, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}

int UsageFail(const std::string& message) {
  std::cerr << "gmux usage: " << message << "\n";
  return 1;
}

}  // namespace

std::optional<double> ParseTimePoint(const std::string& text) {
  if (text == "now") return WallNow();
  if (!text.empty() && text[0] == '@') {
    try {
      size_t used = 0;
      double v = std::stod(text.substr(1), &used);
      if (used + 1 == text.size() && v >= 0) return v;
    } catch (...) {
    }
    return std::nullopt;
  }
  for (const char* format : {"%Y-%m-%d %H:%M:%S", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M",
                             "%Y-%m-%dT%H:%M", "%Y-%m-%d"}) {
    std::tm tm{};
    const char* end = strptime(text.c_str(), format, &tm);
    if (end != nullptr && *end == '\0') {
      tm.tm_isdst = -1;
      const time_t t = std::mktime(&tm);
      if (t != static_cast<time_t>(-1)) return static_cast<double>(t);
    }
  }
  // A duration back from now: "2h" or "-2h".
  auto d = ParseDuration(!text.empty() && text[0] == '-' ? text.substr(1) : text);
  if (d) return WallNow() - *d;
  return std::nullopt;
}

int RunUsage(const UsageOptions& o) {
  json args = json::object();
  if (!o.since.empty()) {
    auto t = ParseTimePoint(o.since);
    if (!t) return UsageFail("--since: expected a date (2026-11-26 [13:00]), @UNIX, now, or a "
                             "duration back from now (90m, 2h, 7d); got '" + o.since + "'");
    args["since"] = *t;
  }
  if (!o.until.empty()) {
    auto t = ParseTimePoint(o.until);
    if (!t) return UsageFail("--until: expected a date, @UNIX, now or a duration; got '" +
                             o.until + "'");
    args["until"] = *t;
  }
  if (!o.tenant.empty()) args["tenant"] = o.tenant;
  args["rows"] = o.rows;
  json answer;
  if (!o.ledger.empty()) {
    // The file itself, no daemon needed (an operator reading the books of a stopped gmuxd).
    daemon::LedgerQuery q;
    q.since = args.value("since", 0.0);
    q.until = args.value("until", 0.0);
    if (!o.tenant.empty()) q.tenant = o.tenant;
    q.rows = o.rows;
    auto entries = daemon::Ledger::Query(o.ledger, q);
    if (!entries.ok()) return UsageFail(entries.status().message());
    answer = {{"ledger", o.ledger}, {"entries", json::array()}};
    for (const auto& e : *entries) answer["entries"].push_back(daemon::LedgerEntryJson(e));
  } else {
    auto r = ControlRequest(o.socket, "gmux usage", std::nullopt, std::nullopt,
                            AdminArgs{"usage", args.dump(-1, ' ', false,
                                                         json::error_handler_t::replace)});
    if (!r.ok()) return UsageFail(r.status().message());
    answer = json::parse(*r, nullptr, false);
    if (answer.is_discarded() || !answer.is_object()) {
      return UsageFail("gmuxd answered something that is not JSON");
    }
  }
  const json entries = answer.value("entries", json::array());
  if (o.json) {
    std::cout << answer.dump(2) << "\n";
    return 0;
  }
  if (o.csv) {
    std::cout << "tenant,device,device_name,start,end,device_s,commands,bytes,memory_byte_s,"
                 "lease_s,intervals\n";
    // RFC 4180 fields: quoted, quotes doubled.
    auto field = [](const std::string& v) {
      std::string out = "\"";
      for (char c : v) out += c == '"' ? std::string("\"\"") : std::string(1, c);
      return out + "\"";
    };
    for (const auto& e : entries) {
      std::printf("%s,%u,%s,%.3f,%.3f,%.6f,%llu,%llu,%.1f,%.3f,%llu\n",
                  field(e.value("tenant", std::string())).c_str(), e.value("device", 0u),
                  field(e.value("device_name", std::string())).c_str(), e.value("start", 0.0),
                  e.value("end", 0.0), e.value("device_s", 0.0),
                  static_cast<unsigned long long>(e.value("commands", uint64_t{0})),
                  static_cast<unsigned long long>(e.value("bytes", uint64_t{0})),
                  e.value("memory_byte_s", 0.0), e.value("lease_s", 0.0),
                  static_cast<unsigned long long>(e.value("intervals", uint64_t{0})));
    }
    return 0;
  }
  if (entries.empty()) {
    std::printf("no usage booked%s\n", o.tenant.empty() ? "" : " for this tenant");
    return 0;
  }
  std::printf("%-19s %-19s %-16s %3s %12s %10s %11s %14s %10s\n", "from", "to", "tenant", "dev",
              "device time", "commands", "moved", "memory", "lease");
  for (const auto& e : entries) {
    const double gib_h = e.value("memory_byte_s", 0.0) / (1024.0 * 1024.0 * 1024.0 * 3600.0);
    std::printf("%-19s %-19s %-16s %3u %11.3fs %10llu %11s %10.4f GiB·h %9.1fs\n",
                LocalTime(e.value("start", 0.0)).c_str(), LocalTime(e.value("end", 0.0)).c_str(),
                e.value("tenant", std::string()).c_str(), e.value("device", 0u),
                e.value("device_s", 0.0),
                static_cast<unsigned long long>(e.value("commands", uint64_t{0})),
                Bytes(static_cast<double>(e.value("bytes", uint64_t{0}))).c_str(), gib_h,
                e.value("lease_s", 0.0));
  }
  return 0;
}

namespace {

int TenantFail(const std::string& action, const std::string& message) {
  std::cerr << "gmux tenant " << action << ": " << message << "\n";
  return 1;
}

// A [limits] value from the command line: an integer, a number, or text ("4GiB").
void InsertValue(toml::table& t, const std::string& key, const std::string& value) {
  try {
    size_t used = 0;
    long long i = std::stoll(value, &used);
    if (used == value.size()) {
      t.insert_or_assign(key, static_cast<int64_t>(i));
      return;
    }
    double d = std::stod(value, &used);
    if (used == value.size()) {
      t.insert_or_assign(key, d);
      return;
    }
  } catch (...) {
  }
  t.insert_or_assign(key, value);
}

}  // namespace

int RunTenant(const std::string& action, const TenantOptions& o) {
  json args = {{"action", action}, {"name", o.name}};
  if (action == "add" || action == "set") {
    // The change as a [[tenant]] table: gmuxd reads it as it reads its config file.
    toml::table t;
    t.insert_or_assign("name", o.name);
    if (o.weight) t.insert_or_assign("weight", *o.weight);
    if (o.fps_target) t.insert_or_assign("fps_target", *o.fps_target);
    if (o.slurm_job) t.insert_or_assign("slurm_job", *o.slurm_job);
    if (!o.uids.empty()) {
      toml::array a;
      for (int64_t u : o.uids) a.push_back(u);
      t.insert_or_assign("uids", std::move(a));
    }
    if (!o.tokens.empty()) {
      toml::array a;
      for (const std::string& tok : o.tokens) a.push_back(tok);
      t.insert_or_assign("tokens", std::move(a));
    }
    if (!o.memory_quota.empty()) InsertValue(t, "memory_quota", o.memory_quota);
    for (const std::string& kv : o.limits) {
      const size_t eq = kv.find('=');
      if (eq == std::string::npos || eq == 0) {
        return TenantFail(action, "--limit expects KEY=VALUE, got '" + kv + "'");
      }
      InsertValue(t, kv.substr(0, eq), kv.substr(eq + 1));
    }
    toml::array tables;
    tables.push_back(std::move(t));
    toml::table root;
    root.insert_or_assign("tenant", std::move(tables));
    std::ostringstream text;
    text << root;
    args["toml"] = text.str();
  }
  auto r = ControlRequest(o.socket, "gmux tenant", std::nullopt, std::nullopt,
                          AdminArgs{"tenant", args.dump(-1, ' ', false,
                                                        json::error_handler_t::replace)});
  if (!r.ok()) return TenantFail(action, r.status().message());
  json answer = json::parse(*r, nullptr, false);
  if (answer.is_discarded() || !answer.is_object()) {
    return TenantFail(action, "gmuxd answered something that is not JSON");
  }
  if (o.json) {
    std::cout << answer.dump(2) << "\n";
    return 0;
  }
  auto line = [](const json& t) {
    const json l = t.value("limits", json::object());
    const uint64_t quota = l.value("memory_quota", uint64_t{0});
    std::string uids;
    for (const auto& u : t.value("uids", json::array())) {
      uids += (uids.empty() ? "" : ",") + std::to_string(u.get<int64_t>());
    }
    std::printf("%-16s %7.3g %-14s %6d %9s %8.1f %8d  %s\n",
                t.value("name", std::string()).c_str(), t.value("weight", 1.0),
                uids.empty() ? "-" : uids.c_str(), t.value("tokens", 0),
                quota == 0 ? "-" : Bytes(static_cast<double>(quota)).c_str(),
                t.value("fps_target", 0.0), t.value("sessions", 0),
                t.value("origin", std::string()).c_str());
  };
  std::printf("%-16s %7s %-14s %6s %9s %8s %8s  %s\n", "tenant", "weight", "uids", "tokens",
              "quota", "fps", "sessions", "from");
  if (action == "list") {
    for (const auto& t : answer.value("tenants", json::array())) line(t);
  } else {
    line(answer.value("tenant", json::object()));
    if (answer.contains("note")) std::printf("%s\n", answer["note"].get<std::string>().c_str());
  }
  return 0;
}

}  // namespace gmux::cli

namespace gmux::cli {

int RunTokenHash(bool json_out) {
  std::string token;
  std::getline(std::cin, token);
  if (!token.empty() && token.back() == '\r') token.pop_back();
  if (token.empty()) {
    std::cerr << "gmux token hash: give the token on stdin, e.g. printf %s \"$TOKEN\" | gmux "
                 "token hash\n";
    return 2;
  }
  const std::string hashed = daemon::HashToken(token);
  if (json_out) {
    std::cout << json{{"hashed", hashed}}.dump() << "\n";
  } else {
    std::cout << hashed << "\n";
  }
  return 0;
}

int RunTokenNew(bool json_out) {
  // 32 random bytes from the kernel, as hex: 256 bits, more than any guessing can reach.
  unsigned char raw[32];
  std::ifstream urandom("/dev/urandom", std::ios::binary);
  if (!urandom.read(reinterpret_cast<char*>(raw), sizeof(raw))) {
    std::cerr << "gmux token new: cannot read /dev/urandom\n";
    return 1;
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string token;
  for (unsigned char c : raw) {
    token += kHex[c >> 4];
    token += kHex[c & 15];
  }
  const std::string hashed = daemon::HashToken(token);
  if (json_out) {
    std::cout << json{{"token", token}, {"hashed", hashed}}.dump() << "\n";
  } else {
    std::cout << "token:  " << token << "   (give it to the tenant: GMUX_TOKEN)\n"
              << "config: " << hashed << "   (put it in the tenant's tokens)\n";
  }
  return 0;
}

}  // namespace gmux::cli
