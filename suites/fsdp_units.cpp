// The FsdpUnits suite (suites/suite_table.h): every sharded parameter in exactly one unit of one dtype and mesh.
#include "suites/conformance.h"

namespace mih::conformance {

using verdicts::no_error_findings;

bool FsdpUnits::applies([[maybe_unused]] const SuiteContext& s) {
  return s.c.config.dp_shard > 1;
}
const char* FsdpUnits::where() { return "cases with dp_shard > 1 (FSDP)"; }

MIH_SUITE_READS_NONE(FsdpUnits);

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
