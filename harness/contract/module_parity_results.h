// check/module_parity.json read typed (schemas/evidence/v1/check.module_parity.schema.json):
// per module parity case, what the candidate module gave against its independent reference,
// validated against the contract's schema once. A case's passed, unmapped and observations
// are required, and an observation's name, errors, tolerance and passed.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace mih::contract {

/// One compared tensor: "output", "aux_loss", "input_grad[<i>]" or "grad:<FQN>".
struct ParityObservation {
  std::string name;
  /// The errors (absolute in the tensor's units; relative dimensionless); absent: the writer
  /// wrote null, the error was not finite.
  std::optional<double> max_abs_error, relative_error;
  double tolerance = 0;  ///< the relative tolerance it was judged at
  bool passed = false;
  std::optional<std::string> note;  ///< why a side counts as zero; absent: none does
};

struct ParityCaseResult {
  bool passed = false;
  std::vector<std::string> unmapped;  ///< trainable FQNs no weight-adapter entry maps
  std::optional<std::string> error;   ///< what building or running the case threw; absent: nothing
  std::optional<std::string> failure; ///< the first failure in one sentence; absent when it passed
  std::vector<ParityObservation> observations;
};

/// module_parity.json (`results`, the parsed file; `file` names it in a refusal): case name
/// -> result.
/// Throws: mih::Error{kFailedPrecondition} naming the file and the field for a value the
///   schema refuses (a case without passed or observations, an observation without its
///   tolerance, passed not a boolean).
std::map<std::string, ParityCaseResult> module_parity_results(const nlohmann::json& results, const std::string& file);

}  // namespace mih::contract
