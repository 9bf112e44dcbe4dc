// The conformance runner (DESIGN.md section 3): the GoogleTest side of a conformance binary.
// A spec file registers the suites for its spec with one macro,
//
//   MIH_CONFORMANCE_SUITES(Llama, "llama", "cpu-smoke");
//
// which instantiates every suite of suites/suites.cpp over the cases of the matrix (a preset
// or a JSON matrix file; `--matrix` overrides it at run time), with test names like
// `Llama/NumericParity.LossMatchesReference/Tp2Sp` (filter with --gtest_filter='Llama/*.*/Tp2Sp').
// Each case is launched once per evidence root and memoized: the first TEST_P that needs it
// (or its reference, or a resume's uninterrupted twin) launches it under a file lock, later
// ones, in this process or another (ctest runs one process per case), read its evidence.
// In verify-only mode nothing is launched: the suites assert on an evidence root produced
// elsewhere (torchrun/srun on a GPU cluster).
//
// Command line of a conformance binary (mih flags first, the rest to GoogleTest):
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

#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "harness/base/error.h"
#include "harness/compare/verdicts.h"

namespace mih::conformance {

struct Options {
  /// Default: build/mih-evidence/<run id> (MIH_EVIDENCE_ROOT overrides).
  std::filesystem::path evidence_root;
  /// Overrides every registration's matrix when not empty.
  std::string matrix;
  bool verify_only = false;
  double case_timeout_s = 300;
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
};
Options& options();

/// One MIH_CONFORMANCE_SUITES line.
struct Registration {
  std::string prefix;   ///< GoogleTest instantiation prefix ("Llama")
  std::string spec;     ///< registered spec name
  std::string matrix;   ///< preset or JSON matrix file
  std::string backend;  ///< TrainingBackend name
  /// Instantiated only when --prefixes names it (a spec variant of the fault catalog).
  bool on_request = false;
};
bool add_registration(Registration r);
const std::vector<Registration>& registrations();

/// The parameter of every conformance TEST_P: one case of one registration.
struct CaseParam {
  std::string prefix, spec, matrix, backend, case_name;
};
void PrintTo(const CaseParam& p, std::ostream* os);
/// The cases of the registration `prefix` (empty unless this binary runs as a conformance
/// binary: the test binaries of the harness link the specs without running them).
std::vector<CaseParam> cases_for(const std::string& prefix);
std::string param_name(const ::testing::TestParamInfo<CaseParam>& info);

/// A case's evidence, launched once per evidence root (see the file comment).
struct CaseOutcome {
  std::filesystem::path evidence;
  std::string outcome;  ///< "ran", "failed", "transport_failure", "verify_only"
  std::string error;
  Code code = Code::kOk;
  double seconds = 0;
  bool launched_here = false;
};
/// Throws: mih::Error{kInvalidSpec} for an unknown spec, matrix or case;
///   kFailedPrecondition when verify-only evidence is missing or belongs to another case.
const CaseOutcome& ensure_case(const CaseParam& p);

/// Records an error that is not a verdict (bad evidence, a case that could not run) for the
/// exit status: infrastructure (transport) first, then bad input or evidence, then 1.
void note_error(Code code);

/// Base of every suite: the case's evidence and that of the case it is compared with.
class ConformanceTest : public ::testing::TestWithParam<CaseParam> {
 protected:
  /// The case's evidence. Fails the test (and returns null) when the case did not run to the
  /// end: a transport failure is reported as infrastructure, not as a verdict.
  const verdicts::CaseEvidence* evidence();
  /// The evidence of the case this one is compared with (the reference, a resume's twin);
  /// null (test skipped by the caller) for the reference itself.
  const verdicts::CaseEvidence* compared();
  /// The evidence of the named case of the same matrix (launched if needed).
  const verdicts::CaseEvidence* other(const std::string& case_name);
  /// The train case of this matrix with this case's config and activation checkpointing off.
  std::string without_activation_checkpointing();
  /// ResolvedCase fields of the matrix.
  std::string compare_to();
  std::string kind();
};

/// The main() of a conformance binary; with tests_by_default false (the `mih` command) no
/// argument prints the CLI's help instead of running the suites.
int conformance_main(int argc, char** argv, bool tests_by_default);

}  // namespace mih::conformance

/// Asserts a verdict in a TEST_P body: pass, GTEST_SKIP with the reason, or FAIL with the
/// message. An exception (a missing evidence file) fails the test with its message.
#define MIH_ASSERT_VERDICT(expr)                                                            \
  do {                                                                                      \
    ::mih::verdicts::Verdict mih_v_;                                                        \
    try {                                                                                   \
      mih_v_ = (expr);                                                                      \
    } catch (const ::mih::Error& mih_e_) {                                                  \
      ::mih::conformance::note_error(mih_e_.code());                                        \
      FAIL() << mih_e_.what();                                                              \
    } catch (const std::exception& mih_e_) {                                                \
      FAIL() << mih_e_.what();                                                              \
    }                                                                                       \
    if (mih_v_.status == ::mih::verdicts::Verdict::Status::kSkip) GTEST_SKIP() << mih_v_.message; \
    if (mih_v_.status == ::mih::verdicts::Verdict::Status::kFail) FAIL() << mih_v_.message; \
  } while (false)

