// MakePolicy: the one place that maps policy names to implementations.
#include <memory>

#include "core/credit_policy.h"
#include "core/fifo_policy.h"
#include "core/params.h"
#include "core/policy.h"
#include "core/rr_policy.h"
#include "core/split_policy.h"

namespace gmux::core {

std::string_view KnownPolicyNames() { return "fifo, rr, credit, split"; }

Result<std::unique_ptr<Policy>> MakePolicy(const PolicySpec& spec) {
  if (spec.name == "fifo") {
    ParamReader params("policy fifo", spec.params);
    GMUX_RETURN_IF_ERROR(params.Finish());
    return std::unique_ptr<Policy>(std::make_unique<FifoPolicy>());
  }
  if (spec.name == "rr") {
    ParamReader params("policy rr", spec.params);
    GMUX_RETURN_IF_ERROR(params.Finish());
    return std::unique_ptr<Policy>(std::make_unique<RrPolicy>());
  }
  if (spec.name == "credit") {
    GMUX_ASSIGN_OR_RETURN(CreditPolicyOptions options, CreditPolicyOptionsFromSpec(spec));
    return std::unique_ptr<Policy>(std::make_unique<CreditPolicy>(options, spec.device));
  }
  if (spec.name == "split") {
    GMUX_ASSIGN_OR_RETURN(SplitPolicyOptions options, SplitPolicyOptionsFromSpec(spec));
    return std::unique_ptr<Policy>(std::make_unique<SplitPolicy>(options));
  }
  return InvalidArgument("unknown policy '" + spec.name + "' (known: " +
                         std::string(KnownPolicyNames()) + ")");
}

}  // namespace gmux::core
