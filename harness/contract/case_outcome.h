// How a case's launch ended (its outcome) and how one conformance test ended (its status), as
// types: the one spelling of each (written into case_run.json and results.jsonl, read back by
// the verdicts, the report and `mih check`), one classification of an outcome, and one
// mapping from an outcome to the code a run's exit status takes. Torch-free.
//
// How to add an outcome: one enumerator in Outcome, its name in case_outcome.cpp's table and
// its class in classify(); every writer, reader, suite and report line follows from those.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "harness/base/error.h"

namespace mih {

/// How a case's launch (or its verify-only evidence) ended.
enum class Outcome {
  kRan,                 ///< "ran": every rank finished; the evidence holds the verdicts
  kVerifyOnly,          ///< "verify_only": evidence produced elsewhere, read in a verify-only run
  kFailed,              ///< "failed": a hook or the model raised and the session recorded why
  kFaultNotReached,     ///< "fault_not_reached": the fault was injected and no rank reached its point
  kTransportFailure,    ///< "transport_failure": a rank died, was killed, or a collective timed out
  kEnvironmentFailure,  ///< "environment_failure": a full or read-only disk
  kInterrupted,         ///< "interrupted": SIGINT/SIGTERM stopped the launch
  kNotRun,              ///< "not_run": it could not start (an unwritable root, a checkpoint that changed)
};

/// What an outcome means for the run.
enum class OutcomeClass {
  kVerdict,             ///< ran, verify_only: the suites judge the evidence
  kConformanceFailure,  ///< failed: the model's (the port's) failure; every test of the case fails
  kInfrastructure,      ///< transport_failure: never a verdict; the run exits with the launch's code
  kBadInput,            ///< fault_not_reached: the case checked nothing it was asked to (exit 11)
  kEnvironment,         ///< environment_failure, not_run, interrupted: the machine or the user, not the model
};

/// "ran", "verify_only", "failed", "fault_not_reached", "transport_failure",
/// "environment_failure", "interrupted", "not_run".
std::string_view outcome_name(Outcome o);
/// The outcome named `name`, or nullopt.
std::optional<Outcome> find_outcome(std::string_view name);
/// Throws: mih::Error{kFailedPrecondition} for another name, listing the valid ones (`where`
///   names the file and field it was read from).
Outcome parse_outcome(std::string_view name, std::string_view where);

OutcomeClass classify(Outcome o);
/// "verdict", "conformance failure", "infrastructure", "bad input", "environment".
std::string_view outcome_class_name(OutcomeClass c);
/// Whether the suites judge the case's evidence (kVerdict).
inline bool has_verdict(Outcome o) { return classify(o) == OutcomeClass::kVerdict; }

/// The code the run's exit status takes for a case with outcome `o` whose launch recorded
/// `code` (kOk when it recorded none): kOk for a verdict or a conformance failure (the tests
/// say it); an infrastructure or environment outcome keeps the launch's code, else kAborted
/// (infrastructure) or kFailedPrecondition (environment); bad input is kInvalidSpec.
Code outcome_code(Outcome o, Code code);

/// How one conformance test ended (results.jsonl "status", the report's cells).
enum class TestStatus { kPassed, kFailed, kSkipped };
/// "passed", "failed", "skipped".
std::string_view test_status_name(TestStatus s);
std::optional<TestStatus> find_test_status(std::string_view name);

}  // namespace mih
