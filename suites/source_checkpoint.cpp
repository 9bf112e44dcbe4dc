// The SourceCheckpoint suite (suites/suite_table.h): the key map against the keys of a source
// checkpoint (CheckpointSpec::source, or the checkpoint the cases are initialized from).
#include "suites/conformance.h"

namespace mih::conformance {

using verdicts::no_error_findings;

bool SourceCheckpoint::applies([[maybe_unused]] const SuiteContext& s) {
  return !s.spec.checkpoint.source.empty() || !s.spec.checkpoint.init_from.empty();
}
const char* SourceCheckpoint::where() {
  return "every case of a spec that names a source checkpoint (checkpoint.source) or is initialized from one "
         "(checkpoint.init_from, --init-from)";
}

MIH_SUITE_READS_NONE(SourceCheckpoint);

TEST_P(SourceCheckpoint, NoUnexpectedOrMissingSourceKey) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(no_error_findings(*ev, {codes::kCkptUnexpectedSource, codes::kCkptMissingSource}));
}

}  // namespace mih::conformance
