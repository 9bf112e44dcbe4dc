// cases/runtime/comm_expected_step<k>.json read typed (schemas/evidence/v1/cases.runtime.comm_expected_step.schema.json):
// the bytes each layer declared for step k, per axis and call site, validated against the
// contract's schema once where the file is read.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include <nlohmann/json_fwd.hpp>

namespace mih::contract {

/// axis -> call site -> layer FQN -> bytes.
using LayerBytes = std::map<std::string, std::map<std::string, std::map<std::string, int64_t>>>;

/// comm_expected_step<`step`>.json (`value`, the parsed file; `file` names it in a refusal).
/// Throws: mih::Error{kFailedPrecondition} naming the file and the field for a value the
///   schema refuses.
LayerBytes comm_expected_by_layer(const nlohmann::json& value, int64_t step, const std::string& file);

}  // namespace mih::contract
