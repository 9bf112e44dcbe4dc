// The CommVolume suite (suites/suite_table.h): the bytes per mesh axis the config implies.
#include "suites/conformance.h"

namespace mih::conformance {

bool CommVolume::applies([[maybe_unused]] const SuiteContext& s) {
  return true;
}
const char* CommVolume::where() { return "every case"; }

MIH_SUITE_READS_NONE(CommVolume);

TEST_P(CommVolume, BytesPerAxisMatchTheConfig) {
  MIH_CASE_EVIDENCE(ev);
  MIH_ASSERT_VERDICT(verdicts::comm_volume(*ev));
}

}  // namespace mih::conformance
