// The PipelineSchedule suite (suites/suite_table.h): the order of forwards and backwards every
// pp rank ran is a valid step of the case's schedule.
#include "suites/conformance.h"

namespace mih::conformance {

bool PipelineSchedule::applies(const SuiteContext& s) { return s.c.config.pipelined(); }
const char* PipelineSchedule::where() { return "cases with pipeline stages (pp x vpp > 1)"; }

MIH_SUITE_READS_NONE(PipelineSchedule);

TEST_P(PipelineSchedule, EveryRankRanAValidOrder) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(verdicts::pipeline_schedule(*ev));
}

}  // namespace mih::conformance
