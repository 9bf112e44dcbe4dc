// The conformance run's GoogleTest listener and case states (conformance_run.cpp's helpers).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

namespace mih::cases {

/// Appends one line per finished test to <root>/results.jsonl, with a start and an end line
/// per process (nothing under RunOptions::read_only). A SIGINT or SIGTERM ends the run after
/// the test in flight: the end line says so and the process exits 128 + the signal.
::testing::TestEventListener* new_results_writer();

struct CaseOutcome;
struct Registration;

/// The first case that case `case_name` of `r` reads beside its own evidence (what it is
/// compared with, along the compare_to chain; a reduced lane's reference and noise twin) whose
/// outcome in this process is not a completed run (nor evidence produced elsewhere, verify-only),
/// with that outcome; {"", null} when every such case that ran or was read here completed. A case whose dependency did not complete is not judged:
/// its failed tests are not verdicts on the model.
std::pair<std::string, const CaseOutcome*> incomplete_dependency(const Registration& r, const std::string& case_name);

/// Records the integration state of every case whose tests all ran in this run; returns the
/// cases whose tests passed and that cannot be MATRIX_PASSED (the run exits 1 for them).
std::vector<std::string> record_case_states();

}  // namespace mih::cases
