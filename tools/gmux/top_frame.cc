#include "top_frame.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <map>
#include <utility>

namespace gmux::cli {

namespace {

using nlohmann::json;

constexpr std::array<std::pair<TopSort, std::string_view>, 6> kSortNames = {{
    {TopSort::kName, "name"},
    {TopSort::kShare, "share"},
    {TopSort::kWeight, "weight"},
    {TopSort::kQueue, "queue"},
    {TopSort::kMemory, "memory"},
    {TopSort::kDeviceTime, "time"},
}};

// The daemon's JSON is read defensively: a field of another type or a missing one reads as zero,
// so a newer or older gmuxd shows what it has rather than stopping the view.
double Num(const json& j, const char* key) {
  if (!j.is_object()) return 0;
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : 0.0;
}

uint64_t Count(const json& j, const char* key) {
  const double v = Num(j, key);
  return v > 0 ? static_cast<uint64_t>(v) : 0;
}

const json& Member(const json& j, const char* key) {
  static const json kNull;
  if (!j.is_object()) return kNull;
  auto it = j.find(key);
  return it != j.end() ? *it : kNull;
}

const json& Array(const json& j, const char* key) {
  static const json kEmpty = json::array();
  const json& m = Member(j, key);
  return m.is_array() ? m : kEmpty;
}

// Names come from config files and from frame agents' programs: control characters would
// reach the terminal as escape sequences, so they are shown as '?'.
std::string Text(const json& j, const char* key, const char* missing = "?") {
  const json& m = Member(j, key);
  std::string s = m.is_string() ? m.get<std::string>() : std::string(missing);
  for (char& c : s) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
  }
  return s;
}

__attribute__((format(printf, 1, 2))) std::string Fmt(const char* fmt, ...) {
  char buf[256];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  return buf;
}

std::string Percent(const std::optional<double>& f) {
  return f ? Fmt("%.1f%%", *f * 100.0) : std::string("-");
}

std::string MiB(uint64_t bytes) {
  return Fmt("%.1f", static_cast<double>(bytes) / (1024.0 * 1024.0));
}

// Display width of UTF-8 text: one column per code point (names are not expected to hold
// double-width characters).
size_t Columns(const std::string& s) {
  return static_cast<size_t>(
      std::count_if(s.begin(), s.end(), [](char c) { return (c & 0xC0) != 0x80; }));
}

// `s` cut to `width` columns, never inside a UTF-8 sequence.
std::string Fit(const std::string& s, size_t width) {
  size_t cols = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if ((s[i] & 0xC0) != 0x80 && cols++ == width) return s.substr(0, i);
  }
  return s;
}

// A table is data: its columns' titles, widths and alignment; every cell is text already.
struct Column {
  const char* title;
  size_t width;
  bool left = false;  // text columns align left and are cut to their width; numbers overflow
};

// One line of cells under `cols`; the start of each cell in `begins` when given.
std::string Row(const std::vector<Column>& cols, const std::vector<std::string>& cells,
                std::vector<size_t>* begins = nullptr) {
  std::string line;
  for (size_t i = 0; i < cols.size(); ++i) {
    if (i > 0) line += ' ';
    if (begins != nullptr) begins->push_back(line.size());
    std::string cell = i < cells.size() ? cells[i] : std::string();
    if (cols[i].left) cell = Fit(cell, cols[i].width);
    const size_t w = Columns(cell);
    const std::string pad = w < cols[i].width ? std::string(cols[i].width - w, ' ') : "";
    line += cols[i].left ? cell + pad : pad + cell;
  }
  while (!line.empty() && line.back() == ' ') line.pop_back();
  return line;
}

std::string Header(const std::vector<Column>& cols, std::vector<size_t>* begins = nullptr) {
  std::vector<std::string> titles;
  for (const auto& c : cols) titles.push_back(c.title);
  return Row(cols, titles, begins);
}

// A tenant's identity across replies: its id where the daemon sends one, else its name.
std::string Key(const json& tenant) {
  const json& id = Member(tenant, "id");
  return id.is_number() ? "#" + id.dump() : "=" + Text(tenant, "name");
}

// Each tenant's device time since `base`, in the order of `tenants`. A tenant absent from
// `base`, or whose counter went back (gmuxd restarted in between), counts from zero.
std::vector<double> DeviceTimeSince(const json& tenants, const json& base) {
  std::map<std::string, double> before;
  for (const auto& t : Array(base, "tenants")) before[Key(t)] = Num(t, "device_time_s");
  std::vector<double> out;
  for (const auto& t : tenants) {
    const double now = Num(t, "device_time_s");
    auto it = before.find(Key(t));
    const double from = it != before.end() && it->second <= now ? it->second : 0.0;
    out.push_back(now - from);
  }
  return out;
}

