#include "slurm_gres.h"

#include <utility>
#include <vector>

namespace gmux::cli {
namespace {

// "name[:type]:count[(...)]" → name and count (0 when the count is not a number).
std::pair<std::string, uint64_t> GresItem(std::string_view item) {
  const size_t paren = item.find('(');
  if (paren != std::string_view::npos) item = item.substr(0, paren);
  const size_t first = item.find(':');
  if (first == std::string_view::npos) return {std::string(item), 1};  // "gpu" alone is one
  const std::string name(item.substr(0, first));
  const std::string count(item.substr(item.rfind(':') + 1));
  if (count.empty() || count.find_first_not_of("0123456789") != std::string::npos ||
      count.size() > 12) {
    return {name, 0};
  }
  return {name, std::stoull(count)};
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
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i <= list.size(); ++i) {
    const char c = i < list.size() ? list[i] : ',';
    if (c == '(') ++depth;
    if (c == ')') --depth;
    if (c != ',' || depth > 0) continue;
    const auto [name, count] = GresItem(list.substr(start, i - start));
    if (name == "gpu") g.gpus += count;
    if (name == "shard") g.shards += count;
    start = i + 1;
  }
  return g;
}

SlurmGres ParseJobGres(std::string_view scontrol_job, const std::string& node) {
  std::vector<std::string> per_node;
  std::string mine, job_gres;
  for (std::string_view line : Lines(scontrol_job)) {
    if (line.rfind("JOB_GRES=", 0) == 0) job_gres = Field(line, "JOB_GRES=");
    if (line.rfind("Nodes=", 0) == 0 && line.find(" GRES=") != std::string_view::npos) {
      per_node.push_back(Field(line, "GRES="));
      if (Field(line, "Nodes=") == node) mine = per_node.back();
    }
  }
  if (!mine.empty()) return ParseGresList(mine);
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
