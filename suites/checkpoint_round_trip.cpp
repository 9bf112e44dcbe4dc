// The CheckpointRoundTrip suite (suites/suite_table.h): what was saved is what is loaded, bit for bit.
#include "suites/conformance.h"

namespace mih::conformance {

bool CheckpointRoundTrip::applies([[maybe_unused]] const SuiteContext& s) {
  return s.c.save_config.has_value();
}
const char* CheckpointRoundTrip::where() { return "resume and cross-topology resume cases"; }

verdicts::Verdict judged_round_trip(const verdicts::JudgedCase& c) { return verdicts::restored_what_was_saved(c.ev); }

// The hashes of every tensor the save captured (its phase's directory) and the load restored.
MIH_SUITE_READS(CheckpointRoundTrip, {.files = {layout::kRoundtripLoad, layout::before_save(layout::kRoundtripSave)},
                                      .tests = {{"LoadedTensorsBitExact", &judged_round_trip}}});

TEST_P(CheckpointRoundTrip, LoadedTensorsBitExact) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(verdicts::checkpoint_round_trip(*ev));
}

}  // namespace mih::conformance
