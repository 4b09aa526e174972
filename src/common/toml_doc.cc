#include "common/toml_doc.h"

#include <cctype>
#include <cstdlib>

#include <fstream>
#include <sstream>

namespace gmux {
namespace {

std::string Join(std::span<const std::string_view> xs) {
  std::string out;
  for (auto x : xs) {
    if (!out.empty()) out += ", ";
    out += x;
  }
  return out;
}

}  // namespace

Result<TomlDoc> TomlDoc::Load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound("cannot open scenario file '" + path + "'");
  std::stringstream buf;
  buf << in.rdbuf();
  return Parse(buf.str(), path);
}

Result<TomlDoc> TomlDoc::Parse(std::string_view text, const std::string& path) {
  TomlDoc doc;
  doc.path_ = path;
  try {
    doc.root_ = toml::parse(text, path);
  } catch (const toml::parse_error& e) {
    std::ostringstream m;
    m << path << ":" << e.source().begin.line << ":" << e.source().begin.column << ": "
      << e.description();
    return InvalidArgument(m.str());
  }
  return doc;
}

Status TomlDoc::Error(const toml::node* node, std::string_view key,
                          std::string_view message) const {
  std::ostringstream m;
  m << path_;
  if (node != nullptr && node->source().begin.line > 0) m << ":" << node->source().begin.line;
  m << ": key '" << key << "': " << message;
  return InvalidArgument(m.str());
}

Result<double> TomlDoc::Number(const toml::table& t, std::string_view key,
                                   std::optional<double> fallback, double min, double max) const {
  const toml::node* n = t.get(key);
  if (n == nullptr) {
    if (fallback) return *fallback;
    return Error(&t, key, "is required");
  }
  std::optional<double> v = n->value<double>();  // accepts integers too
  if (!v || !(n->is_integer() || n->is_floating_point())) return Error(n, key, "expected a number");
  if (*v < min || *v > max) {
    std::ostringstream m;
    m << "value " << *v << " is outside [" << min << ", " << max << "]";
    return Error(n, key, m.str());
  }
  return *v;
}

Result<int64_t> TomlDoc::Integer(const toml::table& t, std::string_view key,
                                     std::optional<int64_t> fallback, int64_t min,
                                     int64_t max) const {
  const toml::node* n = t.get(key);
  if (n == nullptr) {
    if (fallback) return *fallback;
    return Error(&t, key, "is required");
  }
  if (!n->is_integer()) return Error(n, key, "expected an integer");
  int64_t v = *n->value<int64_t>();
  if (v < min || v > max) {
    std::ostringstream m;
    m << "value " << v << " is outside [" << min << ", " << max << "]";
    return Error(n, key, m.str());
  }
  return v;
}

Result<uint64_t> TomlDoc::Bytes(const toml::table& t, std::string_view key,
                                std::optional<uint64_t> fallback) const {
  const toml::node* n = t.get(key);
  if (n == nullptr) {
    if (fallback) return *fallback;
    return Error(&t, key, "is required");
  }
  if (n->is_integer()) {
    int64_t v = *n->value<int64_t>();
    if (v < 0) return Error(n, key, "a size cannot be negative");
    return static_cast<uint64_t>(v);
  }
  if (!n->is_string()) return Error(n, key, "expected a size: bytes, or a string such as \"2GiB\"");
  const std::string text = *n->value<std::string>();
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  const std::string number = text.substr(0, i);
  while (i < text.size() && text[i] == ' ') ++i;
  const std::string unit = text.substr(i);
  static const std::pair<const char*, double> kUnits[] = {
      {"", 1},          {"B", 1},         {"K", 1024.0},    {"KiB", 1024.0}, {"KB", 1e3},
      {"M", 1048576.0}, {"MiB", 1048576.0}, {"MB", 1e6},   {"G", 1073741824.0},
      {"GiB", 1073741824.0}, {"GB", 1e9}, {"T", 1099511627776.0}, {"TiB", 1099511627776.0},
      {"TB", 1e12}};
  double scale = 0;
  for (const auto& [name, f] : kUnits) {
    if (unit == name) scale = f;
  }
  char* end = nullptr;
  const double value = number.empty() ? -1 : std::strtod(number.c_str(), &end);
  if (scale == 0 || value < 0 || end != number.c_str() + number.size()) {
    return Error(n, key, "'" + text + "' is not a size (for example 1048576, \"512MiB\", \"2GiB\")");
  }
  const double bytes = value * scale;
  if (bytes >= 1.8e19) return Error(n, key, "'" + text + "' is too large");
  return static_cast<uint64_t>(bytes + 0.5);
}

