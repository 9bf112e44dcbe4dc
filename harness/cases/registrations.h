// The conformance registrations of a binary and the options of its run: one Registration per
// MIH_CONFORMANCE_SUITES line (suites/conformance.h), the run's options (set once by the
// `mih test` / `mih check` command line, harness/cli), and each registration's case matrix,
// resolved once per process from the spec and the matrix source (a preset or a JSON file).
// Torch-free.
#pragma once

#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "harness/contract/case_request.h"
#include "harness/spec/case_matrix.h"

namespace mih::cases {

/// One MIH_CONFORMANCE_SUITES line.
struct Registration {
  std::string prefix;            ///< GoogleTest instantiation prefix ("Llama")
  std::string spec;              ///< registered spec name
  std::string matrix;            ///< preset or JSON matrix file
  std::string training_backend;  ///< TrainingBackend name ("trainer")
  /// Instantiated only when the run names it (RunOptions::prefixes): a spec variant of the
  /// fault catalog.
  bool on_request = false;
};

/// Adds a registration (from the static initializer of MIH_CONFORMANCE_SUITES). Returns false,
/// after printing why, when the prefix is taken (the binary then refuses to run its tests).
bool add_registration(Registration r);
const std::vector<Registration>& registrations();
/// The registration `prefix`, or null.
const Registration* find_registration(const std::string& prefix);
/// The prefixes registered twice (a binary with any refuses to run: exit 11).
const std::vector<std::string>& duplicate_prefixes();

/// The checkpoint a run initializes a spec's port from (CheckpointSpec::init_from or
/// `--init-from`), as the run checked it before any rank started.
struct InitSource {
  /// Absolute path of the Hugging Face checkpoint directory.
  std::filesystem::path dir;
  /// SHA-256 (64 hex digits) over its files (cases::checkpoint_digest): part of every
  /// fingerprint of the spec's cases, and what each rank checks the files against. Empty in
  /// verify-only runs, which read no checkpoint.
  std::string sha256;
};

/// What a run under `--no-golden` (RunOptions::no_golden) says in its last lines and reports.
inline constexpr char kMatchesOriginalNotRun[] = "MatchesOriginal not run: --no-golden";

/// What one conformance run does: set by the command line (harness/cli binds its flags to
/// these fields), then handed to the run (conformance_run.h), const from then on.
struct RunOptions {
  /// Where every case's evidence goes: <evidence_root>/<spec>/<case>/, results.jsonl.
  std::filesystem::path evidence_root;
  /// Overrides every registration's matrix when not empty.
  std::string matrix;
  /// Assert on evidence produced elsewhere; launch nothing.
  bool verify_only = false;
  /// Verify-only: check evidence whose files no longer match the digests its case_run.json
  /// recorded (a deliberate edit, e.g. a mutation test). Off: such a case is exit 12.
  bool allow_edited_evidence = false;
  /// Verify-only: check evidence whose environment.json names another harness version
  /// (versions.mih) than this binary's. Off: such a case is exit 12, naming both versions.
  bool allow_other_version = false;
  /// `mih check`: judge the evidence without writing into it: no results.jsonl line, no
  /// compare/calibration.json (the verdicts are the output and the exit status).
  bool read_only = false;
  /// How long one case may take (all its launches), then every rank is stopped.
  std::chrono::milliseconds case_timeout{std::chrono::minutes(5)};
  /// How long one collective may wait before its rank fails (a transport failure, never a
  /// verdict). 0: the case timeout, so a hung rank is reported by the launcher's timeout.
  std::chrono::milliseconds collective_timeout{0};
  /// Progress lines on stderr.
  bool progress = true;
  /// Only this spec's cases (mih check of one case directory).
  std::string only_spec;
  /// Only these registrations (a binary that links more specs than it tests); an on-request
  /// registration runs only when named here.
  std::set<std::string> prefixes;
  /// Fault injection (the fault catalog, `mih faults`): the cases in fault_cases run with
  /// MIH_FAULT=<fault> in their rank processes; every other case runs fault-free.
  std::string fault;
  std::set<std::string> fault_cases;
  /// `--init-from DIR`: the checkpoint the run's one selected spec initializes from,
  /// overriding its CheckpointSpec::init_from. Empty: each spec's own (if any).
  std::filesystem::path init_from;
  /// `--golden DIR` (repeatable): golden directories (docs/golden.md), each for the spec its
  /// golden.json names (or the run's one selected spec), overriding the spec's GoldenSpec::dir.
  std::vector<std::filesystem::path> golden_dirs;
  /// `--no-golden`: no golden is read, not even a spec's own GoldenSpec::dir, so MatchesOriginal
  /// is instantiated nowhere; the run says kMatchesOriginalNotRun in its last lines and in its
  /// results' start line (every report's totals). Excludes golden_dirs.
  bool no_golden = false;
  /// The precision lane every matrix runs in (`--dtype`, `--seed`): its settings override
  /// those of a matrix source's own "@" suffix (matrix_of). Empty: the matrix's.
  Lane lane;
  /// Reduced-precision lanes: replaces the spec's noise_k when >= 0 (`--noise-k`).
  double noise_k = -1;
  /// `mih check` of a run root: the tests its run recorded it would run (results.jsonl's start
  /// lines), every one of which must be a test of this binary; empty otherwise.
  std::vector<std::string> recorded_tests;
  /// `mih test --shard i/N`: the run tests only the cases of share `shard_index` (1-based) of
  /// `shard_count` (cases::assign_shards over the cases the filter selects, so N runs of
  /// 1/N ... N/N test every selected case once); the references they compare with still run
  /// where needed. 0: the whole selection.
  int shard_index = 0;
  int shard_count = 0;
};
/// The options of the current run (ConformanceRun::current()), or the defaults when there is
/// none (a harness test binary).
const RunOptions& run_options();
/// Whether a run is current and prepared: the suites are instantiated only then (a harness
/// test binary that links the specs without running them instantiates nothing).
bool run_enabled();

/// Whether the run instantiates `r`'s tests (only_spec, prefixes, on_request).
bool selected(const Registration& r);
/// The checkpoint spec `spec`'s cases initialize from in this run (ConformanceRun::init_source),
/// or null (the seed's).
const InitSource* init_source_of(const std::string& spec);
/// The spec `name` as this run's cases see it: spec::initialized_from its init source, and its
/// golden directory the run's (ConformanceRun::golden) when it has one (what the suites'
/// applies() decide on).
/// Throws: as spec::SpecRegistry::get.
spec::ModelSpec spec_of_run(const std::string& name);

/// The text of the matrix source `r` runs (RunOptions::matrix when set), with
/// RunOptions::lane's settings over its own lane ("cpu-smoke@float32" with --seed 2:
/// "cpu-smoke@float32,seed=2"). Throws: as MatrixSource::parse.
std::string matrix_of(const Registration& r);
/// The case matrix of `spec` from `source`, resolved on first use and kept for the process:
/// every later question about a case (its config, compare_to, kind) reads this one value.
/// Throws: as spec::resolve_matrix_source.
const spec::CaseMatrix& resolved_matrix(const std::string& spec, const std::string& source);

/// The request of case `case_name` of `r` in this run, resolved once and kept by the run
/// (ConformanceRun::request; resolved afresh when no run is current): the case of
/// resolved_matrix(r.spec, matrix_of(r)), that matrix source, r's training backend, the run's
/// fault when the case is one of RunOptions::fault_cases, the checkpoint its spec starts from
/// (init_source_of), the run's timeouts and the fingerprint of all of them (case_fingerprint).
/// Every test of the case, and every case compared with it, reads this one value.
/// Throws: as resolved_matrix; as spec::CaseMatrix::at for a case the matrix does not hold.
std::shared_ptr<const CaseRequest> case_request(const Registration& r, const std::string& case_name);
/// The request of case `case_name` of the matrix, spec and training backend `of` was
/// resolved from (its Reference, noise twin or a resume's twin). Throws: as case_request.
std::shared_ptr<const CaseRequest> sibling_request(const CaseRequest& of, const std::string& case_name);
/// What case_request resolves (uncached): case `case_name` of spec `spec`'s matrix `source`
/// (a MatrixSource's text) for `training_backend`. Throws: as case_request.
CaseRequest resolve_case_request(const std::string& spec, const std::string& source, const std::string& training_backend,
                                 const std::string& case_name);

/// The cases of `r`'s resolved matrix its training backend can run, in matrix order (what the
/// suites are instantiated on and ctest registers). Throws: as resolved_matrix; kInvalidSpec
///   for an unknown training backend.
std::vector<const spec::Case*> runnable_cases(const Registration& r);

/// Why `r` runs none of the cases its matrix lists (spec::CaseMatrix::listed), or "" when it
/// runs one: each listed case the spec rejected, with the arithmetic, and each one its training
/// backend cannot run, with the backend's reason. The cases resolve_matrix adds (the
/// references, the noise twin, a resume's twin, an EP=1 control) check nothing the matrix asked
/// for, so a run of them alone is bad input, never a pass. Throws: as runnable_cases.
std::string why_no_listed_case(const Registration& r);

}  // namespace mih::cases
