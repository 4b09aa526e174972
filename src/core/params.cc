#include "core/params.h"

#include <cmath>
#include <sstream>

namespace gmux::core {

Result<double> ParamReader::Number(const std::string& key, double fallback, double min,
                                   double max) {
  seen_.insert(key);
  auto it = params_.find(key);
  if (it == params_.end()) return fallback;
  double v = it->second;
  if (!std::isfinite(v) || v < min || v > max) {
    std::ostringstream m;
    m << owner_ << ": parameter '" << key << "' = " << v << " is outside [" << min << ", " << max
      << "]";
    return InvalidArgument(m.str());
  }
  return v;
}

Result<int64_t> ParamReader::Integer(const std::string& key, int64_t fallback, int64_t min,
                                     int64_t max) {
  auto v = Number(key, static_cast<double>(fallback), static_cast<double>(min),
                  static_cast<double>(max));
  if (!v.ok()) return v.status();
  if (std::floor(*v) != *v) {
    return InvalidArgument(owner_ + ": parameter '" + key + "' must be an integer");
  }
  return static_cast<int64_t>(*v);
}

Status ParamReader::Finish() const {
  std::string unknown;
  for (const auto& [key, value] : params_) {
    if (seen_.count(key) == 0) {
      if (!unknown.empty()) unknown += ", ";
      unknown += "'" + key + "'";
    }
  }
  if (unknown.empty()) return Status::Ok();
  return InvalidArgument(owner_ + ": unknown parameter(s) " + unknown);
}

}  // namespace gmux::core
