// Reading a conformance run root (read_run_results in report.h): results.jsonl, one line per
// test, and the case directories its tests name (case_run.json, integration_state.json and the
// training metrics).
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/contract/case_record.h"
#include "harness/base/error.h"
#include "harness/contract/evidence_layout.h"
#include "harness/base/files.h"
#include "harness/base/json_fields.h"
#include "harness/evidence/case_completion_internal.h"
#include "harness/evidence/report.h"
#include "harness/evidence/report_internal.h"
#include "harness/evidence/scheduler_jobs.h"

namespace mih {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using report_internal::blank;


// Calls fn(line_number, line) for every non-blank line of `text`; a last line without its
// newline is passed with terminated = false (it may be torn).
template <class Fn>
void for_each_line(const std::string& text, Fn&& fn) {
  size_t start = 0;
  for (int line_number = 1; start < text.size(); ++line_number) {
    size_t end = text.find('\n', start);
    const bool terminated = end != std::string::npos;
    if (!terminated) end = text.size();
    const std::string_view line(text.data() + start, end - start);
    start = end + 1;
    if (!blank(line)) fn(line_number, line, terminated);
  }
}

std::string string_field(const json& j, const char* key, const std::string& where) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return "";
  MIH_CHECK(it->is_string(), where, ": '", key, "' must be a string, got ", json_summary(*it));
  return it->get<std::string>();
}

// "Llama/NumericParity.LossMatchesReference/DpShard2" -> suite, test, case: GoogleTest's
// "<Instance>/<Suite>.<Test>/<Param>" for value-parameterized tests, "<Suite>.<Test>" otherwise.
void split_test_name(const std::string& name, std::string* suite, std::string* test, std::string* case_name) {
  const size_t dot = name.find('.');
  if (dot == std::string::npos) return;
  const std::string left = name.substr(0, dot), right = name.substr(dot + 1);
  const size_t slash_left = left.rfind('/'), slash_right = right.find('/');
  if (suite->empty()) *suite = slash_left == std::string::npos ? left : left.substr(slash_left + 1);
  if (test->empty()) *test = right.substr(0, slash_right);
  if (case_name->empty() && slash_right != std::string::npos) *case_name = right.substr(slash_right + 1);
}

TestResult parse_result_line(const json& j, const std::string& where) {
  MIH_CHECK(j.is_object(), where, ": expected a JSON object, got ", json_summary(j));
  TestResult t;
  t.name = string_field(j, "name", where);
  MIH_CHECK(!t.name.empty(), where, ": 'name' is missing or empty");
  const std::string status = string_field(j, "status", where);
  const std::optional<TestStatus> known = find_test_status(status);
  MIH_CHECK(known.has_value(), where, ": 'status' must be one of passed, failed, skipped; got '", status, "'");
  t.status = *known;
  t.spec = string_field(j, "spec", where);
  t.case_name = string_field(j, "case", where);
  t.suite = string_field(j, "suite", where);
  t.test = string_field(j, "test", where);
  t.message = string_field(j, "message", where);
  t.evidence = string_field(j, "evidence", where);
  t.time = string_field(j, "time", where);
  if (const auto it = j.find("seconds"); it != j.end() && !it->is_null()) {
    MIH_CHECK(it->is_number() && it->get<double>() >= 0, where, ": 'seconds' must be a non-negative number, got ",
              json_summary(*it));
    t.seconds = it->get<double>();
  }
  split_test_name(t.name, &t.suite, &t.test, &t.case_name);
  return t;
}

// Case files never fail the report: what cannot be read is recorded in `problems`.
void take(const json& j, const char* key, std::string* out, const fs::path& file, std::vector<std::string>* problems) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return;
  if (it->is_string()) {
    *out = it->get<std::string>();
  } else {
    problems->push_back(file.string() + ": '" + key + "' must be a string, got " + json_summary(*it));
  }
}

template <class Number>
void take(const json& j, const char* key, Number* out, const fs::path& file, std::vector<std::string>* problems) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return;
  if (it->is_number()) {
    *out = it->get<Number>();
  } else {
    problems->push_back(file.string() + ": '" + key + "' must be a number, got " + json_summary(*it));
  }
}

