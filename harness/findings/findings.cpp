// Finding and FindingReport (see findings.h).
#include "harness/findings/findings.h"

#include <regex>

#include "harness/base/error.h"
#include "harness/base/json_fields.h"

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

namespace {

// Field `name` of finding `j`, which must hold it (with the type the caller gets).
const nlohmann::json& finding_field(const nlohmann::json& j, const char* name) {
  MIH_CHECK_CODE(j.is_object() && j.contains(name), Code::kFailedPrecondition, "finding ",
                 j.is_object() && j.contains("code") ? j["code"].dump() : std::string("(no code)"), " has no '", name,
                 "': it is not a finding mih writes");
  return j[name];
}

Severity parse_severity(const std::string& name) {
  for (Severity s : {Severity::kInfo, Severity::kWarning, Severity::kError}) {
    if (severity_name(s) == name) return s;
  }
  MIH_THROW(Code::kFailedPrecondition, "unknown severity '", name.substr(0, 40), "'; valid: info, warning, error");
}

}  // namespace

void from_json(const nlohmann::json& j, Finding& f) {
  try {
    f.code = finding_field(j, "code").get<std::string>();
    f.phase = finding_field(j, "phase").get<std::string>();
    f.owner = finding_field(j, "owner").get<std::string>();
    f.severity = parse_severity(finding_field(j, "severity").get<std::string>());
    f.message = finding_field(j, "message").get<std::string>();
    f.facts = finding_field(j, "facts");
    f.remediation = finding_field(j, "remediation").get<std::string>();
    // The schema's one optional field: an info or a warning may say no why_unsafe (validate()
    // requires an error's).
    f.why_unsafe = j.contains("why_unsafe") ? j["why_unsafe"].get<std::string>() : std::string();
  } catch (const nlohmann::json::exception& e) {
    MIH_THROW(Code::kFailedPrecondition, "finding ", j.contains("code") ? j["code"].dump() : std::string("(no code)"),
              ": a field of another type (", json_error_text(e), "): it is not a finding mih writes");
  }
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
