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

// The parity of `quantity` against the compared case (ConformanceTest::parity: in a
// reduced-precision lane at calibrated tolerances; the lane's reference and twin themselves
// against the float64 Reference at the oracle factor).
#define MIH_NUMERIC_PARITY_(quantity) \
  MIH_CASE_EVIDENCE(ev);              \
  MIH_COMPARED_EVIDENCE(ref);         \
  MIH_ASSERT_VERDICT(parity(*ref, *ev, quantity, resolved_case().resume_at))

// verdicts::parity of `quantity` on a case of any writer, at its dtype's tolerance.
template <Quantity quantity>
verdicts::Verdict judged_parity(const verdicts::JudgedCase& c) {
  return verdicts::parity(*c.reference, c.ev, quantity, c.tolerance, c.first_step, nullptr, false);
}

// Every number of both runs: metrics, the probed tensors and activations, what is probed.
MIH_SUITE_READS(NumericParity,
                {.files = {layout::kMetrics, layout::kProbes, layout::kParameterWatchlist},
                 .reference_files = {layout::kMetrics, layout::kProbes, layout::kParameterWatchlist},
                 .tests = {{"LossMatchesReference", &judged_parity<Quantity::kLoss>},
                           {"GradNormsMatchReference", &judged_parity<Quantity::kGradNorms>},
                           {"LearningRateMatchesReference", &judged_parity<Quantity::kLr>},
                           {"WatchedTensorsMatchReferenceAtEveryStage", &judged_parity<Quantity::kTensors>}}});

TEST_P(NumericParity, LossMatchesReference) { MIH_NUMERIC_PARITY_(Quantity::kLoss); }
TEST_P(NumericParity, GradNormsMatchReference) { MIH_NUMERIC_PARITY_(Quantity::kGradNorms); }
TEST_P(NumericParity, LearningRateMatchesReference) { MIH_NUMERIC_PARITY_(Quantity::kLr); }
TEST_P(NumericParity, WatchedTensorsMatchReferenceAtEveryStage) {
  MIH_NUMERIC_PARITY_(Quantity::kTensors);
}

}  // namespace mih::conformance
