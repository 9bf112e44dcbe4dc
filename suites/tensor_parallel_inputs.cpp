// The TensorParallelInputs suite (suites/suite_table.h): every tp rank of a data-parallel rank sees the same micro-batches.
#include "suites/conformance.h"

namespace mih::conformance {

using verdicts::no_error_findings;

bool TensorParallelInputs::applies([[maybe_unused]] const SuiteContext& s) {
  return s.c.config.tp > 1;
}
const char* TensorParallelInputs::where() { return "cases with tp > 1"; }

MIH_SUITE_READS_NONE(TensorParallelInputs);

TEST_P(TensorParallelInputs, RanksSeeTheSameInputs) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(no_error_findings(*ev, {codes::kInputTpRanks}));
}

}  // namespace mih::conformance
