// The DataContract suite (suites/suite_table.h): owners, produced fields, the labels shift, forward fields.
#include "suites/conformance.h"

namespace mih::conformance {

using verdicts::no_error_findings;

bool DataContract::applies([[maybe_unused]] const SuiteContext& s) {
  return true;
}
const char* DataContract::where() { return "every case"; }

MIH_SUITE_READS_NONE(DataContract);

TEST_P(DataContract, EveryFieldHasOneOwner) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(no_error_findings(*ev, {codes::kDataNoOwner, codes::kDataTwoOwners}));
}
TEST_P(DataContract, DeclaredFieldsAreProduced) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(no_error_findings(*ev, {codes::kDataNotProduced}));
}
TEST_P(DataContract, LabelsShiftedAsDeclared) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(no_error_findings(*ev, {codes::kDataLabelsShift}));
}
TEST_P(DataContract, ForwardFieldsReachTheModel) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(no_error_findings(*ev, {codes::kDataForwardField}));
}
TEST_P(DataContract, LossFollowsTheLabels) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(no_error_findings(*ev, {codes::kDataLossLabels}));
}

TEST_P(DataContract, TrainerCountsTheValidLabels) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(no_error_findings(*ev, {codes::kDataValidTokens, codes::kDataLossNormalizer}));
}

}  // namespace mih::conformance
