// module_parity_results (see module_parity_results.h).
#include "harness/contract/module_parity_results.h"

#include <nlohmann/json.hpp>

#include "harness/contract/evidence_layout.h"
#include "harness/contract/row_schema.h"

namespace mih::contract {
namespace {

// A string field the schema lets be absent.
std::optional<std::string> optional_string(const nlohmann::json& object, const char* key) {
  if (!object.contains(key)) return std::nullopt;
  return object[key].get<std::string>();
}

// A number the writer wrote as null when it was not finite.
std::optional<double> finite_or_null(const nlohmann::json& value) {
  if (value.is_null()) return std::nullopt;
  return value.get<double>();
}

ParityObservation observation(const nlohmann::json& o) {
  return {o["name"].get<std::string>(), finite_or_null(o["max_abs_error"]), finite_or_null(o["relative_error"]),
          o["tolerance"].get<double>(), o["passed"].get<bool>(), optional_string(o, "note")};
}

}  // namespace

std::map<std::string, ParityCaseResult> module_parity_results(const nlohmann::json& results, const std::string& file) {
  require_schema(layout::kModuleParity, results, file);
  std::map<std::string, ParityCaseResult> out;
  for (const auto& [name, r] : results.items()) {
    ParityCaseResult result{r["passed"].get<bool>(), r["unmapped"].get<std::vector<std::string>>(),
                            optional_string(r, "error"), optional_string(r, "failure"), {}};
    for (const auto& o : r["observations"]) result.observations.push_back(observation(o));
    out.emplace(name, std::move(result));
  }
  return out;
}

}  // namespace mih::contract
