// What each conformance suite's verdicts read of a case, declared once beside the suite, so that
// a case of any writer is judged by every suite whose evidence it holds, through the same
// verdicts as mih's own cases: `mih check` of another writer's evidence (harness/cases/
// foreign_check.h) instantiates, per case, every suite of the suite table whose files the case
// (and the case it is compared with) holds, and names the files the others need.
//
// Every suite declares its reads in its own file (suites/<suite>.cpp), beside applies() and
// where():
//
//   MIH_SUITE_READS(InputIdentity, {.files = {layout::kInputIdentity},
//                                   .reference_files = {layout::kInputIdentity},
//                                   .tests = {{"SameGlobalBatchAsReference", &same_inputs}}});
//
// A suite whose verdicts read only records mih's session writes (its checks' findings, its
// runtime's records) or a spec's declarations, which no other writer's evidence holds, says so:
// MIH_SUITE_READS_NONE(Structure);
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

/// A suite of the suite table and what its verdicts read (null: it judges only mih's session
/// records or a spec's declarations). `mih check` gets these, in the table's order, from its
/// caller (the command, which links the suites: suites/suite_table.h), never from a registry.
struct DeclaredReads {
  std::string suite;
  const SuiteReads* reads = nullptr;
};

/// The "<k>" pattern of a per-step file of the evidence layout (layout::replicas_step:
/// "cases/runtime/replicas_step<k>.json"), for SuiteReads::files.
std::string any_step(std::string (*step_file)(int64_t));

/// The declared files `c` lacks, as "<path> (of the case|of its reference)"; empty when it
/// holds every one (a "<k>" file: some step's).
std::vector<std::string> missing_reads(const SuiteReads& reads, const JudgedCase& c);

}  // namespace mih::verdicts

/// Defines `Suite::reads()` (suites/conformance.h declares it for every suite): the evidence
/// its verdicts read (see above). Once, in the suite's file, inside namespace mih::conformance,
/// followed by a semicolon.
#define MIH_SUITE_READS(Suite, ...)                                    \
  const ::mih::verdicts::SuiteReads* Suite::reads() {                  \
    static const ::mih::verdicts::SuiteReads mih_reads_ __VA_ARGS__; \
    return &mih_reads_;                                                \
  }                                                                    \
  static_assert(true, "")
/// Defines `Suite::reads()` as null: the suite judges only what mih's session writes (its
/// checks' findings, its runtime's records) or a spec's declarations, which no other writer's
/// evidence holds; `mih check` names it so.
#define MIH_SUITE_READS_NONE(Suite)                                                      \
  const ::mih::verdicts::SuiteReads* Suite::reads() { return nullptr; }                 \
  static_assert(true, "")
