// The Structure suite (suites/suite_table.h): the parameter table against the placements, dtypes and devices, finite values.
#include "suites/conformance.h"

namespace mih::conformance {

using verdicts::no_error_findings;

bool Structure::applies([[maybe_unused]] const SuiteContext& s) {
  return true;
}
const char* Structure::where() { return "every case"; }

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

}  // namespace mih::conformance
