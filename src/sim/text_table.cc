#include "sim/text_table.h"

#include <algorithm>
#include <cassert>
#include <cstdio>

namespace gmux::sim {
namespace {

bool LooksNumeric(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || c == '.' || c == '-' || c == '+' || c == '%' || c == 'e')) {
      return false;
    }
  }
  return true;
}

}  // namespace

std::string TextTable::Render() const {
  std::vector<size_t> width(header_.size(), 0);
  for (size_t c = 0; c < header_.size(); ++c) width[c] = header_[c].size();
  for (const auto& row : rows_) {
    assert(row.size() == header_.size());
    for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  }
  auto line = [&](const std::vector<std::string>& cells, std::string& out) {
    for (size_t c = 0; c < cells.size(); ++c) {
      size_t pad = width[c] - cells[c].size();
      if (c > 0) out += "  ";
      if (LooksNumeric(cells[c])) out.append(pad, ' ');
      out += cells[c];
      if (!LooksNumeric(cells[c]) && c + 1 < cells.size()) out.append(pad, ' ');
    }
    out += '\n';
  };
  size_t total = 0;
  for (size_t w : width) total += w;
  total += 2 * (width.empty() ? 0 : width.size() - 1);
  std::string out;
  line(header_, out);
  out.append(total, '-');
  out += '\n';
  for (size_t r = 0; r < rows_.size(); ++r) {
    if (r > 0 && std::find(rules_.begin(), rules_.end(), r) != rules_.end()) {
      out.append(total, '-');
      out += '\n';
    }
    line(rows_[r], out);
  }
  return out;
}

std::string Fixed(double value, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, value);
  return buf;
}

}  // namespace gmux::sim
