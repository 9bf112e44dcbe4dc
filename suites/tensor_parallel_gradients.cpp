// The TensorParallelGradients suite (suites/suite_table.h): a parameter replicated over tp
// whose local gradients differ across the tp ranks (measured before synchronization) is
// declared partial over tp, and one whose gradients are whole is not.
#include "suites/conformance.h"

namespace mih::conformance {

using verdicts::no_error_findings;

bool TensorParallelGradients::applies(const SuiteContext& s) { return s.c.config.tp > 1; }
const char* TensorParallelGradients::where() { return "cases with tp > 1"; }

MIH_SUITE_READS_NONE(TensorParallelGradients);

TEST_P(TensorParallelGradients, PartialSumsDeclaredWhereTheyAre) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(no_error_findings(*ev, {codes::kGradTpPartialUndeclared, codes::kGradTpPartialWhole}));
}

}  // namespace mih::conformance
