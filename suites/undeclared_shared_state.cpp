// The UndeclaredSharedState suite (suites/suite_table.h): no state passed between layers through the shared-state tracer without a declaration, whatever the spec declares.
#include "suites/conformance.h"

namespace mih::conformance {

using verdicts::no_error_findings;

bool UndeclaredSharedState::applies([[maybe_unused]] const SuiteContext& s) {
  return true;
}
const char* UndeclaredSharedState::where() { return "every case"; }

MIH_SUITE_READS_NONE(UndeclaredSharedState);

TEST_P(UndeclaredSharedState, NoKeyWithoutDeclaration) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(no_error_findings(*ev, {codes::kSharedUndeclared}));
}

}  // namespace mih::conformance
