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

// Every rank's digests of its gradient pieces after the synchronization and the bytes rank 0's
// reductions moved, whoever wrote them (mih's session, harness/session/session_replicas.cpp, on
// one pipeline stage; a trainer session; another writer).
MIH_SUITE_READS(GradientSync, {.files = {verdicts::any_step(&layout::gradient_replicas_step), layout::kStructure, layout::kMetrics},
                               .examinable = &gradients_examinable,
                               .tests = {{"EachGradientReducedOverItsDomain", &judged_gradients}}});

TEST_P(GradientSync, EachGradientReducedOverItsDomain) {
  MIH_CASE_EVIDENCE(ev);
  // The copies agree and the reductions moved their bytes (mih's session records no digests
  // under pp, where a rank holds its stage's parameters only, nor for a spec that declares
  // parameters unused, which no rank has a gradient of: GradientPresence judges those; the
  // session's condition is session_internal::digests_recorded) ...
  const bool declares_unused = !spec::SpecRegistry::instance().get(request()->spec).unused_parameters.empty();
  if (ev->config().pp == 1 && !declares_unused) MIH_ASSERT_VERDICT(verdicts::gradient_digests_agree(*ev));
  // ... and each gradient was reduced over exactly its domain's axes, as the session's ledger
  // of reductions says (MIH-GRAD-001), which digests cannot tell.
  MIH_ASSERT_VERDICT(no_error_findings(*ev, {codes::kGradReduction}));
}

}  // namespace mih::conformance
