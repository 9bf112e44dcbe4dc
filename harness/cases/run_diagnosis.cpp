// The diagnosis printer of `mih test` (run_diagnosis_internal.h).
#include "harness/cases/run_diagnosis_internal.h"

#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "harness/evidence/diagnosis.h"
#include "harness/evidence/report.h"

namespace mih::cases {
namespace {

class DiagnosisPrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit DiagnosisPrinter(std::filesystem::path root) : root_(std::move(root)) {}

  void OnTestIterationEnd(const ::testing::UnitTest& unit, int) override {
    if (unit.failed_test_count() == 0) return;
    std::set<std::string> ran;  // the full names of the tests this process ran
    for (int i = 0; i < unit.total_test_suite_count(); ++i) {
      const ::testing::TestSuite& suite = *unit.GetTestSuite(i);
      for (int j = 0; j < suite.total_test_count(); ++j) {
        const ::testing::TestInfo& t = *suite.GetTestInfo(j);
        if (t.should_run()) ran.insert(std::string(suite.name()) + "." + t.name());
      }
    }
    std::vector<std::string> lines;
    try {
      RunResults run = read_run_results(root_);
      std::vector<TestResult> mine;
      std::set<std::pair<std::string, std::string>> cases;
      for (auto& t : run.tests) {
        if (!ran.count(t.name)) continue;
        cases.insert({t.spec, t.case_name});
        mine.push_back(std::move(t));
      }
      run.tests = std::move(mine);
      std::vector<CaseResult> kept;
      for (auto& c : run.cases) {
        if (cases.count({c.spec, c.name})) kept.push_back(std::move(c));
      }
      run.cases = std::move(kept);
      const Diagnosis d = diagnose(diagnosis_cases(run));
      if (d.failing.size() + d.passing.size() < 2) return;
      lines = d.lines();
    } catch (const std::exception& e) {
      lines = {std::string("no diagnosis across the matrix: ") + e.what()};
    }
    for (const auto& line : lines) std::printf("[ DIAGNOSIS ] %s\n", line.c_str());
    std::fflush(stdout);
  }

 private:
  std::filesystem::path root_;
};

}  // namespace

::testing::TestEventListener* new_diagnosis_printer(const std::filesystem::path& root) {
  return new DiagnosisPrinter(root);
}

}  // namespace mih::cases
