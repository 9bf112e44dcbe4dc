// The report as one self-contained HTML page (render_report in report.h): the colored suites x
// cases tables, per case its facts and inline SVG loss and grad-norm curves against the
// compare_to case, the failures and the skipped tests.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "harness/evidence/diagnosis.h"
#include "harness/evidence/report.h"
#include "harness/evidence/report_internal.h"

namespace mih::report_internal {
namespace {

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

// The heat map of a calibrated case: a row per quantity, a column per step and stage, each
// cell its error / tolerance (colored from green, far inside, to red, past it) and titled
// with the error, noise and tolerance.
std::string calibration_heat_map(const CaseCalibration& cal) {
  const std::vector<std::string> stages = calibration_stages(cal);
  std::set<int64_t> steps;
  std::vector<std::string> quantities;
  std::map<std::string, std::map<std::pair<int64_t, std::string>, const CalibrationRow*>> by;
  for (const auto& r : cal.rows) {
    const std::string q = r.kind + " " + r.name;
    if (!by.count(q)) quantities.push_back(q);
    by[q][{r.step, r.stage}] = &r;
    steps.insert(r.step);
  }
  std::vector<std::pair<int64_t, std::string>> columns;
  for (int64_t step : steps) {
    for (const auto& stage : stages) {
      for (const auto& q : quantities) {
        if (by[q].count({step, stage})) {
          columns.emplace_back(step, stage);
          break;
        }
      }
    }
  }
  std::string out = "<p class=\"facts\">" + markup_escape(calibration_line(cal)) +
                    "</p>\n<div class=\"heat\"><table class=\"heat\">\n<tr><th>error / tolerance</th>";
  for (const auto& [step, stage] : columns) {
    out += "<th title=\"" + attr("step " + std::to_string(step) + ", " + stage) + "\">" + std::to_string(step) + "<br>" +
           markup_escape(stage) + "</th>";
  }
  out += "</tr>\n";
  for (const auto& q : quantities) {
    out += "<tr><th class=\"q\">" + markup_escape(q) + "</th>";
    for (const auto& col : columns) {
      const auto it = by[q].find(col);
      if (it == by[q].end()) {
        out += "<td></td>";
        continue;
      }
      const CalibrationRow& r = *it->second;
      const double m = r.tolerance > 0 ? r.error / r.tolerance : (r.error > 0 ? INFINITY : 0);
      const char* level = !(m <= 1) ? "h4" : m > 0.5 ? "h3" : m > 0.1 ? "h2" : "h1";
      out += "<td class=\"" + std::string(level) + "\" title=\"" +
             attr("error " + short_number(r.error) + ", noise " + (std::isnan(r.noise) ? "not measured" : short_number(r.noise)) +
                  ", tolerance " + short_number(r.tolerance) +
                  (r.noise > 0 ? ", error / noise " + short_number(r.error / r.noise) : std::string())) +
             "\">" + (std::isfinite(m) ? fixed(m, 2) : std::string("inf")) + "</td>";
    }
    out += "</tr>\n";
  }
  return out + "</table></div>\n";
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
p.verdict{font-weight:bold}p.verdict.pass{color:#155724}p.verdict.fail{color:#721c24}
svg.chart{margin-right:1em;font-size:11px}svg.chart .title{font-weight:bold}
pre{background:#f6f8fa;padding:0.8em;overflow-x:auto;white-space:pre-wrap}
p.diagnosis{font-weight:bold;border-left:4px solid #dc3545;padding-left:0.6em}
.tag{background:#6c757d;color:white;border-radius:3px;padding:0 0.4em;font-size:0.8em}
div.heat{overflow-x:auto}table.heat{border-collapse:collapse;font-size:10px}
table.heat th,table.heat td{border:1px solid #ddd;padding:1px 3px;text-align:center}
table.heat th.q{text-align:left;font-family:monospace;white-space:nowrap}
td.h1{background:#c3e6cb}td.h2{background:#e2f0d9}td.h3{background:#fff3cd}td.h4{background:#f5c6cb;font-weight:bold}
)";

}  // namespace

std::string render_html(const RunResults& run) {
  std::string out = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>mih conformance report: " +
                    markup_escape(run.root.string()) + "</title>\n<style>\n" + kCss + "</style>\n</head>\n<body>\n";
  out += "<h1>Conformance report</h1>\n<p class=\"root\">" + markup_escape(run.root.string()) + "</p>\n";
  out += "<p class=\"totals\">" + markup_escape(totals_line(run)) + "</p>\n";
  const std::vector<std::string> reasons = not_passed_reasons(run);
  out += reasons.empty() ? "<p class=\"verdict pass\">Verdict: PASSED</p>\n" : "<p class=\"verdict fail\">Verdict: NOT PASSED</p>\n<ul class=\"verdict\">\n";
  for (const auto& r : reasons) out += "<li>" + markup_escape(r) + "</li>\n";
  if (!reasons.empty()) out += "</ul>\n";
  const std::vector<std::string> diagnosis = diagnose(diagnosis_cases(run)).lines();
  if (!diagnosis.empty()) {
    out += "<h2>Diagnosis</h2>\n<p class=\"diagnosis\">" + markup_escape(diagnosis.front()) + "</p>\n";
    if (diagnosis.size() > 1) out += "<pre class=\"diagnosis\">" + markup_escape(join_lines(diagnosis, 1)) + "</pre>\n";
  }
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
        const CaseResult* ref = c.compare_to().empty() ? nullptr : run.find_case(c.spec, c.compare_to());
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
      if (c.calibration.present) out += calibration_heat_map(c.calibration);
      if (c.golden.present) {
        std::string kinds;
        for (const auto& [kind, v] : c.golden.largest_relative_error) {
          kinds += (kinds.empty() ? "" : ", ") + kind + " " + short_number(v);
        }
        out += "<p class=\"facts\">Against the original model (" + markup_escape(c.golden.implementation) + "): " +
               std::to_string(c.golden.quantities) + " quantities, largest error / tolerance " +
               (std::isfinite(c.golden.max_error_over_tolerance) ? fixed(c.golden.max_error_over_tolerance, 3)
                                                                 : std::string("inf")) +
               (c.golden.passed ? "" : " (FAIL)") + "; largest relative error: " + markup_escape(kinds) + "</p>\n";
      }
      out += "</section>\n";
    }
  }
  if (run.tests.empty()) out += "<p>No test has finished in this run.</p>\n";
  if (run.failed() > 0) {
    out += "<h2>Failures</h2>\n";
    for (const TestResult& t : run.tests) {
      if (t.status != TestStatus::kFailed) continue;
      out += "<section class=\"failure\">\n<h3>" + markup_escape(t.name) +
             (transport_failure(run, t) ? " <span class=\"tag\">transport failure</span>" : "") + "</h3>\n";
      out += "<p>evidence: <code>" + markup_escape(evidence_path(run, t.evidence)) + "</code></p>\n";
      out += "<pre>" + markup_escape(t.message.empty() ? "(no message)" : t.message) + "</pre>\n</section>\n";
    }
  }
  if (run.skipped() > 0) {
    out += "<h2>Skipped</h2>\n<ul>\n";
    for (const TestResult& t : run.tests) {
      if (t.status == TestStatus::kSkipped) out += "<li><code>" + markup_escape(t.name) + "</code>: " + markup_escape(first_line(t.message)) + "</li>\n";
    }
    out += "</ul>\n";
  }
  out += "</body>\n</html>\n";
  return out;
}

}  // namespace mih::report_internal
