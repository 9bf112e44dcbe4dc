// The fault catalog and its detection matrix (FAULTS.md; `mih faults`). Each row is an
// integration bug that shipped in a public training stack, planted in the reference models,
// the data pipeline or the runtime behind a fault point (harness/base/fault.h) at the place
// where it happened. `mih faults` runs, per fault, the case where it manifests twice: with the
// fault (MIH_FAULT in that case's ranks only; the reference and every other case it is
// compared with stay fault-free) and without it, runs the conformance suites on both, and
// reports which suites failed, the finding codes, the first divergence, and whether the suite
// FAULTS.md names caught it with a message that names the cause.
//
// A fault counts as detected when one of its expected tests fails on the faulty run with a
// message that matches one of its cause patterns (the parameter, field, key or invariant at
// fault), and every test of the fault-free twin passes or is skipped.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace mih::conformance {

struct FaultEntry {
  std::string id;        ///< "F01"
  std::string kind;      ///< FAULTS.md's kind ("replicated-param grad")
  std::string fault;     ///< what is wrong, as FAULTS.md says it
  std::string where;     ///< the file of the fault point
  std::string prefix;    ///< the MIH_CONFORMANCE_SUITES registration that runs it ("Llama")
  std::string spec;      ///< its spec ("llama")
  nlohmann::json case_entry;  ///< the matrix entry of the case where it manifests
  /// The tests that must catch it: "Suite" (any of its tests) or "Suite.Test"; any of them.
  std::vector<std::string> expected;
  /// ECMAScript regexes; the catching test's message must match one (the cause named).
  std::vector<std::string> causes;
  /// A public report of the bug (for rows the catalog of FAULTS.md lacks).
  std::string report;
};

/// Every fault, F01 first.
const std::vector<FaultEntry>& fault_catalog();

/// `mih faults [--fault ID ...] [--json FILE] [--out DIR] [--case-timeout S] [--list]`.
/// Exit status: 0 every fault detected and every fault-free twin clean; 1 otherwise; 2 usage
/// error; 11 an unknown fault; 14-17 a case that could not run (infrastructure).
int faults_main(const std::vector<std::string>& args);

}  // namespace mih::conformance
