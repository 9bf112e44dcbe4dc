// The NumericParity suite (suites/suite_table.h): every number of the run against the reference (or a resume against its twin).
#include "suites/conformance.h"

namespace mih::conformance {

using verdicts::Quantity;

bool NumericParity::applies([[maybe_unused]] const SuiteContext& s) {
  if (s.c.compare_to.empty()) return false;
  // A spec may declare gradient accumulation not comparable (with its reason) instead of
  // giving it a tolerance: then a case with micro-batches has nothing to compare.
  const auto& t = s.spec.tolerances;
  return s.c.config.micro_batches <= 1 || !t.grad_accumulation.empty() || t.grad_accumulation_reason.empty();
}
const char* NumericParity::where() { return "every case compared with another, except gradient accumulation the spec declares not comparable"; }

TEST_P(NumericParity, LossMatchesReference) {
  MIH_CASE_EVIDENCE(ev);
  MIH_COMPARED_EVIDENCE(ref);
  MIH_ASSERT_VERDICT(verdicts::parity(*ref, *ev, Quantity::kLoss, verdicts::case_tolerance(*ev), resolved_case().resume_at));
}
TEST_P(NumericParity, GradNormsMatchReference) {
  MIH_CASE_EVIDENCE(ev);
  MIH_COMPARED_EVIDENCE(ref);
  MIH_ASSERT_VERDICT(
      verdicts::parity(*ref, *ev, Quantity::kGradNorms, verdicts::case_tolerance(*ev), resolved_case().resume_at));
}
TEST_P(NumericParity, LearningRateMatchesReference) {
  MIH_CASE_EVIDENCE(ev);
  MIH_COMPARED_EVIDENCE(ref);
  MIH_ASSERT_VERDICT(verdicts::parity(*ref, *ev, Quantity::kLr, verdicts::case_tolerance(*ev), resolved_case().resume_at));
}
TEST_P(NumericParity, WatchedTensorsMatchReferenceAtEveryStage) {
  MIH_CASE_EVIDENCE(ev);
  MIH_COMPARED_EVIDENCE(ref);
  MIH_ASSERT_VERDICT(
      verdicts::parity(*ref, *ev, Quantity::kTensors, verdicts::case_tolerance(*ev), resolved_case().resume_at));
}

}  // namespace mih::conformance
