// Reading a conformance run root and rendering its report as Markdown, JUnit XML or HTML
// (see report.h).
#include "harness/evidence/report.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <string_view>
#include <utility>

#include <nlohmann/json.hpp>

#include "harness/base/error.h"
#include "harness/base/files.h"

namespace mih {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::vector<std::string> kStatuses = {"passed", "failed", "skipped"};

// ---------------------------------------------------------------------------------------
// Reading

bool blank(std::string_view line) {
  return std::all_of(line.begin(), line.end(), [](char c) { return c == ' ' || c == '\t' || c == '\r'; });
}

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
  MIH_CHECK(it->is_string(), where, ": '", key, "' must be a string, got ", it->dump());
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
  MIH_CHECK(j.is_object(), where, ": expected a JSON object, got ", j.dump());
  TestResult t;
  t.name = string_field(j, "name", where);
  MIH_CHECK(!t.name.empty(), where, ": 'name' is missing or empty");
  t.status = string_field(j, "status", where);
  MIH_CHECK(std::find(kStatuses.begin(), kStatuses.end(), t.status) != kStatuses.end(), where,
            ": 'status' must be one of passed, failed, skipped; got '", t.status, "'");
  t.spec = string_field(j, "spec", where);
  t.case_name = string_field(j, "case", where);
  t.suite = string_field(j, "suite", where);
  t.test = string_field(j, "test", where);
  t.message = string_field(j, "message", where);
  t.evidence = string_field(j, "evidence", where);
  t.time = string_field(j, "time", where);
  if (const auto it = j.find("seconds"); it != j.end() && !it->is_null()) {
    MIH_CHECK(it->is_number() && it->get<double>() >= 0, where, ": 'seconds' must be a non-negative number, got ",
              it->dump());
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
    problems->push_back(file.string() + ": '" + key + "' must be a string, got " + it->dump());
  }
}

template <class Number>
void take(const json& j, const char* key, Number* out, const fs::path& file, std::vector<std::string>* problems) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return;
  if (it->is_number()) {
    *out = it->get<Number>();
  } else {
    problems->push_back(file.string() + ": '" + key + "' must be a number, got " + it->dump());
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
  try {
    *out = json::parse(text);
  } catch (const json::exception& e) {
    problems->push_back(file.string() + ": not JSON: " + e.what());
    return false;
  }
  if (!out->is_object()) {
    problems->push_back(file.string() + ": expected a JSON object, got " + out->dump());
    return false;
  }
  return true;
}

double metric_value(const json& row, const char* key) {
  const auto it = row.find(key);
  return it != row.end() && it->is_number() ? it->get<double>() : std::numeric_limits<double>::quiet_NaN();
}

