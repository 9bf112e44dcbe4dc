// The InputIdentity suite (suites/suite_table.h): the same global batch as the reference, however it is split over ranks.
#include "suites/conformance.h"

namespace mih::conformance {

using verdicts::no_error_findings;

bool InputIdentity::applies([[maybe_unused]] const SuiteContext& s) {
  return !s.c.compare_to.empty();
}
const char* InputIdentity::where() { return "every case compared with another (not the reference itself)"; }

verdicts::Verdict judged_inputs(const verdicts::JudgedCase& c) { return verdicts::same_inputs_as_reference(*c.reference, c.ev); }

MIH_SUITE_READS(InputIdentity, {.files = {layout::kInputIdentity},
                                .reference_files = {layout::kInputIdentity},
                                .tests = {{"SameGlobalBatchAsReference", &judged_inputs}}});

TEST_P(InputIdentity, SameGlobalBatchAsReference) {
  MIH_CASE_EVIDENCE(ev);
  MIH_COMPARED_EVIDENCE(ref);
  MIH_ASSERT_VERDICT(verdicts::same_inputs_as_reference(*ref, *ev));
}

}  // namespace mih::conformance
