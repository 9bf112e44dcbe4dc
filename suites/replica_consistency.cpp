// The ReplicaConsistency suite (suites/suite_table.h): replicated pieces agree over their replicas after every step.
#include "suites/conformance.h"

namespace mih::conformance {

using verdicts::no_error_findings;

bool ReplicaConsistency::applies([[maybe_unused]] const SuiteContext& s) {
  // Only tp, cp and dp_replicate make ranks hold the same piece (dp_shard splits every FSDP
  // parameter into distinct rows), and pp a declared tie: a copy on the first and on the last
  // stage (llama_tied's embedding and head).
  return s.c.config.tp * s.c.config.cp * s.c.config.dp_replicate > 1 || (s.c.config.pp > 1 && !s.spec.checkpoint.tied.empty());
}
const char* ReplicaConsistency::where() {
  return "cases where some rank pieces are replicated (tp, cp or dp_replicate > 1, or pp with a declared tie)";
}

verdicts::Verdict judged_digests(const verdicts::JudgedCase& c) { return verdicts::replica_digests_agree(c.ev); }
std::string digests_compared(const verdicts::JudgedCase& c) { return verdicts::replica_digests_compared(c.ev); }

// Every rank's digests of its copies, whoever wrote them (mih's session, harness/session/
// session_replicas.cpp, on one pipeline stage; a trainer session; another writer).
MIH_SUITE_READS(ReplicaConsistency, {.files = {verdicts::any_step(&layout::replicas_step), layout::kStructure, layout::kMetrics},
                                     .examinable = &digests_compared,
                                     .tests = {{"ReplicasAgreeAfterEveryStep", &judged_digests}}});

TEST_P(ReplicaConsistency, ReplicasAgreeAfterEveryStep) {
  MIH_CASE_EVIDENCE(ev);
  if (ev->config().pp == 1) {
    MIH_ASSERT_VERDICT(verdicts::replica_digests_agree(*ev));
    return;
  }
  // Under pp mih's session records no digests (a rank holds its stage's parameters only): its
  // ranks' copies, tied ones across stages included, are compared in process (MIH-PROBE-001).
  MIH_ASSERT_VERDICT(no_error_findings(*ev, {codes::kProbeReplicas}));
}

}  // namespace mih::conformance
