// The conformance suites' side of a conformance binary (DESIGN.md section 3). A spec file
// registers the suites for its spec with one macro,
//
//   MIH_CONFORMANCE_SUITES(Llama, "llama", "cpu-smoke");
//
// which instantiates every suite of the suite table (suites/suite_table.h) on the cases of
// the matrix it applies to (a preset or a JSON matrix file; `--matrix` overrides it at run
// time), with test names like `Llama/NumericParity.LossMatchesReference/Tp2Sp` (filter with
// --gtest_filter='Llama/*.*/Tp2Sp'). Each case is launched once per evidence root and
// memoized (harness/cases/memo.h); in verify-only mode nothing is launched.
//
// Command line of a conformance binary (the runner is harness/cli; `--help` lists it):
//   <binary> [--evidence-root DIR] [--matrix PRESET|FILE] [--verify-only] [--case-timeout S]
//            [--prefixes P1,P2] [--no-progress] [--gtest_*]
//   <binary> worker <task> ...      a rank (what the launcher starts)
//   <binary> <mih subcommand> ...   the mih CLI (list, matrix, run, check, compare, report)
// Every test writes a line to <evidence root>/results.jsonl (the input of `mih report`).
//
// Exit status: 0 every test passed; 1 a conformance failure; 2 usage error; 11 bad input
// (unknown spec, preset or case, malformed matrix); 12 evidence missing or of another run;
// 14-17 infrastructure (a case timed out, a rank died), see harness/base/error.h.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "harness/base/error.h"
#include "harness/cases/conformance_run.h"
#include "harness/cases/memo.h"
#include "harness/cases/registrations.h"
#include "harness/compare/verdicts.h"
#include "harness/findings/codes.h"
#include "suites/suite_table.h"

namespace mih::conformance {

using cases::CaseParam;

/// The cases of registration `prefix` that suite `suite` applies to (empty unless this binary
/// runs as a conformance binary: the harness's own test binaries link the specs without
/// running them).
std::vector<CaseParam> cases_for(const std::string& prefix, const std::string& suite);
std::string param_name(const ::testing::TestParamInfo<CaseParam>& info);

/// Base of every suite: the case's evidence and that of the case it is compared with.
class ConformanceTest : public ::testing::TestWithParam<CaseParam> {
 protected:
  /// A case run with a fault of the catalog says so in every failure of its tests.
  void SetUp() override {
    const std::string& fault = request()->fault;
    if (!fault.empty()) {
      fault_trace_.emplace(__FILE__, __LINE__,
                           "fault " + fault + " is injected in this case's ranks (--fault): the catalog's bug, not the port's");
    }
  }
  /// The case's evidence. Fails the test (and returns null) when the case did not run to the
  /// end: a transport failure is reported as infrastructure, not as a verdict.
  const verdicts::CaseEvidence* evidence();
  /// The evidence of the case this one is compared with (the reference, a resume's twin).
  /// Fails the test (and returns null) when the case is compared with nothing.
  const verdicts::CaseEvidence* compared();
  /// The evidence of the named case of the same matrix (launched if needed).
  const verdicts::CaseEvidence* other(const std::string& case_name);
  /// The train case of this matrix with this case's config and activation checkpointing off
  /// ("" when the matrix has none).
  std::string without_activation_checkpointing();
  /// The case's request, as the run resolved it (its case, matrix source, fault, ...).
  const std::shared_ptr<const CaseRequest>& request() const { return GetParam().request; }
  /// The resolved case.
  const spec::Case& resolved_case();
  /// verdicts::parity of `quantity` of `candidate` against `target` from step `first_step`: at
  /// the spec's tolerance for the dtype, or in a reduced-precision lane at the tolerances
  /// calibrated from the lane's reference and noise twin (launched if needed; a failure when
  /// either could not run). `record`: write the comparison to the candidate's
  /// compare/calibration.json (the comparison with its compare_to case only).
  /// Throws: as verdicts::parity and verdicts::lane_calibration.
  verdicts::Verdict parity(const verdicts::CaseEvidence& target, const verdicts::CaseEvidence& candidate,
                           verdicts::Quantity quantity, int64_t first_step = 0, bool record = true);

 private:
  /// The evidence of the case `request` names (launched if needed), or null after a failure
  /// saying why (evidence()'s and other()'s rules).
  const verdicts::CaseEvidence* of(const CaseRequest& request);
  std::optional<::testing::ScopedTrace> fault_trace_;
};

// The suites: one class per MIH_SUITES entry; each defines applies(), where() and reads()
// (MIH_SUITE_READS or MIH_SUITE_READS_NONE, harness/compare/suite_reads.h) in its file.
#define MIH_DECLARE_SUITE_(unused, Suite)         \
  class Suite : public ConformanceTest {          \
   public:                                        \
    static bool applies(const SuiteContext& s);   \
    static const char* where();                   \
    static const verdicts::SuiteReads* reads();   \
  };
MIH_SUITES(MIH_DECLARE_SUITE_, _)
#undef MIH_DECLARE_SUITE_

}  // namespace mih::conformance

