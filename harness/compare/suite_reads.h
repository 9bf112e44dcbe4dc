// What each conformance suite's verdicts read of a case, declared once beside the suite, so that
// a case of any writer is judged by every suite whose evidence it holds, through the same
// verdicts as mih's own cases: `mih check` of another writer's evidence (harness/cases/
// foreign_check.h) instantiates, per case, every suite of the suite table whose files the case
// (and the case it is compared with) holds, and names the files the others need.
//
// A suite declares its reads in its own file (suites/<suite>.cpp):
//
//   MIH_SUITE_READS(InputIdentity, {.files = {layout::kInputIdentity},
//                                   .reference_files = {layout::kInputIdentity},
//                                   .tests = {{"SameGlobalBatchAsReference", &same_inputs}}});
//
// A suite that declares none judges records only mih's session writes (its checks' findings,
// its runtime's records) or a spec's declarations, which no other writer's evidence holds.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "harness/compare/verdicts.h"

namespace mih::verdicts {

/// A case as a suite's verdict judges it, whoever wrote it.
struct JudgedCase {
  const CaseEvidence& ev;
  const CaseEvidence* reference = nullptr;  ///< the case it is compared with; null when none
  double tolerance = 0;                     ///< NumericParity's relative tolerance for its dtype
  int64_t first_step = 0;                   ///< the step it starts at (a resumed run's load)
};

/// One test of a suite: its name (the suite's TEST_P) and the verdict it asserts.
using JudgedTest = std::pair<std::string, Verdict (*)(const JudgedCase&)>;

struct SuiteReads {
  /// Files relative to the case directory its verdicts read; "<k>" stands for any step
  /// (cases/runtime/replicas_step<k>.json: some step's).
  std::vector<std::string> files = {};
  /// Files of the case it is compared with (empty: it is compared with nothing).
  std::vector<std::string> reference_files = {};
  /// Beyond the files, whether they hold something to examine: "" when they do, else what is
  /// missing in words (no parameter piece held by two ranks). Null: the files suffice.
  std::string (*examinable)(const JudgedCase&) = nullptr;
  std::vector<JudgedTest> tests = {};
};

/// Declares `suite`'s reads (MIH_SUITE_READS, at static initialization). Returns true.
/// Throws: mih::Error{kInternal} when the suite declared its reads already.
bool declare_suite_reads(const std::string& suite, SuiteReads reads);
/// The reads `suite` declared; null when it declared none.
const SuiteReads* suite_reads(const std::string& suite);

/// Declares the suites of the suite table in its order (suites/suite_table.cpp, at static
/// initialization). Returns true.
bool declare_suite_names(std::vector<std::string> names);
/// The suites of the suite table in its order; empty in a binary that links no suite.
const std::vector<std::string>& suite_names();

/// The "<k>" pattern of a per-step file of the evidence layout (layout::replicas_step:
/// "cases/runtime/replicas_step<k>.json"), for SuiteReads::files.
std::string any_step(std::string (*step_file)(int64_t));

/// The declared files `c` lacks, as "<path> (of the case|of its reference)"; empty when it
/// holds every one (a "<k>" file: some step's).
std::vector<std::string> missing_reads(const SuiteReads& reads, const JudgedCase& c);

}  // namespace mih::verdicts

/// Declares the evidence suite `Suite`'s verdicts read (see above); once, in the suite's file,
/// inside namespace mih::conformance.
#define MIH_SUITE_READS(Suite, ...)                  \
  static const bool mih_suite_reads_##Suite##_ = \
      ::mih::verdicts::declare_suite_reads(#Suite, ::mih::verdicts::SuiteReads __VA_ARGS__)
