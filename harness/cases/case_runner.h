// Runs one conformance case: writes its request (the resolved case and where it came from,
// contract/case_request.h) to <evidence>/run/case.json, then
// launches its ranks (processes, real Gloo/NCCL groups), each reading that file (never the
// matrix) and training the spec's model under the case's config with a runtime validation
// session that writes the case's evidence. A resume case runs in two launches: the first
// trains resume_at steps under save_config and saves a checkpoint; the second loads it under
// the case's config and trains the remaining steps. The suites assert on the evidence.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "harness/contract/case_outcome.h"
#include "harness/contract/case_record.h"
#include "harness/contract/case_request.h"
#include "harness/base/error.h"
#include "harness/spec/case_matrix.h"

namespace mih {
struct WorkerOptions;  // harness/runtime/worker.h
}  // namespace mih

namespace mih::cases {

/// Where a case runs; what it runs is its CaseRequest (contract/case_request.h).
struct CaseRunOptions {
  /// The case's evidence goes to <evidence_root>/<spec>/<case>/ (a resume's first phase to
  /// its before_save/ folder, the checkpoint to checkpoint/); launcher files to run/.
  std::filesystem::path evidence_root;
  /// The caller holds the case lock (memo.cpp's ensure_case waits for it); otherwise
  /// run_case takes it and refuses a case that another process is running.
  bool lock_held = false;
};

/// What produces the evidence of `request`, as a short hex digest: this binary (size and
/// mtime), the spec's name, the resolved case (config, steps, kind, what it is compared with),
/// the training backend, the fault, both timeouts and the checkpoint the port is initialized
/// from (init_from_sha256; "" for the seed's weights). The request's own fingerprint and its
/// matrix source are not part of it (the case carries what the matrix resolved to). Evidence
/// with another fingerprint is relaunched, never reused; `mih run` and `mih test` compute the
/// same one, so either reuses the other's.
std::string case_fingerprint(const CaseRequest& request);

/// What run_case returns: the case's record, as written to case_run.json (its outcome, error,
/// state, seconds, launch seconds, timing: the fields live there once, never copied into a
/// second struct), and what the file does not hold.
///  - outcome: kRan (every rank finished; the evidence holds the verdicts), kFailed (a hook or
///    the model raised and the session recorded why: a conformance failure), kTransportFailure
///    (a rank died or a collective timed out: infrastructure), or another Outcome
///    (case_outcome.h); error: the reason of kFailed, the launcher's report of kTransportFailure.
struct CaseRunResult : CaseRecord {
  /// The case's evidence directory (absolute).
  std::filesystem::path evidence;
  /// The launch's code for a transport failure (and the code of another outcome that is not a
  /// verdict); kOk otherwise.
  Code code = Code::kOk;
};

/// The worker options of a rank of `phase` (case_phases) of the case `request` whose evidence
/// directory is `evidence`: its run directory (run/<phase>), the case's process-group backend,
/// the collective timeout (the request's; 0 there: its case timeout), the rank's own watchdog
/// (the case timeout: what stops a rank no launcher of mih's watches) and the request's fault.
WorkerOptions case_rank_options(const CaseRequest& request, const std::filesystem::path& evidence,
                                const std::string& phase);

/// The rank command of a case, after its program: "worker <options> case --evidence <evidence>
/// --phase <phase>". The one form every launcher of a case's ranks starts them with: the local
/// launch (run_case), `mih run --prepare`'s printed lines (torchrun) and `mih submit`'s srun.
std::vector<std::string> case_rank_arguments(const WorkerOptions& options, const std::filesystem::path& evidence,
                                             const std::string& phase);

/// case_rank_arguments as one line for /bin/sh, each argument quoted where it needs it.
std::string case_rank_shell_line(const WorkerOptions& options, const std::filesystem::path& evidence,
                                 const std::string& phase);

/// Whether this process can launch case `c` of `spec` with the local launcher, before any rank
/// starts: its process-group backend is in this build (a one-rank case needs none), and a
/// CUDA case has a GPU per rank (rank r runs on cuda:r). A CUDA case initializes CUDA's
/// driver here (compat::cuda_device_count).
/// Throws: mih::Error{kUnimplemented} for a multi-rank case whose backend this build lacks;
///   kFailedPrecondition for a CUDA case with more ranks than this process sees GPUs, naming
///   both counts.
void check_launchable_here(const std::string& spec, const spec::Case& c);

/// A warning when case `c` starts more rank processes than the local launcher carries on
/// this machine (more than 2 per CPU core), else "".
std::string local_launch_warning(const std::string& spec, const spec::Case& c);

/// An exclusive flock on <root>/<spec>/.<case>.lock for as long as it lives: one run of a
/// case at a time over every process sharing the evidence root. `wait`: block until it is
/// free (the conformance runner); otherwise refuse a case that is running.
/// Throws: mih::Error{kFailedPrecondition} naming `what` (spec/case) when it is held and
///   !wait, or when the lock file cannot be created.
class CaseLock {
 public:
  CaseLock(const std::filesystem::path& file, bool wait, const std::string& what);
  ~CaseLock();
  CaseLock(const CaseLock&) = delete;
  CaseLock& operator=(const CaseLock&) = delete;

 private:
  int fd_ = -1;
};

/// Runs the case `request` names (resolved by the caller, once: its spec, a registered one,
/// and its case) and writes <evidence>/case_run.json (the request's fields, seconds, timing,
/// state, outcome, error, the SHA-256 of every evidence file: mih::CaseRecord).
/// Returns its evidence, state and outcome: a dead rank or a collective that never completes
/// is outcome "transport_failure" with the launcher's report, not an exception, so the suites
/// can report it as such.
/// A launch that timed out, a rank killed by a signal, or a rank that failed in a collective
/// (kUnavailable, kDeadlineExceeded) is "transport_failure" whatever the session wrote. A
/// rank that could not initialize the port from request.init_from (the files changed since
/// they were checked, or became unreadable) is "not_run" with that rank's code: bad input or
/// environment, never the model's failure.
/// A request with init_from but no init_from_sha256 has its checkpoint checked here first
/// (check_init_from), and one without a fingerprint gets case_fingerprint's.
/// Throws: mih::Error{kInvalidSpec} for an unknown spec or training backend, a case it cannot
///   run, or an unknown fault (before any rank starts); kFailedPrecondition for an unwritable
///   evidence root, or a case another process is running on this evidence root (nothing of it
///   is touched); as check_init_from for an init_from checkpoint that does not fit; as
///   check_launchable_here (a CUDA case on a machine with fewer GPUs than ranks).
CaseRunResult run_case(const CaseRequest& request, const CaseRunOptions& options);

/// Writes `request` as run/case.json (with its fingerprint, computed when it has none) in the
/// case's evidence directory <evidence_root>/<spec>/<case>, without launching: what an
/// external launcher (torchrun, srun) needs before it starts the ranks (`mih run --prepare`).
/// Returns the evidence directory.
/// Throws: mih::Error{kFailedPrecondition} for an unwritable evidence root, or a directory that
///   holds evidence of a run (any file but run/case.json), which it would delete, naming it.
std::filesystem::path prepare_case(const CaseRequest& request, const CaseRunOptions& options);

/// What a rank reads from <evidence>/run/case.json: mih::CaseRequest (contract/case_request.h).

}  // namespace mih::cases
