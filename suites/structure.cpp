// The Structure suite (suites/suite_table.h): the parameter table against the placements, dtypes and devices, finite
// values, and no tensor under two names the spec does not declare tied.
#include "suites/conformance.h"

namespace mih::conformance {

using verdicts::no_error_findings;

bool Structure::applies([[maybe_unused]] const SuiteContext& s) {
  return true;
}
const char* Structure::where() { return "every case"; }

MIH_SUITE_READS_NONE(Structure);

TEST_P(Structure, LocalShapesMatchPlacements) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(no_error_findings(*ev, {codes::kStructLocalShape}));
}
TEST_P(Structure, DtypeAndDeviceAsConfigured) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(no_error_findings(*ev, {codes::kStructDtypeDevice}));
}
TEST_P(Structure, ParametersAndBuffersFinite) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(no_error_findings(*ev, {codes::kStructNonFinite}));
}

// Issue 52: a port's q_norm registered again as k_norm trained one tensor for both, and no
// suite said so (only structure.json's aliases column did).
TEST_P(Structure, EveryAliasIsADeclaredTie) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(no_error_findings(*ev, {codes::kStructAliasUndeclared}));
}

}  // namespace mih::conformance
