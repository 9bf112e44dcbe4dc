// The results of the spec's state invariants read typed: check/invariants_<phase>.json,
// cases/runtime/invariants_step<k>.json and checkpoint/invariants_after_load.json (each its
// schema of schemas/evidence/v1, one shape: invariant name -> result), validated against the
// contract's schema once. passed and facts are required; weights is optional.
#pragma once

#include <map>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace mih::contract {

struct InvariantResult {
  bool passed = false;    ///< held and did not throw
  nlohmann::json facts;   ///< the invariant's own facts (an object, free form)
  /// Materialization only: the weights it examined, in words; absent for the other phases.
  std::optional<std::string> weights;
};

/// The results `value` holds: the file at `relative` in a case directory (check/invariants_
/// structure.json, cases/runtime/invariants_step3.json, layout::kInvariantsAfterLoad, ...);
/// `file` names it in a refusal. Invariant name -> result, in name order.
/// Throws: mih::Error{kFailedPrecondition} naming the file and the field for a value the
///   schema refuses (a result without passed or facts, passed not a boolean).
std::map<std::string, InvariantResult> invariant_results(const std::string& relative, const nlohmann::json& value,
                                                         const std::string& file);

}  // namespace mih::contract