std::vector<std::optional<double>> SharesOf(const std::vector<double>& times) {
  double total = 0;
  for (double t : times) total += t;
  std::vector<std::optional<double>> out;
  for (double t : times) {
    out.push_back(total > 0 ? std::optional<double>(t / total) : std::nullopt);
  }
  return out;
}

// The figure `sort` orders by (larger first); names are compared separately.
double SortValue(const TopTenant& t, TopSort sort) {
  switch (sort) {
    case TopSort::kShare:
      return t.share_now.value_or(-1.0);
    case TopSort::kWeight:
      return t.weight;
    case TopSort::kQueue:
      return static_cast<double>(t.queued + t.inflight);
    case TopSort::kMemory:
      return static_cast<double>(t.memory_bytes);
    case TopSort::kDeviceTime:
      return t.device_time_s;
    case TopSort::kName:
      break;
  }
  return 0;
}

void AddDevices(const TopHistory& h, TopFrame& f) {
  static const std::vector<Column> cols = {
      {"DEV", 3},    {"POLICY", 9, true}, {"INFL/LIM", 9},  {"QUEUED", 6},   {"HELD", 5},
      {"BUSY", 7},   {"DISPATCHES", 11},  {"MEM_MiB", 10},  {"CAP_MiB", 10}, {"EXPRESS", 8}};
  const auto devices = h.Devices();
  f.header_lines.push_back(static_cast<int>(f.lines.size()));
  f.lines.push_back(Header(cols));
  if (devices.empty()) f.lines.push_back("  (no devices reported)");
  for (const auto& d : devices) {
    f.lines.push_back(Row(
        cols, {std::to_string(d.index), d.policy,
               Fmt("%llu/%llu", static_cast<unsigned long long>(d.inflight),
                   static_cast<unsigned long long>(d.inflight_limit)),
               std::to_string(d.queued), std::to_string(d.held), Percent(d.busy_now),
               std::to_string(d.dispatches), MiB(d.memory_used),
               d.memory_capacity > 0 ? MiB(d.memory_capacity) : "-",
               d.express_session ? "s" + std::to_string(*d.express_session) : "-"}));
  }
  // Oversubscribed memory (DymGPU's slots): one line under each device that has them.
  for (const auto& d : Array(h.latest(), "devices")) {
    const json& sl = Member(d, "slots");
    if (!sl.is_object()) continue;
    f.lines.push_back(Fmt("  device %d slots: %s, %llu x %s MiB; %llu evictions, %llu restores",
                          static_cast<int>(Num(d, "index")), Text(sl, "policy").c_str(),
                          static_cast<unsigned long long>(Count(sl, "slots")),
                          MiB(Count(sl, "slot_bytes")).c_str(),
                          static_cast<unsigned long long>(Count(sl, "evictions")),
                          static_cast<unsigned long long>(Count(sl, "restores"))));
  }
}

void AddTenants(const TopHistory& h, const TopView& view, TopFrame& f) {
  static const std::vector<Column> cols = {
      {"TENANT", 16, true}, {"WEIGHT", 6},   {"W.SHARE", 7}, {"SHARE", 7},
      {"WINDOW", 7},        {"DEVICE_S", 10}, {"QUEUED", 6},  {"INFL", 5},
      {"MEM_MiB", 9},       {"QUOTA", 9},     {"SESS", 4}};
  // The column each sort order shows as sorted (an index into `cols`).
  static const std::map<TopSort, size_t> kSortColumn = {
      {TopSort::kName, 0},  {TopSort::kWeight, 1}, {TopSort::kShare, 3},
      {TopSort::kDeviceTime, 5}, {TopSort::kQueue, 6}, {TopSort::kMemory, 8}};
  std::vector<size_t> begins;
  f.tenant_header = static_cast<int>(f.lines.size());
  f.header_lines.push_back(f.tenant_header);
  f.lines.push_back(Header(cols, &begins));
  const size_t c = kSortColumn.at(view.sort);
  // The title's own cells: numbers align right, so the title sits at the cell's end.
  f.sort_len = std::string_view(cols[c].title).size();
  f.sort_begin = begins[c] + (cols[c].left ? 0 : cols[c].width - f.sort_len);
  const auto tenants = h.Tenants(view.sort);
  if (tenants.empty()) f.lines.push_back("  (no tenants yet: none has connected)");
  for (const auto& t : tenants) {
    f.lines.push_back(Row(cols, {t.name, Fmt("%.2f", t.weight), Percent(t.weight_share),
                                 Percent(t.share_now), Percent(t.share_window),
                                 Fmt("%.3f", t.device_time_s), std::to_string(t.queued),
                                 std::to_string(t.inflight), MiB(t.memory_bytes),
                                 t.memory_quota > 0 ? MiB(t.memory_quota) : "-",
                                 std::to_string(t.sessions)}));
  }
}

