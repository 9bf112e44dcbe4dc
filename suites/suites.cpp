// The conformance suites (DESIGN.md sections 3 and 7): abstract value-parameterized tests,
// one TEST_P per invariant, instantiated per spec by MIH_CONFORMANCE_SUITES. Each reads the
// evidence of its case (launched once, see conformance.h) and asserts a verdict of
// harness/compare/verdicts.h; a failure names the first offender, the step and stage, the
// errors, the tolerance and the file to open.
#include "suites/conformance.h"

namespace mih::conformance {
namespace {

using verdicts::CaseEvidence;
using verdicts::Quantity;
using verdicts::Verdict;

// The case's evidence or return (the failure is already reported).
#define MIH_CASE_EVIDENCE(var)            \
  const CaseEvidence* var = evidence();   \
  if (!var) return

// Vs the reference (or a resume's twin): skip for the reference itself.
#define MIH_COMPARED_EVIDENCE(var)                                           \
  if (compare_to().empty()) GTEST_SKIP() << "the reference is what the others are compared with"; \
  const CaseEvidence* var = compared();                                      \
  if (!var) return

Verdict findings(const CaseEvidence& ev, const std::vector<std::string>& codes) {
  return verdicts::no_error_findings(ev, codes);
}

// Structure: the parameter table against the placements, finite values, declared ties.
TEST_P(Structure, LocalShapesMatchPlacements) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(findings(*ev, {"MIH-STRUCT-001"}));
}
TEST_P(Structure, DtypeAndDeviceAsConfigured) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(findings(*ev, {"MIH-STRUCT-002"}));
}
TEST_P(Structure, ParametersAndBuffersFinite) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(findings(*ev, {"MIH-STRUCT-003"}));
}
TEST_P(Structure, DeclaredTiesAreOneParameter) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(findings(*ev, {"MIH-STRUCT-004"}));
}

// FsdpUnits: every sharded parameter in exactly one unit of one dtype and mesh.
TEST_P(FsdpUnits, EveryShardedParameterInOneUnit) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(findings(*ev, {"MIH-STRUCT-005"}));
  MIH_ASSERT_VERDICT(verdicts::fsdp_units_cover_parameters(*ev));
}
TEST_P(FsdpUnits, UnitsHoldOneDtypeAndMesh) {
  MIH_CASE_EVIDENCE(ev);
  if (ev->degree("dp_shard") <= 1) GTEST_SKIP() << "dp_shard is 1: no FSDP units";
  MIH_ASSERT_VERDICT(findings(*ev, {"MIH-STRUCT-006"}));
}

// OptimizerLayout: at attach, before every step, after a load.
TEST_P(OptimizerLayout, HoldsTheLiveShards) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(findings(*ev, {"MIH-OPTIM-001"}));
}
TEST_P(OptimizerLayout, EveryTrainableParameterInExactlyOneGroup) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(findings(*ev, {"MIH-OPTIM-002", "MIH-OPTIM-004"}));
}
TEST_P(OptimizerLayout, NoFrozenParameter) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(findings(*ev, {"MIH-OPTIM-003"}));
}
TEST_P(OptimizerLayout, WeightDecayAsDeclared) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(findings(*ev, {"MIH-OPTIM-005"}));
}
TEST_P(OptimizerLayout, StateShapesMatchLocalShards) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(findings(*ev, {"MIH-OPTIM-006"}));
}

// DataContract: owners, produced fields, the labels shift, forward fields.
TEST_P(DataContract, EveryFieldHasOneOwner) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(findings(*ev, {"MIH-DATA-001", "MIH-DATA-003"}));
}
TEST_P(DataContract, DeclaredFieldsAreProduced) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(findings(*ev, {"MIH-DATA-002"}));
}
TEST_P(DataContract, LabelsShiftedAsDeclared) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(findings(*ev, {"MIH-DATA-004"}));
}
TEST_P(DataContract, ForwardFieldsReachTheModel) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(findings(*ev, {"MIH-DATA-005"}));
}

