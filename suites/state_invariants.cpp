// The StateInvariants suite (suites/suite_table.h): the spec's named predicates, at every phase.
#include "suites/conformance.h"

namespace mih::conformance {

bool StateInvariants::applies([[maybe_unused]] const SuiteContext& s) {
  return !s.spec.invariants.empty();
}
const char* StateInvariants::where() { return "every case of a spec that declares a state invariant"; }

MIH_SUITE_READS_NONE(StateInvariants);

TEST_P(StateInvariants, AllHold) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(verdicts::state_invariants(*ev));
}

}  // namespace mih::conformance
