// `mih test`, `mih check` and `mih faults`, and the main() of every conformance binary: the
// conformance run's own flags (CLI11; --gtest_* flags go to GoogleTest), the results writer
// (results.jsonl), the ctest case list with its labels from the suite table, and the run's
// exit status.
#include <fcntl.h>
#include <fnmatch.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <variant>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "harness/base/error.h"
#include "harness/base/fault.h"
#include "harness/base/files.h"
#include "harness/base/json_fields.h"
#include "harness/cases/faults.h"
#include "harness/cases/golden.h"
#include "harness/cases/hf_interop.h"
#include "harness/cases/memo.h"
#include "harness/cases/registrations.h"
#include "harness/cli/cli.h"
#include "harness/cli/commands.h"
#include "harness/cli/run_diagnosis_internal.h"
#include "harness/compare/verdicts.h"
#include "harness/evidence/evidence_store.h"
#include "harness/spec/model_spec.h"
#include "harness/runtime/cli_support.h"
#include "harness/runtime/launcher.h"
#include "harness/runtime/fork_server.h"
#include "harness/runtime/selftest.h"
#include "harness/runtime/worker.h"
#include "suites/suite_table.h"

namespace mih {
namespace cli {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using cases::run_options;

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
      if (slash == std::string::npos || !cases::find_registration(full.substr(0, slash))) continue;
      for (int j = 0; j < suite.total_test_count(); ++j) {
        if (suite.GetTestInfo(j)->should_run()) names.push_back(full + "." + suite.GetTestInfo(j)->name());
      }
    }
    expected_ = static_cast<int>(names.size());
    append({{"run", {{"event", "start"}, {"pid", ::getpid()}, {"time", now_stamp()}, {"tests", names}}}});
  }

  void OnTestProgramEnd(const ::testing::UnitTest&) override {
    append({{"run", {{"event", "end"}, {"pid", ::getpid()}, {"time", now_stamp()}, {"completed", written_}}}});
  }

  void OnTestEnd(const ::testing::TestInfo& info) override {
    if (const int sig = interrupt_signal()) interrupted(sig);
    const std::string suite_full = info.test_suite_name(), name_full = info.name();
    const auto slash = suite_full.find('/');
    if (slash == std::string::npos) return;
    const cases::Registration* r = cases::find_registration(suite_full.substr(0, slash));
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
      append_whole(run_options().evidence_root / "results.jsonl", line.dump() + "\n");
      return true;
    } catch (const Error& e) {
      cases::note_error(Code::kFailedPrecondition);
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
                   signal_name(sig), written_, expected_, (run_options().evidence_root / "results.jsonl").c_str());
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
std::string module_parity_on_evidence(const cases::Registration& r) {
  const spec::CaseMatrix& m = cases::resolved_matrix(r.spec, cases::matrix_of(r));
  const auto ref = std::find_if(m.cases.begin(), m.cases.end(),
                                [](const spec::Case& c) { return c.kind == spec::CaseKind::kReference; });
  if (ref == m.cases.end()) {
    return "matrix '" + m.name + "' has no Reference case, which the spec's module parity cases run with";
  }
  try {
    const cases::CaseOutcome& o =
        cases::ensure_case({r.prefix, r.spec, cases::matrix_of(r), r.training_backend, ref->name});
    if (o.outcome != Outcome::kRan) {
      return "its " + ref->name + " did not complete (" + std::string(outcome_name(o.outcome)) + ": " + o.error + ")";
    }
    const verdicts::Verdict v = verdicts::module_parity(verdicts::CaseEvidence(o.evidence));
    return v.passed() ? "" : "ModuleParity fails on " + r.spec + "/" + ref->name + ": " + v.message;
  } catch (const std::exception& e) {
    return std::string("its Reference's module parity could not be read: ") + e.what();
  }
}

