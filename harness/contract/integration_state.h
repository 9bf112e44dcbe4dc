// The integration state of a port's evidence directory (the seed tool's IntegrationState:
// ordered gates, then two terminal states), its names, and integration_state.json read typed
// (schemas/evidence/v1/integration_state.schema.json): one validation where the file is read, a
// missing or mistyped field a refusal naming the file, never a default. Torch-free.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace mih {

/// The gates a port's evidence passes, in order, then the terminal states.
enum class IntegrationState { kDiscovered, kStructureValidated, kModuleParityPassed, kMatrixPassed, kFailed, kBlocked };

/// "DISCOVERED", "STRUCTURE_VALIDATED", "MODULE_PARITY_PASSED", "MATRIX_PASSED", "FAILED",
/// "BLOCKED"; "?" for a value outside the enum.
std::string state_name(IntegrationState s);
/// Throws: mih::Error{kInvalidSpec} for another name, listing the valid ones.
IntegrationState parse_state(const std::string& name);

namespace contract {

/// integration_state.json: {schema_version, state, previous_state, evidence, reason}. mih
/// writes every field; a file another tool or a test wrote may hold less (the report reads
/// its state and reason), so only the state is required and each other field is typed when
/// present, nullopt when absent.
struct IntegrationStateRecord {
  IntegrationState state = IntegrationState::kDiscovered;
  std::optional<IntegrationState> previous_state;  ///< nullopt for the first state (null) or none
  std::optional<std::vector<std::string>> evidence;  ///< the evidence paths each gate named
  std::optional<std::string> reason;                 ///< why it failed or was blocked; "" for a gate
};

/// `value` (the content of integration_state.json) as a record; `file` names it in a refusal.
/// Throws: mih::Error{kFailedPrecondition} "<file> holds no state name (...)", "<file>: 'evidence'
///   must be a list of paths, got 3", ... "it is not the integration state mih writes (edited
///   or damaged); rerun the case", for a value that is no object, a state that is no state's
///   name, or an evidence, reason or previous_state of another type.
IntegrationStateRecord parse_integration_state(const nlohmann::json& value, const std::string& file);

}  // namespace contract
}  // namespace mih
