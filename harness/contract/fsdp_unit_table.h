// check/fsdp_units.json read typed (schemas/evidence/v1/check.fsdp_units.schema.json): every
// declared FSDP unit with its FSDP-sharded parameters and their dtype and mesh signatures,
// validated against the contract's schema once. Both fields of a unit are required.
#pragma once

#include <map>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace mih::contract {

struct FsdpUnit {
  std::vector<std::string> parameters;  ///< FQNs of its FSDP-sharded parameters
  std::vector<std::string> dtypes;      ///< distinct "<dtype>@<mesh>/<DENSE|EXPERT>" of them
};

/// fsdp_units.json (`units`, the parsed file; `file` names it in a refusal): unit name -> unit.
/// Throws: mih::Error{kFailedPrecondition} naming the file and the field for a value the
///   schema refuses (a unit without parameters or dtypes, a non-string FQN).
std::map<std::string, FsdpUnit> fsdp_unit_table(const nlohmann::json& units, const std::string& file);

}  // namespace mih::contract