Result<bool> TomlDoc::Bool(const toml::table& t, std::string_view key,
                               std::optional<bool> fallback) const {
  const toml::node* n = t.get(key);
  if (n == nullptr) {
    if (fallback) return *fallback;
    return Error(&t, key, "is required");
  }
  if (!n->is_boolean()) return Error(n, key, "expected true or false");
  return *n->value<bool>();
}

Result<std::string> TomlDoc::String(const toml::table& t, std::string_view key,
                                        std::optional<std::string> fallback) const {
  const toml::node* n = t.get(key);
  if (n == nullptr) {
    if (fallback) return *fallback;
    return Error(&t, key, "is required");
  }
  if (!n->is_string()) return Error(n, key, "expected a string");
  return std::string(*n->value<std::string_view>());
}

Result<std::string> TomlDoc::Choice(const toml::table& t, std::string_view key,
                                        std::optional<std::string> fallback,
                                        std::initializer_list<std::string_view> choices) const {
  auto s = String(t, key, std::move(fallback));
  if (!s.ok()) return s.status();
  for (auto c : choices) {
    if (c == *s) return s;
  }
  return Error(t.get(key), key,
               "'" + *s + "' is not one of: " +
                   Join(std::span<const std::string_view>(choices.begin(), choices.size())));
}

Result<std::vector<std::string>> TomlDoc::Strings(
    const toml::table& t, std::string_view key,
    std::optional<std::vector<std::string>> fallback) const {
  const toml::node* n = t.get(key);
  if (n == nullptr) {
    if (fallback) return *fallback;
    return Error(&t, key, "is required");
  }
  std::vector<std::string> out;
  if (n->is_string()) {
    out.emplace_back(*n->value<std::string_view>());
    return out;
  }
  const toml::array* a = n->as_array();
  if (a == nullptr) return Error(n, key, "expected a string or an array of strings");
  for (const toml::node& e : *a) {
    if (!e.is_string()) return Error(&e, key, "expected an array of strings");
    out.emplace_back(*e.value<std::string_view>());
  }
  return out;
}

Result<std::vector<double>> TomlDoc::Numbers(const toml::table& t, std::string_view key,
                                                 std::optional<std::vector<double>> fallback) const {
  const toml::node* n = t.get(key);
  if (n == nullptr) {
    if (fallback) return *fallback;
    return Error(&t, key, "is required");
  }
  std::vector<double> out;
  if (n->is_integer() || n->is_floating_point()) {
    out.push_back(*n->value<double>());
    return out;
  }
  const toml::array* a = n->as_array();
  if (a == nullptr) return Error(n, key, "expected a number or an array of numbers");
  for (const toml::node& e : *a) {
    if (!(e.is_integer() || e.is_floating_point())) {
      return Error(&e, key, "expected an array of numbers");
    }
    out.push_back(*e.value<double>());
  }
  return out;
}

Result<const toml::table*> TomlDoc::Table(const toml::table& t, std::string_view key,
                                              bool required) const {
  const toml::node* n = t.get(key);
  if (n == nullptr) {
    if (required) return Error(&t, key, "is required (a table)");
    return static_cast<const toml::table*>(nullptr);
  }
  const toml::table* sub = n->as_table();
  if (sub == nullptr) return Error(n, key, "expected a table");
  return sub;
}

Result<std::vector<const toml::table*>> TomlDoc::Tables(const toml::table& t,
                                                            std::string_view key,
                                                            bool required) const {
  const toml::node* n = t.get(key);
  std::vector<const toml::table*> out;
  if (n == nullptr) {
    if (required) return Error(&t, key, "is required (an array of tables, [[" + std::string(key) + "]])");
    return out;
  }
  const toml::array* a = n->as_array();
  if (a == nullptr) return Error(n, key, "expected an array of tables ([[" + std::string(key) + "]])");
  for (const toml::node& e : *a) {
    const toml::table* sub = e.as_table();
    if (sub == nullptr) return Error(&e, key, "expected an array of tables");
    out.push_back(sub);
  }
  return out;
}

Status TomlDoc::OnlyKeys(const toml::table& t,
                         std::initializer_list<std::string_view> allowed) const {
  return OnlyKeys(t, std::span<const std::string_view>(allowed.begin(), allowed.size()));
}

Status TomlDoc::OnlyKeys(const toml::table& t, std::span<const std::string_view> allowed) const {
  for (const auto& [k, v] : t) {
    bool ok = false;
    for (auto a : allowed) {
      if (a == k.str()) ok = true;
    }
    if (!ok) return Error(&v, k.str(), "unknown key (allowed: " + Join(allowed) + ")");
  }
  return Status::Ok();
}

}  // namespace gmux