TEST_P(DataContract, LossFollowsTheLabels) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(findings(*ev, {"MIH-DATA-006"}));
}

// InputIdentity: the same global batch as the reference, however it is split.
TEST_P(InputIdentity, SameGlobalBatchAsReference) {
  MIH_CASE_EVIDENCE(ev);
  MIH_COMPARED_EVIDENCE(ref);
  MIH_ASSERT_VERDICT(verdicts::same_inputs_as_reference(*ref, *ev));
}
TEST_P(InputIdentity, TensorParallelRanksSeeTheSameInputs) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(findings(*ev, {"MIH-INPUT-002"}));
}
TEST_P(InputIdentity, CpReplicatedFieldsAgree) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(findings(*ev, {"MIH-INPUT-001"}));
}

// CheckpointCoverage: the key map against the model and the external checkpoint.
TEST_P(CheckpointCoverage, EveryTargetKeyLoadedOrTrainingOnly) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(findings(*ev, {"MIH-CKPT-001"}));
}
TEST_P(CheckpointCoverage, TransformsRoundTrip) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(findings(*ev, {"MIH-CKPT-002"}));
}
TEST_P(CheckpointCoverage, NoUnexpectedOrMissingSourceKey) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(findings(*ev, {"MIH-CKPT-003", "MIH-CKPT-004"}));
}

// CheckpointRoundTrip: what was saved is what is loaded, bit for bit.
TEST_P(CheckpointRoundTrip, LoadedTensorsBitExact) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(verdicts::checkpoint_round_trip(*ev));
}

// Resume: the steps after the load equal the uninterrupted run.
TEST_P(Resume, StepCountContinues) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(verdicts::resume_continues_step_count(*ev));
}
TEST_P(Resume, StepsAfterLoadMatchUninterruptedRun) {
  MIH_CASE_EVIDENCE(ev);
  if (kind() != "resume" && kind() != "cross_resume") GTEST_SKIP() << "not a resume case";
  MIH_COMPARED_EVIDENCE(twin);
  const int64_t at = ev->case_info().value("resume_at", int64_t{0});
  MIH_ASSERT_VERDICT(verdicts::parity(*twin, *ev, Quantity::kLoss, verdicts::case_tolerance(*ev), at));
  MIH_ASSERT_VERDICT(verdicts::parity(*twin, *ev, Quantity::kGradNorms, verdicts::case_tolerance(*ev), at));
  MIH_ASSERT_VERDICT(verdicts::parity(*twin, *ev, Quantity::kTensors, verdicts::case_tolerance(*ev), at));
}

// SharedState: every declared key published once per forward by its producer, consumed
// after.
TEST_P(SharedState, EveryKeyHasProducerAndConsumer) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(findings(*ev, {"MIH-SHARED-001", "MIH-SHARED-002", "MIH-SHARED-005"}));
}
TEST_P(SharedState, ConsumedAfterPublished) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(findings(*ev, {"MIH-SHARED-003"}));
}
TEST_P(SharedState, PublishedOncePerForward) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(findings(*ev, {"MIH-SHARED-004"}));
}
TEST_P(SharedState, NoUndeclaredKey) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(findings(*ev, {"MIH-SHARED-006"}));
}

// ModalityGradients: each modality's parameters get finite, non-zero gradients.
TEST_P(ModalityGradients, ModalityParametersReceiveGradients) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(verdicts::modality_gradients(*ev));
}

// StateInvariants: the spec's named predicates, at every phase.
TEST_P(StateInvariants, AllHold) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(verdicts::state_invariants(*ev));
}

// ModuleParity: candidate modules against independent implementations (with the reference).
TEST_P(ModuleParity, CandidatesMatchIndependentImplementations) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(verdicts::module_parity(*ev));
}

