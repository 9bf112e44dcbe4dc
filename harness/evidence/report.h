// The report of a conformance run (`mih report <run root> --format md|junit|html`): reads the
// run root the conformance runner writes (results.jsonl, one line per GoogleTest test, and the
// case directories next to it) and renders it as Markdown, JUnit XML for CI, or one
// self-contained HTML page with the loss and grad-norm curves of every case. No torch.
#pragma once

#include <cstdint>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "harness/contract/case_outcome.h"
#include "harness/contract/case_record.h"
#include "harness/base/parallel_config.h"

namespace mih {

enum class ReportFormat { kMarkdown, kJunit, kHtml };

/// "md", "junit" or "html".
/// Throws: mih::Error{kInvalidSpec} for another name, listing the valid ones.
ReportFormat parse_report_format(const std::string& name);

/// One GoogleTest test of the run: the last line of results.jsonl with its `name`.
struct TestResult {
  std::string spec;       ///< "llama"; "" for a test that belongs to no spec
  std::string case_name;  ///< "DpShard2"; "" for a test that is not parameterized by a case
  std::string suite;      ///< "NumericParity"
  std::string test;       ///< "LossMatchesReference"
  std::string name;       ///< the full GoogleTest name, "Llama/NumericParity.LossMatchesReference/DpShard2"
  TestStatus status = TestStatus::kPassed;
  std::string message;    ///< failure or skip text, possibly several lines; "" when passed
  std::string evidence;   ///< the case directory relative to the run root, "llama/DpShard2"; may be ""
  std::string time;       ///< when the line was written, ISO 8601 UTC ("2026-11-30T11:00:00Z"); may be ""
  double seconds = 0;     ///< the test's wall time
};

/// One training step of a case (a line of cases/runtime/metrics.jsonl). NaN marks a value
/// the line lacks or that was not finite (JSON writes NaN and inf as null).
struct StepPoint {
  int64_t step = 0;
  double loss = std::numeric_limits<double>::quiet_NaN();
  double grad_norm_pre_clip = std::numeric_limits<double>::quiet_NaN();
};

/// One quantity of a calibrated comparison (a reduced-precision lane's compare/calibration.json,
/// verdicts.h calibration_evidence): errors relative to the reference's scale; NaN where the
/// file has null (a noise the twin did not record).
struct CalibrationRow {
  std::string kind;  ///< "metric", "tensor", "activation"
  std::string name;
  int64_t step = 0;
  std::string stage;
  double error = 0, noise = 0, tolerance = 0;
};

/// A case's calibration in a reduced-precision lane; `present` false for every other case.
struct CaseCalibration {
  bool present = false;
  std::string dtype, reference, worst;
  double epsilon = 0, master_epsilon = 0, k = 0, k_update = 0, floor_eps = 0, factor = 1;
  double max_error_over_tolerance = 0;
  std::vector<CalibrationRow> rows;
};

/// A case's comparison with goldens of the original model (compare/golden.json, the
/// MatchesOriginal suite); `present` false for every other case.
struct CaseGolden {
  bool present = false;
  bool passed = false;
  std::string implementation;  ///< "builtin 1 (llama; torch 1.13.0a0)"
  std::string worst;           ///< the quantity of the largest error / tolerance
  double max_error_over_tolerance = 0;
  /// Per kind (loss, logits, hidden_states, gradients, parameters_after_step): the largest
  /// relative error against the golden.
  std::map<std::string, double> largest_relative_error;
  size_t quantities = 0;
};

/// One case of the run, from its evidence directory. Every field read from a file is empty
/// (or 0) when that file is missing: a case that failed early has only some of them.
struct CaseResult {
  std::string spec;      ///< "llama"
  std::string name;      ///< "DpShard2"
  std::string evidence;  ///< the directory relative to the run root, from the tests' `evidence`
  /// case_run.json as its run wrote it (read by CaseRecord's from_json: kind, compare_to,
  /// outcome, error, fault, world size, seconds, timing, matrix, init_from, backend, ...);
  /// nullopt when the case has none (an outside launcher ran it) or one that does not read
  /// (said in `problems`).
  std::optional<CaseRecord> record;
  /// A case without a record of a `mih submit` night whose job did not complete: why
  /// (describe_job_failure); its outcome is transport_failure. "" otherwise.
  std::string failed_job;
  // run/case.json (the case as the parent resolved it): what the matrix diagnosis reads, and
  // the kind and fault of a case without a record.
  std::string requested_kind;   ///< its case's "kind"
  std::string requested_fault;  ///< its "fault"
  std::optional<ParallelConfig> config;       ///< what it trains under (a resume: after the load)
  std::optional<ParallelConfig> save_config;  ///< a resume's config before the save
  // integration_state.json
  std::string state;         ///< "STRUCTURE_VALIDATED", "FAILED", ...
  std::string state_reason;  ///< the state's `reason`
  /// cases/runtime/metrics.jsonl, ascending by step; the last line of a step wins (a resume
  /// that repeats a step). Empty when the file is missing (the case failed before training).
  std::vector<StepPoint> steps;
  /// compare/calibration.json (a case of a reduced-precision lane compared at calibrated
  /// tolerances); not present otherwise.
  CaseCalibration calibration;
  /// compare/golden.json (the Reference of a spec with goldens of the original model).
  CaseGolden golden;
  /// What could not be read, each "<path>: <why>": an evidence file that is not JSON (or a
  /// metrics line), an evidence directory that does not exist or that no test names. The
  /// report shows them instead of failing as a whole.
  std::vector<std::string> problems;