// The integration state of every case whose tests all ran in this run (a case a filter left
// tests of out is not judged, and keeps its state), and the rule that makes it agree with the
// exit status (README "Exit codes"):
//   - every test passed: MATRIX_PASSED, once the spec's module parity holds (its ModuleParity
//     tests in this run, or, when the run did not run them, the same verdict on the Reference's
//     evidence); the gates advance one at a time, through MODULE_PARITY_PASSED;
//   - a test failed: FAILED, naming the failed tests (the run exits non-zero for the test);
//   - every test passed, yet the case cannot be MATRIX_PASSED (the session failed it: an error
//     finding, a hook that raised; an earlier run's tests failed on the same evidence; the
//     module parity does not hold; no state was written): returned, and the run exits 1.
// Verify-only runs (`mih check`) write no state: a case whose recorded state is FAILED or
// BLOCKED is returned when its tests passed.
std::vector<std::string> record_case_states() {
  struct Tally {
    int total = 0, ran = 0;
    std::vector<std::string> failed;
    const cases::Registration* registration = nullptr;
  };
  std::map<std::string, Tally> by_case;  // "<spec>/<case>", the evidence layout
  std::map<std::string, Tally> parity;   // spec -> its ModuleParity tests
  const ::testing::UnitTest& unit = *::testing::UnitTest::GetInstance();
  for (int i = 0; i < unit.total_test_suite_count(); ++i) {
    const ::testing::TestSuite& suite = *unit.GetTestSuite(i);
    const std::string full = suite.name();
    const auto slash = full.find('/');
    if (slash == std::string::npos) continue;
    const cases::Registration* r = cases::find_registration(full.substr(0, slash));
    if (!r) continue;
    for (int j = 0; j < suite.total_test_count(); ++j) {
      const ::testing::TestInfo& test = *suite.GetTestInfo(j);
      const std::string name = test.name();
      const auto pslash = name.rfind('/');
      if (pslash == std::string::npos) continue;
      const bool module_parity = full.substr(slash + 1) == "ModuleParity";
      for (Tally* t : {&by_case[r->spec + "/" + name.substr(pslash + 1)], module_parity ? &parity[r->spec] : nullptr}) {
        if (!t) continue;
        if (!t->registration) t->registration = r;
        ++t->total;
        if (!test.should_run()) continue;
        ++t->ran;
        if (test.result()->Failed()) t->failed.push_back(full.substr(slash + 1) + "." + name.substr(0, pslash));
      }
    }
  }
  const bool verify_only = run_options().verify_only;
  std::vector<std::string> disagree;
  for (const auto& [key, t] : by_case) {
    if (t.ran < t.total || (verify_only && !t.failed.empty())) continue;
    const fs::path dir = run_options().evidence_root / key;
    try {
      if (!fs::exists(dir / "integration_state.json")) {
        // Launched here, a case whose tests passed has its state; evidence of a loop of one's
        // own (verify-only) may have none, and its tests are the verdict.
        if (!verify_only && t.failed.empty()) disagree.push_back(key + ": every test passed, but it has no integration_state.json");
        continue;
      }
      const EvidenceDir evidence = verify_only ? EvidenceDir::open_existing(dir) : EvidenceDir(dir);
      IntegrationStateMachine machine(evidence);
      IntegrationState now = IntegrationState::kDiscovered;
      machine.current(&now);
      if (now == IntegrationState::kFailed || now == IntegrationState::kBlocked) {
        if (t.failed.empty()) {
          disagree.push_back(key + ": every test passed, but its integration_state.json is " + state_name(now) + " (" +
                             evidence.read_json("integration_state.json").value("reason", "") +
                             "); a failed case stays failed: relaunch it into a new evidence root");
        }
        continue;
      }
      if (verify_only) continue;
      if (t.failed.empty()) {
        const std::string spec_name = key.substr(0, key.find('/'));
        std::string parity_problem;
        if (!spec::SpecRegistry::instance().get(spec_name).parity_cases.empty()) {
          const auto p = parity.find(spec_name);
          if (p != parity.end() && p->second.total > 0 && p->second.ran == p->second.total) {
            if (!p->second.failed.empty()) parity_problem = "the spec's ModuleParity failed in this run";
          } else {
            parity_problem = module_parity_on_evidence(*t.registration);
          }
        }
        if (!parity_problem.empty()) {
          disagree.push_back(key + ": every test passed, but the spec's module parity does not hold (" +
                             parity_problem + "); it stays " + state_name(now) + ", never MATRIX_PASSED");
          continue;
        }
        machine.advance_if_before(IntegrationState::kMatrixPassed, {"check/findings.json"});
        continue;
      }
      std::string reason = std::to_string(t.failed.size()) + " of " + std::to_string(t.total) + " tests failed: ";
      for (size_t k = 0; k < std::min<size_t>(t.failed.size(), 5); ++k) reason += (k ? ", " : "") + t.failed[k];
      if (t.failed.size() > 5) reason += ", ...";
      machine.fail(reason + " (see results.jsonl of the run)", {"check/findings.json"});
    } catch (const std::exception& e) {
      // The state could not be read or written: the environment, and the run says so (exit 12).
      cases::note_error(Code::kFailedPrecondition);
      std::fprintf(stderr, "mih: the integration state of %s was not %s: %s\n", dir.c_str(),
                   verify_only ? "read" : "updated", e.what());
    }
  }
  return disagree;
}

std::string run_id() {
  char stamp[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", std::localtime(&now));
  return std::string(stamp) + "-" + std::to_string(::getpid());
}

// `mih check` of a run root: the tests its run recorded it would run, which the check must
// find among its own (run_tests); empty when the check is of one case or the root records none.
std::vector<std::string> g_recorded_tests;

// "<Prefix>/<Suite>.<Test>/<Case>", the name of a conformance test (GoogleTest's for a
// value-parameterized test): no character GoogleTest's filter would read as a pattern.
bool conformance_test_name(const std::string& name) {
  static const std::regex kName("[A-Za-z0-9_]+/[A-Za-z0-9_]+\\.[A-Za-z0-9_]+/[A-Za-z0-9_]+");
  return name.size() < 512 && std::regex_match(name, kName);
}

// The tests the run of `root` recorded it would run: the start line of each of its processes
// in results.jsonl (ResultsWriter), in order, once each; empty when there is none.
// Throws: mih::Error{kFailedPrecondition} naming the file and line for a line that is not
//   JSON (but a torn last one) or a start line whose tests are not conformance test names.
std::vector<std::string> recorded_tests(const fs::path& root) {
  const fs::path file = root / "results.jsonl";
  std::error_code ec;
  if (fs::symlink_status(file, ec).type() == fs::file_type::not_found) return {};
  std::string text;
  MIH_CHECK_CODE(read_file(file, &text), Code::kFailedPrecondition, "mih check: ", file.string(),
                 " cannot be read as a file: it is not the record of a run mih wrote");
  std::vector<std::string> out;
  std::set<std::string> seen;
  size_t start = 0;
  for (int line_number = 1; start < text.size(); ++line_number) {
    size_t end = text.find('\n', start);
    const bool terminated = end != std::string::npos;
    if (!terminated) end = text.size();
    const std::string line = text.substr(start, end - start);
    start = end + 1;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() && !terminated) break;  // a writer died mid-line
    const std::string where = file.string() + " line " + std::to_string(line_number);
    MIH_CHECK_CODE(!j.is_discarded(), Code::kFailedPrecondition, "mih check: ", where,
                   " is not JSON: the run's record was truncated or edited, so what it ran cannot be read; rerun it");
    if (!j.is_object() || !j.contains("run") || !j["run"].is_object() || j["run"].value("event", json()) != "start") continue;
    const json& tests = j["run"].value("tests", json());
    MIH_CHECK_CODE(tests.is_array(), Code::kFailedPrecondition, "mih check: ", where, ": a start line lists no 'tests'");
    for (const auto& t : tests) {
      MIH_CHECK_CODE(t.is_string() && conformance_test_name(t.get<std::string>()), Code::kFailedPrecondition,
                     "mih check: ", where, ": ", t.is_string() ? "'" + t.get<std::string>().substr(0, 200) + "'" : t.type_name(),
                     " is not a conformance test name mih wrote (<Prefix>/<Suite>.<Test>/<Case>)");
      if (seen.insert(t.get<std::string>()).second) out.push_back(t.get<std::string>());
    }
  }
  return out;
}

