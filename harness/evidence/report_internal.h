// Internal to the report (report.cpp, report_read.cpp, report_md.cpp, report_html.cpp): the
// text-safety and number helpers, the suites x cases tables and the per-format renderers they
// share. Not part of mih's API.
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "harness/evidence/report.h"

namespace mih::report_internal {

// ---------------------------------------------------------------------------------------
// Text safety (report.cpp)

/// True iff `line` holds only spaces, tabs and carriage returns.
bool blank(std::string_view line);

/// Valid UTF-8 holding only characters XML 1.0 allows (#x9 | #xA | #xD | [#x20-#xD7FF] |
/// [#xE000-#xFFFD] | [#x10000-#x10FFFF], XML 1.0 section 2.2); anything else becomes U+FFFD.
std::string clean_text(std::string_view s);

/// For XML and HTML text and attribute values (quoted with "). Line breaks and tabs in an
/// attribute are character references, or attribute-value normalization turns them into spaces.
std::string markup_escape(std::string_view raw, bool attribute = false);

/// markup_escape for an attribute value.
std::string attr(std::string_view raw);

/// The first non-blank line, cut at `limit` bytes on a character boundary.
std::string first_line(const std::string& message, size_t limit = 200);

/// lines[from..] each ended by a newline ("" when there are none).
std::string join_lines(const std::vector<std::string>& lines, size_t from);

/// "%.*f" of `value` with `digits` decimals.
std::string fixed(double value, int digits = 3);

/// "%.4g" of `value`.
std::string short_number(double value);

// ---------------------------------------------------------------------------------------
// The suites x cases tables (report.cpp)

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

/// Per spec, its suites x cases table.
std::map<std::string, SpecTable> spec_tables(const RunResults& run);

std::string spec_title(const std::string& spec);
std::string case_title(const std::string& name);
/// `c`, or the first case along its compare_to chain, whose outcome is infrastructure (it did
/// not complete); null when none (or `c` is null).
const CaseResult* incomplete_along(const RunResults& run, const CaseResult* c);
/// A failed test of a case that did not complete, or of one compared with such a case
/// (incomplete_along): not a verdict.
bool transport_failure(const RunResults& run, const TestResult& t);
/// How many of the run's failed tests are transport failures (not judged).
int not_judged(const RunResults& run);
/// An outcome other than "ran", state FAILED or BLOCKED, or unreadable evidence.
bool case_needs_attention(const CaseResult& c);
/// The evidence directory under the run root, "-" for none.
std::string evidence_path(const RunResults& run, const std::string& evidence);
/// "<n> tests: <p> passed, <f> failed, [<j> not judged (infrastructure: <k> cases did not
/// complete), ]<s> skipped; <c> cases".
std::string totals_line(const RunResults& run);
/// The case's facts joined by "; ": kind, world size, seconds, outcome, state, compare_to, error,
/// the fault injected.
std::string case_facts(const CaseResult& c);
/// The cases whose record fails them (state FAILED or BLOCKED, a fault injected, or evidence that
/// cannot be read as mih wrote it) while no test of theirs failed: JUnit adds a failed testcase for each.
std::vector<const CaseResult*> cases_failed_by_record(const RunResults& run);
/// The failure message of such a case.
std::string case_record_failure(const CaseResult& c);

// ---------------------------------------------------------------------------------------
// A reduced-precision lane's calibration (report.cpp)

/// "float32 lane against LaneReference: tolerance = max(10 x noise, 4 x epsilon = 4.77e-07);
/// largest error / tolerance 0.31 (tensor 'norm.weight' at step 2, grad_before_clip)".
std::string calibration_line(const CaseCalibration& c);

/// The stages of a calibration in the order a step computes them ("metrics" first), each
/// present one once.
std::vector<std::string> calibration_stages(const CaseCalibration& c);

/// The largest error / tolerance and error / noise over the rows of one step and stage (NaN
/// when none; error / noise NaN when no row had a noise).
struct CalibrationCell {
  double margin = 0, ratio = 0;
  int rows = 0;
};
std::map<std::pair<std::string, int64_t>, CalibrationCell> calibration_cells(const CaseCalibration& c);

// ---------------------------------------------------------------------------------------
// The formats (see render_report in report.h)

std::string render_markdown(const RunResults& run);  // report_md.cpp
std::string render_junit(const RunResults& run);     // report_md.cpp
std::string render_html(const RunResults& run);      // report_html.cpp

}  // namespace mih::report_internal
