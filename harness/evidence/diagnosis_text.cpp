// The diagnosis in words and JSON, and the diagnosis cases of a run root (diagnosis.h): the
// summary and lines every report format and `mih test` print, to_json for faults.json, and
// diagnosis_cases, which reads each case's verdict, configuration and spec facts from evidence.
#include "harness/evidence/diagnosis.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/contract/evidence_layout.h"
#include "harness/base/files.h"
#include "harness/base/json_fields.h"
#include "harness/evidence/report.h"
#include "harness/evidence/report_internal.h"
#include "harness/base/strings.h"

namespace mih {
namespace {

using nlohmann::json;

// "fails only with ep > 1", "fails only without activation checkpointing".
std::string only_with(const std::string& phrase) {
  return phrase.rfind("without ", 0) == 0 ? "fails only " + phrase : "fails only with " + phrase;
}

std::string join(const std::vector<std::string>& items, const std::string& sep = ", ", size_t limit = 8) {
  std::string out;
  for (size_t i = 0; i < items.size() && i < limit; ++i) out += (i ? sep : "") + items[i];
  if (items.size() > limit) out += sep + "... (" + std::to_string(items.size() - limit) + " more)";
  return out;
}

std::string cases_word(size_t n) { return std::to_string(n) + (n == 1 ? " case" : " cases"); }

}  // namespace

std::string Diagnosis::summary() const {
  if (kind == Kind::kOriginalModel || original.empty()) return table_summary();
  // Some specs' Reference is not the original, another spec fails besides: that first.
  return std::string(kNotTheOriginalModel) + ": " + join(original, "; ") +
         (consequences.empty() ? "" : "; its failing cases (" + join(consequences) + ") are its consequences") +
         "; besides, the other specs: " + table_summary();
}

std::string Diagnosis::table_summary() const {
  const size_t n = failing.size() + passing.size();
  switch (kind) {
    case Kind::kNoFailure: return "";
    case Kind::kEveryCase: {
      const bool reference = std::any_of(failing.begin(), failing.end(), [](const std::string& id) {
        return id.size() >= 10 && id.compare(id.size() - 10, 10, "/Reference") == 0;
      });
      if (n == 1) return "1 case ran and it fails (" + failing.front() + "): nothing to contrast it with";
      if (reference) {
        return "every case fails, the Reference included (" + cases_word(n) +
               "): not a parallel bug; look at the data, the model or the Reference";
      }
      return "every case fails alike (" + cases_word(n) + ", no Reference among them): no feature separates them; a "
             "passing case (the Reference, a world-size-1 case) would tell whether it is parallel at all";
    }
    case Kind::kOriginalModel: {
      std::string out = std::string(kNotTheOriginalModel) + ": " +
                        (original.empty() ? join(failing) + " fail MatchesOriginal" : join(original, "; "));
      const std::string fix = "compare the port's equations and its declared config with the original's, starting "
                              "at the layer the localization names";
      if (consequences.empty()) {
        std::vector<std::string> suites(original_suites.begin(), original_suites.end());
        return out + " (only " + (suites.empty() ? std::string("MatchesOriginal") : join(suites, " and ")) +
               " fail" + (suites.size() > 1 ? "" : "s") + "; " + std::to_string(passing.size()) +
               " case(s) pass: every configuration agrees with the port's Reference): not a parallel bug; " + fix;
      }
      return out + "; the " + cases_word(consequences.size()) + " failing besides (" + join(consequences) +
             ") are compared with that Reference or run its code: treat them as its consequences, not an axis's; "
             "fix the port first (" + fix + "), then rerun them";
    }
    case Kind::kEveryParallel: {
      std::string out;
      if (failing.size() == 1) {
        out = "1 of " + cases_word(n) + " fails (" + failing.front() +
              ") and only world-size-1 cases pass: too few cases to tell which of its features matters";
      } else {
        out = "every parallel case fails (" + std::to_string(failing.size()) + " of " + cases_word(n) +
              ") and only world-size-1 cases pass: not one axis but what every parallel layout here shares (a "
              "reduction over the whole mesh such as the grad norm, the loss normalization, the data split)";
      }
      if (!indistinguishable.empty()) {
        out += "; " + std::string(failing.size() == 1 ? "it has " : "all of them have ") + join(indistinguishable) +
               ": a passing parallel case without it would tell";
      }
      return out;
    }
    case Kind::kSeparated: {
      std::string out;
      if (failing.size() == 1) {
        out = "1 of " + cases_word(n) + " fails: " + failing.front() + ", the only one with " + explanation;
      } else {
        out = only_with(explanation) + " (" + std::to_string(failing.size()) + " of " + cases_word(n) +
              " fail, every one with it; no passing case has it)";
      }
      if (!controls.empty()) {
        out += std::string(failing.size() == 1 && controls.size() == 1 ? "; its " : "; ") + controls_phrase +
               (controls.size() > 1 ? " pass: " : " passes: ") + join(controls);
      }
      return out;
    }
    case Kind::kMostly:
      return "mostly with " + explanation + ": " + std::to_string(failing.size()) + " of " + cases_word(n) +
             " fail, with " + std::to_string(exceptions.size()) + " exception" + (exceptions.size() == 1 ? "" : "s") +
             " (" + join(exceptions) + ")";
    case Kind::kInconclusive:
      return "no feature of the configurations, nor a pair of them, separates the " +
             std::to_string(failing.size()) + " failing from the " + std::to_string(passing.size()) +
             " passing cases (failing: " + join(failing) + ")";
  }
  return "";
}

std::vector<std::string> Diagnosis::lines() const {
  if (kind == Kind::kNoFailure) return {};
  std::vector<std::string> out = {summary()};
  if ((kind == Kind::kSeparated || kind == Kind::kMostly) && !indistinguishable.empty()) {
    out.push_back("the run cannot tell " + explanation + " from " + join(indistinguishable, " or ") +
                  " (no case has one without the other)");
  }
  if (reference_compared_only) {
    std::string suites = join(reference_compared_suites(), ", ");
    out.push_back("only the suites that compare with the Reference fail (among " + suites +
                  "); every findings-based suite passes on the failing cases: the numbers differ while every "
                  "structural check holds (a reduction, a normalization, or the Reference itself)");
  }
  if (pair) {
    out.push_back("smallest pair to rerun" +
                  (pair->differences.empty() ? std::string() : " (they differ in: " + join(pair->differences) + ")") +
                  ":");
    out.push_back("  fails:  " + pair->failing_command);
    out.push_back("  passes: " + pair->passing_command +
                  (pair->passing_fault_not_reached ? "  (it never reached the fault's code: it ran the correct code)"
                                                   : ""));
    if (!pair->test_command.empty()) out.push_back("  both verdicts: " + pair->test_command);
  }
  if (!compared_nothing.empty() && kind != Kind::kOriginalModel) {
    out.push_back("passed without comparing anything (no " + join(comparison_suites(), ", ") +
                  " ran on them), so never a control: " + join(compared_nothing));
  }
  if (!no_verdict.empty()) out.push_back("left out, without a verdict: " + join(no_verdict));
  return out;
}

json Diagnosis::to_json() const {
  json j = {{"kind", diagnosis_kind_name(kind)},
            {"summary", summary()},
            {"lines", lines()},
            {"features", features},
            {"explanation", explanation},
            {"indistinguishable", indistinguishable},
            {"failing", failing},
            {"passing", passing},
            {"no_verdict", no_verdict},
            {"exceptions", exceptions},
            {"controls", controls},
            {"compared_nothing", compared_nothing},
            {"original", original},
            {"consequences", consequences},
            {"original_suites", original_suites},
            {"reference_compared_only", reference_compared_only},
            {"pair", nullptr}};
  if (pair) {
    j["pair"] = {{"failing", pair->failing},
                 {"passing", pair->passing},
                 {"failing_command", pair->failing_command},
                 {"passing_command", pair->passing_command},
                 {"differences", pair->differences},
                 {"passing_fault_not_reached", pair->passing_fault_not_reached},
                 {"test_command", pair->test_command}};
  }
  return j;
}

namespace {

// Where case `r` diverges from the original model: the localization of its failed
// HiddenStatesMatchOriginal (the first layer whose output diverges), else of another failed
// MatchesOriginal test, else the first line of a failed ModuleParity test; "" when none failed.
std::string original_divergence(const RunResults& run, const CaseResult& r) {
  std::string best;
  int rank = 4;  // lower is better
  for (const TestResult& t : run.tests) {
    if (t.spec != r.spec || t.case_name != r.name || t.status != TestStatus::kFailed) continue;
    if (!original_model_suites().count(t.suite)) continue;
    const size_t at = t.message.find("localized to '");
    std::string line;
    int here = 3;
    if (at != std::string::npos) {
      line = t.message.substr(at, t.message.find('\n', at) - at);
      here = t.test == "HiddenStatesMatchOriginal" ? 0 : t.suite == "MatchesOriginal" ? 1 : 2;
    } else {
      line = t.message.substr(0, t.message.find('\n'));
    }
    if (here < rank && !line.empty()) {
      rank = here;
      best = line + " (" + t.test + ")";
    }
  }
  return best.size() > 400 ? best.substr(0, 400) + " ..." : best;
}

// The spec's key/value heads as its case recorded them (spec.resolved.json); 0 when not declared.
int64_t key_value_heads(const RunResults& run, const CaseResult& r) {
  if (r.evidence.empty()) return 0;
  // A missing or unreadable file says nothing here: the checks that read it say why.
  std::string text, problem;
  json j;
  if (!read_file(run.root / r.evidence / layout::kSpecResolved, &text) || !parse_json_bounded(text, &j, &problem) ||
      !j.is_object()) {
    return 0;
  }
  const auto it = j.find("num_key_value_heads");
  return it != j.end() && it->is_number_integer() ? it->get<int64_t>() : 0;
}

// The first case along r's compare_to chain whose evidence cannot be trusted as a reference
// (infrastructure, the environment: interrupted, not run): r's comparisons with it judged
// nothing, whatever they say. A case that never reached its fault is not one: it ran the
// correct code to the end, the best reference a faulty case can be compared with.
const CaseResult* unjudged_along(const RunResults& run, const CaseResult& r) {
  std::set<std::string> seen;
  for (const CaseResult* c = run.find_case(r.spec, r.compare_to()); c && seen.insert(c->name).second;
       c = run.find_case(c->spec, c->compare_to())) {
    if (!c->outcome()) continue;
    const OutcomeClass k = classify(*c->outcome());
    if (k == OutcomeClass::kInfrastructure || k == OutcomeClass::kEnvironment) return c;
  }
  return nullptr;
}

}  // namespace

std::vector<DiagnosisCase> diagnosis_cases(const RunResults& run) {
  std::vector<DiagnosisCase> out;
  for (const CaseResult& r : run.cases) {
    DiagnosisCase c;
    c.spec = r.spec;
    c.name = r.name;
    c.kind = r.kind().empty() ? "train" : r.kind();
    c.fault = r.fault();
    if (r.record) {
      c.matrix = r.record->matrix.text();
      c.init_from = r.record->init_from;
      c.training_backend = r.record->training_backend;
    }
    bool any_failed = false, any_passed = false;
    for (const TestResult& t : run.tests) {
      if (t.spec != r.spec || t.case_name != r.name) continue;
      if (c.prefix.empty() && t.name.find('/') != std::string::npos) c.prefix = t.name.substr(0, t.name.find('/'));
      if (t.status == TestStatus::kFailed) {
        any_failed = true;
        c.failed_suites.insert(t.suite);
      } else if (t.status == TestStatus::kPassed) {
        any_passed = true;
        c.passed_suites.insert(t.suite);
      }
    }
    for (const auto& s : c.failed_suites) c.passed_suites.erase(s);
    c.original_divergence = original_divergence(run, r);
    c.num_key_value_heads = key_value_heads(run, r);
    // A case it is compared with (along compare_to) that did not complete: its failures judged nothing.
    const CaseResult* incomplete_reference = report_internal::incomplete_along(run, run.find_case(r.spec, r.compare_to()));
    if (!r.config) {
      c.no_verdict = "no run/case.json says its configuration";
    } else if (r.outcome() && classify(*r.outcome()) != OutcomeClass::kVerdict &&
               classify(*r.outcome()) != OutcomeClass::kConformanceFailure) {
      // No verdict on the model: infrastructure, the environment, or bad input.
      c.no_verdict = outcome_name(*r.outcome());
    } else if (incomplete_reference && any_failed) {
      c.no_verdict = "compared with " + incomplete_reference->name + ", which did not complete";
    } else if (const CaseResult* unjudged = unjudged_along(run, r); unjudged && any_failed) {
      c.no_verdict = "compared with " + unjudged->name + ", which has no verdict (" +
                     std::string(outcome_name(*unjudged->outcome())) + ")";
    } else if (any_failed) {
      c.verdict = DiagnosisCase::Verdict::kFailed;
    } else if (any_passed) {
      c.verdict = DiagnosisCase::Verdict::kPassed;
    } else {
      c.no_verdict = "no test ran";
    }
    if (r.config) c.config = *r.config;
    c.save_config = r.save_config;
    out.push_back(std::move(c));
  }
  return out;
}

}  // namespace mih
