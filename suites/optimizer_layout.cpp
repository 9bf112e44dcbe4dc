// The OptimizerLayout suite (suites/suite_table.h): the optimizer holds the live shards, at attach, before every step, after a load.
#include "suites/conformance.h"

namespace mih::conformance {

using verdicts::no_error_findings;

bool OptimizerLayout::applies([[maybe_unused]] const SuiteContext& s) {
  return true;
}
const char* OptimizerLayout::where() { return "every case"; }

namespace {
verdicts::Verdict judged_groups(const verdicts::JudgedCase& c) { return verdicts::optimizer_groups_cover_trainable(c.ev); }
verdicts::Verdict judged_frozen(const verdicts::JudgedCase& c) { return verdicts::optimizer_holds_no_frozen(c.ev); }
verdicts::Verdict judged_decay(const verdicts::JudgedCase& c) { return verdicts::no_decay_on_norms_or_biases(c.ev); }
verdicts::Verdict judged_state(const verdicts::JudgedCase& c) { return verdicts::optimizer_state_shapes_match(c.ev); }
std::string layout_examinable(const verdicts::JudgedCase& c) { return verdicts::optimizer_layout_examinable(c.ev); }
}  // namespace

// The optimizer's groups and state shapes as recorded (check/optimizer_layout_initial.json, every
// cases/runtime/optimizer_layout_step<k>.json, a load's) against the parameter table, whoever
// wrote them. Not declared to another writer's evidence: HoldsTheLiveShards (tensor identity,
// seen in-process only), NoParameterFrozenWithoutDeclaration and WeightDecayAsDeclared (they
// judge the spec's frozen patterns and the trainer's declared decay, which another writer has
// none of).
MIH_SUITE_READS(OptimizerLayout, {.files = {layout::kStructure},
                                  .examinable = &layout_examinable,
                                  .tests = {{"EveryTrainableParameterInExactlyOneGroup", &judged_groups},
                                            {"NoFrozenParameter", &judged_frozen},
                                            {"StateShapesMatchLocalShards", &judged_state},
                                            {"NoWeightDecayOnNormsOrBiases", &judged_decay}}});

TEST_P(OptimizerLayout, HoldsTheLiveShards) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(no_error_findings(*ev, {codes::kOptimNotLive}));
}
// Each: the in-process check's findings (MIH-OPTIM-*, every rank, by tensor identity) and the
// rule on the recorded layout, which judges any writer.
TEST_P(OptimizerLayout, EveryTrainableParameterInExactlyOneGroup) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(no_error_findings(*ev, {codes::kOptimTwoGroups, codes::kOptimMissing}));
  MIH_ASSERT_VERDICT(verdicts::optimizer_groups_cover_trainable(*ev));
}
TEST_P(OptimizerLayout, NoFrozenParameter) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(no_error_findings(*ev, {codes::kOptimFrozen}));
  MIH_ASSERT_VERDICT(verdicts::optimizer_holds_no_frozen(*ev));
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
  MIH_ASSERT_VERDICT(verdicts::optimizer_state_shapes_match(*ev));
}

TEST_P(OptimizerLayout, NoWeightDecayOnNormsOrBiases) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(no_error_findings(*ev, {codes::kOptimDecayOnNorm}));
  MIH_ASSERT_VERDICT(verdicts::no_decay_on_norms_or_biases(*ev));
}

}  // namespace mih::conformance
