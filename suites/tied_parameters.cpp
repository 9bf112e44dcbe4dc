// The TiedParameters suite (suites/suite_table.h): the spec's tied pairs are one parameter after sharding.
#include "suites/conformance.h"

namespace mih::conformance {

using verdicts::no_error_findings;

bool TiedParameters::applies([[maybe_unused]] const SuiteContext& s) {
  return !s.spec.checkpoint.tied.empty();
}
const char* TiedParameters::where() { return "every case of a spec that declares tied parameters (checkpoint.tied)"; }

MIH_SUITE_READS_NONE(TiedParameters);

TEST_P(TiedParameters, DeclaredTiesAreOneParameter) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(no_error_findings(*ev, {codes::kStructTie}));
}

}  // namespace mih::conformance
