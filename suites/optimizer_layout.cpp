// The OptimizerLayout suite (suites/suite_table.h): the optimizer holds the live shards, at attach, before every step, after a load.
#include "suites/conformance.h"

namespace mih::conformance {

using verdicts::no_error_findings;

bool OptimizerLayout::applies([[maybe_unused]] const SuiteContext& s) {
  return true;
}
const char* OptimizerLayout::where() { return "every case"; }

MIH_SUITE_READS_NONE(OptimizerLayout);

TEST_P(OptimizerLayout, HoldsTheLiveShards) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(no_error_findings(*ev, {codes::kOptimNotLive}));
}
TEST_P(OptimizerLayout, EveryTrainableParameterInExactlyOneGroup) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(no_error_findings(*ev, {codes::kOptimTwoGroups, codes::kOptimMissing}));
}
TEST_P(OptimizerLayout, NoFrozenParameter) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(no_error_findings(*ev, {codes::kOptimFrozen}));
}
// A parameter with requires_grad false that the spec does not declare frozen is trained by no
// one: the run stays green while the model never learns it.
TEST_P(OptimizerLayout, NoParameterFrozenWithoutDeclaration) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(no_error_findings(*ev, {codes::kFrozenUndeclared}));
}
TEST_P(OptimizerLayout, WeightDecayAsDeclared) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(no_error_findings(*ev, {codes::kOptimWeightDecay}));
}
TEST_P(OptimizerLayout, StateShapesMatchLocalShards) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(no_error_findings(*ev, {codes::kOptimStateShape}));
}

TEST_P(OptimizerLayout, NoWeightDecayOnNormsOrBiases) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(no_error_findings(*ev, {codes::kOptimDecayOnNorm}));
}

}  // namespace mih::conformance