  /// The record's outcome; transport_failure for a failed night job; nullopt for neither (an
  /// outside launcher ran it).
  std::optional<Outcome> outcome() const;
  /// Why the case did not run to the end (the record's error, the night job's failure), or "".
  std::string error() const;
  /// The fault of the catalog injected into the case's ranks ("F20"; the record's, else
  /// run/case.json's); "" for a fault-free case. Such a case is never a pass of the port.
  std::string fault() const;
  /// "train", ... (the record's, else run/case.json's); "" when neither says.
  std::string kind() const;
  /// The case of the same spec this one is compared with ("Reference"; the record's); "" for none.
  std::string compare_to() const;
};

/// Everything a report shows about one run root.
struct RunResults {
  std::filesystem::path root;
  /// One per test name, sorted by name (so by spec instance, suite, test, case).
  std::vector<TestResult> tests;
  /// One per (spec, case_name) named by a test with a case, sorted by spec then name.
  std::vector<CaseResult> cases;
  /// Tests the run's processes set out to run (their "run" start lines); -1 when the file has
  /// none (written before mih recorded them).
  int expected_tests = -1;
  /// "" for a complete run; else "incomplete: K of N tests (why; the fix)", the first words of
  /// every report's summary.
  std::string incomplete;
  /// What the run left out on purpose, said in every report's totals ("MatchesOriginal not
  /// run: --no-golden"): the last start line's "not_run".
  std::vector<std::string> not_run;

  int passed() const;
  int failed() const;
  int skipped() const;
  /// The case `name` of `spec`, or nullptr when the run has none.
  const CaseResult* find_case(const std::string& spec, const std::string& name) const;
};

/// Reads `root`/results.jsonl and the evidence directories of the cases its tests name.
/// Blank lines are skipped; a last line without its newline that is not JSON (a writer that
/// died mid-line) is dropped. Missing fields spec, case, suite and test are taken from `name`
/// ("<Instance>/<Suite>.<Test>/<Case>"; spec stays "" then).
/// Throws: mih::Error{kFailedPrecondition} naming the path when `root` or results.jsonl does
///   not exist, with the fix (run the conformance binary or scripts/conformance with
///   --evidence-root <root> first); kFailedPrecondition (bad evidence, exit 12) naming the
///   file and the 1-based line for a line that is not a JSON object, lacks `name` or
///   `status`, has a status other than passed/failed/skipped, or a field of the wrong type
///   (`seconds` a non-negative number, the others strings). A case file that cannot be read is
///   recorded in CaseResult::problems.
RunResults read_run_results(const std::filesystem::path& root);

/// Why `run` is not a pass, one line each; empty when it is one: some test finished, none
/// failed, the run is complete, and every case ran fault-free (no fault in its record) to an
/// integration state other than FAILED or BLOCKED, with readable evidence and an outcome of
/// "ran" or "verify_only" (or no case_run.json: launched by an outside launcher).
std::vector<std::string> not_passed_reasons(const RunResults& run);

/// Renders `run`. Text is made safe for the format: invalid UTF-8 and the control characters
/// XML 1.0 forbids (all below U+0020 but tab, newline and carriage return) become U+FFFD;
/// markup characters are escaped. Every format states the verdict (not_passed_reasons): the
/// Markdown and HTML pages under the totals ("Verdict: PASSED", or "Verdict: NOT PASSED"
/// and each reason), and JUnit as a failed <testcase name="<case>"> of <testsuite
/// name="<spec>.CaseRecord"> for each case whose record says FAILED, BLOCKED or names a
/// fault while no test of it failed, so that a CI reading only JUnit is not green either.
///  - kMarkdown: title with the root, totals, per spec a suites x cases table ("pass", "FAIL",
///    "skip", "-" when the suite has no test for the case; a cell is FAIL if any of its tests
///    failed, else pass if any passed), the cases to look at (an outcome other than "ran", state
///    FAILED or BLOCKED, unreadable evidence), every failed test with its evidence directory
///    and message in a fenced block, then the skipped tests with the first line of the reason.
///  - kJunit: JUnit XML valid against tests/evidence/junit.xsd (the subset of the Jenkins
///    xunit-plugin junit-10.xsd and Ant schema that mih emits): one <testsuite> per (spec,
///    suite) named "llama.NumericParity", a <testcase> per test named "<test>/<case>". A
///    failed test of a case whose outcome is "transport_failure" is an <error
///    type="transport_failure"> (counted in `errors`), never a conformance <failure>.
///    <testsuites> carries no `skipped`: junit-10.xsd rejects it there (it is on each
///    <testsuite>). Timestamps are UTC without a zone suffix, as the Ant schema requires.
///  - kHtml: one self-contained page (inline CSS and SVG, no script, no external resource):
///    totals, the colored tables, per case its facts and two SVG line charts (loss and
///    grad_norm_pre_clip per step, min/max on the axes), with the `compare_to` case's curve
///    dashed when that case is in the run, then the failures and the skipped tests.
///  A case of a reduced-precision lane (compare/calibration.json) adds its calibration: the
///  dtype, k and floor and the largest error / tolerance, then in Markdown a stage x step
///  table of the largest error / tolerance and error / noise, and in HTML a heat map of error /
///  tolerance per quantity (rows) and step and stage (columns), each cell titled with its
///  error, noise and tolerance.
std::string render_report(const RunResults& run, ReportFormat format);

}  // namespace mih