bool read_json_object(const fs::path& file, json* out, std::vector<std::string>* problems) {
  std::error_code ec;
  if (!fs::exists(file, ec)) return false;
  std::string text;
  if (!read_file(file, &text)) {
    problems->push_back(file.string() + ": cannot be read");
    return false;
  }
  std::string problem;
  if (!parse_json_bounded(text, out, &problem)) {
    problems->push_back(file.string() + ": not JSON: " + problem);
    return false;
  }
  if (!out->is_object()) {
    problems->push_back(file.string() + ": expected a JSON object, got " + json_summary(*out));
    return false;
  }
  return true;
}

double metric_value(const json& row, const char* key) {
  const auto it = row.find(key);
  return it != row.end() && it->is_number() ? it->get<double>() : std::numeric_limits<double>::quiet_NaN();
}

// case_run.json, as its run wrote it (CaseRecord's from_json); one that does not read is a
// problem of the case, and the case has no record.
void read_record_into(const fs::path& case_run, CaseResult* c) {
  json j;
  if (!read_json_object(case_run, &j, &c->problems)) return;
  try {
    c->record = j.get<CaseRecord>();
  } catch (const Error& e) {
    c->problems.push_back(case_run.string() + ": " + e.message());
  }
}

// run/case.json: the case's configs, and the fault and kind of a case without a record.
void read_request_into(const fs::path& case_file, CaseResult* c) {
  json j;
  if (!read_json_object(case_file, &j, &c->problems)) return;
  // A case launched by an outside launcher has no case_run.json; its case file names the fault.
  take(j, "fault", &c->requested_fault, case_file, &c->problems);
  try {
    const json& resolved = j.at("case");
    c->config = resolved.at("config").get<ParallelConfig>();
    if (resolved.contains("save_config")) c->save_config = resolved.at("save_config").get<ParallelConfig>();
    take(resolved, "kind", &c->requested_kind, case_file, &c->problems);
  } catch (const std::exception& e) {
    c->config.reset();
    c->save_config.reset();
    c->problems.push_back(case_file.string() + ": not a case the runner resolved: " + e.what());
  }
}

// The reduced lane's calibration: its settings and per quantity its error, noise and tolerance.
void read_calibration_into(const fs::path& calibration, CaseResult* c) {
  json j;
  if (!read_json_object(calibration, &j, &c->problems)) return;
  CaseCalibration& cal = c->calibration;
  cal.present = true;
  take(j, "dtype", &cal.dtype, calibration, &c->problems);
  take(j, "reference", &cal.reference, calibration, &c->problems);
  take(j, "worst", &cal.worst, calibration, &c->problems);
  take(j, "epsilon", &cal.epsilon, calibration, &c->problems);
  cal.master_epsilon = cal.epsilon;
  take(j, "master_epsilon", &cal.master_epsilon, calibration, &c->problems);
  take(j, "k", &cal.k, calibration, &c->problems);
  take(j, "k_update", &cal.k_update, calibration, &c->problems);
  take(j, "factor", &cal.factor, calibration, &c->problems);
  take(j, "floor_eps", &cal.floor_eps, calibration, &c->problems);
  cal.max_error_over_tolerance = metric_value(j, "max_error_over_tolerance");
  const json quantities = j.contains("quantities") ? j["quantities"] : json::array();
  if (!quantities.is_array()) c->problems.push_back(calibration.string() + ": 'quantities' must be a list");
  for (const auto& q : quantities.is_array() ? quantities : json::array()) {
    if (!q.is_object() || !q.contains("step") || !q["step"].is_number_integer()) {
      c->problems.push_back(calibration.string() + ": a quantity without an integer 'step'");
      break;
    }
    CalibrationRow row;
    take(q, "kind", &row.kind, calibration, &c->problems);
    take(q, "name", &row.name, calibration, &c->problems);
    take(q, "stage", &row.stage, calibration, &c->problems);
    row.step = q["step"].get<int64_t>();
    row.error = metric_value(q, "error");
    row.noise = metric_value(q, "noise");
    row.tolerance = metric_value(q, "tolerance");
    cal.rows.push_back(std::move(row));
  }
}

