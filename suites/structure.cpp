// The Structure suite (suites/suite_table.h): the parameter table against the placements, dtypes and devices, finite
// values, and no tensor under two names the spec does not declare tied.
#include "suites/conformance.h"

namespace mih::conformance {

using verdicts::no_error_findings;

bool Structure::applies([[maybe_unused]] const SuiteContext& s) {
  return true;
}
const char* Structure::where() { return "every case"; }

namespace {
verdicts::Verdict judged_local_shapes(const verdicts::JudgedCase& c) { return verdicts::local_shapes_match_placements(c.ev); }
verdicts::Verdict judged_dtypes(const verdicts::JudgedCase& c) { return verdicts::dtypes_as_configured(c.ev); }
std::string structure_examinable(const verdicts::JudgedCase& c) { return verdicts::structure_examinable(c.ev); }
}  // namespace

// The parameter table (rank 0's rows: global and local shape, placement per axis, dtype, device)
// and the degrees and lane it ran under, whoever wrote them. Not declared to another writer's
// evidence: ParametersAndBuffersFinite (the check reads every parameter and buffer in-process at
// initialization; the probes hold the watched parameters' non-finite counts only, and no buffer,
// so a pass on them would say what was not examined) and EveryAliasIsADeclaredTie (it judges
// the aliases against the spec's declared ties, which another writer has none of).
MIH_SUITE_READS(Structure, {.files = {layout::kStructure, layout::kConfigResolved},
                            .examinable = &structure_examinable,
                            .tests = {{"LocalShapesMatchPlacements", &judged_local_shapes},
                                      {"DtypeAndDeviceAsConfigured", &judged_dtypes}}});

// The in-process check (MIH-STRUCT-001: every rank's tensor against its padded and tp pieces)
// and the table's rule, rank 0's rows against their placements, which judges any writer.
TEST_P(Structure, LocalShapesMatchPlacements) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(no_error_findings(*ev, {codes::kStructLocalShape}));
  MIH_ASSERT_VERDICT(verdicts::local_shapes_match_placements(*ev));
}
TEST_P(Structure, DtypeAndDeviceAsConfigured) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(no_error_findings(*ev, {codes::kStructDtypeDevice}));
  MIH_ASSERT_VERDICT(verdicts::dtypes_as_configured(*ev));
}
TEST_P(Structure, ParametersAndBuffersFinite) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(no_error_findings(*ev, {codes::kStructNonFinite}));
}

// Issue 52: a port's q_norm registered again as k_norm trained one tensor for both, and no
// suite said so (only structure.json's aliases column did).
TEST_P(Structure, EveryAliasIsADeclaredTie) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(no_error_findings(*ev, {codes::kStructAliasUndeclared}));
}

}  // namespace mih::conformance
