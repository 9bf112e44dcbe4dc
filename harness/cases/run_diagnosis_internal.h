// The diagnosis across the matrix at the end of `mih test` and `mih check` (internal to
// harness/cli): a GoogleTest listener that prints it above GoogleTest's list of failures.
#pragma once

#include <filesystem>

#include <gtest/gtest.h>

namespace mih::cases {

/// A listener that, when the run had a failure, diagnoses the cases whose tests this process
/// ran (their results in `root`/results.jsonl, their configurations in their evidence) and
/// prints the diagnosis (evidence/diagnosis.h) on stdout, each line prefixed "[ DIAGNOSIS ]".
/// Append it after the results writer: GoogleTest calls the end events in reverse order, so it
/// prints before GoogleTest's summary. Prints nothing when fewer than two cases have a verdict
/// (a ctest test runs one case: `mih report` of the root diagnoses the whole run); a failure to
/// read the results is said in one line and never changes the run's outcome.
::testing::TestEventListener* new_diagnosis_printer(const std::filesystem::path& root);

}  // namespace mih::cases
