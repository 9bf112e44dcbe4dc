// The conformance run's results writer (results.jsonl) and the integration state of each
// case after its tests (see conformance_run.h).
#include "harness/cases/run_results_internal.h"

#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "harness/contract/case_outcome.h"
#include "harness/base/error.h"
#include "harness/contract/evidence_layout.h"
#include "harness/base/files.h"
#include "harness/cases/conformance_run.h"
#include "harness/cases/memo.h"
#include "harness/cases/memo_internal.h"
#include "harness/cases/registrations.h"
#include "harness/compare/verdicts.h"
#include "harness/evidence/case_completion_internal.h"
#include "harness/evidence/evidence_store.h"
#include "harness/runtime/launcher.h"
#include "harness/spec/model_spec.h"

namespace mih::cases {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const char* signal_name(int sig) { return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "a signal"; }

// Appends one line per finished test to <root>/results.jsonl (whole-line O_APPEND writes:
// several processes of one ctest run share the file, and a full disk keeps whole lines or
// nothing). Each process first appends a "run" start line listing the tests it will run and
// last an end line, so a report can tell an incomplete run ("incomplete: K of N tests").
// A SIGINT or SIGTERM (the launch in flight stopped by the launcher) ends the run after the
// test in flight, which is not recorded: the end line says so and the process exits 128 +
// the signal.
class ResultsWriter : public ::testing::EmptyTestEventListener {
 public:
  void OnTestProgramStart(const ::testing::UnitTest& unit) override {
    json names = json::array();
    for (int i = 0; i < unit.total_test_suite_count(); ++i) {
      const ::testing::TestSuite& suite = *unit.GetTestSuite(i);
      const std::string full = suite.name();
      const auto slash = full.find('/');
      if (slash == std::string::npos || !find_registration(full.substr(0, slash))) continue;
      for (int j = 0; j < suite.total_test_count(); ++j) {
        if (suite.GetTestInfo(j)->should_run()) names.push_back(full + "." + suite.GetTestInfo(j)->name());
      }
    }
    expected_ = static_cast<int>(names.size());
    json start = {{"event", "start"}, {"pid", ::getpid()}, {"time", now_stamp()}, {"tests", names}};
    // What the run left out on purpose, for every report's totals (RunResults::not_run).
    if (run_options().no_golden) start["not_run"] = json::array({kMatchesOriginalNotRun});
    append({{"run", start}});
  }

  void OnTestProgramEnd(const ::testing::UnitTest&) override {
    append({{"run", {{"event", "end"}, {"pid", ::getpid()}, {"time", now_stamp()}, {"completed", written_}}}});
  }

  void OnTestEnd(const ::testing::TestInfo& info) override {
    if (const int sig = interrupt_signal()) interrupted(sig);
    const std::string suite_full = info.test_suite_name(), name_full = info.name();
    const auto slash = suite_full.find('/');
    if (slash == std::string::npos) return;
    const Registration* r = find_registration(suite_full.substr(0, slash));
    if (!r) return;
    const auto pslash = name_full.rfind('/');
    const std::string case_name = pslash == std::string::npos ? "" : name_full.substr(pslash + 1);
    const auto* result = info.result();
    const TestStatus status = result->Skipped() ? TestStatus::kSkipped
                              : result->Failed() ? TestStatus::kFailed
                                                 : TestStatus::kPassed;
    std::string message;
    for (int i = 0; i < result->total_part_count(); ++i) {
      const auto& part = result->GetTestPartResult(i);
      if (part.failed() || part.skipped()) message += (message.empty() ? "" : "\n") + std::string(part.message());
    }
    std::string examined;  // what a passing verdict examined (MIH_ASSERT_VERDICT records it)
    for (int i = 0; i < result->test_property_count(); ++i) {
      if (std::string(result->GetTestProperty(i).key()) == "examined") examined = result->GetTestProperty(i).value();
    }
    char stamp[32];
    const std::time_t now = std::time(nullptr);
    std::strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
    json line = {{"name", suite_full + "." + name_full},
                       {"spec", r->spec},
                       {"case", case_name},
                       {"suite", suite_full.substr(slash + 1)},
                       {"test", pslash == std::string::npos ? name_full : name_full.substr(0, pslash)},
                       {"status", test_status_name(status)},
                       {"message", message},
                       {"seconds", static_cast<double>(result->elapsed_time()) / 1000.0},
                       {"evidence", r->spec + "/" + case_name},
                       {"time", stamp}};
    if (!examined.empty()) line["examined"] = examined;
    if (append(line)) ++written_;
  }

