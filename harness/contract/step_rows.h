// The rows of a JSONL evidence file (metrics.jsonl, input_identity.jsonl, probes/rank0.jsonl)
// indexed by their step, and by a second key such as "stage": the one place that refuses a row
// without an integer step and a second row of one step (which row a reader took would decide
// its verdict: a wrong first row hidden by a right second one).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace mih {

/// (step, the second key's value) of a row; the value is "" when indexed by step alone.
using StepKey = std::pair<int64_t, std::string>;

/// `rows` (the lines of evidence file `file`, named in the refusal) by their integer "step" and,
/// when `second_key` is not empty, their string `second_key`. Returns the refusal, "" when every
/// row is indexed into `*out`: a row that is no object or has no integer "step" (or no string
/// `second_key`), or a second row of one step (and second key): "evidence file <file> has two
/// rows for step 0: ...; it is not one run's evidence; rerun the case".
/// For a caller whose refusal is a result (a Verdict); rows_by_step throws it.
std::string index_rows_by_step(const std::vector<nlohmann::json>& rows, const std::string& file,
                               const std::string& second_key, std::map<StepKey, nlohmann::json>* out);

/// `rows` of `file` by their step (index_rows_by_step with no second key).
/// Throws: mih::Error{kFailedPrecondition} with index_rows_by_step's refusal.
std::map<int64_t, nlohmann::json> rows_by_step(const std::vector<nlohmann::json>& rows, const std::string& file);

/// `rows` of `file` by (step, `second_key`): probes' lines by (step, "stage").
/// Throws: mih::Error{kFailedPrecondition} with index_rows_by_step's refusal.
std::map<StepKey, nlohmann::json> rows_by_step_and(const std::vector<nlohmann::json>& rows, const std::string& file,
                                                   const std::string& second_key);

}  // namespace mih
