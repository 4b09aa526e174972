#include "daemon/kernel_scan.h"

#include <array>
#include <cctype>

namespace gmux::daemon {

namespace {

constexpr std::array<std::string_view, 5> kForbidden = {
    "get_group_id", "get_num_groups", "get_global_size", "get_global_offset",
    "get_global_linear_id"};

bool IdentChar(char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_'; }

// Finds a forbidden identifier or construct in OpenCL C source; "" when there is none.
std::string FirstOffence(std::string_view s) {
  size_t i = 0;
  const size_t n = s.size();
  bool line_start = true;  // only whitespace since the last newline
  while (i < n) {
    char c = s[i];
    if (c == '/' && i + 1 < n && s[i + 1] == '/') {
      while (i < n && s[i] != '\n') ++i;
      continue;
    }
    if (c == '/' && i + 1 < n && s[i + 1] == '*') {
      size_t end = s.find("*/", i + 2);
      i = end == std::string_view::npos ? n : end + 2;
      continue;
    }
    if (c == '"' || c == '\'') {
      ++i;
      while (i < n && s[i] != c) i += (s[i] == '\\') ? 2 : 1;
      ++i;
      line_start = false;
      continue;
    }
    if (c == '\n') {
      line_start = true;
      ++i;
      continue;
    }
    if (c == '#') {
      if (i + 1 < n && s[i + 1] == '#') return "the token-pasting operator ##";
      if (line_start) {
        size_t j = i + 1;
        while (j < n && (s[j] == ' ' || s[j] == '\t')) ++j;
        if (s.substr(j, 7) == "include") return "#include";
      }
      ++i;
      continue;
    }
    if (c != ' ' && c != '\t' && c != '\r') line_start = false;
    if (IdentChar(c)) {
      size_t j = i;
      while (j < n && IdentChar(s[j])) ++j;
      std::string_view tok = s.substr(i, j - i);
      for (std::string_view f : kForbidden) {
        if (tok == f) return std::string(f);
      }
      i = j;
      continue;
    }
    ++i;
  }
  return "";
}

}  // namespace

SplitVerdict ScanForSplit(std::string_view source, std::string_view build_options) {
  SplitVerdict v;
  std::string bad = FirstOffence(source);
  if (!bad.empty()) {
    v.reason = "source uses " + bad;
    return v;
  }
  // Options can define macros (-D NAME=get_group_id) or add include paths (-I, -include).
  for (std::string_view f : kForbidden) {
    if (build_options.find(f) != std::string_view::npos) {
      v.reason = "build options name " + std::string(f);
      return v;
    }
  }
  if (build_options.find("-I") != std::string_view::npos ||
      build_options.find("-include") != std::string_view::npos) {
    v.reason = "build options add include files";
    return v;
  }
  v.splittable = true;
  return v;
}

}  // namespace gmux::daemon