// The fault of the catalog the record of `case_dir` names: its case_run.json, or the run/case.json
// of a case launched by torchrun or srun (which has no case_run.json); "" for none, no record,
// or a name that is no fault (the verify-only run then refuses the record, naming the field).
std::string recorded_fault(const fs::path& case_dir) {
  std::string text;
  if (!read_file(case_dir / "case_run.json", &text) && !read_file(case_dir / "run" / "case.json", &text)) return "";
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("fault") || !j["fault"].is_string() || j["fault"].get<std::string>().empty()) {
    return "";
  }
  try {
    return fault::name(fault::parse(j["fault"].get<std::string>()));
  } catch (const Error&) {
    return "";
  }
}

// `mih check <dir>`: a case directory (<root>/<spec>/<case>) or a run root.
std::vector<std::string> check_arguments(const fs::path& target, std::string* filter) {
  MIH_CHECK_CODE(fs::is_directory(target), Code::kFailedPrecondition, "mih check: ", target.string(),
                 " is not a directory; give a case's evidence directory (<root>/<spec>/<case>) or a run root");
  std::vector<std::string> args = {"--verify-only"};
  if (fs::exists(target / "environment.json") && fs::exists(target / "spec.resolved.json")) {
    const verdicts::CaseEvidence ev(target);
    const std::string spec_name = ev.json("spec.resolved.json").value("name", "");
    fs::path dir = fs::absolute(target).lexically_normal();
    if (dir.filename().empty()) dir = dir.parent_path();  // a trailing '/'
    const fs::path root = dir.parent_path().parent_path();
    // The verdicts read <root>/<spec>/<case>: a directory holding another case's evidence
    // (a copy, a rename) would have them check that other case instead.
    const std::string case_name = ev.case_info().value("name", "");
    MIH_CHECK_CODE(dir.filename() == case_name && dir.parent_path().filename() == spec_name, Code::kFailedPrecondition,
                   "mih check: ", target.string(), " holds the evidence of ", spec_name, "/", case_name,
                   " (its spec.resolved.json and case info), not of ", dir.parent_path().filename().string(), "/",
                   dir.filename().string(), "; check a case where it was written: <root>/", spec_name, "/", case_name);
    args.insert(args.end(), {"--evidence-root", root.string(), "--only-spec", spec_name});
    if (ev.has("case_run.json")) args.insert(args.end(), {"--matrix", ev.json("case_run.json").value("matrix", "")});
    // A case that started from a checkpoint is checked as one (its source keys included).
    if (ev.has("run/case.json")) {
      const json& case_file = ev.json("run/case.json");
      const json init = case_file.value("init_from", json());
      if (init.is_string() && !init.get<std::string>().empty()) {
        args.insert(args.end(), {"--init-from", init.get<std::string>()});
      }
    }
    // Name the spec's registrations: an on-request one (a fault-catalog variant) runs only then.
    std::string prefixes;
    for (const auto& r : cases::registrations()) {
      if (r.spec == spec_name) prefixes += (prefixes.empty() ? "" : ",") + r.prefix;
    }
    if (!prefixes.empty()) args.insert(args.end(), {"--prefixes", prefixes});
    // A case run with a fault of the catalog is checked as that fault run, never as the port.
    if (const std::string fault = recorded_fault(dir); !fault.empty()) {
      args.insert(args.end(), {"--fault", fault, "--fault-cases", case_name});
      std::fprintf(stderr, "mih check: %s/%s ran with fault %s of the catalog injected (its case record): checked as "
                   "that fault run, never as the fault-free port\n", spec_name.c_str(), case_name.c_str(), fault.c_str());
    }
    *filter = "*/*.*/" + ev.case_info().value("name", "");
  } else {
    args.insert(args.end(), {"--evidence-root", fs::absolute(target).string()});
    // What the run ran: the tests its processes recorded in results.jsonl's start lines. A
    // check of a filtered run judges those, never the whole default matrix (whose other cases
    // were never asked for); a root without that record (cases launched by torchrun or srun)
    // is checked over the matrix of every spec with evidence there.
    const std::vector<std::string> recorded = recorded_tests(target);
    std::set<std::string> recorded_prefixes, recorded_cases;  // "<prefix>", "<prefix>/<case>"
    for (const auto& name : recorded) {
      const std::string prefix = name.substr(0, name.find('/'));
      recorded_cases.insert(prefix + "/" + name.substr(name.rfind('/') + 1));
      MIH_CHECK_CODE(cases::find_registration(prefix) != nullptr, Code::kFailedPrecondition, "mih check: ",
                     (target / "results.jsonl").string(), " records test ", name, " of registration '", prefix,
                     "', which this mih does not link; check the run with the conformance binary that ran it");
      recorded_prefixes.insert(prefix);
    }
    std::string matrix;
    if (fs::exists(target / "run.json")) {
      const json run = read_json_file(target / "run.json");
      matrix = run.value("matrix", "");
      // The matrix each recorded registration ran, its lane included (run.json's registrations).
      std::set<std::string> ran;
      for (const auto& r : run.value("registrations", json::array())) {
        if (r.is_object() && r.value("prefix", json()).is_string() && recorded_prefixes.count(r["prefix"].get<std::string>()) &&
            r.value("matrix", json()).is_string()) {
          ran.insert(r["matrix"].get<std::string>());
        }
      }
      if (ran.size() == 1 && !ran.begin()->empty()) matrix = *ran.begin();
      // A run of one spec from a checkpoint (`mih test --only-spec S --init-from DIR`).
      const json init = run.value("init_from", json::object());
      if (init.is_object() && init.size() == 1 && fs::is_directory(target / init.begin().key())) {
        std::set<std::string> spec_dirs;
        for (const auto& r : cases::registrations()) {
          if (fs::is_directory(target / r.spec)) spec_dirs.insert(r.spec);
        }
        if (spec_dirs.size() == 1 && init.begin().value().contains("dir")) {
          args.insert(args.end(), {"--init-from", init.begin().value()["dir"].get<std::string>()});
        }
      }
    }
    if (!matrix.empty()) args.insert(args.end(), {"--matrix", matrix});
    // Only the specs with evidence under this root.
    std::string specs, prefixes;
    for (const auto& r : cases::registrations()) {
      if (recorded.empty() ? !fs::is_directory(target / r.spec) : !recorded_prefixes.count(r.prefix)) continue;
      specs += (specs.empty() ? "" : ":") + r.prefix + "/*";
      prefixes += (prefixes.empty() ? "" : ",") + r.prefix;
    }
    MIH_CHECK_CODE(!specs.empty(), Code::kFailedPrecondition, "mih check: ", target.string(),
                   " holds no evidence of a registered spec (no <spec>/ folder); is it a run root?");
    // Every case's record must be readable: a truncated or foreign case_run.json is named
    // here, not reported as hundreds of failing tests.
    for (const auto& r : cases::registrations()) {
      std::error_code ec;
      if (!fs::is_directory(target / r.spec, ec)) continue;
      for (const auto& entry : fs::directory_iterator(target / r.spec, ec)) {
        const fs::path record = entry.path() / "case_run.json";
        if (!fs::exists(record, ec)) continue;
        std::string text;
        const bool read = read_file(record, &text);
        const json j = read ? parse_json_lenient(text) : json();
        MIH_CHECK_CODE(read && j.is_object() && j.contains("outcome"), Code::kFailedPrecondition, "mih check: ",
                       record.string(), read ? " is not a case record mih wrote (truncated or foreign)" : " cannot be read",
                       "; rerun the case: mih run --spec ", r.spec, " --case ", entry.path().filename().string(),
                       " --evidence-root ", target.string());
      }
    }
    args.insert(args.end(), {"--prefixes", prefixes});
    // The cases run with a fault of the catalog (their case_run.json) are checked as that
    // fault run, never as the port: `mih test --fault F --fault-cases ...` as the run was.
    std::map<std::string, std::set<std::string>> fault_cases;  // fault -> case names
    for (const auto& r : cases::registrations()) {
      std::error_code ec;
      if (!(recorded.empty() ? fs::is_directory(target / r.spec, ec) : recorded_prefixes.count(r.prefix) > 0)) continue;
      for (const auto& entry : fs::directory_iterator(target / r.spec, ec)) {
        if (!recorded.empty() && !recorded_cases.count(r.prefix + "/" + entry.path().filename().string())) continue;
        const std::string fault = recorded_fault(entry.path());
        if (fault.empty()) continue;
        fault_cases[fault].insert(entry.path().filename().string());
        std::fprintf(stderr, "mih check: %s/%s ran with fault %s of the catalog injected (its case record): checked "
                     "as that fault run, never as the fault-free port\n", r.spec.c_str(),
                     entry.path().filename().string().c_str(), fault.c_str());
      }
    }
    MIH_CHECK_CODE(fault_cases.size() <= 1, Code::kFailedPrecondition, "mih check: the cases of ", target.string(),
                   " ran with different faults of the catalog (", fault_cases.begin()->first, " and ",
                   std::next(fault_cases.begin())->first, "), which no one run injects; check each case directory");
    if (!fault_cases.empty()) {
      std::string names;
      for (const auto& n : fault_cases.begin()->second) names += (names.empty() ? "" : ",") + n;
      args.insert(args.end(), {"--fault", fault_cases.begin()->first, "--fault-cases", names});
    }
    if (recorded.empty()) {
      *filter = specs;
    } else {
      g_recorded_tests = recorded;
      *filter = "";
      for (const auto& name : recorded) *filter += (filter->empty() ? "" : ":") + name;
    }
  }
  return args;
}

