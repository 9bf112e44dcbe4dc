// The SharedStateUse suite (suites/suite_table.h): every publish and consume of shared state, declared or not: consumed after published, published once per forward, none undeclared.
#include "suites/conformance.h"

namespace mih::conformance {

using verdicts::no_error_findings;

bool SharedStateUse::applies([[maybe_unused]] const SuiteContext& s) {
  return true;
}
const char* SharedStateUse::where() { return "every case"; }

TEST_P(SharedStateUse, ConsumedAfterPublished) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(no_error_findings(*ev, {codes::kSharedBeforePublish}));
}

TEST_P(SharedStateUse, PublishedOncePerForward) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(no_error_findings(*ev, {codes::kSharedTwice}));
}

TEST_P(SharedStateUse, NoUndeclaredKey) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(no_error_findings(*ev, {codes::kSharedUndeclared}));
}

}  // namespace mih::conformance
