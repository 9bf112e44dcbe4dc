// The ActivationCheckpointEquivalence suite (suites/suite_table.h): recomputing in backward changes nothing.
#include "suites/conformance.h"

namespace mih::conformance {

using verdicts::Quantity;

bool ActivationCheckpointEquivalence::applies([[maybe_unused]] const SuiteContext& s) {
  return s.c.config.activation_checkpointing;
}
const char* ActivationCheckpointEquivalence::where() { return "cases with activation checkpointing"; }

MIH_SUITE_READS_NONE(ActivationCheckpointEquivalence);

TEST_P(ActivationCheckpointEquivalence, RegionsRecomputed) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(verdicts::activation_checkpoint_enabled(*ev));
}
TEST_P(ActivationCheckpointEquivalence, MatchesTheRunWithoutCheckpointing) {
  MIH_CASE_EVIDENCE(ev);
  std::string twin = without_activation_checkpointing();
  if (twin.empty()) twin = resolved_case().compare_to;
  const verdicts::CaseEvidence* base = other(twin);
  if (!base) return;
  // The gradients first: a recompute that differs from the forward shows there, one step
  // before the loss moves. A resume into checkpointing trains from its resume step on: the
  // steps it ran.
  const bool record = twin == resolved_case().compare_to;
  const int64_t from = resolved_case().resume_at;
  MIH_ASSERT_VERDICT(parity(*base, *ev, Quantity::kTensors, from, record));
  MIH_ASSERT_VERDICT(parity(*base, *ev, Quantity::kLoss, from, record));
}

}  // namespace mih::conformance
