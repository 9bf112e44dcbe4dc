// Runs one conformance case: launches its ranks (processes, real Gloo/NCCL groups), each
// training the spec's model under the case's config with a runtime validation session that
// writes the case's evidence. A resume case runs in two launches: the first trains
// resume_at steps under save_config and saves a checkpoint; the second loads it under the
// case's config and trains the remaining steps. The suites (issue 7) assert on the evidence.
#pragma once

#include <chrono>
#include <filesystem>
#include <string>

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
};

struct CaseRunResult {
  std::filesystem::path evidence;
  /// The case's integration state after the run ("STRUCTURE_VALIDATED", "FAILED", ...).
  std::string state;
  /// Wall time of the launches, seconds.
  double seconds = 0;
};

/// Runs the case. Returns its evidence and state (FAILED when a check found an error or a
/// hook raised: a conformance failure, not an exception).
/// Throws: mih::Error{kInvalidSpec} for an unknown spec, matrix or case (before any rank
///   starts); the launch's code (kAborted, kDeadlineExceeded, kUnavailable...) with its
///   report when a rank dies or a collective never completes.
CaseRunResult run_case(const CaseRunOptions& options);

}  // namespace mih
