// Findings: what a check reports. Each has a code MIH-<AREA>-NNN (AREA in capitals, e.g.
// STRUCT, OPTIM, DATA, INPUT, CKPT, SHARED, MODAL, INVAR, PROBE), the phase, the owner FQN
// (parameter, module, field or key), a severity, a message, facts as JSON, and for errors why
// the state is unsafe and how to fix it (the seed tool's Finding; DESIGN.md section 6).
#pragma once

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
/// Throws: nlohmann::json::exception for a missing field; as Finding::validate.
void from_json(const nlohmann::json& j, Finding& f);

/// The findings of one check (or a whole session): status FAIL if any error, else PASS.
class FindingReport {
 public:
  /// Validates and adds `f`. Throws: as Finding::validate.
  void add(Finding f);
  const std::vector<Finding>& findings() const { return findings_; }
  bool failed() const;
  /// {"status": "PASS"|"FAIL", "errors": n, "warnings": n, "findings": [...]}.
  nlohmann::json to_json() const;
  /// One line per error: "MIH-STRUCT-001 layers.0.q_proj.weight: message (fix: remediation)".
  std::string summary() const;

 private:
  std::vector<Finding> findings_;
};

}  // namespace mih
