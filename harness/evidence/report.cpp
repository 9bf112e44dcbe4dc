// The report's common part (see report.h): text safety for every format, the suites x cases
// tables, RunResults' counts and render_report's dispatch. Reading is in report_read.cpp,
// Markdown and JUnit in report_md.cpp, HTML in report_html.cpp.
#include "harness/evidence/report.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "harness/base/error.h"
#include "harness/evidence/report_internal.h"
#include "harness/base/strings.h"

namespace mih {
namespace report_internal {
namespace {

const std::string kReplacement = "\xEF\xBF\xBD";  // U+FFFD

}  // namespace

bool blank(std::string_view line) {
  return std::all_of(line.begin(), line.end(), [](char c) { return c == ' ' || c == '\t' || c == '\r'; });
}

std::string clean_text(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      if (c < 0x20 && c != '\t' && c != '\n' && c != '\r') {
        out += kReplacement;
      } else {
        out += static_cast<char>(c);
      }
      ++i;
      continue;
    }
    size_t len = 0;
    uint32_t cp = 0;
    if ((c & 0xE0) == 0xC0) {
      len = 2, cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3, cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4, cp = c & 0x07;
    }
    bool ok = len > 0 && i + len <= s.size();
    for (size_t k = 1; ok && k < len; ++k) {
      const auto d = static_cast<unsigned char>(s[i + k]);
      ok = (d & 0xC0) == 0x80;
      cp = (cp << 6) | (d & 0x3F);
    }
    ok = ok && !(len == 2 && cp < 0x80) && !(len == 3 && cp < 0x800) && !(len == 4 && cp < 0x10000) &&
         cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF) && cp != 0xFFFE && cp != 0xFFFF;
    if (ok) {
      out.append(s.substr(i, len));
      i += len;
    } else {
      out += kReplacement;
      ++i;
    }
  }
  return out;
}

std::string markup_escape(std::string_view raw, bool attribute) {
  std::string out;
  for (const char c : clean_text(raw)) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      case '\n': out += attribute ? "&#10;" : "\n"; break;
      case '\r': out += attribute ? "&#13;" : "\r"; break;
      case '\t': out += attribute ? "&#9;" : "\t"; break;
      default: out += c;
    }
  }
  return out;
}

std::string attr(std::string_view raw) { return markup_escape(raw, true); }

std::string first_line(const std::string& message, size_t limit) {
  std::string line;
  size_t start = 0;
  while (start <= message.size()) {
    size_t end = message.find('\n', start);
    if (end == std::string::npos) end = message.size();
    line = message.substr(start, end - start);
    if (!blank(line)) break;
    line.clear();
    start = end + 1;
  }
  if (line.size() > limit) {
    size_t cut = limit;
    while (cut > 0 && (static_cast<unsigned char>(line[cut]) & 0xC0) == 0x80) --cut;
    line = line.substr(0, cut) + "...";
  }
  return line;
}

std::string join_lines(const std::vector<std::string>& lines, size_t from) {
  std::string out;
  for (size_t i = from; i < lines.size(); ++i) out += lines[i] + "\n";
  return out;
}

std::string fixed(double value, int digits) {
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), "%.*f", digits, value);
  return buffer;
}

std::string short_number(double value) {
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), "%.4g", value);
  return buffer;
}

std::map<std::string, SpecTable> spec_tables(const RunResults& run) {
  std::map<std::string, std::pair<std::set<std::string>, std::set<std::string>>> names;
  std::map<std::string, SpecTable> tables;
  for (const TestResult& t : run.tests) {
    names[t.spec].first.insert(t.suite);
    names[t.spec].second.insert(t.case_name);
    Cell& cell = tables[t.spec].cells[{t.suite, t.case_name}];
    (t.status == TestStatus::kPassed ? cell.passed : t.status == TestStatus::kFailed ? cell.failed : cell.skipped) += 1;
  }
  for (auto& [spec, table] : tables) {
    table.suites.assign(names[spec].first.begin(), names[spec].first.end());
    table.cases.assign(names[spec].second.begin(), names[spec].second.end());
  }
  return tables;
}

std::string spec_title(const std::string& spec) { return spec.empty() ? "(no spec)" : spec; }
std::string case_title(const std::string& name) { return name.empty() ? "(no case)" : name; }

const CaseResult* incomplete_along(const RunResults& run, const CaseResult* c) {
  std::set<std::string> seen;
  for (; c && seen.insert(c->name).second; c = run.find_case(c->spec, c->compare_to())) {
    if (c->outcome() && classify(*c->outcome()) == OutcomeClass::kInfrastructure) return c;
  }
  return nullptr;
}

bool transport_failure(const RunResults& run, const TestResult& t) {
  return t.status == TestStatus::kFailed && !t.case_name.empty() &&
         incomplete_along(run, run.find_case(t.spec, t.case_name)) != nullptr;
}

