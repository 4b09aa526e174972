// TomlDoc: a parsed TOML file (a scenario or gmuxd's config) plus typed getters whose errors
// name the file, the line and the key, e.g. "scenarios/x.toml:12: key 'weight': expected a
// number > 0".
//
// Scenario runners and gmuxd's config loader read their files through these helpers and reject
// unknown keys, so a typo in a file is an error, not a silent default.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <toml++/toml.h>

#include "common/status.h"

namespace gmux {

class TomlDoc {
 public:
  // Reads and parses `path`. Errors: kNotFound (missing file), kInvalidArgument (syntax, with
  // line and column).
  static Result<TomlDoc> Load(const std::string& path);
  // Parses `text` as if it were the file `path` (for tests and embedded scenarios).
  static Result<TomlDoc> Parse(std::string_view text, const std::string& path);

  const toml::table& root() const { return root_; }
  const std::string& path() const { return path_; }

  // kInvalidArgument "PATH:LINE: key 'KEY': MESSAGE" (line of `node`, or of `table` when the
  // key is missing).
  Status Error(const toml::node* node, std::string_view key, std::string_view message) const;

  // Typed getters. `fallback` nullopt means the key is required.
  Result<double> Number(const toml::table& t, std::string_view key, std::optional<double> fallback,
                        double min = -1e300, double max = 1e300) const;
  Result<int64_t> Integer(const toml::table& t, std::string_view key,
                          std::optional<int64_t> fallback, int64_t min = INT64_MIN,
                          int64_t max = INT64_MAX) const;
  // A size in bytes: an integer, or a string of a number and a unit ("2GiB", "512 MiB", "1.5G";
  // K/M/G/T and KiB/MiB/GiB/TiB are powers of 1024, KB/MB/GB/TB of 1000, B bytes).
  Result<uint64_t> Bytes(const toml::table& t, std::string_view key,
                         std::optional<uint64_t> fallback) const;
  Result<bool> Bool(const toml::table& t, std::string_view key, std::optional<bool> fallback) const;
  Result<std::string> String(const toml::table& t, std::string_view key,
                             std::optional<std::string> fallback) const;
  // One of `choices`.
  Result<std::string> Choice(const toml::table& t, std::string_view key,
                             std::optional<std::string> fallback,
                             std::initializer_list<std::string_view> choices) const;
  // An array of strings / numbers (a single scalar is accepted as a one-element array).
  Result<std::vector<std::string>> Strings(const toml::table& t, std::string_view key,
                                           std::optional<std::vector<std::string>> fallback) const;
  Result<std::vector<double>> Numbers(const toml::table& t, std::string_view key,
                                      std::optional<std::vector<double>> fallback) const;
  // A sub-table; nullptr when absent and not required.
  Result<const toml::table*> Table(const toml::table& t, std::string_view key, bool required) const;
  // An array of tables ([[name]]); empty when absent and not required.
  Result<std::vector<const toml::table*>> Tables(const toml::table& t, std::string_view key,
                                                 bool required) const;

  // Errors on the first key of `t` not in `allowed`.
  Status OnlyKeys(const toml::table& t, std::initializer_list<std::string_view> allowed) const;
  Status OnlyKeys(const toml::table& t, std::span<const std::string_view> allowed) const;

 private:
  std::string path_;
  toml::table root_;
};

}  // namespace gmux