void read_case_files(const fs::path& root, CaseResult* c) {
  const fs::path dir = root / c->evidence;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    c->problems.push_back("evidence directory " + dir.string() + " does not exist");
    return;
  }
  json j;
  const fs::path case_run = dir / "case_run.json";
  if (read_json_object(case_run, &j, &c->problems)) {
    take(j, "kind", &c->kind, case_run, &c->problems);
    take(j, "compare_to", &c->compare_to, case_run, &c->problems);
    take(j, "outcome", &c->outcome, case_run, &c->problems);
    take(j, "error", &c->error, case_run, &c->problems);
    take(j, "world_size", &c->world_size, case_run, &c->problems);
    take(j, "seconds", &c->seconds, case_run, &c->problems);
    if (j.contains("timing") && j["timing"].is_object()) {
      for (const auto& [k, v] : j["timing"].items()) {
        if (v.is_number()) c->timing[k] = v.get<double>();
      }
    }
  }
  const fs::path state = dir / "integration_state.json";
  if (read_json_object(state, &j, &c->problems)) {
    take(j, "state", &c->state, state, &c->problems);
    take(j, "reason", &c->state_reason, state, &c->problems);
  }
  const fs::path metrics = dir / "cases" / "runtime" / "metrics.jsonl";
  if (!fs::exists(metrics, ec)) return;
  std::string text;
  if (!read_file(metrics, &text)) {
    c->problems.push_back(metrics.string() + ": cannot be read");
    return;
  }
  std::map<int64_t, StepPoint> by_step;  // a repeated step (a resume): the last line wins
  for_each_line(text, [&](int line_number, std::string_view line, bool terminated) {
    json row;
    try {
      row = json::parse(line.begin(), line.end());
    } catch (const json::exception& e) {
      if (terminated) c->problems.push_back(metrics.string() + " line " + std::to_string(line_number) + ": not JSON: " + e.what());
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

// ---------------------------------------------------------------------------------------
// Text safety

const std::string kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// Valid UTF-8 holding only characters XML 1.0 allows (#x9 | #xA | #xD | [#x20-#xD7FF] |
// [#xE000-#xFFFD] | [#x10000-#x10FFFF], XML 1.0 section 2.2); anything else becomes U+FFFD.
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

// For XML and HTML text and attribute values (quoted with "). Line breaks and tabs in an
// attribute are character references, or attribute-value normalization turns them into spaces.
std::string markup_escape(std::string_view raw, bool attribute = false) {
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

// The first non-blank line, cut at `limit` bytes on a character boundary.
std::string first_line(const std::string& message, size_t limit = 200) {
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

std::string fixed(double value, int digits = 3) {
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), "%.*f", digits, value);
  return buffer;
}

std::string short_number(double value) {
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), "%.4g", value);
  return buffer;
}

// ---------------------------------------------------------------------------------------
// The suites x cases tables

struct Cell {
  int passed = 0, failed = 0, skipped = 0;
  std::string label() const {
    if (failed > 0) return "FAIL";
    if (passed > 0) return "pass";
    if (skipped > 0) return "skip";
    return "-";
  }
};

struct SpecTable {
  std::vector<std::string> suites, cases;  // sorted
  std::map<std::pair<std::string, std::string>, Cell> cells;  // (suite, case)
  Cell cell(const std::string& suite, const std::string& case_name) const {
    const auto it = cells.find({suite, case_name});
    return it == cells.end() ? Cell{} : it->second;
  }
};

std::map<std::string, SpecTable> spec_tables(const RunResults& run) {
  std::map<std::string, std::pair<std::set<std::string>, std::set<std::string>>> names;
  std::map<std::string, SpecTable> tables;
  for (const TestResult& t : run.tests) {
    names[t.spec].first.insert(t.suite);
    names[t.spec].second.insert(t.case_name);
    Cell& cell = tables[t.spec].cells[{t.suite, t.case_name}];
    (t.status == "passed" ? cell.passed : t.status == "failed" ? cell.failed : cell.skipped) += 1;
  }
  for (auto& [spec, table] : tables) {
    table.suites.assign(names[spec].first.begin(), names[spec].first.end());
    table.cases.assign(names[spec].second.begin(), names[spec].second.end());
  }
  return tables;
}

std::string spec_title(const std::string& spec) { return spec.empty() ? "(no spec)" : spec; }
std::string case_title(const std::string& name) { return name.empty() ? "(no case)" : name; }

bool transport_failure(const RunResults& run, const TestResult& t) {
  const CaseResult* c = t.case_name.empty() ? nullptr : run.find_case(t.spec, t.case_name);
  return t.status == "failed" && c != nullptr && c->outcome == "transport_failure";
}

bool case_needs_attention(const CaseResult& c) {
  return (!c.outcome.empty() && c.outcome != "ran") || c.state == "FAILED" || c.state == "BLOCKED" || !c.problems.empty();
}

std::string evidence_path(const RunResults& run, const std::string& evidence) {
  return evidence.empty() ? "-" : (run.root / evidence).string();
}

std::string totals_line(const RunResults& run) {
  return std::to_string(run.tests.size()) + " tests: " + std::to_string(run.passed()) + " passed, " +
         std::to_string(run.failed()) + " failed, " + std::to_string(run.skipped()) + " skipped; " +
         std::to_string(run.cases.size()) + " cases";
}

std::string case_facts(const CaseResult& c) {
  std::vector<std::string> facts;
  if (!c.kind.empty()) facts.push_back(c.kind);
  if (c.world_size > 0) facts.push_back("world size " + std::to_string(c.world_size));
  if (c.seconds > 0) facts.push_back(fixed(c.seconds, 1) + " s");
  if (!c.outcome.empty()) facts.push_back("outcome " + c.outcome);
  if (!c.state.empty()) facts.push_back("state " + c.state + (c.state_reason.empty() ? "" : " (" + c.state_reason + ")"));
  if (!c.compare_to.empty()) facts.push_back("compared to " + c.compare_to);
  if (!c.error.empty()) facts.push_back("error: " + c.error);
  std::string out;
  for (const auto& f : facts) out += (out.empty() ? "" : "; ") + f;
  return out;
}

// ---------------------------------------------------------------------------------------
// Markdown

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
  std::map<std::string, double> sum;
  double launches = 0;
  int n = 0;
  for (const CaseResult& c : run.cases) {
    if (c.timing.empty()) continue;
    ++n;
    launches += c.seconds;
    for (const auto& [k, v] : c.timing) sum[k] += v;
  }
  if (n == 0 || launches <= 0) return "";
  std::string out = "\n## Time\n\n" + std::to_string(n) + " case launches, " + fixed(launches, 1) +
                    " s in all (rank 0's time by kind):\n\n| | s | share |\n|---|---|---|\n";
  for (const auto& [key, title] : std::vector<std::pair<std::string, std::string>>{
           {"process_start_s", "process start (exec to main: libtorch load)"},
           {"rendezvous_s", "rendezvous and mesh"},
           {"training_s", "training (build and steps, less the checks)"},
           {"checks_s", "checks and probes (the validation session)"},
           {"other_s", "spawn, teardown, launcher"}}) {
    out += "| " + title + " | " + fixed(sum[key], 1) + " | " + fixed(100 * sum[key] / launches, 0) + "% |\n";
  }
  return out;
}