// The device pool (BioCloud): each exclusive device, who holds it and for how long.
void AddPool(const json& stats, TopFrame& f) {
  const json& pool = Member(stats, "pool");
  if (!pool.is_object() || Array(pool, "devices").empty()) return;
  static const std::vector<Column> cols = {{"POOL", 4},       {"STATE", 9, true},
                                           {"LEASE", 6, true}, {"TENANT", 16, true},
                                           {"KIND", 8, true},  {"HELD_S", 9},
                                           {"EXPIRES_S", 9}};
  f.lines.emplace_back();
  f.header_lines.push_back(static_cast<int>(f.lines.size()));
  f.lines.push_back(Header(cols));
  for (const auto& d : Array(pool, "devices")) {
    const std::string lease = Text(d, "lease", "-");
    json held = json::object();
    for (const auto& l : Array(pool, "leases")) {
      if (Text(l, "lease", "") == lease) held = l;
    }
    f.lines.push_back(
        Row(cols, {std::to_string(static_cast<int>(Num(d, "device"))), Text(d, "state"), lease,
                   Text(d, "tenant", "-"), Text(held, "kind", "-"),
                   held.contains("held_s") ? Fmt("%.1f", Num(held, "held_s")) : "-",
                   held.contains("expires_in_s") ? Fmt("%.1f", Num(held, "expires_in_s"))
                                                 : "-"}));
  }
  std::string waiting;
  for (const auto& w : Array(pool, "waiting")) {
    waiting += (waiting.empty() ? ": " : ", ") + Text(w, "tenant");
  }
  f.lines.push_back(Fmt("pool: %zu waiting", Array(pool, "waiting").size()) + waiting +
                    Fmt("; %llu grants, %llu reclaimed",
                        static_cast<unsigned long long>(Count(pool, "grants")),
                        static_cast<unsigned long long>(Count(pool, "reclaims"))));
}

// Frame agents (vGASA): GL programs under a frame-rate SLA, with their measured FPS.
void AddFrames(const json& stats, TopFrame& f) {
  static const std::vector<Column> cols = {
      {"  TENANT", 16, true}, {"PID", 7},    {"PROGRAM", 14, true}, {"TARGET", 6},
      {"FPS", 7},             {"SLEEP_MS", 8}, {"SHARE", 6},        {"FRAMES", 9}};
  for (const auto& g : Array(Member(stats, "frames"), "groups")) {
    if (Array(g, "agents").empty()) continue;
    f.lines.emplace_back();
    f.lines.push_back("frames on '" + Text(g, "renderer") + "', SLA policy " +
                      Text(g, "policy"));
    f.header_lines.push_back(static_cast<int>(f.lines.size()));
    f.lines.push_back(Header(cols));
    for (const auto& a : Array(g, "agents")) {
      f.lines.push_back(Row(
          cols, {"  " + Text(a, "tenant"), std::to_string(static_cast<long>(Num(a, "pid"))),
                 Text(a, "program"), Fmt("%.1f", Num(a, "target_fps")),
                 Fmt("%.1f", Num(a, "fps")), Fmt("%.2f", Num(a, "sleep_ms_per_frame")),
                 Fmt("%.2f", Num(a, "share")), std::to_string(Count(a, "frames"))}));
    }
  }
}

json OrNull(const std::optional<double>& v) { return v ? json(*v) : json(nullptr); }

}  // namespace

std::string_view TopSortName(TopSort sort) {
  for (const auto& [s, name] : kSortNames) {
    if (s == sort) return name;
  }
  return "?";
}

std::optional<TopSort> ParseTopSort(std::string_view name) {
  for (const auto& [s, n] : kSortNames) {
    if (n == name) return s;
  }
  return std::nullopt;
}

TopSort CycleTopSort(TopSort sort, int step) {
  const int n = static_cast<int>(kSortNames.size());
  int i = 0;
  while (i < n && kSortNames[static_cast<size_t>(i)].first != sort) ++i;
  return kSortNames[static_cast<size_t>(((i + step) % n + n) % n)].first;
}

