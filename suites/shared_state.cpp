// The SharedState suite (suites/suite_table.h): every declared key published each forward by its declared producer and consumed by each declared consumer, after its publication, once per forward (an activation-checkpoint recompute included).
#include "suites/conformance.h"

namespace mih::conformance {

using verdicts::no_error_findings;

bool SharedState::applies([[maybe_unused]] const SuiteContext& s) {
  return !s.spec.shared_state.empty();
}
const char* SharedState::where() { return "every case of a spec that declares shared state"; }

MIH_SUITE_READS_NONE(SharedState);

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

}  // namespace mih::conformance
