// The outcome and test-status vocabulary (see case_outcome.h).
#include "harness/contract/case_outcome.h"
#include "harness/base/strings.h"

#include <array>
#include <utility>

namespace mih {
namespace {

constexpr std::array<std::pair<Outcome, std::string_view>, 8> kOutcomes = {{
    {Outcome::kRan, "ran"},
    {Outcome::kVerifyOnly, "verify_only"},
    {Outcome::kFailed, "failed"},
    {Outcome::kFaultNotReached, "fault_not_reached"},
    {Outcome::kTransportFailure, "transport_failure"},
    {Outcome::kEnvironmentFailure, "environment_failure"},
    {Outcome::kInterrupted, "interrupted"},
    {Outcome::kNotRun, "not_run"},
}};

constexpr std::array<std::pair<TestStatus, std::string_view>, 3> kStatuses = {{
    {TestStatus::kPassed, "passed"},
    {TestStatus::kFailed, "failed"},
    {TestStatus::kSkipped, "skipped"},
}};

}  // namespace

std::string_view outcome_name(Outcome o) {
  for (const auto& [value, name] : kOutcomes) {
    if (value == o) return name;
  }
  return "unknown";
}

std::optional<Outcome> find_outcome(std::string_view name) {
  for (const auto& [value, n] : kOutcomes) {
    if (n == name) return value;
  }
  return std::nullopt;
}

Outcome parse_outcome(std::string_view name, std::string_view where) {
  if (const auto o = find_outcome(name)) return *o;
  const std::string valid = join(kOutcomes, ", ", [](const auto& row) { return std::string(row.second); });
  MIH_THROW(Code::kFailedPrecondition, where, ": outcome '", std::string(name.substr(0, 80)),
            "' is none mih writes (", valid, "): the record is not mih's or was edited; rerun the case");
}

OutcomeClass classify(Outcome o) {
  switch (o) {
    case Outcome::kRan:
    case Outcome::kVerifyOnly:
      return OutcomeClass::kVerdict;
    case Outcome::kFailed:
      return OutcomeClass::kConformanceFailure;
    case Outcome::kTransportFailure:
      return OutcomeClass::kInfrastructure;
    case Outcome::kFaultNotReached:
      return OutcomeClass::kBadInput;
    case Outcome::kEnvironmentFailure:
    case Outcome::kInterrupted:
    case Outcome::kNotRun:
      return OutcomeClass::kEnvironment;
  }
  return OutcomeClass::kInfrastructure;
}

std::string_view outcome_class_name(OutcomeClass c) {
  switch (c) {
    case OutcomeClass::kVerdict: return "verdict";
    case OutcomeClass::kConformanceFailure: return "conformance failure";
    case OutcomeClass::kInfrastructure: return "infrastructure";
    case OutcomeClass::kBadInput: return "bad input";
    case OutcomeClass::kEnvironment: return "environment";
  }
  return "infrastructure";
}

Code outcome_code(Outcome o, Code code) {
  switch (classify(o)) {
    case OutcomeClass::kVerdict:
    case OutcomeClass::kConformanceFailure:
      return Code::kOk;
    case OutcomeClass::kInfrastructure:
      return code == Code::kOk ? Code::kAborted : code;
    case OutcomeClass::kBadInput:
      return Code::kInvalidSpec;
    case OutcomeClass::kEnvironment:
      return code == Code::kOk ? Code::kFailedPrecondition : code;
  }
  return Code::kAborted;
}

std::string_view test_status_name(TestStatus s) {
  for (const auto& [value, name] : kStatuses) {
    if (value == s) return name;
  }
  return "unknown";
}

std::optional<TestStatus> find_test_status(std::string_view name) {
  for (const auto& [value, n] : kStatuses) {
    if (n == name) return value;
  }
  return std::nullopt;
}

}  // namespace mih
