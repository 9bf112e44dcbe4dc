// invariant_results (see invariant_results.h).
#include "harness/contract/invariant_results.h"

#include "harness/contract/row_schema.h"

namespace mih::contract {

std::map<std::string, InvariantResult> invariant_results(const std::string& relative, const nlohmann::json& value,
                                                         const std::string& file) {
  require_schema(relative, value, file);
  std::map<std::string, InvariantResult> out;
  for (const auto& [name, r] : value.items()) {
    InvariantResult result{r["passed"].get<bool>(), r["facts"], std::nullopt};
    if (r.contains("weights")) result.weights = r["weights"].get<std::string>();
    out.emplace(name, std::move(result));
  }
  return out;
}

}  // namespace mih::contract