// For ctest registration (cmake/MihConformance.cmake): one line per case of every selected
// registration, "<prefix> <spec> <case> <label,label,...>". Labels: conformance, the spec, the
// case's group, its mesh axes of degree > 1 and knobs (sp, ac, mb), and the suites the suite
// table applies to it.
void print_cases() {
  for (const auto& r : cases::registrations()) {
    if (!cases::selected(r)) continue;
    const spec::ModelSpec& s = spec::SpecRegistry::instance().get(r.spec);
    for (const spec::Case* runnable : cases::runnable_cases(r)) {
      const spec::Case& c = *runnable;
      const ParallelConfig& k = c.config;
      std::vector<std::string> labels = {"conformance", r.spec, c.group};
      for (const auto& d : kMeshDims) {
        if (k.*d.degree > 1) labels.emplace_back(d.name);
      }
      if (k.ep > 1 || (c.save_config && c.save_config->ep > 1)) labels.push_back("ep");
      if (k.sequence_parallel) labels.push_back("sp");
      if (k.activation_checkpointing) labels.push_back("ac");
      if (k.micro_batches > 1) labels.push_back("mb");
      for (const auto& row : conformance::suite_table()) {
        if (row.applies({s, c})) labels.push_back(row.name);
      }
      std::string joined;
      for (const auto& l : labels) joined += (joined.empty() ? "" : ",") + l;
      std::printf("%s %s %s %s\n", r.prefix.c_str(), r.spec.c_str(), c.name.c_str(), joined.c_str());
    }
  }
}

// " (--gtest_filter=...)" when the flags hold a filter.
std::string filter_text(const std::vector<std::string>& gtest_flags) {
  for (const auto& f : gtest_flags) {
    if (f.rfind("--gtest_filter=", 0) == 0) return " (" + f + ")";
  }
  return "";
}

// The GoogleTest filter of the run: the last --gtest_filter, else GTEST_FILTER, else "*".
std::string gtest_filter_of(const std::vector<std::string>& gtest_flags) {
  std::string filter;
  for (const auto& f : gtest_flags) {
    if (f.rfind("--gtest_filter=", 0) == 0) filter = f.substr(15);
  }
  if (filter.empty()) {
    const char* env = std::getenv("GTEST_FILTER");
    filter = env && *env ? env : "*";
  }
  return filter;
}

// Whether GoogleTest's filter selects test `name` ("Llama/MatchesOriginal.X/Reference"): a
// positive pattern matches it (':'-separated, '*' and '?' wildcards; none: "*") and no negative
// one (after '-') does.
bool filter_selects(const std::string& filter, const std::string& name) {
  auto any = [&](const std::string& patterns) {
    size_t start = 0;
    while (true) {
      const size_t end = patterns.find(':', start);
      const std::string p = patterns.substr(start, end == std::string::npos ? std::string::npos : end - start);
      if (!p.empty() && ::fnmatch(p.c_str(), name.c_str(), 0) == 0) return true;
      if (end == std::string::npos) return false;
      start = end + 1;
    }
  };
  const size_t dash = filter.find('-');
  const std::string positive = dash == std::string::npos ? filter : filter.substr(0, dash);
  const std::string negative = dash == std::string::npos ? "" : filter.substr(dash + 1);
  return any(positive.empty() ? "*" : positive) && !any(negative);
}

