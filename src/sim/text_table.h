// TextTable: aligned plain-text tables for the human-readable output of `gmux sim run` and
// `gmux demo`. Numbers are formatted by the caller (Fixed() helps) so each column controls its
// own precision.
#pragma once

#include <string>
#include <vector>

namespace gmux::sim {

class TextTable {
 public:
  explicit TextTable(std::vector<std::string> header) : header_(std::move(header)) {}

  // Precondition: row.size() == header size.
  void AddRow(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  // A horizontal rule before the next row (e.g. between runs).
  void AddRule() { rules_.push_back(rows_.size()); }

  // Columns padded to their widest cell; text left-aligned, cells that look numeric right-aligned.
  std::string Render() const;

 private:
  std::vector<std::string> header_;
  std::vector<std::vector<std::string>> rows_;
  std::vector<size_t> rules_;
};

// `value` with `digits` digits after the point ("12.35").
std::string Fixed(double value, int digits);

}  // namespace gmux::sim
