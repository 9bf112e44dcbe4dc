// The SharedState suite (suites/suite_table.h): every declared key published once per forward by its producer, consumed after.
#include "suites/conformance.h"

namespace mih::conformance {

using verdicts::no_error_findings;

bool SharedState::applies([[maybe_unused]] const SuiteContext& s) {
  return true;
}
const char* SharedState::where() { return "every case"; }

TEST_P(SharedState, EveryKeyHasProducerAndConsumer) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(
      no_error_findings(*ev, {codes::kSharedNoProducer, codes::kSharedNoConsumer, codes::kSharedWrongProducer}));
}
TEST_P(SharedState, ConsumedAfterPublished) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(no_error_findings(*ev, {codes::kSharedBeforePublish}));
}
TEST_P(SharedState, PublishedOncePerForward) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(no_error_findings(*ev, {codes::kSharedTwice}));
}
TEST_P(SharedState, NoUndeclaredKey) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(no_error_findings(*ev, {codes::kSharedUndeclared}));
}

}  // namespace mih::conformance
