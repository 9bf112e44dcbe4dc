// The NumericParity suite (suites/suite_table.h): every number of the run against the reference (or a resume against its twin).
#include <optional>

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

// The parity of `quantity` against the compared case: in a reduced-precision lane at the
// tolerances calibrated from the lane's reference and its noise twin (launched if needed;
// the two themselves against the float64 Reference at the oracle factor), else at the
// spec's tolerance for the case's dtype.
#define MIH_NUMERIC_PARITY_(quantity)                                                                          \
  MIH_CASE_EVIDENCE(ev);                                                                                       \
  MIH_COMPARED_EVIDENCE(ref);                                                                                  \
  const verdicts::CaseEvidence* lane_reference = nullptr;                                                      \
  const verdicts::CaseEvidence* noise_twin = nullptr;                                                          \
  if (resolved_case().config.dtype != DType::kFloat64) {                                                     \
    lane_reference = other(spec::kLaneReference);                                                              \
    noise_twin = other(spec::kNoiseTwin);                                                                      \
    if (!lane_reference || !noise_twin) return;                                                                \
  }                                                                                                            \
  MIH_ASSERT_VERDICT([&] {                                                                                     \
    if (!lane_reference) return verdicts::parity(*ref, *ev, quantity, verdicts::case_tolerance(*ev),           \
                                                 resolved_case().resume_at);                                   \
    const Calibration cal =                                                                                    \
        verdicts::lane_calibration(*lane_reference, *noise_twin, *ev, cases::run_options().noise_k);           \
    return verdicts::parity(*ref, *ev, quantity, 0, resolved_case().resume_at, &cal);                          \
  }())

TEST_P(NumericParity, LossMatchesReference) { MIH_NUMERIC_PARITY_(Quantity::kLoss); }
TEST_P(NumericParity, GradNormsMatchReference) { MIH_NUMERIC_PARITY_(Quantity::kGradNorms); }
TEST_P(NumericParity, LearningRateMatchesReference) { MIH_NUMERIC_PARITY_(Quantity::kLr); }
TEST_P(NumericParity, WatchedTensorsMatchReferenceAtEveryStage) {
  MIH_NUMERIC_PARITY_(Quantity::kTensors);
}

}  // namespace mih::conformance
