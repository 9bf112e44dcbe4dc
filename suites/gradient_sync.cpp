// The GradientSync suite (suites/suite_table.h): every gradient is reduced over exactly the
// mesh axes of its gradient domain (the parameter table), as the collectives of the step
// actually reduced it.
#include "suites/conformance.h"

namespace mih::conformance {

using verdicts::no_error_findings;

bool GradientSync::applies(const SuiteContext& s) { return s.c.config.world_size() > 1; }
const char* GradientSync::where() { return "cases with more than one rank"; }

verdicts::Verdict judged_gradients(const verdicts::JudgedCase& c) { return verdicts::gradient_digests_agree(c.ev); }
std::string gradients_examinable(const verdicts::JudgedCase& c) { return verdicts::gradient_digests_examinable(c.ev); }

// Another writer's digests of every rank's gradient pieces after its synchronization and the
// bytes its reductions moved (mih's session judges its gradients in process and records its
// findings, MIH-GRAD-001, which the TEST_P below reads).
MIH_SUITE_READS(GradientSync, {.files = {verdicts::any_step(&layout::gradient_replicas_step), layout::kStructure, layout::kMetrics},
                               .examinable = &gradients_examinable,
                               .tests = {{"EachGradientReducedOverItsDomain", &judged_gradients}}});

TEST_P(GradientSync, EachGradientReducedOverItsDomain) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(no_error_findings(*ev, {codes::kGradReduction}));
}

}  // namespace mih::conformance