 private:
  static std::string now_stamp() {
    char stamp[32];
    const std::time_t now = std::time(nullptr);
    std::strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
    return stamp;
  }

  // One whole line, or nothing and a message (once) that makes the run exit 12. `mih check`
  // writes nothing into the evidence it judges.
  bool append(const json& line) {
    if (run_options().read_only) return true;
    try {
      append_whole(run_options().evidence_root / layout::kResults, line.dump() + "\n");
      return true;
    } catch (const Error& e) {
      note_error(Code::kFailedPrecondition);
      if (!write_failed_) std::fprintf(stderr, "mih: failed_precondition error: %s\n", e.what());
      write_failed_ = true;
      return false;
    }
  }

  [[noreturn]] void interrupted(int sig) {
    append({{"run",
             {{"event", "end"}, {"pid", ::getpid()}, {"time", now_stamp()}, {"completed", written_},
              {"interrupted", signal_name(sig)}}}});
    if (run_options().read_only) {
      std::fprintf(stderr, "mih: interrupted by %s after %d of %d tests\n", signal_name(sig), written_, expected_);
    } else {
      std::fprintf(stderr,
                   "mih: interrupted by %s: %d of %d tests recorded in %s (marked incomplete; the test in flight is "
                   "not); rerun the same command to finish: complete cases are reused\n",
                   signal_name(sig), written_, expected_, (run_options().evidence_root / layout::kResults).c_str());
    }
    std::fflush(nullptr);
    std::_Exit(128 + sig);
  }

  int expected_ = 0, written_ = 0;
  bool write_failed_ = false;
};

// Whether the module parity of registration `r`'s spec holds on its Reference's evidence (what
// ModuleParity asserts there), for a run that judges a case without running ModuleParity
// (ctest runs one case per process): "" when it holds, else why not. The Reference is the
// memoized case every other test of the run reads (launched if this run has not yet).
std::string module_parity_on_evidence(const Registration& r) {
  const spec::CaseMatrix& m = resolved_matrix(r.spec, matrix_of(r));
  const auto ref = std::find_if(m.cases.begin(), m.cases.end(),
                                [](const spec::Case& c) { return c.kind == spec::CaseKind::kReference; });
  if (ref == m.cases.end()) {
    return "matrix '" + m.name + "' has no Reference case, which the spec's module parity cases run with";
  }
  try {
    const CaseOutcome& o = ensure_case(*case_request(r, ref->name));
    if (o.outcome != Outcome::kRan) {
      return "its " + ref->name + " did not complete (" + std::string(outcome_name(o.outcome)) + ": " + o.error + ")";
    }
    const verdicts::Verdict v = verdicts::module_parity(verdicts::CaseEvidence(o.evidence));
    return v.passed() ? "" : "ModuleParity fails on " + r.spec + "/" + ref->name + ": " + v.message;
  } catch (const std::exception& e) {
    return std::string("its Reference's module parity could not be read: ") + e.what();
  }
}

}  // namespace

::testing::TestEventListener* new_results_writer() { return new ResultsWriter; }

std::pair<std::string, const CaseOutcome*> incomplete_dependency(const Registration& r, const std::string& case_name) {
  const spec::CaseMatrix& m = resolved_matrix(r.spec, matrix_of(r));
  auto find = [&](const std::string& name) -> const spec::Case* {
    for (const spec::Case& c : m.cases) {
      if (c.name == name) return &c;
    }
    return nullptr;
  };
  std::vector<std::string> reads;
  std::set<std::string> seen = {case_name};
  for (const spec::Case* c = find(case_name); c && !c->compare_to.empty() && seen.insert(c->compare_to).second;
       c = find(c->compare_to)) {
    reads.push_back(c->compare_to);
  }
  for (const char* lane : {spec::kLaneReference, spec::kNoiseTwin}) {
    if (find(lane) && seen.insert(lane).second) reads.push_back(lane);
  }
  for (const std::string& name : reads) {
    const CaseOutcome* o = memoized_outcome(r.spec, name);
    if (o && o->outcome != Outcome::kRan && o->outcome != Outcome::kVerifyOnly) return {r.spec + "/" + name, o};
  }
  return {"", nullptr};
}

