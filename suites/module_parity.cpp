// The ModuleParity suite (suites/suite_table.h): candidate modules against independent
// implementations, forward and backward (harness/spec/module_parity.h; run with the reference).
#include "suites/conformance.h"

namespace mih::conformance {

bool ModuleParity::applies([[maybe_unused]] const SuiteContext& s) {
  return s.c.kind == spec::CaseKind::kReference && !s.spec.parity_cases.empty();
}
const char* ModuleParity::where() { return "the reference case of a spec that declares module parity cases"; }

MIH_SUITE_READS_NONE(ModuleParity);

TEST_P(ModuleParity, CandidatesMatchIndependentImplementations) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(verdicts::module_parity(*ev));
}

}  // namespace mih::conformance
