// A rank's uncaught error, errors/rank<r>.json of a launch's run directory, read typed
// (schemas/evidence/v1/run.errors.rank.schema.json; the worker writes it as it exits): one
// validation where the file is read, a missing or mistyped field a refusal, never a default.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace mih::contract {

/// The fields of errors/rank<r>.json the launcher's report quotes.
struct RankErrorRecord {
  std::string code;                  ///< code_name() of the error's Code ("failed_precondition")
  std::string message;               ///< the error's message
  std::vector<std::string> context;  ///< the context lines added on the way up, outermost last
};

/// `value` (the parsed file) as a record; `file` names it in a refusal.
/// Throws: mih::Error{kFailedPrecondition} "<file>: 'context' must be a list of strings, got
///   none: it is not the error record a mih rank writes" for a value that is no object, a
///   missing or mistyped code, message or context, or a code that is none of code_name's.
RankErrorRecord parse_rank_error(const nlohmann::json& value, const std::string& file);

}  // namespace mih::contract
