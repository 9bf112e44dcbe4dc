// Findings: what a check reports. Each has a code MIH-<AREA>-NNN (AREA in capitals, e.g.
// STRUCT, OPTIM, DATA, INPUT, CKPT, SHARED, MODAL, INVAR, PROBE), the phase, the owner FQN
// (parameter, module, field or key), a severity, a message, facts as JSON, and for errors why
// the state is unsafe and how to fix it (the seed tool's Finding; DESIGN.md section 6).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace mih {

enum class Severity { kInfo, kWarning, kError };

std::string severity_name(Severity s);

struct Finding {
  std::string code;   // "MIH-STRUCT-001"
  std::string phase;  // structure, materialization, checkpoint, runtime
  std::string owner;  // FQN of the parameter/module, or a field or key
  Severity severity = Severity::kError;
  std::string message;
  nlohmann::json facts = nlohmann::json::object();
  std::string why_unsafe;   // required for errors
  std::string remediation;  // required for errors

  /// Throws: mih::Error{kInternal} naming the code if it is not MIH-<AREA>-NNN, the phase is
  ///   unknown, or an error lacks why_unsafe or remediation (a check's bug, not bad input).
  void validate() const;
};

void to_json(nlohmann::json& j, const Finding& f);
/// Every field of to_json is required but why_unsafe (the schema's one optional field: "" when
/// absent); the severity must be one of severity_name's.
/// Throws: mih::Error{kFailedPrecondition} naming the finding and the field for a missing or
///   mistyped field or an unknown severity (read as info before); as Finding::validate.
void from_json(const nlohmann::json& j, Finding& f);

/// The record that a check ran: its name (codes::check_of), how many times, and what it
/// examined in all (a count and its unit: "parameters", "declared tied pairs"). A
/// findings-based verdict with no record of the check that emits its codes, or a record of
/// nothing examined, is a failure: no finding from a check that never looked is not a pass.
struct CheckRun {
  std::string check;
  int64_t runs = 0;
  int64_t examined = 0;
  std::string unit;
};

/// The findings of one check (or a whole session): status FAIL if any error, else PASS.
class FindingReport {
 public:
  /// Validates and adds `f`. Throws: as Finding::validate.
  void add(Finding f);
  /// Records one run of `check` that examined `examined` `unit`s (summed over runs).
  void ran(const std::string& check, int64_t examined, const std::string& unit);
  /// Adds the findings and the run records of `other`.
  void absorb(const FindingReport& other);
  const std::vector<Finding>& findings() const { return findings_; }
  const std::vector<CheckRun>& runs() const { return runs_; }
  bool failed() const;
  /// {"status": "PASS"|"FAIL", "errors": n, "warnings": n, "findings": [...],
  ///  "checks": {check: {"runs": n, "examined": n, "unit": "..."}}}.
  nlohmann::json to_json() const;
  /// One line per error: "MIH-STRUCT-001 layers.0.q_proj.weight: message (fix: remediation)".
  std::string summary() const;

 private:
  std::vector<Finding> findings_;
  std::vector<CheckRun> runs_;
};

}  // namespace mih
