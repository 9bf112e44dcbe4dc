// The GradientPresence suite (suites/suite_table.h): a parameter no rank's backward gave a
// gradient is left as it is by the optimizer (PyTorch's optimizers skip a grad of None), and
// every trainable parameter gets a gradient at some step of the run unless the spec declares
// it may not (ModelSpec::unused_parameters).
#include "suites/conformance.h"

namespace mih::conformance {

using verdicts::no_error_findings;

bool GradientPresence::applies([[maybe_unused]] const SuiteContext& s) { return true; }
const char* GradientPresence::where() { return "every case"; }

// Zeros in place of an absent gradient let AdamW decay the parameter and move it by its
// momentum; the single-rank reference does the same, so parity cannot see it.
MIH_SUITE_READS_NONE(GradientPresence);

TEST_P(GradientPresence, OptimizerLeavesParametersWithoutGradient) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(no_error_findings(*ev, {codes::kOptimMovedWithoutGradient}));
}
TEST_P(GradientPresence, EveryTrainableParameterGetsAGradient) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(no_error_findings(*ev, {codes::kGradNeverReceived}));
}

}  // namespace mih::conformance