// The registrations of the run with their cases and rejected cases, for a run that selected
// nothing: "  Llama (spec llama, matrix cpu-smoke): Reference, DpShard2, ...".
std::string what_exists() {
  std::string out;
  for (const auto& r : cases::registrations()) {
    if (!cases::selected(r)) continue;
    const spec::CaseMatrix& m = cases::resolved_matrix(r.spec, cases::matrix_of(r));
    std::string names;
    for (const auto& c : m.cases) names += (names.empty() ? "" : ", ") + c.name;
    out += "  " + r.prefix + " (spec " + r.spec + ", matrix " + cases::matrix_of(r) + "): " + names + "\n";
    for (const auto& rej : m.rejected) out += "    rejected " + rej.name + ": " + rej.reason + "\n";
  }
  if (out.empty()) out = "  no registration is selected (--prefixes, --only-spec)\n";
  return out + "  test names are <Prefix>/<Suite>.<Test>/<Case>, e.g. --gtest_filter='Llama/*.*/DpShard2'\n";
}

// The conformance run's own flags; what CLI11 does not know goes to GoogleTest when it is a
// --gtest_* flag and is a usage error otherwise.
struct RunFlags {
  std::string evidence_root, matrix, only_spec, fault, init_from, dtype;
  int64_t seed = -1;
  double noise_k = -1;
  std::vector<std::string> prefixes, fault_cases, goldens;
  bool verify_only = false, allow_edited_evidence = false, allow_other_version = false, no_progress = false,
       list_cases = false;
  std::chrono::milliseconds case_timeout{std::chrono::minutes(5)};
  std::chrono::milliseconds collective_timeout{0};
};

// Parses `args` into the run options; returns the GoogleTest flags, or the exit status of a
// usage error or --help.
std::variant<std::vector<std::string>, int> parse_run_flags(const std::vector<std::string>& args, RunFlags* f) {
  CLI::App app{"Runs the conformance suites of the specs linked into this binary: each case launched once "
               "(its ranks as processes), every suite asserting on its evidence; --gtest_* flags go to "
               "GoogleTest. Exit status: see the footer.",
               "mih test"};
  app.footer(exit_status_legend());
  app.add_option("--evidence-root", f->evidence_root,
                 "where the run's evidence goes (default: MIH_EVIDENCE_ROOT, else mih-evidence/<run id> in the current "
                 "directory)");
  app.add_option("--matrix", f->matrix, "preset (cpu-smoke, cpu-smoke-variants, cpu-precision, cpu-full, gpu-smoke; @<dtype>[,seed=N] sets the lane) or JSON matrix file; overrides every spec's");
  app.add_option("--dtype", f->dtype,
                 "the precision lane: float64, float32 or bfloat16 (appends @<dtype> to every matrix; a reduced lane "
                 "compares each case with its own reference at tolerances calibrated from a noise twin)")
      ->check(CLI::IsMember({"float64", "float32", "bfloat16", "float16"}));
  app.add_option("--seed", f->seed, "parameter-init seed of every case, the reference's included (appends seed=N)")
      ->check(CLI::Range(int64_t{0}, (int64_t{1} << 53) - 1));
  app.add_option("--noise-k", f->noise_k,
                 "reduced lanes: the multiple of the measured noise each tolerance is (default: the spec's noise_k)")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--verify-only", f->verify_only, "assert on evidence produced elsewhere; launch nothing");
  app.add_flag("--allow-edited-evidence", f->allow_edited_evidence,
               "verify-only and check: check evidence whose files differ from the SHA-256 digests its case_run.json "
               "records (else exit 12)");
  app.add_flag("--allow-other-version", f->allow_other_version,
               "verify-only and check: check evidence that another harness version wrote (environment.json's "
               "versions.mih; else exit 12)");
  add_seconds(app, "--case-timeout", f->case_timeout, "how long one case may take (all its launches)");
  add_seconds(app, "--collective-timeout", f->collective_timeout,
              "how long one collective may wait before its rank fails (an infrastructure failure; default: the "
              "case timeout)");
  app.add_option("--prefixes", f->prefixes, "only these MIH_CONFORMANCE_SUITES registrations")->delimiter(',');
  app.add_option("--only-spec", f->only_spec, "only this spec's cases");
  app.add_option("--init-from", f->init_from,
                 "every case of the run's one spec (select it with --only-spec), its reference included, starts from "
                 "this local Hugging Face checkpoint directory (through the key map; checked before any case "
                 "starts; its files' SHA-256 join each case's fingerprint; it is the source checkpoint too), "
                 "instead of the spec's checkpoint.init_from or the seed's weights")
      ->check(cli::non_empty_path());
  app.add_option("--golden", f->goldens,
                 "a golden of the original model (`mih golden` writes one; docs/golden.md) the spec its golden.json "
                 "names is compared with (MatchesOriginal on its Reference), instead of the spec's golden.dir; "
                 "checked before any case starts (repeatable)")
      ->check(cli::non_empty_path());
  app.add_flag("--no-progress", f->no_progress, "no progress lines on stderr");
  app.add_flag("--mih-list-cases", f->list_cases, "print the cases and their ctest labels, then exit");
  app.add_option("--fault", f->fault, "fault of the catalog (F01-F32) the --fault-cases run with")
      ->check(CLI::Validator([](std::string& v) { return v.empty() ? std::string("an empty fault name") : std::string(); },
                             "FAULT"));
  app.add_option("--fault-cases", f->fault_cases, "the cases that run with --fault")->delimiter(',');
  app.allow_extras(true);
  std::vector<std::string> argv_s = {"mih test"};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::Success& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 2;
  }
  std::vector<std::string> gtest;
  for (const auto& extra : app.remaining()) {
    if (extra.rfind("--gtest_", 0) != 0) {
      std::fprintf(stderr,
                   "mih test: unknown option '%s'; the options are listed by `mih test --help`, and GoogleTest's "
                   "are --gtest_* (e.g. --gtest_filter='Llama/*.*/Tp2Sp')\n",
                   extra.c_str());
      return 2;
    }
    // GoogleTest prints its help and runs nothing for a flag it does not know: a misspelt one
    // is a usage error here, naming it.
    static const std::set<std::string> kGtestFlags = {
        "also_run_disabled_tests", "break_on_failure", "brief", "catch_exceptions", "color", "death_test_style",
        "death_test_use_fork", "fail_fast", "filter", "flagfile", "help", "internal_run_death_test", "list_tests",
        "output", "print_time", "print_utf8", "random_seed", "recreate_environments_when_repeating", "repeat",
        "show_internal_stack_frames", "shuffle", "stack_trace_depth", "stream_result_to", "throw_on_failure"};
    const std::string name = extra.substr(8, extra.find('=') == std::string::npos ? std::string::npos : extra.find('=') - 8);
    if (!kGtestFlags.count(name)) {
      std::fprintf(stderr, "mih test: unknown GoogleTest flag '%s'; GoogleTest's flags are listed by --gtest_help\n",
                   extra.c_str());
      return 2;
    }
    gtest.push_back(extra);
  }
  return gtest;
}

