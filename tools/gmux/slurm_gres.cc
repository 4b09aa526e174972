#include "slurm_gres.h"

#include <optional>
#include <utility>
#include <vector>

namespace gmux::cli {
namespace {

// A decimal of at most `max_digits` digits and nothing else; nullopt otherwise.
std::optional<uint64_t> Decimal(std::string_view s, size_t max_digits) {
  if (s.empty() || s.size() > max_digits ||
      s.find_first_not_of("0123456789") != std::string_view::npos) {
    return std::nullopt;
  }
  return std::stoull(std::string(s));
}

// The items of a comma-separated list, not splitting inside open...close (Slurm's "(IDX:0,1)"
// after a GRES, "[01-04,07]" in a node list).
std::vector<std::string_view> TopLevelItems(std::string_view list, char open, char close) {
  std::vector<std::string_view> items;
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i <= list.size(); ++i) {
    const char c = i < list.size() ? list[i] : ',';
    if (c == open) ++depth;
    if (c == close) --depth;
    if (c != ',' || depth > 0) continue;
    items.push_back(list.substr(start, i - start));
    start = i + 1;
  }
  return items;
}

// "name[:type]:count[(...)]" → name and count (0 when the count is not a number).
std::pair<std::string, uint64_t> GresItem(std::string_view item) {
  const size_t paren = item.find('(');
  if (paren != std::string_view::npos) item = item.substr(0, paren);
  const size_t first = item.find(':');
  if (first == std::string_view::npos) return {std::string(item), 1};  // "gpu" alone is one
  return {std::string(item.substr(0, first)),
          Decimal(item.substr(item.rfind(':') + 1), 12).value_or(0)};
}

// The value of `key=` on `line` up to the next space ("" when absent).
std::string Field(std::string_view line, std::string_view key) {
  size_t at = 0;
  while ((at = line.find(key, at)) != std::string_view::npos) {
    if (at == 0 || line[at - 1] == ' ') {
      const size_t from = at + key.size();
      const size_t end = line.find(' ', from);
      return std::string(line.substr(from, end == std::string_view::npos ? end : end - from));
    }
    at += key.size();
  }
  return "";
}

std::vector<std::string_view> Lines(std::string_view text) {
  std::vector<std::string_view> out;
  size_t at = 0;
  while (at < text.size()) {
    size_t nl = text.find('\n', at);
    if (nl == std::string_view::npos) nl = text.size();
    std::string_view line = text.substr(at, nl - at);
    while (!line.empty() && line.front() == ' ') line.remove_prefix(1);
    out.push_back(line);
    at = nl + 1;
  }
  return out;
}

}  // namespace

SlurmGres ParseGresList(std::string_view list) {
  SlurmGres g;
  if (list == "(null)") return g;
  for (std::string_view item : TopLevelItems(list, '(', ')')) {
    const auto [name, count] = GresItem(item);
    if (name == "gpu") g.gpus += count;
    if (name == "shard") g.shards += count;
  }
  return g;
}

bool InHostlist(std::string_view list, std::string_view node) {
  for (std::string_view item : TopLevelItems(list, '[', ']')) {
    const size_t open = item.find('['), close = item.find(']');
    if (open == std::string_view::npos || close == std::string_view::npos || close < open) {
      if (item == node) return true;
      continue;
    }
    // prefix[ranges]suffix, ranges "01-04,07": one bracket group, as Slurm prints a node list.
    const std::string_view prefix = item.substr(0, open), suffix = item.substr(close + 1);
    if (node.size() <= prefix.size() + suffix.size() || node.substr(0, prefix.size()) != prefix ||
        node.substr(node.size() - suffix.size()) != suffix) {
      continue;
    }
    const std::string_view digits =
        node.substr(prefix.size(), node.size() - prefix.size() - suffix.size());
    const std::optional<uint64_t> n = Decimal(digits, 9);
    if (!n) continue;
    for (std::string_view r : TopLevelItems(item.substr(open + 1, close - open - 1), '[', ']')) {
      const size_t dash = r.find('-');
      const std::string_view lo = r.substr(0, dash);
      const std::string_view hi = dash == std::string_view::npos ? lo : r.substr(dash + 1);
      const std::optional<uint64_t> from = Decimal(lo, 9), to = Decimal(hi, 9);
      if (!from || !to) continue;
      // Zero-padded ranges name zero-padded nodes ("n[01-04]" is n01..n04, not n1).
      if (lo.size() > 1 && lo[0] == '0' && digits.size() != lo.size()) continue;
      if (*n >= *from && *n <= *to) return true;
    }
  }
  return false;
}

SlurmGres ParseJobGres(std::string_view scontrol_job, const std::string& node) {
  std::vector<std::string> per_node;
  std::optional<std::string> mine;
  std::string job_gres;
  for (std::string_view line : Lines(scontrol_job)) {
    if (line.rfind("JOB_GRES=", 0) == 0) job_gres = Field(line, "JOB_GRES=");
    if (line.rfind("Nodes=", 0) == 0 && line.find(" GRES=") != std::string_view::npos) {
      per_node.push_back(Field(line, "GRES="));
      if (InHostlist(Field(line, "Nodes="), node)) mine = per_node.back();
    }
  }
  if (mine) return ParseGresList(*mine);  // this node's (perhaps none)
  if (per_node.size() == 1) return ParseGresList(per_node[0]);
  return ParseGresList(job_gres);
}

SlurmGres ParseNodeGres(std::string_view scontrol_node) {
  for (std::string_view line : Lines(scontrol_node)) {
    const std::string g = Field(line, "Gres=");
    if (!g.empty()) return ParseGresList(g);
  }
  return {};
}

}  // namespace gmux::cli
