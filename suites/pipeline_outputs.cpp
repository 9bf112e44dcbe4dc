// The PipelineOutputs suite (suites/suite_table.h): what the model is given, recomputed from the
// raw documents the pipeline cut its rows from (a pipeline bug the reference shares, which the
// comparison with it cannot see).
#include "suites/conformance.h"

namespace mih::conformance {

using verdicts::no_error_findings;

bool PipelineOutputs::applies(const SuiteContext& s) { return s.spec.data.rows_from_documents; }
const char* PipelineOutputs::where() { return "every case of a spec whose pipeline cuts rows out of documents"; }

MIH_SUITE_READS_NONE(PipelineOutputs);

TEST_P(PipelineOutputs, FieldsRecomputedFromTheRawDocuments) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(no_error_findings(*ev, {codes::kDataNotFromDocuments}));
}

}  // namespace mih::conformance
