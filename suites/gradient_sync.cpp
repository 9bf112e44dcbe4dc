// The GradientSync suite (suites/suite_table.h): every gradient is reduced over exactly the
// mesh axes of its gradient domain (the parameter table), as the collectives of the step
// actually reduced it.
#include "suites/conformance.h"

namespace mih::conformance {

using verdicts::no_error_findings;

bool GradientSync::applies(const SuiteContext& s) { return s.c.config.world_size() > 1; }
const char* GradientSync::where() { return "cases with more than one rank"; }

TEST_P(GradientSync, EachGradientReducedOverItsDomain) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(no_error_findings(*ev, {codes::kGradReduction}));
}

}  // namespace mih::conformance
