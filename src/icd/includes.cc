#include "icd/includes.h"

#include <cctype>
#include <deque>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <utility>

namespace gmux::icd {

namespace {

// Options split as a shell would split them for the compiler: whitespace separates, double
// quotes group.
std::vector<std::string> Tokens(const std::string& s) {
  std::vector<std::string> out;
  std::string cur;
  bool in = false, quoted = false;
  for (char c : s) {
    if (c == '"') {
      quoted = !quoted;
      in = true;
      continue;
    }
    if (!quoted && std::isspace(static_cast<unsigned char>(c))) {
      if (in) out.push_back(std::move(cur));
      cur.clear();
      in = false;
      continue;
    }
    cur += c;
    in = true;
  }
  if (in) out.push_back(std::move(cur));
  return out;
}

std::string Quote(const std::string& t) {
  bool plain = !t.empty();
  for (char c : t) {
    if (std::isspace(static_cast<unsigned char>(c)) || c == '"') plain = false;
  }
  return plain ? t : "\"" + t + "\"";
}

// Regular files only: a directory, FIFO or device under an -I directory is not a header.
bool ReadFile(const std::string& path, std::string& out) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return false;
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  std::ostringstream ss;
  ss << f.rdbuf();
  if (!f.good() && !f.eof()) return false;
  out = ss.str();
  return true;
}

std::string DirOf(const std::string& rel) {
  size_t slash = rel.rfind('/');
  return slash == std::string::npos ? "" : rel.substr(0, slash + 1);
}

}  // namespace

std::string NormalizeRelative(const std::string& name) {
  if (name.empty() || name[0] == '/') return "";
  std::vector<std::string> parts;
  std::string part;
  std::istringstream in(name);
  while (std::getline(in, part, '/')) {
    if (part.empty() || part == ".") continue;
    if (part == "..") {
      if (parts.empty()) return "";
      parts.pop_back();
      continue;
    }
    parts.push_back(part);
  }
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "" : "/") + p;
  return out;
}

std::vector<std::string> IncludeNames(const std::string& source) {
  std::vector<std::string> out;
  size_t i = 0;
  const size_t n = source.size();
  while (i < n) {
    size_t end = source.find('\n', i);
    if (end == std::string::npos) end = n;
    size_t p = i;
    auto skip_space = [&] {
      while (p < end && (source[p] == ' ' || source[p] == '\t')) ++p;
    };
    skip_space();
    if (p < end && source[p] == '#') {
      ++p;
      skip_space();
      if (source.compare(p, 7, "include") == 0) {
        p += 7;
        skip_space();
        if (p < end && (source[p] == '"' || source[p] == '<')) {
          const char close = source[p] == '"' ? '"' : '>';
          size_t q = source.find(close, p + 1);
          if (q != std::string::npos && q < end && q > p + 1) {
            out.push_back(source[p] + source.substr(p + 1, q - p - 1));
          }
        }
      }
    }
    i = end + 1;
  }
  return out;
}

IncludeSet CollectIncludes(const std::string& options, const std::vector<std::string>& sources) {
  IncludeSet set;
  std::vector<std::string> dirs;
  std::string rest;
  const std::vector<std::string> toks = Tokens(options);
  for (size_t i = 0; i < toks.size(); ++i) {
    const std::string& t = toks[i];
    if (t == "-I" && i + 1 < toks.size()) {
      dirs.push_back(toks[++i]);
    } else if (t.size() > 2 && t.compare(0, 2, "-I") == 0) {
      dirs.push_back(t.substr(2));
    } else {
      rest += (rest.empty() ? "" : " ") + Quote(t);
    }
  }
  if (dirs.empty()) {
    set.options = options;  // untouched: nothing to resolve
    return set;
  }
  set.options = rest;
  set.dirs = static_cast<uint32_t>(dirs.size());

  // Breadth-first over the include graph. A file is known by (dir, normalized name).
  std::set<std::pair<uint32_t, std::string>> seen;
  struct Pending {
    std::string text;
    int dir = -1;          // where the including file lives (-1: the program's source)
    std::string base;      // its directory below that root
  };
  std::deque<Pending> work;
  for (const auto& s : sources) work.push_back({s, -1, ""});
  size_t bytes = 0;
  while (!work.empty()) {
    Pending cur = std::move(work.front());
    work.pop_front();
    for (const std::string& inc : IncludeNames(cur.text)) {
      const bool quoted = inc[0] == '"';
      const std::string name = inc.substr(1);
      // Candidates in the compiler's order: beside the including file (quoted includes), then
      // each -I directory.
      std::vector<std::pair<uint32_t, std::string>> candidates;
      if (quoted && cur.dir >= 0) {
        candidates.emplace_back(static_cast<uint32_t>(cur.dir), cur.base + name);
      }
      for (uint32_t d = 0; d < dirs.size(); ++d) candidates.emplace_back(d, name);
      for (auto& [d, rel] : candidates) {
        std::string norm = NormalizeRelative(rel);
        if (norm.empty()) continue;
        if (seen.count({d, norm}) != 0) break;  // found here before: the compiler stops here too
        std::string data;
        if (!ReadFile(dirs[d] + "/" + norm, data)) continue;
        if (set.files.size() >= kMaxIncludeFiles || bytes + data.size() > kMaxIncludeBytes) {
          break;  // the build will say what it could not find
        }
        seen.insert({d, norm});
        bytes += data.size();
        work.push_back({data, static_cast<int>(d), DirOf(norm)});
        set.files.push_back({d, norm, std::move(data)});
        break;
      }
    }
  }
  return set;
}

}  // namespace gmux::icd