void TopHistory::Add(double t_s, json stats) {
  if (!stats.is_object()) stats = json::object();
  samples_.push_back({t_s, std::move(stats)});
  // Keep the newest sample at or before the window's start: the window's differences start
  // there, so the window is covered whole once the history is long enough.
  while (samples_.size() > 2 && samples_[1].t_s <= t_s - window_s_) samples_.pop_front();
}

const json& TopHistory::latest() const {
  static const json kEmpty = json::object();
  return samples_.empty() ? kEmpty : samples_.back().stats;
}

double TopHistory::interval_s() const {
  return samples_.size() < 2 ? 0.0 : samples_.back().t_s - samples_[samples_.size() - 2].t_s;
}

double TopHistory::window_span_s() const {
  return samples_.size() < 2 ? 0.0 : samples_.back().t_s - samples_.front().t_s;
}

std::vector<TopTenant> TopHistory::Tenants(TopSort sort) const {
  const json& tenants = Array(latest(), "tenants");
  std::vector<std::optional<double>> now(tenants.size()), window(tenants.size());
  if (samples_.size() >= 2) {
    now = SharesOf(DeviceTimeSince(tenants, samples_[samples_.size() - 2].stats));
    window = SharesOf(DeviceTimeSince(tenants, samples_.front().stats));
  }
  std::vector<TopTenant> out;
  double busy_weight = 0;
  for (size_t i = 0; i < tenants.size(); ++i) {
    const json& t = tenants[i];
    TopTenant r;
    r.name = Text(t, "name");
    r.weight = Num(t, "weight");
    r.share_now = now[i];
    r.share_window = window[i];
    r.device_time_s = Num(t, "device_time_s");
    r.queued = Count(t, "pending_commands");
    r.inflight = Count(t, "inflight");
    r.sessions = Count(t, "sessions");
    for (const auto& m : Array(t, "memory")) {
      r.memory_bytes += Count(m, "used");
      r.memory_quota = std::max(r.memory_quota, Count(m, "quota"));
    }
    // Busy: it competed for the device over the window, so a weighted policy owes it a part.
    if (r.share_window.value_or(0) > 0 || r.queued > 0 || r.inflight > 0) {
      r.weight_share = r.weight;
      busy_weight += r.weight;
    }
    out.push_back(std::move(r));
  }
  for (auto& r : out) {
    if (!r.weight_share) continue;
    r.weight_share = busy_weight > 0 ? std::optional<double>(*r.weight_share / busy_weight)
                                     : std::nullopt;
  }
  std::stable_sort(out.begin(), out.end(), [sort](const TopTenant& a, const TopTenant& b) {
    if (sort != TopSort::kName) {
      const double va = SortValue(a, sort), vb = SortValue(b, sort);
      if (va != vb) return va > vb;
    }
    return a.name < b.name;
  });
  return out;
}

std::vector<TopDevice> TopHistory::Devices() const {
  std::map<int, double> busy_before;
  const double dt = interval_s();
  if (samples_.size() >= 2) {
    for (const auto& d : Array(samples_[samples_.size() - 2].stats, "devices")) {
      busy_before[static_cast<int>(Num(d, "index"))] = Num(d, "busy_s");
    }
  }
  std::vector<TopDevice> out;
  for (const auto& d : Array(latest(), "devices")) {
    TopDevice r;
    r.index = static_cast<int>(Num(d, "index"));
    r.policy = Text(d, "policy");
    r.inflight = Count(d, "inflight");
    r.inflight_limit = Count(latest(), "inflight_per_device");
    r.queued = Count(d, "queued_commands");
    r.held = Count(d, "held_commands");
    r.dispatches = Count(d, "dispatches");
    r.memory_used = Count(d, "memory_used");
    r.memory_capacity = Count(d, "memory_capacity");
    const json& express = Member(d, "express_session");
    if (express.is_number()) r.express_session = Count(d, "express_session");
    auto it = busy_before.find(r.index);
    if (dt > 0 && it != busy_before.end()) {
      r.busy_now = std::max(0.0, Num(d, "busy_s") - it->second) / dt;
    }
    out.push_back(std::move(r));
  }
  return out;
}

