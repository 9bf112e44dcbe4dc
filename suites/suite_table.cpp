// The suite table (see suite_table.h), generated from MIH_SUITES.
#include "suites/suite_table.h"

#include "harness/base/error.h"
#include "suites/conformance.h"

namespace mih::conformance {

const std::vector<SuiteRow>& suite_table() {
#define MIH_SUITE_ROW_(unused, Suite) {#Suite, &Suite::applies, &Suite::where, &Suite::reads},
  static const std::vector<SuiteRow> table = {MIH_SUITES(MIH_SUITE_ROW_, _)};
#undef MIH_SUITE_ROW_
  return table;
}

std::vector<verdicts::DeclaredReads> declared_reads() {
  std::vector<verdicts::DeclaredReads> out;
  for (const SuiteRow& row : suite_table()) out.push_back({row.name, row.reads()});
  return out;
}

const SuiteRow& suite_row(const std::string& name) {
  for (const auto& row : suite_table()) {
    if (row.name == name) return row;
  }
  MIH_THROW(Code::kInternal, "suite '", name, "' is not in the suite table (suites/suite_table.h)");
}

// A binary may link the suites without instantiating all of them (a spec-less test binary,
// or a spec none of whose cases a suite applies to).
#define MIH_ALLOW_UNINSTANTIATED_(unused, Suite) GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(Suite);
MIH_SUITES(MIH_ALLOW_UNINSTANTIATED_, _)
#undef MIH_ALLOW_UNINSTANTIATED_

}  // namespace mih::conformance
