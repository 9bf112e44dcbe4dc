// The ReplicaConsistency suite (suites/suite_table.h): replicated pieces agree over their replicas after every step.
#include "suites/conformance.h"

namespace mih::conformance {

using verdicts::no_error_findings;

bool ReplicaConsistency::applies([[maybe_unused]] const SuiteContext& s) {
  return s.c.config.world_size() > 1;
}
const char* ReplicaConsistency::where() { return "cases of more than one rank"; }

TEST_P(ReplicaConsistency, ReplicasAgreeAfterEveryStep) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(no_error_findings(*ev, {codes::kProbeReplicas}));
}

}  // namespace mih::conformance