TopFrame RenderTopFrame(const TopHistory& h, const TopView& view) {
  TopFrame f;
  const json& s = h.latest();
  std::string title = "gmux top: gmuxd at " + view.daemon;
  if (!view.clock.empty()) title += "  " + view.clock;
  title += Fmt("  (every %.1f s, window %.0f s, sort: ", view.refresh_s, h.window_s()) +
           std::string(TopSortName(view.sort)) + ")";
  f.lines.push_back(title);
  if (!view.error.empty()) {
    f.error_line = static_cast<int>(f.lines.size());
    f.lines.push_back("gmuxd not reachable: " + view.error +
                      Fmt(" (retrying every %.1f s)", view.refresh_s));
    return f;
  }
  const json& sch = Member(s, "scheduler");
  f.lines.push_back(Fmt("tenants: %zu, %llu active; commands outstanding: %llu; worker deaths: "
                        "%llu; scheduler: %.0f ns per dispatch",
                        Array(s, "tenants").size(),
                        static_cast<unsigned long long>(Count(s, "active_tenants")),
                        static_cast<unsigned long long>(Count(s, "outstanding_commands")),
                        static_cast<unsigned long long>(Count(s, "worker_deaths")),
                        Num(sch, "ns_per_dispatch")));
  if (view.paused) {
    f.lines.push_back("PAUSED: the figures stay as they were; p resumes");
  } else if (h.interval_s() <= 0) {
    f.lines.push_back("shares of device time: after the next refresh");
  } else {
    std::string of;
    if (h.window_span_s() < h.window_s() - 1e-6) of = Fmt(" (of %.0f s)", h.window_s());
    f.lines.push_back(Fmt("shares of device time: SHARE over the last %.1f s, WINDOW over the "
                          "last %.1f s",
                          h.interval_s(), h.window_span_s()) +
                      of);
  }
  f.lines.emplace_back();
  AddDevices(h, f);
  f.lines.emplace_back();
  AddTenants(h, view, f);
  AddPool(s, f);
  AddFrames(s, f);
  return f;
}

json TopJson(const TopHistory& h, TopSort sort) {
  json devices = json::array(), tenants = json::array();
  for (const auto& d : h.Devices()) {
    devices.push_back({{"index", d.index},
                       {"policy", d.policy},
                       {"inflight", d.inflight},
                       {"inflight_limit", d.inflight_limit},
                       {"queued", d.queued},
                       {"held", d.held},
                       {"dispatches", d.dispatches},
                       {"busy_now", OrNull(d.busy_now)},
                       {"memory_used", d.memory_used},
                       {"memory_capacity", d.memory_capacity},
                       {"express_session", d.express_session ? json(*d.express_session)
                                                             : json(nullptr)}});
  }
  for (const auto& t : h.Tenants(sort)) {
    tenants.push_back({{"name", t.name},
                       {"weight", t.weight},
                       {"weight_share", OrNull(t.weight_share)},
                       {"share_now", OrNull(t.share_now)},
                       {"share_window", OrNull(t.share_window)},
                       {"device_time_s", t.device_time_s},
                       {"queued", t.queued},
                       {"inflight", t.inflight},
                       {"sessions", t.sessions},
                       {"memory_bytes", t.memory_bytes},
                       {"memory_quota", t.memory_quota}});
  }
  json out = {{"interval_s", h.interval_s()},
              {"window_s", h.window_s()},
              {"window_span_s", h.window_span_s()},
              {"sort", std::string(TopSortName(sort))},
              {"devices", std::move(devices)},
              {"tenants", std::move(tenants)}};
  for (const char* key : {"pool", "frames"}) {
    if (Member(h.latest(), key).is_object()) out[key] = h.latest()[key];
  }
  return out;
}

std::vector<std::string> TopHelpLines() {
  return {
      "gmux top: keys",
      "",
      "  q        quit (also Ctrl-C)",
      "  s / S    sort the tenants by the next / previous column:",
      "           name, share, weight, queue, memory, time",
      "  p        pause: keep the figures on screen; p again resumes",
      "  h / ?    this help; any key returns",
      "  Ctrl-L   redraw the screen",
      "",
      "Tenants' columns",
      "  WEIGHT    the configured weight",
      "  W.SHARE   its weight over the weights of the busy tenants (used the device in the",
      "            window, or have commands queued or in flight): what a weighted policy",
      "            aims to give it; - when it is not busy",
      "  SHARE     its part of all tenants' device time over the last refresh interval",
      "  WINDOW    the same over the window (--window, 10 s by default)",
      "  DEVICE_S  device time since gmuxd started (profiled START->END of its dispatches)",
      "  QUEUED    commands waiting in the policies;  INFL: commands on a device",
      "  MEM_MiB   device memory it holds now;  QUOTA: its quota per device;  SESS: sessions",
      "",
      "Devices' columns",
      "  INFL/LIM  commands in flight and the limit (inflight_per_device);  QUEUED, HELD",
      "  BUSY      device time of completed dispatches per second over the last interval",
      "            (above 100% when several commands run at once)",
      "",
      "A tenant that is not root or an admin sees only its own row.",
      "",
      "Press any key to return.",
  };
}

}  // namespace gmux::cli
