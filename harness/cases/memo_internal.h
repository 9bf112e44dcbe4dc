// What the run's memo of cases (memo.cpp) tells the rest of the run (run_results.cpp): the
// outcome of a case this process asked for. Not installed.
#pragma once

#include <string>

#include "harness/cases/memo.h"

namespace mih::cases {

/// The outcome ensure_case memoized for case `case_name` of spec `spec` in this process (any
/// training backend or matrix), or null when none was (never asked for, or it threw: a case
/// that could not be checked or launched).
const CaseOutcome* memoized_outcome(const std::string& spec, const std::string& case_name);

}  // namespace mih::cases
