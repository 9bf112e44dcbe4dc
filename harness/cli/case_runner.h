// Runs one conformance case: launches its ranks (processes, real Gloo/NCCL groups), each
// training the spec's model under the case's config with a runtime validation session that
// writes the case's evidence. A resume case runs in two launches: the first trains
// resume_at steps under save_config and saves a checkpoint; the second loads it under the
// case's config and trains the remaining steps. The suites (issue 7) assert on the evidence.
#pragma once

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "harness/base/error.h"

namespace mih {

struct CaseRunOptions {
  std::string spec;
  /// A preset or a JSON matrix file.
  std::string matrix = "cpu-smoke";
  std::string case_name;
  /// The case's evidence goes to <evidence_root>/<spec>/<case>/ (a resume's first phase to
  /// its before_save/ folder, the checkpoint to checkpoint/); launcher files to run/.
  std::filesystem::path evidence_root;
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  /// The TrainingBackend that trains the case (harness/session/backend.h).
  std::string backend = "trainer";
  /// Recorded in case_run.json: what produced the evidence (the conformance runner reuses a
  /// case's evidence only when its fingerprint matches).
  std::string fingerprint;
  /// A fault of the catalog ("F03"; harness/base/fault.h) the rank processes inject: set as
  /// their MIH_FAULT, which is otherwise cleared (an exported MIH_FAULT never leaks into a case).
  std::string fault;
};

struct CaseRunResult {
  std::filesystem::path evidence;
  /// The case's integration state after the run ("STRUCTURE_VALIDATED", "FAILED", ...).
  std::string state;
  /// Wall time of the launches, seconds (and of each launch: a resume has two).
  double seconds = 0;
  std::vector<double> launch_seconds;
  /// "ran" (every rank finished; the evidence holds the verdicts), "failed" (a hook or the
  /// model raised and the session recorded why: a conformance failure) or
  /// "transport_failure" (a rank died or a collective timed out: infrastructure).
  std::string outcome;
  /// The reason of "failed", the launcher's report of "transport_failure".
  std::string error;
  /// The launch's code for a transport failure.
  Code code = Code::kOk;
};

/// Runs the case and writes <evidence>/case_run.json (spec, case, kind, world_size, config,
/// compare_to, seconds, state, outcome, error). Returns its evidence, state and outcome: a
/// dead rank or a collective that never completes is outcome "transport_failure" with the
/// launcher's report, not an exception, so the suites can report it as such.
/// Throws: mih::Error{kInvalidSpec} for an unknown spec, matrix, case or backend, or a case
///   the backend cannot run (before any rank starts); kFailedPrecondition for an unwritable
///   evidence root.
CaseRunResult run_case(const CaseRunOptions& options);

}  // namespace mih