#define MIH_CONFORMANCE_INSTANTIATE_(Prefix, Suite)                                                  \
  INSTANTIATE_TEST_SUITE_P(Prefix, Suite, ::testing::ValuesIn(::mih::conformance::cases_for(#Prefix)), \
                           ::mih::conformance::param_name)

/// Instantiates every conformance suite for `spec` over `matrix` (a preset or a JSON file),
/// trained by the TrainingBackend `backend`. One line per spec, at global namespace scope (it
/// opens namespace mih::conformance, where the suites live).
#define MIH_CONFORMANCE_SUITES_REGISTER_(Prefix, spec, matrix, backend, on_request)           \
  namespace mih::conformance {                                                                \
  static const bool mih_conformance_registered_##Prefix =                                     \
      add_registration({#Prefix, spec, matrix, backend, on_request});                        \
  MIH_CONFORMANCE_INSTANTIATE_(Prefix, Structure);                                            \
  MIH_CONFORMANCE_INSTANTIATE_(Prefix, FsdpUnits);                                            \
  MIH_CONFORMANCE_INSTANTIATE_(Prefix, OptimizerLayout);                                      \
  MIH_CONFORMANCE_INSTANTIATE_(Prefix, DataContract);                                         \
  MIH_CONFORMANCE_INSTANTIATE_(Prefix, InputIdentity);                                        \
  MIH_CONFORMANCE_INSTANTIATE_(Prefix, CheckpointCoverage);                                   \
  MIH_CONFORMANCE_INSTANTIATE_(Prefix, CheckpointRoundTrip);                                  \
  MIH_CONFORMANCE_INSTANTIATE_(Prefix, Resume);                                               \
  MIH_CONFORMANCE_INSTANTIATE_(Prefix, SharedState);                                          \
  MIH_CONFORMANCE_INSTANTIATE_(Prefix, ModalityGradients);                                    \
  MIH_CONFORMANCE_INSTANTIATE_(Prefix, StateInvariants);                                      \
  MIH_CONFORMANCE_INSTANTIATE_(Prefix, ModuleParity);                                         \
  MIH_CONFORMANCE_INSTANTIATE_(Prefix, NumericParity);                                        \
  MIH_CONFORMANCE_INSTANTIATE_(Prefix, ReplicaConsistency);                                   \
  MIH_CONFORMANCE_INSTANTIATE_(Prefix, ActivationCheckpointEquivalence);                      \
  MIH_CONFORMANCE_INSTANTIATE_(Prefix, CommVolume);                                           \
  }  /* namespace mih::conformance */                                                         \
  static_assert(true, "")

#define MIH_CONFORMANCE_SUITES_WITH_BACKEND(Prefix, spec, matrix, backend) \
  MIH_CONFORMANCE_SUITES_REGISTER_(Prefix, spec, matrix, backend, false)

#define MIH_CONFORMANCE_SUITES(Prefix, spec, matrix) MIH_CONFORMANCE_SUITES_WITH_BACKEND(Prefix, spec, matrix, "trainer")

/// Like MIH_CONFORMANCE_SUITES, but the suites are instantiated only when the run names the
/// prefix (`--prefixes Prefix`): a spec variant that is not part of the default matrix, like
/// the fault catalog's (`mih faults`).
#define MIH_CONFORMANCE_SUITES_ON_REQUEST(Prefix, spec, matrix) \
  MIH_CONFORMANCE_SUITES_REGISTER_(Prefix, spec, matrix, "trainer", true)

namespace mih::conformance {
// The suites (defined in suites/suites.cpp), declared here for the macro.
#define MIH_DECLARE_SUITE_(Suite) \
  class Suite : public ConformanceTest {}
MIH_DECLARE_SUITE_(Structure);
MIH_DECLARE_SUITE_(FsdpUnits);
MIH_DECLARE_SUITE_(OptimizerLayout);
MIH_DECLARE_SUITE_(DataContract);
MIH_DECLARE_SUITE_(InputIdentity);
MIH_DECLARE_SUITE_(CheckpointCoverage);
MIH_DECLARE_SUITE_(CheckpointRoundTrip);
MIH_DECLARE_SUITE_(Resume);
MIH_DECLARE_SUITE_(SharedState);
MIH_DECLARE_SUITE_(ModalityGradients);
MIH_DECLARE_SUITE_(StateInvariants);
MIH_DECLARE_SUITE_(ModuleParity);
MIH_DECLARE_SUITE_(NumericParity);
MIH_DECLARE_SUITE_(ReplicaConsistency);
MIH_DECLARE_SUITE_(ActivationCheckpointEquivalence);
MIH_DECLARE_SUITE_(CommVolume);
#undef MIH_DECLARE_SUITE_
}  // namespace mih::conformance
