// The CheckpointCoverage suite (suites/suite_table.h): the key map against the model and the external checkpoint.
#include "suites/conformance.h"

namespace mih::conformance {

using verdicts::no_error_findings;

bool CheckpointCoverage::applies([[maybe_unused]] const SuiteContext& s) {
  return true;
}
const char* CheckpointCoverage::where() { return "every case"; }

MIH_SUITE_READS_NONE(CheckpointCoverage);

TEST_P(CheckpointCoverage, EveryTargetKeyLoadedOrTrainingOnly) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(no_error_findings(*ev, {codes::kCkptTargetKey}));
}
TEST_P(CheckpointCoverage, TransformsRoundTrip) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(no_error_findings(*ev, {codes::kCkptRoundTrip}));
}

}  // namespace mih::conformance
