// check/findings.json read typed (schemas/evidence/v1/check.findings.schema.json): the findings
// of a case and the record of the checks that ran, validated against the contract's schema once
// where the file is read. Every field of a finding and of a check's record is required.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace mih::contract {

struct Finding {
  std::string code;      ///< MIH-<AREA>-NNN
  std::string phase;     ///< structure, materialization, checkpoint, runtime
  std::string owner;     ///< the parameter, module, field, ... it is about
  std::string severity;  ///< info, warning, error
  std::string message;
  std::string remediation;
  nlohmann::json facts;  ///< the check's facts, free form (an object)
  bool error() const { return severity == "error"; }
};

/// checks.<name>: that a check ran, how often and what it examined.
struct CheckRun {
  int64_t runs = 0;
  int64_t examined = 0;
  std::string unit;  ///< what examined counts ("parameters", "tokens")
};

struct FindingsFile {
  std::vector<Finding> findings;
  std::map<std::string, CheckRun> checks;
};

/// findings.json (`findings`, the parsed file; `relative` the contract's path of it,
/// layout::kFindings or its before_save/ copy; `file` names it in a refusal).
/// Throws: mih::Error{kFailedPrecondition} naming the file and the field for a value the
///   schema refuses (a missing or mistyped field).
FindingsFile findings_file(const nlohmann::json& findings, const std::string& relative, const std::string& file);

}  // namespace mih::contract
