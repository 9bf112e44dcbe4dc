// The Resume suite (suites/suite_table.h): the steps after the load equal the uninterrupted run.
#include "suites/conformance.h"

namespace mih::conformance {

using verdicts::Quantity;

bool Resume::applies([[maybe_unused]] const SuiteContext& s) {
  return s.c.save_config.has_value();
}
const char* Resume::where() { return "resume and cross-topology resume cases"; }

MIH_SUITE_READS_NONE(Resume);

TEST_P(Resume, StepCountContinues) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(verdicts::resume_continues_step_count(*ev));
}
TEST_P(Resume, StepsAfterLoadMatchUninterruptedRun) {
  MIH_CASE_EVIDENCE(ev);
  MIH_COMPARED_EVIDENCE(twin);
  const int64_t at = resolved_case().resume_at;
  MIH_ASSERT_VERDICT(parity(*twin, *ev, Quantity::kLoss, at));
  MIH_ASSERT_VERDICT(parity(*twin, *ev, Quantity::kGradNorms, at));
  MIH_ASSERT_VERDICT(parity(*twin, *ev, Quantity::kTensors, at));
}
// The learning rate of every step after the load is the uninterrupted run's: a schedule
// resumes at the saved step (a scheduler whose state a checkpoint drops warms up again).
TEST_P(Resume, LearningRateAfterLoadMatchesUninterruptedRun) {
  MIH_CASE_EVIDENCE(ev);
  MIH_COMPARED_EVIDENCE(twin);
  MIH_ASSERT_VERDICT(parity(*twin, *ev, Quantity::kLr, resolved_case().resume_at));
}

}  // namespace mih::conformance
