// Finding and FindingReport (see findings.h).
#include "harness/findings/findings.h"

#include <regex>

#include "harness/base/error.h"

namespace mih {

std::string severity_name(Severity s) {
  switch (s) {
    case Severity::kInfo: return "info";
    case Severity::kWarning: return "warning";
    case Severity::kError: return "error";
  }
  return "?";
}

void Finding::validate() const {
  static const std::regex kCode("MIH-[A-Z]+-[0-9]{3}");
  MIH_INTERNAL_ASSERT(std::regex_match(code, kCode), "finding code '", code, "' is not of the form MIH-<AREA>-NNN");
  MIH_INTERNAL_ASSERT(phase == "structure" || phase == "materialization" || phase == "checkpoint" || phase == "runtime",
                      "finding ", code, ": unknown phase '", phase, "'");
  MIH_INTERNAL_ASSERT(severity != Severity::kError || (!why_unsafe.empty() && !remediation.empty()), "finding ", code,
                      " is an error without why_unsafe and remediation");
}

void to_json(nlohmann::json& j, const Finding& f) {
  j = {{"code", f.code},       {"phase", f.phase},     {"owner", f.owner},           {"severity", severity_name(f.severity)},
       {"message", f.message}, {"facts", f.facts},     {"why_unsafe", f.why_unsafe}, {"remediation", f.remediation}};
}

void from_json(const nlohmann::json& j, Finding& f) {
  const std::string severity = j.at("severity").get<std::string>();
  f.code = j.at("code").get<std::string>();
  f.phase = j.at("phase").get<std::string>();
  f.owner = j.at("owner").get<std::string>();
  f.severity = severity == "error" ? Severity::kError : severity == "warning" ? Severity::kWarning : Severity::kInfo;
  f.message = j.at("message").get<std::string>();
  f.facts = j.value("facts", nlohmann::json::object());
  f.why_unsafe = j.value("why_unsafe", "");
  f.remediation = j.value("remediation", "");
  f.validate();
}

void FindingReport::add(Finding f) {
  f.validate();
  findings_.push_back(std::move(f));
}

void FindingReport::ran(const std::string& check, int64_t examined, const std::string& unit) {
  for (auto& r : runs_) {
    if (r.check != check) continue;
    ++r.runs;
    r.examined += examined;
    return;
  }
  runs_.push_back({check, 1, examined, unit});
}

void FindingReport::absorb(const FindingReport& other) {
  for (const auto& f : other.findings_) findings_.push_back(f);
  for (const auto& r : other.runs_) {
    bool merged = false;
    for (auto& mine : runs_) {
      if (mine.check != r.check) continue;
      mine.runs += r.runs;
      mine.examined += r.examined;
      merged = true;
    }
    if (!merged) runs_.push_back(r);
  }
}

bool FindingReport::failed() const {
  for (const auto& f : findings_) {
    if (f.severity == Severity::kError) return true;
  }
  return false;
}

nlohmann::json FindingReport::to_json() const {
  int errors = 0, warnings = 0;
  for (const auto& f : findings_) {
    errors += f.severity == Severity::kError;
    warnings += f.severity == Severity::kWarning;
  }
  nlohmann::json checks = nlohmann::json::object();
  for (const auto& r : runs_) checks[r.check] = {{"runs", r.runs}, {"examined", r.examined}, {"unit", r.unit}};
  return {{"status", failed() ? "FAIL" : "PASS"},
          {"errors", errors},
          {"warnings", warnings},
          {"findings", findings_},
          {"checks", checks}};
}

std::string FindingReport::summary() const {
  std::string out;
  for (const auto& f : findings_) {
    if (f.severity != Severity::kError) continue;
    out += f.code + " " + f.owner + ": " + f.message + " (fix: " + f.remediation + ")\n";
  }
  return out;
}

}  // namespace mih
