// The FrozenParameters suite (suites/suite_table.h): the parameters the spec declares frozen
// (ModelSpec::frozen) stay frozen on every rank after sharding: requires_grad false, no
// gradient after backward, no optimizer state after the step.
#include "suites/conformance.h"

namespace mih::conformance {

using verdicts::no_error_findings;

bool FrozenParameters::applies([[maybe_unused]] const SuiteContext& s) { return !s.spec.frozen.empty(); }
const char* FrozenParameters::where() { return "every case of a spec that declares frozen parameters (frozen)"; }

MIH_SUITE_READS_NONE(FrozenParameters);

TEST_P(FrozenParameters, RequireNoGradOnEveryRank) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(no_error_findings(*ev, {codes::kFrozenTrainable}));
}
TEST_P(FrozenParameters, GetNoGradientAndNoOptimizerState) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(no_error_findings(*ev, {codes::kFrozenGradient, codes::kFrozenOptimizerState}));
}

}  // namespace mih::conformance