// The integration state of every case whose tests all ran in this run (a case a filter left
// tests of out is not judged, and keeps its state), and the rule that makes it agree with the
// exit status (README "Exit codes"):
//   - every test passed: MATRIX_PASSED, once the spec's module parity holds (its ModuleParity
//     tests in this run, or, when the run did not run them, the same verdict on the Reference's
//     evidence); the gates advance one at a time, through MODULE_PARITY_PASSED;
//   - a test failed on a case that ran to its end (Outcome::kRan): FAILED, naming the failed
//     tests (the run exits non-zero for the test); a case that did not (infrastructure, bad
//     input, environment), or whose tests read one that did not (incomplete_dependency), keeps
//     its state;
//   - every test passed, yet the case cannot be MATRIX_PASSED (the session failed it: an error
//     finding, a hook that raised; an earlier run's tests failed on the same evidence; the
//     module parity does not hold; no state was written): returned, and the run exits 1.
// Verify-only runs (`mih check`) write no state: a case whose recorded state is FAILED or
// BLOCKED is returned when its tests passed.
namespace {

// The tests of a case (or of a spec's ModuleParity) in this run.
struct Tally {
  int total = 0, ran = 0;
  std::vector<std::string> failed;
  const Registration* registration = nullptr;
};

struct Tallies {
  std::map<std::string, Tally> by_case;  // "<spec>/<case>", the evidence layout
  std::map<std::string, Tally> parity;   // spec -> its ModuleParity tests
};

// Every conformance test of the run, by case and (ModuleParity) by spec.
Tallies tally_tests() {
  Tallies out;
  const ::testing::UnitTest& unit = *::testing::UnitTest::GetInstance();
  for (int i = 0; i < unit.total_test_suite_count(); ++i) {
    const ::testing::TestSuite& suite = *unit.GetTestSuite(i);
    const std::string full = suite.name();
    const auto slash = full.find('/');
    if (slash == std::string::npos) continue;
    const Registration* r = find_registration(full.substr(0, slash));
    if (!r) continue;
    for (int j = 0; j < suite.total_test_count(); ++j) {
      const ::testing::TestInfo& test = *suite.GetTestInfo(j);
      const std::string name = test.name();
      const auto pslash = name.rfind('/');
      if (pslash == std::string::npos) continue;
      const bool module_parity = full.substr(slash + 1) == "ModuleParity";
      for (Tally* t : {&out.by_case[r->spec + "/" + name.substr(pslash + 1)], module_parity ? &out.parity[r->spec] : nullptr}) {
        if (!t) continue;
        if (!t->registration) t->registration = r;
        ++t->total;
        if (!test.should_run()) continue;
        ++t->ran;
        if (test.result()->Failed()) t->failed.push_back(full.substr(slash + 1) + "." + name.substr(0, pslash));
      }
    }
  }
  return out;
}

// Whether the state `recorded` of case `key` is settled (none, not the run's, FAILED or
// BLOCKED): left as it is, with a line in `disagree` where every test passed.
bool settled(const std::string& key, const Tally& t, const CaseState& recorded, std::vector<std::string>& disagree) {
  if (recorded.state.empty()) {
    // Launched here, a case whose tests passed has its state; evidence of a loop of one's
    // own (verify-only) may have none, and its tests are the verdict.
    if (!run_options().verify_only && t.failed.empty()) {
      disagree.push_back(key + ": every test passed, but it has no integration_state.json");
    }
    return true;
  }
  if (!recorded.disagreement.empty()) {
    if (t.failed.empty()) {
      disagree.push_back(key + ": every test passed, but " + recorded.disagreement +
                         ": the state is not its run's; relaunch the case into a new evidence root");
    }
    return true;
  }
  const IntegrationState now = parse_state(recorded.state);
  if (now != IntegrationState::kFailed && now != IntegrationState::kBlocked) return false;
  if (t.failed.empty()) {
    disagree.push_back(key + ": every test passed, but its integration_state.json is " + state_name(now) + " (" +
                       recorded.reason + "); a failed case stays failed: relaunch it into a new evidence root");
  }
  return true;
}

// Every test of case `key` passed: MATRIX_PASSED once the spec's module parity holds.
void pass_case(const std::string& key, const Tally& t, const Tallies& tallies, const CaseState& recorded,
               IntegrationStateMachine& machine, std::vector<std::string>& disagree) {
  const std::string spec_name = key.substr(0, key.find('/'));
  std::string parity_problem;
  if (!spec::SpecRegistry::instance().get(spec_name).parity_cases.empty()) {
    const auto p = tallies.parity.find(spec_name);
    if (p != tallies.parity.end() && p->second.total > 0 && p->second.ran == p->second.total) {
      if (!p->second.failed.empty()) parity_problem = "the spec's ModuleParity failed in this run";
    } else {
      parity_problem = module_parity_on_evidence(*t.registration);
    }
  }
  if (!parity_problem.empty()) {
    disagree.push_back(key + ": every test passed, but the spec's module parity does not hold (" + parity_problem +
                       "); it stays " + state_name(parse_state(recorded.state)) + ", never MATRIX_PASSED");
    return;
  }
  machine.advance_if_before(IntegrationState::kMatrixPassed, {layout::kFindings});
}

// A test of case `key` failed. Only a verdict on the model fails it: a case that did not run to
// its end (a transport failure, bad input, an environment problem, an external launch's
// evidence this run refused to replace) keeps its state, and the run's exit status says why.
void fail_case(const std::string& key, const Tally& t, IntegrationStateMachine& machine) {
  const std::string spec_name = key.substr(0, key.find('/')), case_name = key.substr(key.find('/') + 1);
  const CaseOutcome* outcome = memoized_outcome(spec_name, case_name);
  if (!outcome || outcome->outcome != Outcome::kRan) return;
  // Nor does a case whose tests read a case that did not complete (its Reference died): they
  // judged nothing, and a rerun judges it.
  if (incomplete_dependency(*t.registration, case_name).second) return;
  std::string reason = std::to_string(t.failed.size()) + " of " + std::to_string(t.total) + " tests failed: ";
  for (size_t k = 0; k < std::min<size_t>(t.failed.size(), 5); ++k) reason += (k ? ", " : "") + t.failed[k];
  if (t.failed.size() > 5) reason += ", ...";
  machine.fail(reason + " (see results.jsonl of the run)", {layout::kFindings});
}

}  // namespace

std::vector<std::string> record_case_states() {
  const Tallies tallies = tally_tests();
  const bool verify_only = run_options().verify_only;
  std::vector<std::string> disagree;
  for (const auto& [key, t] : tallies.by_case) {
    if (t.ran < t.total || (verify_only && !t.failed.empty())) continue;
    const fs::path dir = run_options().evidence_root / key;
    try {
      // The state as the run's record bounds it (case_run.json's "state"): integration_state.json
      // is outside the digests, and deleting or editing it never turns a failed case into a pass.
      const CaseState recorded = read_case_state(dir);
      if (settled(key, t, recorded, disagree) || verify_only) continue;
      const EvidenceDir evidence(dir);
      IntegrationStateMachine machine(evidence);
      if (t.failed.empty()) {
        pass_case(key, t, tallies, recorded, machine, disagree);
      } else {
        fail_case(key, t, machine);
      }
    } catch (const std::exception& e) {
      // The state could not be read or written: the environment, and the run says so (exit 12).
      note_error(Code::kFailedPrecondition);
      std::fprintf(stderr, "mih: the integration state of %s was not %s: %s\n", dir.c_str(),
                   verify_only ? "read" : "updated", e.what());
    }
  }
  return disagree;
}

}  // namespace mih::cases