/// Asserts a verdict in a TEST_P body: pass, or FAIL with the message. A verdict that skips
/// is a failure here (the suite table decides where a suite runs; a test never skips), and
/// an exception (a missing evidence file) fails the test with its message.
#define MIH_ASSERT_VERDICT(expr)                                                            \
  do {                                                                                      \
    ::mih::verdicts::Verdict mih_v_;                                                        \
    try {                                                                                   \
      mih_v_ = (expr);                                                                      \
    } catch (const ::mih::Error& mih_e_) {                                                  \
      ::mih::cases::note_error(mih_e_.code());                                              \
      FAIL() << mih_e_.what();                                                              \
    } catch (const std::exception& mih_e_) {                                                \
      FAIL() << mih_e_.what();                                                              \
    }                                                                                       \
    if (mih_v_.status == ::mih::verdicts::Verdict::Status::kSkip)                           \
      FAIL() << "nothing to check on this case, yet the suite table applies the suite here: " \
             << mih_v_.message;                                                             \
    if (mih_v_.status == ::mih::verdicts::Verdict::Status::kFail) FAIL() << mih_v_.message; \
    if (!mih_v_.message.empty()) ::testing::Test::RecordProperty("examined", mih_v_.message); \
  } while (false)

/// The case's evidence, or return (the failure is already reported).
#define MIH_CASE_EVIDENCE(var)                            \
  const ::mih::verdicts::CaseEvidence* var = evidence();  \
  if (!var) return

/// The evidence of the case it is compared with, or return.
#define MIH_COMPARED_EVIDENCE(var)                        \
  const ::mih::verdicts::CaseEvidence* var = compared();  \
  if (!var) return

#define MIH_CONFORMANCE_INSTANTIATE_(Prefix, Suite)                                                  \
  INSTANTIATE_TEST_SUITE_P(Prefix, Suite, ::testing::ValuesIn(::mih::conformance::cases_for(#Prefix, #Suite)), \
                           ::mih::conformance::param_name);

/// Registers the spec and instantiates every suite of the suite table for it over `matrix`
/// (a preset or a JSON file), trained by the TrainingBackend `training_backend`. One line per
/// spec, at global namespace scope (it opens namespace mih::conformance, where the suites
/// live).
#define MIH_CONFORMANCE_SUITES_REGISTER_(Prefix, spec, matrix, training_backend, on_request)  \
  namespace mih::conformance {                                                                \
  static const bool mih_conformance_registered_##Prefix =                                     \
      ::mih::cases::add_registration({#Prefix, spec, matrix, training_backend, on_request}); \
  MIH_SUITES(MIH_CONFORMANCE_INSTANTIATE_, Prefix)                                            \
  }  /* namespace mih::conformance */                                                         \
  static_assert(true, "")

/// Like MIH_CONFORMANCE_SUITES, trained by the TrainingBackend registered as
/// `training_backend` (MIH_REGISTER_TRAINING_BACKEND, harness/session/backend.h) instead of
/// mih's Trainer.
#define MIH_CONFORMANCE_SUITES_WITH_BACKEND(Prefix, spec, matrix, training_backend) \
  MIH_CONFORMANCE_SUITES_REGISTER_(Prefix, spec, matrix, training_backend, false)

/// Instantiates every suite of the suite table for the registered spec named `spec` (a
/// string: ModelSpec::name, registered with MIH_REGISTER_SPEC) over `matrix` (a preset such as
/// "cpu-smoke", or a JSON matrix file; `--matrix` overrides it at run time), trained by mih's
/// Trainer. `Prefix` (an identifier, UpperCamelCase by convention) starts every test name:
/// `Prefix/<Suite>.<Invariant>/<Case>`. Once per spec, at global namespace scope.
/// Example: MIH_CONFORMANCE_SUITES(MyPort, "my_port", "cpu-smoke");
#define MIH_CONFORMANCE_SUITES(Prefix, spec, matrix) MIH_CONFORMANCE_SUITES_WITH_BACKEND(Prefix, spec, matrix, "trainer")

/// Like MIH_CONFORMANCE_SUITES, but the suites are instantiated only when the run names the
/// prefix (`--prefixes Prefix`): a spec variant that is not part of the default matrix, like
/// the fault catalog's (`mih faults`).
#define MIH_CONFORMANCE_SUITES_ON_REQUEST(Prefix, spec, matrix) \
  MIH_CONFORMANCE_SUITES_REGISTER_(Prefix, spec, matrix, "trainer", true)
