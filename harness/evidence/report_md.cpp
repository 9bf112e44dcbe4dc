// The report as Markdown (suites x cases tables, the cases to look at, the launches' time,
// failures, skipped tests) and as JUnit XML for CI (render_report in report.h).
#include <algorithm>
#include <cctype>
#include <cmath>
#include <deque>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "harness/contract/case_outcome.h"
#include "harness/evidence/diagnosis.h"
#include "harness/evidence/report.h"
#include "harness/evidence/report_internal.h"

namespace mih::report_internal {

// ---------------------------------------------------------------------------------------
// Markdown

namespace {

size_t longest_backtick_run(std::string_view s) {
  size_t longest = 0, run = 0;
  for (const char c : s) {
    run = c == '`' ? run + 1 : 0;
    longest = std::max(longest, run);
  }
  return longest;
}

std::string md_code(std::string_view raw) {
  const std::string s = clean_text(raw);
  const std::string ticks(longest_backtick_run(s) + 1, '`');
  const bool pad = !s.empty() && (s.front() == '`' || s.back() == '`');
  return ticks + (pad ? " " : "") + s + (pad ? " " : "") + ticks;
}

std::string md_cell(std::string_view raw) {
  std::string out;
  for (const char c : clean_text(raw)) {
    if (c == '|') {
      out += "\\|";
    } else {
      out += (c == '\n' || c == '\r') ? ' ' : c;
    }
  }
  return out;
}

// Where the launches' time went: rank 0's time by kind summed over the cases launched.
std::string time_section(const RunResults& run) {
  static const std::vector<std::pair<double CaseTiming::*, std::string>> kKinds = {
      {&CaseTiming::process_start_s, "process start (exec to main: libtorch load)"},
      {&CaseTiming::rendezvous_s, "rendezvous and mesh"},
      {&CaseTiming::training_s, "training (build and steps, less the checks)"},
      {&CaseTiming::checks_s, "checks and probes (the validation session)"},
      {&CaseTiming::other_s, "spawn, teardown, launcher"}};
  CaseTiming sum;
  double launches = 0;
  int n = 0;
  for (const CaseResult& c : run.cases) {
    if (!c.record) continue;
    ++n;
    launches += c.record->seconds;
    for (const auto& [kind, title] : kKinds) sum.*kind += c.record->timing.*kind;
  }
  if (n == 0 || launches <= 0) return "";
  std::string out = "\n## Time\n\n" + std::to_string(n) + " case launches, " + fixed(launches, 1) +
                    " s in all (rank 0's time by kind):\n\n| | s | share |\n|---|---|---|\n";
  for (const auto& [kind, title] : kKinds) {
    out += "| " + title + " | " + fixed(sum.*kind, 1) + " | " + fixed(100 * sum.*kind / launches, 0) + "% |\n";
  }
  return out;
}

// Each case compared with goldens of the original model (MatchesOriginal): the golden, the
// largest error / tolerance and the largest relative error per kind of quantity.
std::string original_model_section(const RunResults& run) {
  static const std::vector<std::string> kKinds = {"loss", "logits", "hidden_states", "gradients",
                                                  "parameters_after_step"};
  std::string out;
  for (const CaseResult& c : run.cases) {
    const CaseGolden& g = c.golden;
    if (!g.present) continue;
    if (out.empty()) {
      out = "\n## Against the original model\n\nEach case compared with goldens of the original model "
            "(MatchesOriginal, compare/golden.json): the largest error / tolerance (below 1 passes) and, per kind "
            "of quantity, the largest relative error.\n\n| case | golden | quantities | largest error / tolerance |";
      for (const auto& k : kKinds) out += " " + k + " |";
      out += "\n|---|---|---|---|";
      for (size_t i = 0; i < kKinds.size(); ++i) out += "---|";
      out += "\n";
    }
    out += "| " + md_cell(spec_title(c.spec) + "/" + c.name) + " | " + md_cell(g.implementation) + " | " +
           std::to_string(g.quantities) + " | " +
           (std::isfinite(g.max_error_over_tolerance) ? fixed(g.max_error_over_tolerance, 3) : std::string("inf")) +
           (g.passed ? "" : " **FAIL**") + (g.worst.empty() ? "" : " (" + md_cell(g.worst) + ")") + " |";
    for (const auto& k : kKinds) {
      const auto it = g.largest_relative_error.find(k);
      out += " " + (it == g.largest_relative_error.end() ? std::string("-") : short_number(it->second)) + " |";
    }
    out += "\n";
  }
  return out;
}

// Each calibrated case of a reduced-precision lane: its rule and margin, and per stage and step
// the largest error / tolerance (what the verdict needs below 1) and error / noise.
std::string precision_section(const RunResults& run) {
  std::string out;
  for (const CaseResult& c : run.cases) {
    const CaseCalibration& cal = c.calibration;
    if (!cal.present) continue;
    if (out.empty()) {
      out = "\n## Precision lanes\n\nEach case of a reduced-precision lane against its lane's reference, every "
            "quantity at its calibrated tolerance (compare/calibration.json). Cells: the largest error / tolerance "
            "at that step and stage (below 1 passes), then the largest error / noise.\n";
    }
    out += "\n### " + md_cell(spec_title(c.spec) + " / " + c.name) + "\n\n" + md_cell(calibration_line(cal)) + "\n\n";
    std::set<int64_t> steps;
    for (const auto& r : cal.rows) steps.insert(r.step);
    out += "| stage |";
    for (int64_t s : steps) out += " step " + std::to_string(s) + " |";
    out += "\n|---|";
    for (size_t i = 0; i < steps.size(); ++i) out += "---|";
    out += "\n";
    const auto cells = calibration_cells(cal);
    for (const auto& stage : calibration_stages(cal)) {
      out += "| " + md_cell(stage) + " |";
      for (int64_t s : steps) {
        const auto it = cells.find({stage, s});
        if (it == cells.end()) {
          out += " - |";
          continue;
        }
        const CalibrationCell& cell = it->second;
        out += " " + (std::isfinite(cell.margin) ? fixed(cell.margin, 2) : std::string("inf")) +
               (cell.margin > 1 ? " **FAIL**" : "") + " (" +
               (cell.ratio > 0 ? (std::isfinite(cell.ratio) ? fixed(cell.ratio, 1) : std::string("inf")) : std::string("-")) +
               ") |";
      }
      out += "\n";
    }
  }
  return out;
}

}  // namespace

std::string render_markdown(const RunResults& run) {
  std::string out = "# Conformance report: " + md_code(run.root.string()) + "\n\n" + totals_line(run) + "\n";
  const std::vector<std::string> reasons = not_passed_reasons(run);
  out += reasons.empty() ? "\n**Verdict: PASSED**\n" : "\n**Verdict: NOT PASSED**\n\n";
  for (const auto& r : reasons) out += "- " + md_cell(r) + "\n";
  // The diagnosis across the matrix, above everything it summarizes.
  const std::vector<std::string> diagnosis = diagnose(diagnosis_cases(run)).lines();
  if (!diagnosis.empty()) {
    out += "\n## Diagnosis\n\n" + md_cell(diagnosis.front()) + "\n";
    const std::string rest = clean_text(join_lines(diagnosis, 1));
    if (!rest.empty()) {
      const std::string fence(std::max<size_t>(3, longest_backtick_run(rest) + 1), '`');
      out += "\n" + fence + "\n" + rest + fence + "\n";
    }
  }
  const auto tables = spec_tables(run);
  for (const auto& [spec, table] : tables) {
    out += "\n## " + md_cell(spec_title(spec)) + "\n\n| suite |";
    for (const auto& c : table.cases) out += " " + md_cell(case_title(c)) + " |";
    out += "\n|---|";
    for (size_t i = 0; i < table.cases.size(); ++i) out += "---|";
    out += "\n";
    for (const auto& suite : table.suites) {
      out += "| " + md_cell(suite) + " |";
      for (const auto& c : table.cases) out += " " + table.cell(suite, c).label() + " |";
      out += "\n";
    }
    bool header = false;
    for (const CaseResult& c : run.cases) {
      if (c.spec != spec || !case_needs_attention(c)) continue;
      if (!header) out += "\nCases to look at:\n\n";
      header = true;
      out += "- " + md_code(c.name) + ": " + md_cell(case_facts(c)) + "\n";
      for (const auto& p : c.problems) out += "  - " + md_cell(p) + "\n";
    }
  }
  if (run.tests.empty()) out += "\nNo test has finished in this run.\n";
  out += original_model_section(run);
  out += precision_section(run);
  out += time_section(run);
  if (run.failed() > 0) {
    out += "\n## Failures\n";
    for (const TestResult& t : run.tests) {
      if (t.status != TestStatus::kFailed) continue;
      const std::string message = clean_text(t.message.empty() ? "(no message)" : t.message);
      const std::string fence(std::max<size_t>(3, longest_backtick_run(message) + 1), '`');
      out += "\n### " + md_code(t.name) + (transport_failure(run, t) ? " (transport failure)" : "") + "\n\n";
      out += "Evidence: " + md_code(evidence_path(run, t.evidence)) + "\n\n";
      out += fence + "\n" + message + (message.back() == '\n' ? "" : "\n") + fence + "\n";
    }
  }
  if (run.skipped() > 0) {
    out += "\n## Skipped\n\n";
    for (const TestResult& t : run.tests) {
      if (t.status == TestStatus::kSkipped) out += "- " + md_code(t.name) + ": " + md_cell(first_line(t.message)) + "\n";
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------
// JUnit XML

namespace {

// "2026-11-30T11:00:00.123Z" -> "2026-11-30T11:00:00": the Ant schema's timestamp has no zone.
// "" for anything that is not UTC in that form.
std::string junit_timestamp(const std::string& time) {
  const std::string pattern = "dddd-dd-ddTdd:dd:dd";
  if (time.size() < pattern.size()) return "";
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == 'd' ? !std::isdigit(static_cast<unsigned char>(time[i])) : time[i] != pattern[i]) return "";
  }
  size_t i = pattern.size();
  if (i < time.size() && time[i] == '.') {
    ++i;
    while (i < time.size() && std::isdigit(static_cast<unsigned char>(time[i]))) ++i;
  }
  if (i < time.size() && time[i] == 'Z') ++i;
  return i == time.size() ? time.substr(0, pattern.size()) : "";
}

}  // namespace

std::string render_junit(const RunResults& run) {
  struct Suite {
    std::vector<const TestResult*> tests;
    int failures = 0, errors = 0, skipped = 0;
    double seconds = 0;
    std::string timestamp;
  };
  std::map<std::string, Suite> suites;  // by classname
  int failures = 0, errors = 0;
  double seconds = 0;
  // A case whose record fails it (FAILED, BLOCKED, a fault injected) while its tests passed
  // is a failed testcase of its own: JUnit must not be green where the report is not.
  std::deque<TestResult> records;
  for (const CaseResult* c : cases_failed_by_record(run)) {
    TestResult t;
    t.spec = c->spec;
    t.case_name = c->name;
    t.suite = "CaseRecord";
    t.test = "Record";
    t.name = c->spec + ".CaseRecord.Record/" + c->name;
    t.status = TestStatus::kFailed;
    t.message = case_record_failure(*c);
    t.evidence = c->evidence;
    records.push_back(std::move(t));
  }
  std::vector<const TestResult*> all;
  for (const TestResult& t : run.tests) all.push_back(&t);
  for (const TestResult& t : records) all.push_back(&t);
  for (const TestResult* each : all) {
    const TestResult& t = *each;
    Suite& s = suites[t.spec.empty() ? t.suite : t.spec + "." + t.suite];
    s.tests.push_back(&t);
    s.seconds += t.seconds;
    seconds += t.seconds;
    if (t.status == TestStatus::kSkipped) s.skipped += 1;
    if (t.status == TestStatus::kFailed) (transport_failure(run, t) ? s.errors : s.failures) += 1;
    const std::string ts = junit_timestamp(t.time);
    if (!ts.empty() && (s.timestamp.empty() || ts < s.timestamp)) s.timestamp = ts;
  }
  for (const auto& [name, s] : suites) failures += s.failures, errors += s.errors;
  // The diagnosis across the matrix, in each failed testcase's system-out (CI shows it there).
  const std::vector<std::string> diagnosis = diagnose(diagnosis_cases(run)).lines();

  std::string out = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  out += "<testsuites name=\"" +
         attr("mih conformance " + run.root.string() + (run.incomplete.empty() ? "" : " (" + run.incomplete + ")")) +
         "\" tests=\"" +
         std::to_string(all.size()) + "\" failures=\"" + std::to_string(failures) + "\" errors=\"" +
         std::to_string(errors) + "\" time=\"" + fixed(seconds) + "\">\n";
  for (const auto& [classname, s] : suites) {
    out += "  <testsuite name=\"" + attr(classname) + "\" tests=\"" + std::to_string(s.tests.size()) +
           "\" failures=\"" + std::to_string(s.failures) + "\" errors=\"" + std::to_string(s.errors) +
           "\" skipped=\"" + std::to_string(s.skipped) + "\" time=\"" + fixed(s.seconds) + "\"" +
           (s.timestamp.empty() ? "" : " timestamp=\"" + s.timestamp + "\"") + ">\n";
    for (const TestResult* t : s.tests) {
      std::string name = t->test.empty() ? t->name : t->test;
      if (!t->test.empty() && !t->case_name.empty()) name += "/" + t->case_name;
      out += "    <testcase classname=\"" + attr(classname) + "\" name=\"" + attr(name) + "\" time=\"" +
             fixed(t->seconds) + "\"";
      if (t->status == TestStatus::kPassed) {
        out += "/>\n";
        continue;
      }
      out += ">\n";
      if (t->status == TestStatus::kSkipped) {
        out += "      <skipped message=\"" + attr(t->message) + "\"/>\n";
      } else {
        const bool error = transport_failure(run, *t);
        const std::string element = error ? "error" : "failure";
        out += "      <" + element + " message=\"" + attr(first_line(t->message)) + "\" type=\"" +
               (error ? std::string(outcome_name(Outcome::kTransportFailure)) : std::string("conformance")) + "\">" + markup_escape(t->message) + "</" + element +
               ">\n";
        out += "      <system-out>evidence: " + markup_escape(evidence_path(run, t->evidence)) +
               (diagnosis.empty() ? "" : "\nmatrix diagnosis: " + markup_escape(join_lines(diagnosis, 0))) +
               "</system-out>\n";
      }
      out += "    </testcase>\n";
    }
    out += "  </testsuite>\n";
  }
  out += "</testsuites>\n";
  return out;
}

}  // namespace mih::report_internal
