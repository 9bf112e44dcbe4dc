// The conformance run of this process (`mih test`, `mih check`, a conformance binary's main):
// its options, set once by the command line and const afterwards; what it resolves once
// before any test runs (every selected registration's matrix, the checkpoint each spec starts
// from, the golden each spec is compared with); the results writer (results.jsonl); the case
// states after the tests; and the exit status, which the memoized cases (memo.h) and the
// suites report their errors to. harness/cli only parses flags into RunOptions and dispatches.
#pragma once

#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "harness/base/error.h"
#include "harness/cases/registrations.h"

namespace mih::cases {

class ConformanceRun {
 public:
  /// Makes `options` this process's run (run_options() reads them until the run ends).
  /// `options.evidence_root` is absolute (the command line chose it) and `options.fault` a
  /// catalog name.
  /// Throws: mih::Error{kInternal} when another run is current.
  explicit ConformanceRun(RunOptions options);
  ~ConformanceRun();
  ConformanceRun(const ConformanceRun&) = delete;
  ConformanceRun& operator=(const ConformanceRun&) = delete;

  /// The run of this process, or null (a harness test binary that links the specs and runs
  /// none of their tests).
  static ConformanceRun* current();

  const RunOptions& options() const { return options_; }

  /// Everything a run checks before any test runs, in this order: --fault goes with
  /// --fault-cases; the evidence root exists (verify-only) or is created writable; every
  /// selected registration's matrix resolves (its rejections said) and lists a case it can
  /// run; every --fault-cases name is a selected case; the checkpoint each spec starts from
  /// fits its port; the goldens are read and, where `golden_compared(spec)` (a MatchesOriginal
  /// test of the spec is selected), checked against this run's export. `listing`
  /// (--gtest_list_tests): no directory is created and no checkpoint or golden tensor is read.
  /// Throws: mih::Error{kInvalidSpec} for bad input (a matrix, a case name, a checkpoint that
  ///   does not fit), kFailedPrecondition for a missing or unwritable root or golden.
  void prepare(bool listing, const std::function<bool(const std::string& spec)>& golden_compared);
  /// Whether prepare() completed: the suites are instantiated only then.
  bool prepared() const { return prepared_; }

  /// Runs GoogleTest with `gtest_flags` (InitGoogleTest, the results writer and the diagnosis
  /// printer, RUN_ALL_TESTS), then records each complete case's integration state, and
  /// returns the run's exit status (README "Exit codes"): a run that selected no test is
  /// kInvalidSpec, naming what exists; `mih check` of a run root that recorded tests this
  /// binary does not have is kFailedPrecondition.
  int execute(const std::vector<std::string>& gtest_flags);

  /// The checkpoint spec `spec`'s cases initialize from in this run, or null (the seed's).
  const InitSource* init_source(const std::string& spec) const;
  /// Spec name -> the checkpoint its cases start from (prepare()).
  const std::map<std::string, InitSource>& init_sources() const { return init_sources_; }
  /// The golden directory spec `spec` is compared with in this run ("" : none, its own
  /// dropped), or null: the spec's own GoldenSpec::dir.
  const std::filesystem::path* golden(const std::string& spec) const;

  /// The request of case `case_name` of spec `spec`'s matrix `source` for `training_backend`
  /// in this run (resolve_case_request), resolved on first use and kept until the run ends.
  /// Thread-safe. Throws: as resolve_case_request.
  std::shared_ptr<const CaseRequest> request(const std::string& spec, const std::string& source,
                                             const std::string& training_backend, const std::string& case_name) const;

  /// An error that is not a verdict (bad evidence, a case that could not run): the exit
  /// status takes it (note_error, below).
  void note_error(Code code);
  /// A case that did not complete (a transport failure): the exit status takes its code first.
  void note_infrastructure(Code code);
  void count_launch() { ++cases_launched_; }
  int cases_launched() const { return cases_launched_; }
  /// The exit status given GoogleTest's `gtest_rc`: infrastructure first, then bad input or
  /// evidence, then 1 for a failed test, else 0.
  int exit_status(int gtest_rc) const;

 private:
  /// The checkpoint each selected spec's cases start from (prepare()); `read_checkpoints`:
  /// check each against its port (off for verify-only runs and listings).
  void resolve_init_sources(bool read_checkpoints);

  const RunOptions options_;
  bool prepared_ = false;
  std::map<std::string, InitSource> init_sources_;
  std::map<std::string, std::filesystem::path> goldens_;
  bool infrastructure_failed_ = false;
  Code infrastructure_code_ = Code::kOk;
  Code input_code_ = Code::kOk;
  int cases_launched_ = 0;
  mutable std::mutex requests_mu_;
  mutable std::map<std::string, std::shared_ptr<const CaseRequest>> requests_;
};

/// Records `code` in the current run (ConformanceRun::note_error); nothing without one.
void note_error(Code code);

/// The registrations of the run with their cases and rejected cases, for a run that selected
/// nothing: "  Llama (spec llama, matrix cpu-smoke): Reference, DpShard2, ...".
std::string what_exists();

}  // namespace mih::cases
