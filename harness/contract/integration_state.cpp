// The integration states and integration_state.json read typed (see integration_state.h).
#include "harness/contract/integration_state.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "harness/base/error.h"
#include "harness/base/json_fields.h"

namespace mih {

std::string state_name(IntegrationState s) {
  switch (s) {
    case IntegrationState::kDiscovered: return "DISCOVERED";
    case IntegrationState::kStructureValidated: return "STRUCTURE_VALIDATED";
    case IntegrationState::kModuleParityPassed: return "MODULE_PARITY_PASSED";
    case IntegrationState::kMatrixPassed: return "MATRIX_PASSED";
    case IntegrationState::kFailed: return "FAILED";
    case IntegrationState::kBlocked: return "BLOCKED";
  }
  return "?";
}

IntegrationState parse_state(const std::string& name) {
  for (auto s : {IntegrationState::kDiscovered, IntegrationState::kStructureValidated, IntegrationState::kModuleParityPassed,
                 IntegrationState::kMatrixPassed, IntegrationState::kFailed, IntegrationState::kBlocked}) {
    if (state_name(s) == name) return s;
  }
  MIH_THROW(Code::kInvalidSpec, "unknown integration state '", name,
            "'; valid: DISCOVERED, STRUCTURE_VALIDATED, MODULE_PARITY_PASSED, MATRIX_PASSED, FAILED, BLOCKED");
}

namespace contract {
namespace {

using nlohmann::json;

constexpr char kNotMihs[] = ": it is not the integration state mih writes (edited or damaged); rerun the case";

IntegrationState state_of(const json& name, const std::string& file) {
  try {
    return parse_state(name.get<std::string>());
  } catch (const Error& e) {
    MIH_THROW(Code::kFailedPrecondition, file, ": ", e.message(), "; rerun the case");
  }
}

}  // namespace

IntegrationStateRecord parse_integration_state(const json& value, const std::string& file) {
  MIH_CHECK_CODE(value.is_object() && value.contains("state") && value["state"].is_string(), Code::kFailedPrecondition,
                 file, " holds no state name (", json_summary(value), ")", kNotMihs);
  IntegrationStateRecord out;
  out.state = state_of(value["state"], file);
  if (value.contains("evidence")) {
    const json& evidence = value["evidence"];
    MIH_CHECK_CODE(evidence.is_array() && std::all_of(evidence.begin(), evidence.end(), [](const json& p) { return p.is_string(); }),
                   Code::kFailedPrecondition, file, ": 'evidence' must be a list of paths, got ", json_summary(evidence),
                   kNotMihs);
    out.evidence = evidence.get<std::vector<std::string>>();
  }
  if (value.contains("reason")) {
    MIH_CHECK_CODE(value["reason"].is_string(), Code::kFailedPrecondition, file, ": 'reason' must be a string, got ",
                   json_summary(value["reason"]), kNotMihs);
    out.reason = value["reason"].get<std::string>();
  }
  if (value.contains("previous_state") && !value["previous_state"].is_null()) {
    MIH_CHECK_CODE(value["previous_state"].is_string(), Code::kFailedPrecondition, file,
                   ": 'previous_state' must be a state's name or null, got ", json_summary(value["previous_state"]),
                   kNotMihs);
    out.previous_state = state_of(value["previous_state"], file);
  }
  return out;
}

}  // namespace contract
}  // namespace mih
