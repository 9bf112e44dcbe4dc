// The record of a case's run as a type (issue 36): what the parent (cases::run_case) writes
// once as <case dir>/case_run.json (mih::layout::kCaseRecord) after the case's launches: the
// case it ran and where it came from, its outcome, the integration state it left, its timing
// and the SHA-256 of every evidence file it wrote. Strict JSON both ways: to_json writes every
// field, from_json requires each one and refuses any other (a typo, an edit, a file of another
// tool), naming it; the readers (reuse, verify-only, mih check, mih report, mih faults) take
// this type, never `.value(key, default)`. Torch-free.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/contract/case_outcome.h"
#include "harness/contract/case_request.h"
#include "harness/base/parallel_config.h"

namespace mih {

/// Rank 0's wall time by kind over the case's launches, seconds (case_run.json "timing").
struct CaseTiming {
  double process_start_s = 0;  ///< exec or fork to main()
  double rendezvous_s = 0;     ///< the store and the process groups
  double training_s = 0;       ///< build and steps, less the session's checks
  double checks_s = 0;         ///< the session's checks and the end of the run
  /// The rest of the launches' wall time (spawn, teardown, the launcher's waits); may be
  /// slightly negative when the clocks of parent and rank disagree.
  double other_s = 0;
};

/// One launch of a case: its phase and how many ranks it starts.
struct CasePhase {
  std::string name;    ///< "train"; a resume's "save", then "load"
  int world_size = 1;  ///< the ranks of the phase's config (a resume's save: save_config's)
};

/// Every phase a case can launch, the one list of them (run/<phase>/, the rank's --phase, the
/// record's started_by): "train" (the whole case), "save" (a resume's first launch), "load".
inline constexpr std::array<const char*, 3> kCasePhases = {"train", "save", "load"};

/// The launches of case `c`, in order: a resume (save_config) saves then loads, every other
/// case trains once. What the local runner, `mih run --prepare`, `mih submit` and the rank's
/// own check of its --phase all follow.
std::vector<CasePhase> case_phases(const spec::Case& c);

/// What case_run.json holds. Field names on disk in brackets where they differ.
struct CaseRecord {
  std::string spec;       ///< the spec's registry name ("llama")
  std::string case_name;  ///< ["case"] the case's name ("DpShard2")
  spec::CaseKind kind = spec::CaseKind::kTrain;
  std::string group;       ///< the case's group ("axis", "resume", ...)
  int64_t world_size = 1;  ///< ranks of the case's config (ParallelConfig::world_size)
  ParallelConfig config;   ///< the config it trained under (a resume: after the load)
  std::string compare_to;  ///< the case its numbers are compared with, or ""
  MatrixSource matrix;     ///< the matrix source it was resolved from (CaseRequest::matrix)
  std::string training_backend;
  /// The run's fingerprint (binary, case definition, backend, fault, timeout, init source):
  /// evidence is reused only under the same one.
  std::string fingerprint;
  std::string fault;  ///< the catalog fault injected ("F03"), or ""
  /// The checkpoint directory the ranks initialized from, as given, and its digest; "" each
  /// (null on disk) for the seed's initialization.
  std::string init_from;
  std::string init_from_sha256;
  /// The request's timeouts ("case_timeout_ms", "collective_timeout_ms" on disk): what a
  /// transport failure of the case ran into.
  std::chrono::milliseconds case_timeout{std::chrono::minutes(5)};
  std::chrono::milliseconds collective_timeout{0};
  /// A fault run only: whether the fault's code ran on some rank.
  std::optional<bool> fault_reached;
  double seconds = 0;                  ///< wall time of the launches, seconds
  std::vector<double> launch_seconds;  ///< of each launch (a resume has two)
  CaseTiming timing;
  /// Per phase ("train", "save", "load"): how each rank started, by rank ("fork_server", "exec").
  std::map<std::string, std::vector<std::string>> started_by;
  std::string state;  ///< the integration state after the run ("STRUCTURE_VALIDATED", "FAILED", ...)
  Outcome outcome = Outcome::kNotRun;
  std::string error;  ///< why the case did not run or failed; "" for kRan
  /// Every evidence file the case wrote (relative to the case directory) -> its SHA-256 (hex).
  std::map<std::string, std::string> files;
};

/// The record of `request`'s case before it runs: its case (name, kind, group, world size,
/// config, compare_to), where it came from (matrix, backend, fault, init source), its
/// timeouts and its fingerprint; the run fills in the rest.
CaseRecord record_of(const CaseRequest& request);

/// Every field (init_from and init_from_sha256 as null when ""; fault_reached only when set).
/// from_json requires every field but fault_reached and refuses any other.
/// Throws: mih::Error{kFailedPrecondition} naming a missing, mistyped or unknown field or an
///   outcome mih does not write.
void to_json(nlohmann::json& j, const CaseRecord& r);
void from_json(const nlohmann::json& j, CaseRecord& r);

/// Reads `file` (a case_run.json), parsed with the bound on depth and duplicate keys of
/// parse_json_strict.
/// Throws: mih::Error{kFailedPrecondition} naming the file when it is missing, unreadable, not
///   JSON, not an object or not a record mih wrote (as from_json), with "rerun the case".
CaseRecord read_case_record(const std::filesystem::path& file);

}  // namespace mih