std::string render_markdown(const RunResults& run) {
  std::string out = "# Conformance report: " + md_code(run.root.string()) + "\n\n" + totals_line(run) + "\n";
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
  out += time_section(run);
  if (run.failed() > 0) {
    out += "\n## Failures\n";
    for (const TestResult& t : run.tests) {
      if (t.status != "failed") continue;
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
      if (t.status == "skipped") out += "- " + md_code(t.name) + ": " + md_cell(first_line(t.message)) + "\n";
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------
// JUnit XML

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
  for (const TestResult& t : run.tests) {
    Suite& s = suites[t.spec.empty() ? t.suite : t.spec + "." + t.suite];
    s.tests.push_back(&t);
    s.seconds += t.seconds;
    seconds += t.seconds;
    if (t.status == "skipped") s.skipped += 1;
    if (t.status == "failed") (transport_failure(run, t) ? s.errors : s.failures) += 1;
    const std::string ts = junit_timestamp(t.time);
    if (!ts.empty() && (s.timestamp.empty() || ts < s.timestamp)) s.timestamp = ts;
  }
  for (const auto& [name, s] : suites) failures += s.failures, errors += s.errors;

  std::string out = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  out += "<testsuites name=\"" + attr("mih conformance " + run.root.string()) + "\" tests=\"" +
         std::to_string(run.tests.size()) + "\" failures=\"" + std::to_string(failures) + "\" errors=\"" +
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
      if (t->status == "passed") {
        out += "/>\n";
        continue;
      }
      out += ">\n";
      if (t->status == "skipped") {
        out += "      <skipped message=\"" + attr(t->message) + "\"/>\n";
      } else {
        const bool error = transport_failure(run, *t);
        const std::string element = error ? "error" : "failure";
        out += "      <" + element + " message=\"" + attr(first_line(t->message)) + "\" type=\"" +
               (error ? "transport_failure" : "conformance") + "\">" + markup_escape(t->message) + "</" + element +
               ">\n";
        out += "      <system-out>evidence: " + markup_escape(evidence_path(run, t->evidence)) + "</system-out>\n";
      }
      out += "    </testcase>\n";
    }
    out += "  </testsuite>\n";
  }
  out += "</testsuites>\n";
  return out;
}

