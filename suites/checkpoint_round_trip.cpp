// The CheckpointRoundTrip suite (suites/suite_table.h): what was saved is what is loaded, bit for bit.
#include "suites/conformance.h"

namespace mih::conformance {

bool CheckpointRoundTrip::applies([[maybe_unused]] const SuiteContext& s) {
  return s.c.save_config.has_value();
}
const char* CheckpointRoundTrip::where() { return "resume and cross-topology resume cases"; }

TEST_P(CheckpointRoundTrip, LoadedTensorsBitExact) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(verdicts::checkpoint_round_trip(*ev));
}

}  // namespace mih::conformance