// The checkpoint each selected spec's cases start from: --init-from for the run's one spec,
// else the spec's CheckpointSpec::init_from. Checked here, before any test runs: a URL, an
// LFS pointer, a missing shard, a key or shape that does not fit the port is bad input (exit
// 11, 12 for a missing directory), never a failing case. Verify-only runs and listings read
// no checkpoint (the evidence was produced elsewhere): the directory only decides where the
// SourceCheckpoint suite applies.
void resolve_init_sources(cases::RunOptions& o, bool read_checkpoints) {
  std::set<std::string> specs;
  for (const auto& r : cases::registrations()) {
    if (cases::selected(r)) specs.insert(r.spec);
  }
  if (!o.init_from.empty()) {
    std::string names;
    for (const auto& n : specs) names += (names.empty() ? "'" : ", '") + n + "'";
    MIH_CHECK(specs.size() == 1, "--init-from ", o.init_from.string(), ": a checkpoint initializes the port of one "
              "spec, and this run selects ", specs.size(), " (", names.empty() ? "none" : names,
              "); add --only-spec NAME");
  }
  for (const auto& name : specs) {
    const spec::ModelSpec s = spec::SpecRegistry::instance().get(name);
    const fs::path dir = o.init_from.empty() ? fs::path(s.checkpoint.init_from) : o.init_from;
    if (dir.empty()) continue;
    if (!read_checkpoints) {
      o.init_sources[name] = {fs::absolute(dir).lexically_normal(), ""};
      continue;
    }
    cases::progress(name + ": checking checkpoint " + dir.string() + ", which its cases start from");
    o.init_sources[name] = with_context(
        o.init_from.empty() ? "spec '" + name + "': checkpoint.init_from" : std::string("--init-from"),
        [&] { return cases::check_init_from(s, dir); });
  }
}