// NumericParity: every number of the run against the reference.
TEST_P(NumericParity, LossMatchesReference) {
  MIH_CASE_EVIDENCE(ev);
  MIH_COMPARED_EVIDENCE(ref);
  MIH_ASSERT_VERDICT(verdicts::parity(*ref, *ev, Quantity::kLoss, verdicts::case_tolerance(*ev),
                                      ev->case_info().value("resume_at", int64_t{0})));
}
TEST_P(NumericParity, GradNormsMatchReference) {
  MIH_CASE_EVIDENCE(ev);
  MIH_COMPARED_EVIDENCE(ref);
  MIH_ASSERT_VERDICT(verdicts::parity(*ref, *ev, Quantity::kGradNorms, verdicts::case_tolerance(*ev),
                                      ev->case_info().value("resume_at", int64_t{0})));
}
TEST_P(NumericParity, LearningRateMatchesReference) {
  MIH_CASE_EVIDENCE(ev);
  MIH_COMPARED_EVIDENCE(ref);
  MIH_ASSERT_VERDICT(verdicts::parity(*ref, *ev, Quantity::kLr, verdicts::case_tolerance(*ev),
                                      ev->case_info().value("resume_at", int64_t{0})));
}
TEST_P(NumericParity, WatchedTensorsMatchReferenceAtEveryStage) {
  MIH_CASE_EVIDENCE(ev);
  MIH_COMPARED_EVIDENCE(ref);
  MIH_ASSERT_VERDICT(verdicts::parity(*ref, *ev, Quantity::kTensors, verdicts::case_tolerance(*ev),
                                      ev->case_info().value("resume_at", int64_t{0})));
}

// ReplicaConsistency: replicated pieces agree over their replicas after every step.
TEST_P(ReplicaConsistency, ReplicasAgreeAfterEveryStep) {
  MIH_CASE_EVIDENCE(ev);
  if (ev->config().value("world_size", 1) <= 1) GTEST_SKIP() << "one rank: no replica";
  MIH_ASSERT_VERDICT(findings(*ev, {"MIH-PROBE-001"}));
}

// ActivationCheckpointEquivalence: recomputing in backward changes nothing.
TEST_P(ActivationCheckpointEquivalence, RegionsRecomputed) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(verdicts::activation_checkpoint_enabled(*ev));
}
TEST_P(ActivationCheckpointEquivalence, MatchesTheRunWithoutCheckpointing) {
  MIH_CASE_EVIDENCE(ev);
  if (!ev->config().value("activation_checkpointing", false)) GTEST_SKIP() << "activation checkpointing is off";
  std::string twin = without_activation_checkpointing();
  if (twin.empty()) twin = compare_to();
  const CaseEvidence* base = other(twin);
  if (!base) return;
  // The gradients first: a recompute that differs from the forward shows there, one step
  // before the loss moves.
  MIH_ASSERT_VERDICT(verdicts::parity(*base, *ev, Quantity::kTensors, verdicts::case_tolerance(*ev)));
  MIH_ASSERT_VERDICT(verdicts::parity(*base, *ev, Quantity::kLoss, verdicts::case_tolerance(*ev)));
}
TEST_P(ActivationCheckpointEquivalence, RecomputeDoesNotRepublishSharedState) {
  MIH_CASE_EVIDENCE(ev);
  if (!ev->config().value("activation_checkpointing", false)) GTEST_SKIP() << "activation checkpointing is off";
  MIH_ASSERT_VERDICT(findings(*ev, {"MIH-SHARED-004"}));
}

// CommVolume: the bytes per mesh axis the config implies.
TEST_P(CommVolume, BytesPerAxisMatchTheConfig) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(verdicts::comm_volume(*ev));
}

}  // namespace

// A binary may link the suites without instantiating all of them (a spec-less test binary).
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(Structure);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(FsdpUnits);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(OptimizerLayout);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(DataContract);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(InputIdentity);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(CheckpointCoverage);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(CheckpointRoundTrip);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(Resume);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(SharedState);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(ModalityGradients);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(StateInvariants);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(ModuleParity);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(NumericParity);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(ReplicaConsistency);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(ActivationCheckpointEquivalence);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(CommVolume);

}  // namespace mih::conformance