// compare/golden.json's summary: passed, the worst quantity, per kind the largest error.
void read_golden_into(const fs::path& golden, CaseResult* c) {
  json j;
  if (!read_json_object(golden, &j, &c->problems)) return;
  CaseGolden& g = c->golden;
  g.present = true;
  if (const auto passed = j.find("passed"); passed != j.end()) {
    g.passed = passed->is_boolean() && passed->get<bool>();
    if (!passed->is_boolean()) c->problems.push_back(golden.string() + ": 'passed' must be true or false");
  }
  take(j, "worst", &g.worst, golden, &c->problems);
  if (j.contains("golden") && j["golden"].is_object()) take(j["golden"], "implementation", &g.implementation, golden, &c->problems);
  g.max_error_over_tolerance = metric_value(j, "max_error_over_tolerance");
  if (j.contains("largest_relative_error") && j["largest_relative_error"].is_object()) {
    for (const auto& [kind, v] : j["largest_relative_error"].items()) {
      if (v.is_number()) g.largest_relative_error[kind] = v.get<double>();
    }
  }
  if (j.contains("quantities") && j["quantities"].is_array()) g.quantities = j["quantities"].size();
}

// metrics.jsonl: the loss and grad norm of each step (a repeated step, a resume: the last line).
void read_steps_into(const fs::path& metrics, CaseResult* c) {
  std::string text;
  if (!read_file(metrics, &text)) {
    c->problems.push_back(metrics.string() + ": cannot be read");
    return;
  }
  std::map<int64_t, StepPoint> by_step;
  for_each_line(text, [&](int line_number, std::string_view line, bool terminated) {
    json row;
    std::string problem;
    if (!parse_json_bounded(line, &row, &problem)) {
      if (terminated) c->problems.push_back(metrics.string() + " line " + std::to_string(line_number) + ": not JSON: " + problem);
      return;
    }
    if (!row.is_object() || !row.contains("step") || !row["step"].is_number_integer()) {
      c->problems.push_back(metrics.string() + " line " + std::to_string(line_number) + ": no integer 'step'");
      return;
    }
    StepPoint p;
    p.step = row["step"].get<int64_t>();
    p.loss = metric_value(row, "loss");
    p.grad_norm_pre_clip = metric_value(row, "grad_norm_pre_clip");
    by_step[p.step] = p;
  });
  for (const auto& [step, p] : by_step) c->steps.push_back(p);
}

void read_case_files(const fs::path& root, CaseResult* c) {
  const fs::path dir = root / c->evidence;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    c->problems.push_back("evidence directory " + dir.string() + " does not exist");
    return;
  }
  const fs::path case_run = dir / layout::kCaseRecord;
  read_record_into(case_run, c);
  // A case of a `mih submit` night has no case_run.json: a job of it that did not complete
  // is its outcome (infrastructure), as the verify-only run said.
  if (!c->record) {
    try {
      if (const auto job = infrastructure_job(root, c->spec, c->name, dir)) c->failed_job = describe_job_failure(*job);
    } catch (const Error& e) {
      c->problems.push_back(e.message());
    }
  }
  read_request_into(dir / layout::kCaseRequest, c);
  // mih's case runner writes case_run.json when its launches end: its evidence without one is a
  // run that did not finish (or lost its record), never an external launch's to report.
  if (!c->outcome() && !fs::exists(case_run, ec) && launched_by_case_runner(dir)) {
    c->problems.push_back(case_run.string() + " is missing, though mih's case runner launched the case (" +
                          layout::kEnvironment + "): its run did not finish, or its record was lost; incomplete, "
                          "rerun the case");
  }
  // The state as the run's record bounds it: integration_state.json is outside the digests.
  try {
    const CaseState state = read_case_state(dir);
    c->state = state.state;
    c->state_reason = state.reason;
    if (!state.disagreement.empty()) c->problems.push_back(dir.string() + ": " + state.disagreement);
  } catch (const Error& e) {
    c->problems.push_back(e.message());
  }
  if (fs::exists(dir / layout::kCalibration, ec)) read_calibration_into(dir / layout::kCalibration, c);
  if (fs::exists(dir / layout::kGoldenComparison, ec)) read_golden_into(dir / layout::kGoldenComparison, c);
  if (fs::exists(dir / layout::kMetrics, ec)) read_steps_into(dir / layout::kMetrics, c);
}