int run_tests(const std::vector<std::string>& args) {
  RunFlags f;
  auto parsed = parse_run_flags(args, &f);
  if (const int* status = std::get_if<int>(&parsed)) return *status;
  const std::vector<std::string> gtest_flags = std::get<std::vector<std::string>>(parsed);
  MIH_CHECK(cases::duplicate_prefixes().empty(), "MIH_CONFORMANCE_SUITES prefix '", cases::duplicate_prefixes().front(),
            "' is registered twice; give each registration its own prefix");
  cases::RunOptions& o = run_options();
  o.evidence_root = f.evidence_root;
  o.matrix = f.matrix;
  if (!f.dtype.empty()) o.lane = f.dtype;
  if (f.seed >= 0) o.lane += (o.lane.empty() ? "" : ",") + std::string("seed=") + std::to_string(f.seed);
  o.noise_k = f.noise_k;
  o.verify_only = f.verify_only;
  o.allow_edited_evidence = f.allow_edited_evidence;
  o.allow_other_version = f.allow_other_version;
  o.case_timeout = f.case_timeout;
  o.collective_timeout = f.collective_timeout;
  o.progress = !f.no_progress;
  o.only_spec = f.only_spec;
  o.init_from = f.init_from;
  o.golden_dirs.assign(f.goldens.begin(), f.goldens.end());
  if (!o.only_spec.empty()) static_cast<void>(spec::SpecRegistry::instance().get(o.only_spec));  // unknown: exit 11
  for (const auto& x : f.prefixes) {
    MIH_CHECK(cases::find_registration(x) != nullptr, "--prefixes: no MIH_CONFORMANCE_SUITES registration '", x,
              "' is linked");
    o.prefixes.insert(x);
  }
  if (!f.fault.empty()) o.fault = fault::name(fault::parse(f.fault));
  o.fault_cases.insert(f.fault_cases.begin(), f.fault_cases.end());
  if (f.list_cases) {
    print_cases();
    return 0;
  }
  MIH_CHECK(o.fault.empty() == o.fault_cases.empty(),
            "--fault and --fault-cases go together: the fault, and the cases that run with it (the others, the "
            "reference first, run fault-free)");
  if (o.evidence_root.empty()) {
    const char* env = std::getenv("MIH_EVIDENCE_ROOT");
    // Relative to the working directory: a conformance binary run from its build folder
    // writes <build>/mih-evidence, not <build>/build/mih-evidence.
    o.evidence_root = env && *env ? fs::path(env) : fs::path("mih-evidence") / run_id();
  }
  o.evidence_root = fs::absolute(o.evidence_root);
  bool listing = false;
  for (const auto& a : gtest_flags) listing = listing || a.rfind("--gtest_list_tests", 0) == 0;
  if (listing) {
  } else if (o.verify_only) {
    MIH_CHECK_CODE(fs::is_directory(o.evidence_root), Code::kFailedPrecondition, "--verify-only: evidence root ",
                   o.evidence_root.string(), " does not exist");
  } else {
    static_cast<void>(EvidenceDir(o.evidence_root));  // created and writable, or exit 12 naming the path and the OS error
  }
  // Resolve every registration's matrix now, once: a bad preset or file is bad input (exit
  // 11) before any test runs, not 160 failing tests. A rejected case is said, with its
  // arithmetic, before anything launches. A selected spec that runs none of the cases its
  // matrix lists is bad input too, whatever references, noise twin or controls mih adds
  // beside them: those check nothing the matrix asked for (every such spec named, with every
  // rejection).
  std::set<std::string> known_cases;
  std::vector<std::string> nothing_listed;
  for (const auto& r : cases::registrations()) {
    if (!cases::selected(r)) continue;
    const spec::CaseMatrix& m = cases::resolved_matrix(r.spec, cases::matrix_of(r));
    for (const auto& rejected : m.rejected) {
      cases::progress(r.spec + "/" + rejected.name + ": not run, the spec cannot take it: " + rejected.reason);
    }
    if (const std::string why = cases::why_no_listed_case(r); !why.empty()) {
      nothing_listed.push_back(why + "; `mih matrix --spec " + r.spec + " --matrix " + cases::matrix_of(r) +
                               "` shows the arithmetic");
    }
    for (const auto& c : m.cases) known_cases.insert(c.name);
  }
  if (!nothing_listed.empty()) {
    std::string text;
    for (const auto& line : nothing_listed) text += "\n  " + line;
    MIH_THROW(Code::kInvalidSpec, nothing_listed.size() == 1 ? "" : std::to_string(nothing_listed.size()) + " specs: ",
              "no case the matrix lists can run", text,
              "\n  change the cases (or max_world_size), or leave the spec out of the run (--only-spec NAME, "
              "--prefixes P)");
  }
  // A --fault-cases name that is no selected case would run the fault nowhere: a green that lies.
  for (const auto& name : o.fault_cases) {
    if (known_cases.count(name)) continue;
    std::string list;
    for (const auto& k : known_cases) list += (list.empty() ? "" : ", ") + k;
    MIH_THROW(Code::kInvalidSpec, "--fault-cases: no selected case is named '", name, "' (the cases: ", list, ")");
  }
  resolve_init_sources(o, !o.verify_only && !listing);
  // Goldens: read now (the suite table asks for them), checked against this run's export
  // where the run selects a MatchesOriginal test (before any rank starts).
  const std::string filter = gtest_filter_of(gtest_flags);
  cases::resolve_goldens(o, [&](const std::string& spec_name) {
    if (listing) return false;
    for (const auto& r : cases::registrations()) {
      if (!cases::selected(r) || r.spec != spec_name) continue;
      const spec::ModelSpec s = cases::spec_of_run(spec_name);
      for (const spec::Case* c : cases::runnable_cases(r)) {
        if (!conformance::suite_row("MatchesOriginal").applies({s, *c})) continue;
        for (const char* test : {"LossAndLogitsMatchOriginal", "HiddenStatesMatchOriginal", "GradientsMatchOriginal",
                                 "StepMatchesOriginal"}) {
          if (filter_selects(filter, r.prefix + "/MatchesOriginal." + test + "/" + c->name)) return true;
        }
      }
    }
    return false;
  });
  o.enabled = true;
  std::vector<std::string> gargs = {"mih"};
  gargs.insert(gargs.end(), gtest_flags.begin(), gtest_flags.end());
  std::vector<char*> gargv;
  for (auto& a : gargs) gargv.push_back(a.data());
  int gargc = static_cast<int>(gargv.size());
  ::testing::InitGoogleTest(&gargc, gargv.data());
  if (!g_recorded_tests.empty()) {
    // `mih check` of a run root: every test the run recorded is one of this binary's under the
    // run's matrix, or the check would judge less than the run ran.
    std::set<std::string> here;
    const ::testing::UnitTest& unit = *::testing::UnitTest::GetInstance();
    for (int i = 0; i < unit.total_test_suite_count(); ++i) {
      const ::testing::TestSuite& suite = *unit.GetTestSuite(i);
      // Every instantiated test (should_run is decided later, in RUN_ALL_TESTS; the filter
      // is exactly the recorded names).
      for (int j = 0; j < suite.total_test_count(); ++j) {
        here.insert(std::string(suite.name()) + "." + suite.GetTestInfo(j)->name());
      }
    }
    std::vector<std::string> missing;
    for (const auto& name : g_recorded_tests) {
      if (!here.count(name)) missing.push_back(name);
    }
    MIH_CHECK_CODE(missing.empty(), Code::kFailedPrecondition, "mih check: ", o.evidence_root.string(),
                   "/results.jsonl records ", g_recorded_tests.size(), " tests of its run, and ", missing.size(),
                   " of them (", missing.front(), missing.size() > 1 ? ", ..." : "", ") are no test of this mih under "
                   "the run's matrix", o.matrix.empty() ? std::string() : " '" + o.matrix + "'",
                   ": the run used another binary, matrix or lane; check it with the conformance binary that ran it");
  }
  if (!listing) ::testing::UnitTest::GetInstance()->listeners().Append(new ResultsWriter);
  // After the writer: its end event comes first, above GoogleTest's list of failures.
  if (!listing) ::testing::UnitTest::GetInstance()->listeners().Append(new_diagnosis_printer(o.evidence_root));
  if (::testing::UnitTest::GetInstance()->total_test_count() == 0) {
    std::fprintf(stderr, "mih: no conformance test is linked (MIH_CONFORMANCE_SUITES in a spec file of an OBJECT library)\n");
    return 1;
  }
  if (!o.verify_only && !listing) {
    json regs = json::array();
    for (const auto& r : cases::registrations()) {
      regs.push_back({{"prefix", r.prefix},
                      {"spec", r.spec},
                      {"matrix", cases::matrix_of(r)},
                      {"training_backend", r.training_backend}});
    }
    json init_from = json::object();
    for (const auto& [name, source] : o.init_sources) {
      init_from[name] = {{"dir", source.dir.string()}, {"sha256", source.sha256}};
    }
    std::ofstream(o.evidence_root / "run.json")
        << json({{"matrix", o.matrix}, {"registrations", regs}, {"init_from", init_from}}).dump(2);
  }
  cases::progress("evidence root " + o.evidence_root.string() + (o.verify_only ? " (verify-only)" : ""));
  if (listing) return RUN_ALL_TESTS();
  install_interrupt_handlers();  // SIGINT/SIGTERM: the ranks stopped, what is done written and said
  const int rc = RUN_ALL_TESTS();
  const bool help = std::find(gtest_flags.begin(), gtest_flags.end(), "--gtest_help") != gtest_flags.end();
  if (!help && ::testing::UnitTest::GetInstance()->test_to_run_count() == 0) {
    // A run that checked nothing is an error, never a green.
    std::fprintf(stderr, "mih: %s error: the run selected no test%s; what exists:\n%s",
                 std::string(code_name(Code::kInvalidSpec)).c_str(), filter_text(gtest_flags).c_str(),
                 what_exists().c_str());
    return exit_status(Code::kInvalidSpec);
  }
  const std::vector<std::string> disagree = record_case_states();
  for (const auto& line : disagree) std::fprintf(stderr, "mih: conformance failure: %s\n", line.c_str());
  cases::progress(std::to_string(cases::cases_launched()) + " case(s) launched; results in " +
                  (o.evidence_root / "results.jsonl").string() + "; `mih report " + o.evidence_root.string() +
                  " --format md` for the table");
  const int status = cases::run_exit_status(rc);
  // The state and the exit status agree: a case that cannot be MATRIX_PASSED is no pass.
  return status == 0 && !disagree.empty() ? 1 : status;
}

}  // namespace