// ---------------------------------------------------------------------------------------
// HTML

struct Series {
  std::string label;
  std::vector<std::pair<int64_t, double>> points;  // (step, value), NaN for a missing value
  bool dashed = false;
};

std::vector<std::pair<int64_t, double>> curve(const CaseResult& c, double StepPoint::*metric) {
  std::vector<std::pair<int64_t, double>> points;
  for (const StepPoint& p : c.steps) points.emplace_back(p.step, p.*metric);
  return points;
}

// An inline SVG line chart of `series` against the step: min/max labels on both axes, one
// polyline per run of finite values (a non-finite value breaks the line), a legend.
std::string svg_chart(const std::string& metric, const std::vector<Series>& series) {
  constexpr double kWidth = 440, kHeight = 240, kLeft = 70, kRight = 16, kTop = 44, kBottom = 36;
  constexpr double kPlotWidth = kWidth - kLeft - kRight, kPlotHeight = kHeight - kTop - kBottom;
  const char* kColors[] = {"#1f77b4", "#d62728"};
  double x_min = INFINITY, x_max = -INFINITY, y_min = INFINITY, y_max = -INFINITY;
  int not_finite = 0;
  for (const Series& s : series) {
    for (const auto& [step, value] : s.points) {
      x_min = std::min(x_min, static_cast<double>(step));
      x_max = std::max(x_max, static_cast<double>(step));
      if (!std::isfinite(value)) {
        not_finite += &s == &series.front() ? 1 : 0;
        continue;
      }
      y_min = std::min(y_min, value);
      y_max = std::max(y_max, value);
    }
  }
  std::string out = "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart\" width=\"" + fixed(kWidth, 0) +
                    "\" height=\"" + fixed(kHeight, 0) + "\" viewBox=\"0 0 " + fixed(kWidth, 0) + " " +
                    fixed(kHeight, 0) + "\" role=\"img\"><title>" + markup_escape(metric) + " per step</title>\n";
  const std::string title =
      metric + (not_finite > 0 ? " (" + std::to_string(not_finite) + (not_finite == 1 ? " step" : " steps") + " not finite)" : "");
  out += "<text x=\"" + fixed(kLeft, 0) + "\" y=\"16\" class=\"title\">" + markup_escape(title) + "</text>\n";
  out += "<rect x=\"" + fixed(kLeft, 1) + "\" y=\"" + fixed(kTop, 1) + "\" width=\"" + fixed(kPlotWidth, 1) +
         "\" height=\"" + fixed(kPlotHeight, 1) + "\" fill=\"none\" stroke=\"#999\"/>\n";
  if (!(y_min <= y_max)) {
    out += "<text x=\"" + fixed(kLeft + kPlotWidth / 2, 1) + "\" y=\"" + fixed(kTop + kPlotHeight / 2, 1) +
           "\" text-anchor=\"middle\">no finite values</text>\n</svg>";
    return out;
  }
  // A flat curve or a single step still gets a visible range.
  const double y_pad = y_max > y_min ? 0 : std::max(std::abs(y_max) * 0.05, 1e-12);
  const double x_pad = x_max > x_min ? 0 : 0.5;
  const double y_lo = y_min - y_pad, y_hi = y_max + y_pad, x_lo = x_min - x_pad, x_hi = x_max + x_pad;
  auto x = [&](double step) { return kLeft + (step - x_lo) / (x_hi - x_lo) * kPlotWidth; };
  auto y = [&](double v) { return kTop + (y_hi - v) / (y_hi - y_lo) * kPlotHeight; };
  const std::string bottom = fixed(kTop + kPlotHeight + 14, 1);
  out += "<text x=\"" + fixed(kLeft - 4, 1) + "\" y=\"" + fixed(kTop + 4, 1) + "\" text-anchor=\"end\">" +
         short_number(y_max) + "</text>\n";
  out += "<text x=\"" + fixed(kLeft - 4, 1) + "\" y=\"" + fixed(kTop + kPlotHeight, 1) + "\" text-anchor=\"end\">" +
         short_number(y_min) + "</text>\n";
  out += "<text x=\"" + fixed(kLeft, 1) + "\" y=\"" + bottom + "\" text-anchor=\"start\">" + short_number(x_min) +
         "</text>\n";
  out += "<text x=\"" + fixed(kLeft + kPlotWidth, 1) + "\" y=\"" + bottom + "\" text-anchor=\"end\">" +
         short_number(x_max) + "</text>\n";
  out += "<text x=\"" + fixed(kLeft + kPlotWidth / 2, 1) + "\" y=\"" + fixed(kHeight - 6, 1) +
         "\" text-anchor=\"middle\">step</text>\n";
  double legend_x = kLeft;  // the legend is the row under the title
  for (size_t i = 0; i < series.size(); ++i) {
    const Series& s = series[i];
    const std::string color = kColors[i % 2], dash = s.dashed ? " stroke-dasharray=\"5 3\"" : "";
    out += "<g class=\"series\">";
    std::string points;
    auto flush = [&] {
      if (points.find(' ') != std::string::npos) {
        out += "<polyline fill=\"none\" stroke=\"" + color + "\" stroke-width=\"1.5\"" + dash + " points=\"" + points +
               "\"/>";
      } else if (!points.empty()) {  // a single finite step between gaps
        const size_t comma = points.find(',');
        out += "<circle cx=\"" + points.substr(0, comma) + "\" cy=\"" + points.substr(comma + 1) + "\" r=\"2\" fill=\"" +
               color + "\"/>";
      }
      points.clear();
    };
    for (const auto& [step, value] : s.points) {
      if (!std::isfinite(value)) {
        flush();
        continue;
      }
      points += (points.empty() ? "" : " ") + fixed(x(static_cast<double>(step)), 1) + "," + fixed(y(value), 1);
    }
    flush();
    out += "</g>\n";
    out += "<line x1=\"" + fixed(legend_x, 1) + "\" y1=\"28\" x2=\"" + fixed(legend_x + 18, 1) +
           "\" y2=\"28\" stroke=\"" + color + "\" stroke-width=\"1.5\"" + dash + "/>";
    out += "<text x=\"" + fixed(legend_x + 22, 1) + "\" y=\"32\">" + markup_escape(s.label) + "</text>\n";
    legend_x += 34 + 7.0 * static_cast<double>(s.label.size());
  }
  out += "</svg>";
  return out;
}

