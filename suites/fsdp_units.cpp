// The FsdpUnits suite (suites/suite_table.h): every sharded parameter in exactly one unit of one dtype and mesh.
#include "suites/conformance.h"

namespace mih::conformance {

using verdicts::no_error_findings;

bool FsdpUnits::applies([[maybe_unused]] const SuiteContext& s) {
  return s.c.config.dp_shard > 1;
}
const char* FsdpUnits::where() { return "cases with dp_shard > 1 (FSDP)"; }

namespace {
verdicts::Verdict judged_units(const verdicts::JudgedCase& c) { return verdicts::fsdp_units_cover_parameters(c.ev); }
std::string units_examinable(const verdicts::JudgedCase& c) { return verdicts::fsdp_units_examinable(c.ev); }
}  // namespace

// The FSDP units (check/fsdp_units.json: each unit's parameters and dtype@mesh signatures)
// against the parameter table's sharded rows, whoever wrote them. Not declared to another
// writer's evidence: UnitsHoldOneDtypeAndMesh (the in-process check's signature of each
// parameter and the root unit of mih's runtime; the declared test judges the recorded
// signatures, one per unit, too).
MIH_SUITE_READS(FsdpUnits, {.files = {layout::kStructure, layout::kFsdpUnits, layout::kConfigResolved},
                            .examinable = &units_examinable,
                            .tests = {{"EveryShardedParameterInOneUnit", &judged_units}}});

TEST_P(FsdpUnits, EveryShardedParameterInOneUnit) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(no_error_findings(*ev, {codes::kStructFsdpUnit}));
  MIH_ASSERT_VERDICT(verdicts::fsdp_units_cover_parameters(*ev));
}
TEST_P(FsdpUnits, UnitsHoldOneDtypeAndMesh) {
  MIH_CASE_EVIDENCE(ev);
  // The root unit is one of them: routed experts (reduced over edp) never join it (over dp_shard).
  MIH_ASSERT_VERDICT(no_error_findings(*ev, {codes::kStructUnitMixed, codes::kStructExpertInRoot}));
}

}  // namespace mih::conformance