// What results.jsonl records: each test's last result, and the runs' start and end lines.
struct ResultsLog {
  std::map<std::string, TestResult> by_name;  // a rerun test: its last line wins
  std::map<std::string, int> last_start;      // test -> line of the last start line listing it
  std::map<std::string, int> last_result;     // test -> line of its last result
  std::string interrupted;                    // the signal the last end line names
  std::vector<std::string> not_run;           // the last start line's
  int last_start_line = 0, last_end_line = 0;
};

// A process's start or end line (ResultsWriter).
void read_run_line(const json& m, const std::string& where, int line_number, ResultsLog& log) {
  MIH_CHECK(m.is_object() && m.contains("event") && m["event"].is_string(), where,
            ": a 'run' line must be an object with an 'event'");
  const std::string event = m["event"].get<std::string>();
  MIH_CHECK(event == "start" || event == "end", where, ": a 'run' line's event must be start or end, got '",
            event, "'");
  (event == "start" ? log.last_start_line : log.last_end_line) = line_number;
  if (event == "start") {
    MIH_CHECK(m.contains("tests") && m["tests"].is_array(), where, ": a start line must list its 'tests'");
    log.not_run.clear();
    const json not_run = m.contains("not_run") ? m["not_run"] : json::array();
    MIH_CHECK(not_run.is_array(), where, ": 'not_run' must be a list, got ", json_summary(not_run));
    for (const auto& n : not_run) {
      MIH_CHECK(n.is_string(), where, ": 'not_run' must be strings, got ", json_summary(n));
      log.not_run.push_back(n.get<std::string>());
    }
    for (const auto& n : m["tests"]) {
      MIH_CHECK(n.is_string(), where, ": 'tests' must be test names, got ", json_summary(n));
      log.last_start[n.get<std::string>()] = line_number;
    }
  }
  if (event == "end" && m.contains("interrupted") && m["interrupted"].is_string()) {
    log.interrupted = m["interrupted"].get<std::string>();
  } else if (event == "end") {
    log.interrupted.clear();  // a later run that ended by itself
  }
}

// results.jsonl is evidence mih writes: a damaged line is bad evidence (exit 12), like any
// other evidence file, never bad input.
ResultsLog read_results_log(const fs::path& file, const std::string& text) {
  ResultsLog log;
  try {
    for_each_line(text, [&](int line_number, std::string_view line, bool terminated) {
      const std::string where = file.string() + " line " + std::to_string(line_number);
      json j;
      std::string problem;
      if (!parse_json_bounded(line, &j, &problem)) {
        if (!terminated) return;  // a writer died mid-line
        MIH_THROW(Code::kInvalidSpec, where, " is not JSON: ", problem);
      }
      if (j.is_object() && j.contains("run")) {
        read_run_line(j["run"], where, line_number, log);
        return;
      }
      TestResult t = parse_result_line(j, where);
      log.last_result[t.name] = line_number;
      log.by_name[t.name] = std::move(t);
    });
  } catch (const Error& e) {
    if (e.code() != Code::kInvalidSpec) throw;
    MIH_THROW(Code::kFailedPrecondition, e.message(),
              ": results.jsonl is the run's record, written only by mih; rerun the run on a fresh root (or remove "
              "the damaged line to report the rest)");
  }
  return log;
}