std::string html_id(const std::string& spec, const std::string& name) {
  std::string id = "case-" + spec + "-" + name;
  for (char& c : id) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_') c = '_';
  }
  return id;
}

const char* kCss = R"(body{font-family:system-ui,sans-serif;margin:2em;color:#222}
h1{font-size:1.5em}.root{font-family:monospace;color:#555}
table.matrix{border-collapse:collapse;margin:0.5em 0 1em}
table.matrix th,table.matrix td{border:1px solid #ccc;padding:0.25em 0.7em;text-align:center}
table.matrix th{background:#f4f4f4}table.matrix th.suite{text-align:left}
td.pass{background:#d4edda;color:#155724}td.FAIL{background:#f8d7da;color:#721c24;font-weight:bold}
td.skip{background:#fff3cd;color:#856404}td.none{color:#aaa}
section.case{margin:1em 0;padding:0.5em 1em;border-left:4px solid #ccc}
section.case.attention{border-left-color:#dc3545}.facts{color:#555}.problem{color:#a00}
svg.chart{margin-right:1em;font-size:11px}svg.chart .title{font-weight:bold}
pre{background:#f6f8fa;padding:0.8em;overflow-x:auto;white-space:pre-wrap}
.tag{background:#6c757d;color:white;border-radius:3px;padding:0 0.4em;font-size:0.8em}
)";

std::string render_html(const RunResults& run) {
  std::string out = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>mih conformance report: " +
                    markup_escape(run.root.string()) + "</title>\n<style>\n" + kCss + "</style>\n</head>\n<body>\n";
  out += "<h1>Conformance report</h1>\n<p class=\"root\">" + markup_escape(run.root.string()) + "</p>\n";
  out += "<p class=\"totals\">" + markup_escape(totals_line(run)) + "</p>\n";
  const auto tables = spec_tables(run);
  for (const auto& [spec, table] : tables) {
    out += "<h2>" + markup_escape(spec_title(spec)) + "</h2>\n<table class=\"matrix\">\n<tr><th class=\"suite\">suite</th>";
    for (const auto& c : table.cases) {
      const bool linked = !c.empty() && run.find_case(spec, c) != nullptr;
      out += "<th>" + (linked ? "<a href=\"#" + html_id(spec, c) + "\">" : std::string()) + markup_escape(case_title(c)) +
             (linked ? "</a>" : "") + "</th>";
    }
    out += "</tr>\n";
    for (const auto& suite : table.suites) {
      out += "<tr><th class=\"suite\">" + markup_escape(suite) + "</th>";
      for (const auto& c : table.cases) {
        const std::string label = table.cell(suite, c).label();
        out += "<td class=\"" + (label == "-" ? std::string("none") : label) + "\">" + label + "</td>";
      }
      out += "</tr>\n";
    }
    out += "</table>\n";
    for (const CaseResult& c : run.cases) {
      if (c.spec != spec) continue;
      out += "<section class=\"case" + std::string(case_needs_attention(c) ? " attention" : "") + "\" id=\"" +
             html_id(c.spec, c.name) + "\">\n<h3>" + markup_escape(spec_title(c.spec) + " / " + c.name) + "</h3>\n";
      out += "<p class=\"facts\">" + markup_escape(case_facts(c)) + "<br>evidence: <code>" +
             markup_escape(evidence_path(run, c.evidence)) + "</code></p>\n";
      for (const auto& p : c.problems) out += "<p class=\"problem\">" + markup_escape(p) + "</p>\n";
      if (c.steps.empty()) {
        out += "<p>No training metrics: cases/runtime/metrics.jsonl is missing (the case stopped before training).</p>\n";
      } else {
        const CaseResult* ref = c.compare_to.empty() ? nullptr : run.find_case(c.spec, c.compare_to);
        if (ref != nullptr && ref->steps.empty()) ref = nullptr;
        out += "<div class=\"charts\">\n";
        for (const auto& [metric, member] : {std::pair{"loss", &StepPoint::loss},
                                             std::pair{"grad_norm_pre_clip", &StepPoint::grad_norm_pre_clip}}) {
          std::vector<Series> series = {{c.name, curve(c, member), false}};
          if (ref != nullptr) series.push_back({ref->name, curve(*ref, member), true});
          out += svg_chart(metric, series) + "\n";
        }
        out += "</div>\n";
      }
      out += "</section>\n";
    }
  }
  if (run.tests.empty()) out += "<p>No test has finished in this run.</p>\n";
  if (run.failed() > 0) {
    out += "<h2>Failures</h2>\n";
    for (const TestResult& t : run.tests) {
      if (t.status != "failed") continue;
      out += "<section class=\"failure\">\n<h3>" + markup_escape(t.name) +
             (transport_failure(run, t) ? " <span class=\"tag\">transport failure</span>" : "") + "</h3>\n";
      out += "<p>evidence: <code>" + markup_escape(evidence_path(run, t.evidence)) + "</code></p>\n";
      out += "<pre>" + markup_escape(t.message.empty() ? "(no message)" : t.message) + "</pre>\n</section>\n";
    }
  }
  if (run.skipped() > 0) {
    out += "<h2>Skipped</h2>\n<ul>\n";
    for (const TestResult& t : run.tests) {
      if (t.status == "skipped") out += "<li><code>" + markup_escape(t.name) + "</code>: " + markup_escape(first_line(t.message)) + "</li>\n";
    }
    out += "</ul>\n";
  }
  out += "</body>\n</html>\n";
  return out;
}

}  // namespace

ReportFormat parse_report_format(const std::string& name) {
  if (name == "md") return ReportFormat::kMarkdown;
  if (name == "junit") return ReportFormat::kJunit;
  if (name == "html") return ReportFormat::kHtml;
  MIH_THROW(Code::kInvalidSpec, "report format: expected one of md, junit, html; got '", name, "'");
}

int RunResults::passed() const {
  return static_cast<int>(std::count_if(tests.begin(), tests.end(), [](const TestResult& t) { return t.status == "passed"; }));
}

int RunResults::failed() const {
  return static_cast<int>(std::count_if(tests.begin(), tests.end(), [](const TestResult& t) { return t.status == "failed"; }));
}

int RunResults::skipped() const {
  return static_cast<int>(std::count_if(tests.begin(), tests.end(), [](const TestResult& t) { return t.status == "skipped"; }));
}

const CaseResult* RunResults::find_case(const std::string& spec, const std::string& name) const {
  for (const CaseResult& c : cases) {
    if (c.spec == spec && c.name == name) return &c;
  }
  return nullptr;
}

RunResults read_run_results(const fs::path& root) {
  const std::string fix = "; run the conformance binary or scripts/conformance with --evidence-root " + root.string() + " first";
  std::error_code ec;
  MIH_CHECK_CODE(fs::is_directory(root, ec), Code::kFailedPrecondition, "run root '", root.string(), "' does not exist",
                 fix);
  const fs::path file = root / "results.jsonl";
  MIH_CHECK_CODE(fs::exists(file, ec), Code::kFailedPrecondition, "'", file.string(),
                 "' does not exist: no test of the run has finished", fix);
  std::string text;
  MIH_CHECK_CODE(read_file(file, &text), Code::kFailedPrecondition, "cannot read '", file.string(), "'");

  std::map<std::string, TestResult> by_name;  // a rerun test: its last line wins
  for_each_line(text, [&](int line_number, std::string_view line, bool terminated) {
    const std::string where = file.string() + " line " + std::to_string(line_number);
    json j;
    try {
      j = json::parse(line.begin(), line.end());
    } catch (const json::exception& e) {
      if (!terminated) return;  // a writer died mid-line
      MIH_THROW(Code::kInvalidSpec, where, " is not JSON: ", e.what());
    }
    TestResult t = parse_result_line(j, where);
    by_name[t.name] = std::move(t);
  });

  RunResults run;
  run.root = root;
  std::map<std::pair<std::string, std::string>, CaseResult> cases;
  for (auto& [name, t] : by_name) {
    if (!t.case_name.empty()) {
      CaseResult& c = cases[{t.spec, t.case_name}];
      c.spec = t.spec;
      c.name = t.case_name;
      if (c.evidence.empty()) c.evidence = t.evidence;
    }
    run.tests.push_back(std::move(t));
  }
  for (auto& [key, c] : cases) {
    if (c.evidence.empty()) {
      c.problems.push_back("no test of the case names its evidence directory");
    } else {
      read_case_files(root, &c);
    }
    run.cases.push_back(std::move(c));
  }
  return run;
}

std::string render_report(const RunResults& run, ReportFormat format) {
  switch (format) {
    case ReportFormat::kMarkdown: return render_markdown(run);
    case ReportFormat::kJunit: return render_junit(run);
    case ReportFormat::kHtml: return render_html(run);
  }
  MIH_INTERNAL_ASSERT(false, "unknown report format ", static_cast<int>(format));
  return "";
}

}  // namespace mih
