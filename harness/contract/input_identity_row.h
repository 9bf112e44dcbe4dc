// data/input_identity.jsonl read typed (schemas/evidence/v1/data.input_identity.schema.json): one
// InputIdentityRow per step, validated against the contract's schema once where the file is
// read, indexed by step with the one refusal of two rows for one step (step_rows.h).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace mih::contract {

struct InputIdentityRow {
  int64_t step = 0;
  std::string global;                         ///< SHA-256 over every field's name and hash
  std::map<std::string, std::string> fields;  ///< field name -> SHA-256 of its rows
  int64_t rows = 0;                           ///< rows of the global batch
};

/// The lines of input_identity.jsonl by step. `file` names the file in a refusal.
/// Throws: mih::Error{kFailedPrecondition} naming the file, the line and step and the field for
///   a line the schema refuses, and for two rows of one step.
std::map<int64_t, InputIdentityRow> input_identity_rows(const std::vector<nlohmann::json>& lines, const std::string& file);

}  // namespace mih::contract
