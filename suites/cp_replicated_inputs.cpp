// The CpReplicatedInputs suite (suites/suite_table.h): every cp rank receives a cp-replicated field whole and the same.
#include <algorithm>

#include "suites/conformance.h"

namespace mih::conformance {

using verdicts::no_error_findings;

bool CpReplicatedInputs::applies([[maybe_unused]] const SuiteContext& s) {
  return s.c.config.cp > 1 && std::any_of(s.spec.data.fields.begin(), s.spec.data.fields.end(),
                                   [](const spec::FieldSpec& f) { return f.cp == spec::CpSharding::kReplicated; });
}
const char* CpReplicatedInputs::where() { return "cases with cp > 1 of a spec with a cp-replicated field"; }

MIH_SUITE_READS_NONE(CpReplicatedInputs);

TEST_P(CpReplicatedInputs, FieldsAgreeOverCp) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(no_error_findings(*ev, {codes::kInputCpReplicated}));
}

}  // namespace mih::conformance