int run_conformance_tests(const std::vector<std::string>& args) {
  std::vector<std::string> all;
  if (!args.empty() && args[0] == "--check") {
    MIH_CHECK(args.size() >= 2, "mih check needs an evidence directory");
    // A check judges the evidence and writes nothing into it (its verdict: the output and the
    // exit status; --gtest_output=json:FILE for a machine-readable copy).
    run_options().read_only = true;
    std::string filter;
    for (auto& a : check_arguments(args[1], &filter)) all.push_back(a);
    for (size_t i = 2; i < args.size(); ++i) all.push_back(args[i]);
    all.push_back("--gtest_filter=" + filter);
  } else {
    all = args;
  }
  return run_tests(all);
}

CommandRun setup_test(CLI::App& sub, const Invocation&) {
  return [&sub] { return run_conformance_tests(sub.remaining()); };
}

CommandRun setup_check(CLI::App& sub, const Invocation&) {
  return [&sub] {
    const std::vector<std::string> rest = sub.remaining();
    if (!rest.empty() && (rest[0] == "-h" || rest[0] == "--help")) {
      std::printf("%s\nUsage: mih check <evidence> [mih test options] [--gtest_* ...]\n"
                  "The options of `mih test --help` apply (without --verify-only, which check implies).\n\n%s\n",
                  sub.get_description().c_str(), exit_status_legend().c_str());
      return 0;
    }
    if (rest.empty() || rest[0].rfind("-", 0) == 0) {
      std::fprintf(stderr, "mih check: give the evidence to check first: a case directory or a run root\n");
      return 2;
    }
    std::vector<std::string> args = {"--check"};
    args.insert(args.end(), rest.begin(), rest.end());
    return run_conformance_tests(args);
  };
}

CommandRun setup_faults(CLI::App& sub, const Invocation&) {
  auto o = std::make_shared<cases::FaultsOptions>();
  auto quiet = std::make_shared<bool>(false);
  sub.add_option("--fault", o->only, "only these faults (F01 ... F32; repeat or comma-separate)")->delimiter(',');
  sub.add_option("--json", o->json_out, "write the detection matrix as JSON here (default: <out>/faults.json)");
  auto out_given = sub.add_option("--out", o->out, "evidence folder: fault-free/ (the twins), <ID>/ per fault "
                                                    "(default mih-faults, mih-faults-<dtype> in a reduced lane, in the current directory)");
  sub.add_option("--dtype", o->dtype,
                 "the precision lane: float64 (the oracle), float32 or bfloat16 (each case against the lane's reference "
                 "at tolerances calibrated from its noise twin)")
      ->check(CLI::IsMember({"float64", "float32", "bfloat16"}))
      ->capture_default_str();
  add_seconds(sub, "--case-timeout", o->case_timeout, "how long one case may take");
  sub.add_flag("--list", o->list, "print the catalog and exit");
  sub.add_flag("--no-progress", *quiet, "no progress lines on stderr");
  return [o, quiet, out_given] {
    o->progress = !*quiet;
    if (out_given->count() == 0 && o->dtype != "float64") o->out = "mih-faults-" + o->dtype;
    return cases::run_faults(*o);
  };
}

}  // namespace cli

namespace {
// What a rank forked by the fork server runs: `<binary> worker ...`.
int forked_rank_main(int argc, char** argv) { return conformance_main(argc, argv, false); }
}  // namespace

int conformance_main(int argc, char** argv, bool tests_by_default) {
  if (argc > 1 && std::strcmp(argv[1], "worker") == 0) return worker_main(argc - 1, argv + 1);
  if (argc > 1 && std::strcmp(argv[1], "__process-state") == 0) return run_process_state_command(argc, argv);
  // A subcommand, --help or --version is the CLI; a conformance or GoogleTest flag runs the
  // suites; no argument runs them in a conformance binary and prints the help in `mih`.
  bool tests = tests_by_default;
  if (argc > 1) {
    const std::string a = argv[1];
    tests = a[0] == '-' && a != "--help" && a != "-h" && a != "--version";
  }
  // Before anything else runs, for the commands that launch local ranks: the fork server is
  // a copy of this process as exec left it.
  const std::string command = argc > 1 ? argv[1] : "";
  if (tests || command == "test" || command == "launch" || command == "selftest" || command == "run" ||
      command == "faults") {
    start_fork_server(argc, argv, forked_rank_main);
  }
  if (!tests) return cli_main(argc, argv);
  try {
    return cli::run_conformance_tests(std::vector<std::string>(argv + 1, argv + argc));
  } catch (...) {
    return cli::report_current_exception("mih");
  }
}

}  // namespace mih
