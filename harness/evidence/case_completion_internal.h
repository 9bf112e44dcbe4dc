// What a case directory's own records say of its run, where case_run.json's digests do not
// reach (issue 53): the integration state as the run's record bounds it (integration_state.json
// is advanced by the verdicts after the run, so it is outside the digests), whether mih's case
// runner launched it (then a case without case_run.json is incomplete), and whether the ranks
// of a run without a record (a `mih submit` night's) recorded that they ended.
#pragma once

#include <filesystem>
#include <string>

namespace mih {

/// The integration state of a case directory as its records agree on it.
struct CaseState {
  std::string state;   ///< "MATRIX_PASSED", "FAILED", ...; "" when no record names one
  std::string reason;  ///< the state's reason
  /// Where integration_state.json does not say what case_run.json recorded of the run: the run
  /// left the case FAILED or BLOCKED and the file says another state or is missing, or the file
  /// is missing though the run left one. "" when they agree. A case with a disagreement is no
  /// pass, whatever its tests say.
  std::string disagreement;
};

/// Reads `dir`/integration_state.json and the "state" case_run.json recorded after the run.
/// The record's FAILED or BLOCKED stands whatever the file says (its digested evidence judged
/// it so); else the file's state, or the record's where the file is missing. A record that
/// cannot be read is not consulted (its readers refuse it).
/// Throws: mih::Error{kFailedPrecondition} naming integration_state.json when it exists and is
///   not a state mih writes.
CaseState read_case_state(const std::filesystem::path& dir);

/// Whether mih's case runner (mih test, mih run), which writes case_run.json when its launches
/// end, launched the ranks whose evidence `dir` holds: environment.json's launcher is "mih" and
/// the ranks' rendezvous store was the case's own run/<phase>/store. `mih launch` runs ranks in
/// a run directory of its own and writes no record: its evidence is an external launch's.
bool launched_by_case_runner(const std::filesystem::path& dir);

/// Why `dir` holds a second run of its case, or "": SLURM requeued the job that ran it (rank 0's
/// environment.json, of either phase, has SLURM_RESTART_COUNT > 0), and the requeued run wrote
/// over the first one's evidence in the same directory.
std::string why_requeued(const std::filesystem::path& dir);

/// Why the ranks' own records in `dir` do not say the case's run ended, or "" when they do:
/// every rank of every phase of run/case.json wrote run/<phase>/timing_rank<r>.json (the last
/// thing a rank does), or the session recorded the case FAILED with its reason; and no SLURM
/// requeue ran it again over the same directory (why_requeued).
std::string why_run_not_ended(const std::filesystem::path& dir);

}  // namespace mih