int not_judged(const RunResults& run) {
  return static_cast<int>(
      std::count_if(run.tests.begin(), run.tests.end(), [&](const TestResult& t) { return transport_failure(run, t); }));
}

bool case_needs_attention(const CaseResult& c) {
  return (c.outcome() && *c.outcome() != Outcome::kRan) || c.state == "FAILED" || c.state == "BLOCKED" || !c.problems.empty() ||
         !c.fault().empty();
}

std::string evidence_path(const RunResults& run, const std::string& evidence) {
  return evidence.empty() ? "-" : (run.root / evidence).string();
}

// The failed tests of cases that did not complete (infrastructure, never a model failure) are
// counted apart from the failed tests that are verdicts, with the cases that did not complete.
std::string totals_line(const RunResults& run) {
  const int infrastructure = not_judged(run);
  const auto incomplete = std::count_if(run.cases.begin(), run.cases.end(),
                                        [&](const CaseResult& c) { return incomplete_along(run, &c) == &c; });
  return (run.incomplete.empty() ? "" : run.incomplete + "; ") + std::to_string(run.tests.size()) + " tests: " +
         std::to_string(run.passed()) + " passed, " + std::to_string(run.failed() - infrastructure) + " failed, " +
         (infrastructure == 0 ? std::string()
                              : std::to_string(infrastructure) + " not judged (infrastructure: " +
                                    std::to_string(incomplete) + (incomplete == 1 ? " case" : " cases") +
                                    " did not complete), ") +
         std::to_string(run.skipped()) + " skipped; " + std::to_string(run.cases.size()) + " cases" +
         (run.not_run.empty() ? "" : "; " + join(run.not_run, "; "));
}

std::string case_facts(const CaseResult& c) {
  std::vector<std::string> facts;
  if (!c.kind().empty()) facts.push_back(c.kind());
  if (c.record && c.record->world_size > 0) facts.push_back("world size " + std::to_string(c.record->world_size));
  if (c.record && c.record->seconds > 0) facts.push_back(fixed(c.record->seconds, 1) + " s");
  if (c.outcome()) facts.push_back("outcome " + std::string(outcome_name(*c.outcome())));
  if (!c.state.empty()) facts.push_back("state " + c.state + (c.state_reason.empty() ? "" : " (" + c.state_reason + ")"));
  if (!c.compare_to().empty()) facts.push_back("compared to " + c.compare_to());
  if (!c.error().empty()) facts.push_back("error: " + c.error());
  if (!c.fault().empty()) facts.push_back("fault " + c.fault() + " injected (the catalog's bug, not the port's)");
  std::string out = join(facts, "; ");
  return out;
}

std::vector<const CaseResult*> cases_failed_by_record(const RunResults& run) {
  std::vector<const CaseResult*> out;
  for (const CaseResult& c : run.cases) {
    if (c.state != "FAILED" && c.state != "BLOCKED" && c.fault().empty() && c.problems.empty()) continue;
    const bool a_test_failed = std::any_of(run.tests.begin(), run.tests.end(), [&](const TestResult& t) {
      return t.spec == c.spec && t.case_name == c.name && t.status == TestStatus::kFailed;
    });
    if (!a_test_failed) out.push_back(&c);
  }
  return out;
}

std::string case_record_failure(const CaseResult& c) {
  if (!c.problems.empty()) {
    return "case " + c.spec + "/" + c.name + ": its evidence is not what mih wrote (" + join(c.problems, "; ") +
           "): no result of it can be trusted; rerun the case";
  }
  if (!c.fault().empty()) {
    return "case " + c.spec + "/" + c.name + " ran with fault " + c.fault() + " of the catalog injected (its case " +
           "record): its tests judge the catalog's bug, never the fault-free port";
  }
  return "case " + c.spec + "/" + c.name + " is in state " + c.state + " (integration_state.json" +
         (c.state_reason.empty() ? std::string() : ": " + c.state_reason) + ") though no test of it failed in this run";
}

std::string calibration_line(const CaseCalibration& c) {
  std::string out = c.dtype + " lane against " + (c.reference.empty() ? std::string("its reference") : c.reference) +
                    ": tolerance = " + (c.factor != 1 ? short_number(c.factor) + " x " : std::string()) + "max(" +
                    short_number(c.k) + " x noise (" + short_number(c.k_update) + " for updated parameters), " +
                    short_number(c.floor_eps) + " x epsilon = " + short_number(c.floor_eps * c.epsilon) +
                    (c.master_epsilon != c.epsilon && c.master_epsilon > 0
                         ? " for activations, " + short_number(c.floor_eps * c.master_epsilon) + " for the float32 rest"
                         : std::string()) +
                    ")";
  out += "; largest error / tolerance " +
         (std::isfinite(c.max_error_over_tolerance) ? fixed(c.max_error_over_tolerance, 3) : std::string("not finite"));
  if (!c.worst.empty()) out += " (" + c.worst + ")";
  return out + "; " + std::to_string(c.rows.size()) + " quantities";
}

