#include "daemon/kernel_scan.h"

#include <array>
#include <cctype>

namespace gmux::daemon {

namespace {

constexpr std::array<std::string_view, 5> kForbidden = {
    "get_group_id", "get_num_groups", "get_global_size", "get_global_offset",
    "get_global_linear_id"};

bool IdentChar(char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_'; }

struct Offences {
  std::string construct;  // a construct no rewrite can see through ("" when none)
  std::string builtin;    // the first forbidden builtin ("" when none)
  bool groups = false;    // get_group_id or get_num_groups: the values depend on the local size
};

// Finds the forbidden identifiers and constructs in OpenCL C source.
Offences Scan(std::string_view s) {
  Offences o;
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
      if (i + 1 < n && s[i + 1] == '#') {
        o.construct = "the token-pasting operator ##";
        return o;
      }
      if (line_start) {
        size_t j = i + 1;
        while (j < n && (s[j] == ' ' || s[j] == '\t')) ++j;
        if (s.substr(j, 7) == "include") {
          o.construct = "#include";
          return o;
        }
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
        if (tok != f) continue;
        if (o.builtin.empty()) o.builtin = std::string(f);
        if (f == "get_group_id" || f == "get_num_groups") o.groups = true;
      }
      // The prelude's own names: a program that uses them is not rewritten.
      if (tok.substr(0, 7) == "__gmux_" || tok.substr(0, 7) == "__GMUX_") {
        o.construct = "the reserved name " + std::string(tok);
        return o;
      }
      i = j;
      continue;
    }
    ++i;
  }
  return o;
}

}  // namespace

SplitVerdict ScanForSplit(std::string_view source, std::string_view build_options) {
  SplitVerdict v;
  Offences o = Scan(source);
  if (!o.construct.empty()) {
    v.reason = "source uses " + o.construct;
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
  if (!o.builtin.empty()) {
    v.reason = "source uses " + o.builtin;
    v.restorable = true;
    v.uses_groups = o.groups;
    return v;
  }
  v.splittable = true;
  return v;
}

std::string RestoringSource(std::string_view source) {
  // Plain functions (not static inline: OpenCL C 1.1 has no static functions), defined before
  // the macros so that they call the real builtins. The launch's own work-group geometry is
  // uniform under splitting (splitter.h), so get_local_size is the enqueued size. Dimensions
  // past work_dim are the same in a chunk as in the whole launch: the backend answers those
  // (PoCL answers 0 for index 3 where the spec says 1, and a variant must not differ).
  std::string out = R"(size_t __gmux_global_size(uint d) {
  if (d >= get_work_dim()) return get_global_size(d);
  return d == 0 ? (size_t)__GMUX_GS0 : d == 1 ? (size_t)__GMUX_GS1 : (size_t)__GMUX_GS2;
}
size_t __gmux_global_offset(uint d) {
  if (d >= get_work_dim()) return get_global_offset(d);
  return d == 0 ? (size_t)__GMUX_GO0 : d == 1 ? (size_t)__GMUX_GO1 : (size_t)__GMUX_GO2;
}
size_t __gmux_group_id(uint d) {
  if (d >= get_work_dim()) return get_group_id(d);
  return (get_global_id(d) - get_local_id(d) - __gmux_global_offset(d)) / get_local_size(d);
}
size_t __gmux_num_groups(uint d) {
  if (d >= get_work_dim()) return get_num_groups(d);
  return __gmux_global_size(d) / get_local_size(d);
}
size_t __gmux_global_linear_id(void) {
  size_t id = 0;
  for (uint d = get_work_dim(); d-- > 0;) {
    id = id * __gmux_global_size(d) + (get_global_id(d) - __gmux_global_offset(d));
  }
  return id;
}
#define get_global_size(d) __gmux_global_size(d)
#define get_global_offset(d) __gmux_global_offset(d)
#define get_group_id(d) __gmux_group_id(d)
#define get_num_groups(d) __gmux_num_groups(d)
#define get_global_linear_id() __gmux_global_linear_id()
#line 1
)";
  out.append(source);
  return out;
}

std::string RestoringOptions(uint32_t dim, const std::array<size_t, 3>& global,
                             const std::array<size_t, 3>& offset) {
  std::string o;
  for (uint32_t d = 0; d < 3; ++d) {
    size_t gs = d < dim ? global[d] : 1, go = d < dim ? offset[d] : 0;
    o += " -D__GMUX_GS" + std::to_string(d) + "=" + std::to_string(gs) + "UL";
    o += " -D__GMUX_GO" + std::to_string(d) + "=" + std::to_string(go) + "UL";
  }
  return o;
}

}  // namespace gmux::daemon