// Incomplete: a test has no result after the last start line that lists it (the run was
// interrupted, its process died, or its disk filled); an older result does not count.
void judge_completeness(const ResultsLog& log, RunResults& run) {
  if (log.last_start.empty()) return;
  int done = 0;
  for (const auto& [name, start] : log.last_start) {
    const auto r = log.last_result.find(name);
    done += r != log.last_result.end() && r->second > start ? 1 : 0;
  }
  run.expected_tests = static_cast<int>(log.last_start.size());
  if (done < run.expected_tests) {
    run.incomplete = "incomplete: " + std::to_string(done) + " of " + std::to_string(run.expected_tests) + " tests (" +
                     (log.last_end_line < log.last_start_line
                          ? std::string("the last run has no end line: its process died (killed or crashed) "
                                        "or is still running")
                      : !log.interrupted.empty() ? "interrupted by " + log.interrupted
                                                 : std::string("the run ended without recording every test: its disk "
                                                               "filled, or a test crashed its process's writer")) +
                     "; rerun the same command on this root to finish)";
  }
}

// The cases a case is compared with that no test of the run names (a run that selected only the
// comparison): read too, so that one that did not complete is said, and the comparison's
// failures are not counted as verdicts. Each read once, along compare_to chains.
void read_compared_cases(const fs::path& root, std::map<std::pair<std::string, std::string>, CaseResult>& cases) {
  std::vector<const CaseResult*> unvisited;
  for (const auto& [key, c] : cases) unvisited.push_back(&c);
  while (!unvisited.empty()) {
    const CaseResult& c = *unvisited.back();
    unvisited.pop_back();
    if (c.compare_to().empty() || c.evidence.empty() || cases.count({c.spec, c.compare_to()})) continue;
    CaseResult ref;
    ref.spec = c.spec;
    ref.name = c.compare_to();
    ref.evidence = (fs::path(c.evidence).parent_path() / ref.name).string();
    std::error_code ec;
    if (!fs::is_directory(root / ref.evidence, ec)) continue;
    read_case_files(root, &ref);
    unvisited.push_back(&cases.emplace(std::make_pair(ref.spec, ref.name), std::move(ref)).first->second);
  }
}

}  // namespace

RunResults read_run_results(const fs::path& root) {
  const std::string fix = "; run the conformance binary or scripts/conformance with --evidence-root " + root.string() + " first";
  std::error_code ec;
  MIH_CHECK_CODE(fs::is_directory(root, ec), Code::kFailedPrecondition, "run root '", root.string(), "' does not exist",
                 fix);
  const fs::path file = root / layout::kResults;
  MIH_CHECK_CODE(fs::exists(file, ec), Code::kFailedPrecondition, "'", file.string(),
                 "' does not exist: no test of the run has finished", fix);
  std::string text;
  MIH_CHECK_CODE(read_file(file, &text), Code::kFailedPrecondition, "cannot read '", file.string(), "'");
  ResultsLog log = read_results_log(file, text);
  RunResults run;
  run.root = root;
  run.not_run = std::move(log.not_run);
  judge_completeness(log, run);
  std::map<std::pair<std::string, std::string>, CaseResult> cases;
  for (auto& [name, t] : log.by_name) {
    if (!t.case_name.empty()) {
      CaseResult& c = cases[{t.spec, t.case_name}];
      c.spec = t.spec;
      c.name = t.case_name;
      if (c.evidence.empty()) c.evidence = t.evidence;
    }
    run.tests.push_back(std::move(t));
  }
  // "<Suite> not run: <why>" of the last run is not the root's truth where an earlier run of
  // the root judged that suite (a --no-golden verify-only run over a root that compared with
  // the golden): the report counts those tests, so it does not also say the suite never ran.
  std::erase_if(run.not_run, [&](const std::string& line) {
    const std::string suite = line.substr(0, line.find(" not run:"));
    return std::any_of(run.tests.begin(), run.tests.end(), [&](const TestResult& t) { return t.suite == suite; });
  });
  for (auto& [key, c] : cases) {
    if (c.evidence.empty()) {
      c.problems.push_back("no test of the case names its evidence directory");
    } else {
      read_case_files(root, &c);
    }
  }
  read_compared_cases(root, cases);
  for (auto& [key, c] : cases) run.cases.push_back(std::move(c));
  return run;
}

}  // namespace mih
