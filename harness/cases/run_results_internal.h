// The conformance run's GoogleTest listener and case states (conformance_run.cpp's helpers).
#pragma once

#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace mih::cases {

/// Appends one line per finished test to <root>/results.jsonl, with a start and an end line
/// per process (nothing under RunOptions::read_only). A SIGINT or SIGTERM ends the run after
/// the test in flight: the end line says so and the process exits 128 + the signal.
::testing::TestEventListener* new_results_writer();

/// Records the integration state of every case whose tests all ran in this run; returns the
/// cases whose tests passed and that cannot be MATRIX_PASSED (the run exits 1 for them).
std::vector<std::string> record_case_states();

}  // namespace mih::cases
