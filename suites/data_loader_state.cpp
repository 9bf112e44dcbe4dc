// The DataLoaderState suite (suites/suite_table.h): a loader with epochs continues across a
// resume exactly where the checkpoint was saved: every sample once per epoch over both
// phases, and the uninterrupted run's ledger after the load.
#include "suites/conformance.h"

namespace mih::conformance {

bool DataLoaderState::applies(const SuiteContext& s) {
  return static_cast<bool>(s.spec.data.make_loader) && s.c.save_config.has_value();
}
const char* DataLoaderState::where() {
  return "resume and cross-topology resume cases of a spec whose data has a loader with state (epochs)";
}

MIH_SUITE_READS_NONE(DataLoaderState);

// No sample twice in an epoch, none skipped, across the save and the load.
TEST_P(DataLoaderState, EverySampleOncePerEpochAcrossTheResume) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(verdicts::samples_once_per_epoch(*ev));
}
// After the load each step serves the uninterrupted run's samples and leaves the loader (its
// epoch, position, seed) as that run's.
TEST_P(DataLoaderState, SampleLedgerAfterLoadMatchesUninterruptedRun) {
  MIH_CASE_EVIDENCE(ev);
  MIH_COMPARED_EVIDENCE(twin);
  MIH_ASSERT_VERDICT(verdicts::ledger_matches_uninterrupted_run(*twin, *ev, resolved_case().resume_at));
}

}  // namespace mih::conformance
