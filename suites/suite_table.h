// The suite table: every conformance suite, once, with where it applies. The table drives the
// instantiation (a suite is instantiated only on the cases it applies to, so a run has no
// skipped test) and the ctest labels of each case (cmake/MihConformance.cmake).
//
// How to add a suite: write suites/<snake_name>.cpp with
//
//   bool MySuite::applies(const SuiteContext& s) { return s.c.config.tp > 1; }
//   const char* MySuite::where() { return "cases with tp > 1"; }
//   MIH_SUITE_READS_NONE(MySuite);
//   TEST_P(MySuite, SomethingHolds) {
//     MIH_CASE_EVIDENCE(ev);
//     MIH_ASSERT_VERDICT(verdicts::no_error_findings(*ev, {codes::kMyCode}));
//   }
//
// add it to suites/CMakeLists.txt and add `X(arg, MySuite)` to MIH_SUITES below. A suite whose
// verdicts judge files another writer can write too declares them instead of
// MIH_SUITE_READS_NONE (MIH_SUITE_READS(MySuite, {.files = ..., .tests = ...}),
// harness/compare/suite_reads.h), and `mih check` then judges every foreign case holding them
// through the same verdicts. Every TEST_P of a
// suite runs on the same cases: a test that applies elsewhere belongs to another suite. A code
// must be in codes::kAllCodes with the check that emits it, and that check must record its run
// (FindingReport::ran, with what it examined): no_error_findings fails when the check left no
// record or examined nothing on the case, so apply the suite only where it has something to
// examine. tests/conformance/suites_can_fail.py must then show an input on which each new
// TEST_P fails (a fault of the catalog, or a mutation of real evidence).
#pragma once

#include <string>
#include <vector>

#include "harness/compare/suite_reads.h"
#include "harness/spec/case_matrix.h"
#include "harness/spec/model_spec.h"

/// The suites, in report order: X(arg, Name) per suite (`arg` is passed through).
#define MIH_SUITES(X, arg) \
  X(arg, Structure) \
  X(arg, TiedParameters) \
  X(arg, FsdpUnits) \
  X(arg, OptimizerLayout) \
  X(arg, FrozenParameters) \
  X(arg, DataContract) \
  X(arg, PipelineOutputs) \
  X(arg, InputIdentity) \
  X(arg, TensorParallelInputs) \
  X(arg, CpReplicatedInputs) \
  X(arg, CheckpointCoverage) \
  X(arg, SourceCheckpoint) \
  X(arg, CheckpointRoundTrip) \
  X(arg, DataLoaderState) \
  X(arg, Resume) \
  X(arg, SharedState) \
  X(arg, UndeclaredSharedState) \
  X(arg, ModalityGradients) \
  X(arg, StateInvariants) \
  X(arg, ModuleParity) \
  X(arg, MatchesOriginal) \
  X(arg, NumericParity) \
  X(arg, GradientSync) \
  X(arg, GradientPresence) \
  X(arg, TensorParallelGradients) \
  X(arg, ReplicaConsistency) \
  X(arg, ActivationCheckpointEquivalence) \
  X(arg, CommVolume) \
  X(arg, PipelineSchedule)

namespace mih::conformance {

/// What a suite's applies() decides on: the spec and one resolved case of its matrix.
struct SuiteContext {
  const spec::ModelSpec& spec;
  const spec::Case& c;
};

struct SuiteRow {
  std::string name;
  /// Whether the suite has something to check on this case of this spec.
  bool (*applies)(const SuiteContext&);
  /// Where it applies, in words ("cases with dp_shard > 1").
  const char* (*where)();
  /// The evidence its verdicts read (MIH_SUITE_READS or MIH_SUITE_READS_NONE in its file,
  /// harness/compare/suite_reads.h),
  /// by which `mih check` judges a case of another writer holding those files; null when it
  /// judges records only mih's session writes or a spec's declarations.
  const verdicts::SuiteReads* (*reads)();
};

/// Every suite of MIH_SUITES, in order.
const std::vector<SuiteRow>& suite_table();
/// Every suite of the table with its declared reads, in order: what `mih check` of another
/// writer's evidence instantiates (harness/cases/foreign_check.h).
std::vector<verdicts::DeclaredReads> declared_reads();
/// The row of `name`. Throws: mih::Error{kInternal} for a name not in the table.
const SuiteRow& suite_row(const std::string& name);

}  // namespace mih::conformance