std::vector<std::string> calibration_stages(const CaseCalibration& c) {
  static const std::vector<std::string> kOrder = {"metrics",          "model_before",    "forward_output",
                                                  "output_grad",      "grad_before_clip", "grad_after_clip",
                                                  "after_optimizer", "optimizer_state"};
  std::set<std::string> present;
  for (const auto& r : c.rows) present.insert(r.stage);
  std::vector<std::string> out;
  for (const auto& s : kOrder) {
    if (present.erase(s)) out.push_back(s);
  }
  out.insert(out.end(), present.begin(), present.end());
  return out;
}

std::map<std::pair<std::string, int64_t>, CalibrationCell> calibration_cells(const CaseCalibration& c) {
  std::map<std::pair<std::string, int64_t>, CalibrationCell> out;
  for (const auto& r : c.rows) {
    CalibrationCell& cell = out[{r.stage, r.step}];
    const double margin = r.tolerance > 0 ? r.error / r.tolerance : (r.error > 0 ? INFINITY : 0);
    // NaN never wins a max: an error that is not finite is infinitely past its tolerance.
    cell.margin = std::max(cell.margin, std::isnan(margin) ? INFINITY : margin);
    if (r.noise > 0) cell.ratio = std::max(cell.ratio, std::isnan(r.error) ? INFINITY : r.error / r.noise);
    ++cell.rows;
  }
  return out;
}

}  // namespace report_internal

ReportFormat parse_report_format(const std::string& name) {
  if (name == "md") return ReportFormat::kMarkdown;
  if (name == "junit") return ReportFormat::kJunit;
  if (name == "html") return ReportFormat::kHtml;
  MIH_THROW(Code::kInvalidSpec, "report format: expected one of md, junit, html; got '", name, "'");
}

std::vector<std::string> not_passed_reasons(const RunResults& run) {
  std::vector<std::string> out;
  if (run.tests.empty()) out.push_back("no test has finished in this run");
  if (!run.incomplete.empty()) out.push_back(run.incomplete);
  const int judged_failed = run.failed() - report_internal::not_judged(run);
  if (judged_failed > 0) out.push_back(std::to_string(judged_failed) + " test" + (judged_failed == 1 ? "" : "s") + " failed");
  for (const CaseResult& c : run.cases) {
    const std::string name = report_internal::spec_title(c.spec) + "/" + c.name;
    if (!c.fault().empty()) {
      out.push_back(name + ": ran with fault " + c.fault() + " of the catalog injected (its case record): a check of " +
                    "the catalog's bug, not of the fault-free port");
    }
    if (c.state == "FAILED" || c.state == "BLOCKED") {
      out.push_back(name + ": integration state " + c.state + (c.state_reason.empty() ? "" : " (" + c.state_reason + ")"));
    }
    if (c.outcome() && !has_verdict(*c.outcome())) {
      out.push_back(name + ": outcome " + std::string(outcome_name(*c.outcome())) + (c.error().empty() ? "" : " (" + report_internal::first_line(c.error()) + ")"));
    }
    if (!c.problems.empty()) out.push_back(name + ": evidence that cannot be read: " + c.problems.front());
  }
  return out;
}

std::optional<Outcome> CaseResult::outcome() const {
  if (record) return record->outcome;
  if (!failed_job.empty()) return Outcome::kTransportFailure;
  return std::nullopt;
}

std::string CaseResult::error() const { return record ? record->error : failed_job; }

std::string CaseResult::fault() const { return record ? record->fault : requested_fault; }

std::string CaseResult::kind() const { return record ? std::string(spec::case_kind_name(record->kind)) : requested_kind; }

std::string CaseResult::compare_to() const { return record ? record->compare_to : ""; }

int RunResults::passed() const {
  return static_cast<int>(std::count_if(tests.begin(), tests.end(), [](const TestResult& t) { return t.status == TestStatus::kPassed; }));
}

int RunResults::failed() const {
  return static_cast<int>(std::count_if(tests.begin(), tests.end(), [](const TestResult& t) { return t.status == TestStatus::kFailed; }));
}

int RunResults::skipped() const {
  return static_cast<int>(std::count_if(tests.begin(), tests.end(), [](const TestResult& t) { return t.status == TestStatus::kSkipped; }));
}

const CaseResult* RunResults::find_case(const std::string& spec, const std::string& name) const {
  for (const CaseResult& c : cases) {
    if (c.spec == spec && c.name == name) return &c;
  }
  return nullptr;
}

std::string render_report(const RunResults& run, ReportFormat format) {
  switch (format) {
    case ReportFormat::kMarkdown: return report_internal::render_markdown(run);
    case ReportFormat::kJunit: return report_internal::render_junit(run);
    case ReportFormat::kHtml: return report_internal::render_html(run);
  }
  MIH_INTERNAL_ASSERT(false, "unknown report format ", static_cast<int>(format));
  return "";
}

}  // namespace mih
