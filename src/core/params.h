// ParamReader: typed access to a PolicySpec's numeric parameters with validation.
//
// Each policy's Make function reads the keys it knows; Finish() reports any key nobody read, so a
// misspelt parameter in a config is an error instead of a silent default.
#pragma once

#include <map>
#include <set>
#include <string>

#include "common/status.h"

namespace gmux::core {

class ParamReader {
 public:
  ParamReader(std::string owner, const std::map<std::string, double>& params)
      : owner_(std::move(owner)), params_(params) {}

  // Value of `key`, or `fallback` when absent. Errors when present and outside [min, max].
  Result<double> Number(const std::string& key, double fallback, double min, double max);
  // Same, requiring an integral value.
  Result<int64_t> Integer(const std::string& key, int64_t fallback, int64_t min, int64_t max);

  // kInvalidArgument naming every key that no Number()/Integer() call asked for.
  Status Finish() const;

 private:
  std::string owner_;
  const std::map<std::string, double>& params_;
  std::set<std::string> seen_;
};

}  // namespace gmux::core
