// The ModalityGradients suite (suites/suite_table.h): each modality's parameters get finite, non-zero gradients.
#include "suites/conformance.h"

namespace mih::conformance {

bool ModalityGradients::applies([[maybe_unused]] const SuiteContext& s) {
  return !s.spec.modalities.empty();
}
const char* ModalityGradients::where() { return "every case of a spec that declares a modality"; }

MIH_SUITE_READS_NONE(ModalityGradients);

TEST_P(ModalityGradients, ModalityParametersReceiveGradients) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(verdicts::modality_gradients(*ev));
}

}  // namespace mih::conformance
