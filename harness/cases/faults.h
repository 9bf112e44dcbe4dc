// The fault catalog and its detection matrix (docs/fault-catalog.md; `mih faults`). Each row is an
// integration bug that shipped in a public training stack, planted in the reference models,
// the data pipeline or the runtime behind a fault point (harness/base/fault.h) at the place
// where it happened. `mih faults` runs, per fault, the case where it manifests twice: with the
// fault (MIH_FAULT in that case's ranks only; the reference and every other case it is
// compared with stay fault-free) and without it, runs the conformance suites on both, and
// reports which suites failed, the finding codes, the first divergence, and whether the suite
// docs/fault-catalog.md names caught it with a message that names the cause.
//
// A fault counts as detected when one of its expected tests fails on the faulty run with a
// message that matches one of its cause patterns (the parameter, field, key or invariant at
// fault), and every test of the fault-free twin passes or is skipped. It counts as localized
// when the place the catching test blames (verdicts::blame) is the catalog's expected_blame.
#pragma once

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace mih::cases {

struct FaultEntry {
  std::string id;        ///< "F01"
  std::string kind;      ///< docs/fault-catalog.md's kind ("replicated-param grad")
  std::string fault;     ///< what is wrong, as docs/fault-catalog.md says it
  std::string where;     ///< the file of the fault point
  std::string prefix;    ///< the MIH_CONFORMANCE_SUITES registration that runs it ("Llama")
  std::string spec;      ///< its spec ("llama")
  nlohmann::json case_entry;  ///< the matrix entry of the case where it manifests
  /// The tests that must catch it: "Suite" (any of its tests) or "Suite.Test"; any of them.
  std::vector<std::string> expected;
  /// ECMAScript regexes; the catching test's message must match one (the cause named).
  std::vector<std::string> causes;
  /// A public report of the bug (for rows the catalog of docs/fault-catalog.md lacks).
  std::string report;
  /// The place the harness should blame first (verdicts::blame): the module FQN where the
  /// fault lives, or "loss", "data", "grad_norm", "grad_sync", "optimizer", "checkpoint".
  std::string expected_blame;
  /// The contrast cases that also run with the fault, so that the diagnosis across the fault's
  /// cases (evidence/diagnosis.h) has controls: matrix entries (a case without the feature the
  /// fault needs, another with it), and "Reference" for a fault of the model or the data, which
  /// the Reference runs too (otherwise the fault-free Reference joins the diagnosis).
  std::vector<nlohmann::json> contrast;
  /// The feature key the diagnosis across the case, its contrasts and the Reference must name
  /// ("ep>1", "sp", "cross_topology_resume"; "every_case" when every case fails alike).
  std::string expected_diagnosis;
  /// A bug of the port against the original model, the same in every configuration (F28-F32):
  /// it runs in every case of its matrix, the reference included, so every suite that compares
  /// the port with itself passes and only the expected suite (MatchesOriginal, on the
  /// reference) may fail; detected means caught by it and no other test failing.
  bool config_invariant = false;
};

/// Every fault, F01 first.
const std::vector<FaultEntry>& fault_catalog();

/// What `mih faults` runs (its flags, parsed by harness/cli).
struct FaultsOptions {
  /// Only these faults ("F03"); all when empty.
  std::vector<std::string> only;
  /// The detection matrix's JSON (a Markdown table next to it); default <out>/faults.json.
  std::string json_out;
  /// Evidence: fault-free/ (the twins), <ID>/ per fault, matrices/. Relative paths are
  /// relative to the working directory.
  std::filesystem::path out = "mih-faults";
  std::chrono::milliseconds case_timeout{std::chrono::minutes(5)};
  /// The precision lane the catalog runs in: "float64" (the oracle lane), "float32" or
  /// "bfloat16" (each case against the lane's reference at calibrated tolerances).
  std::string dtype = "float64";
  /// Print the catalog and return.
  bool list = false;
  bool progress = true;
};

/// Runs the detection matrix: each case through `<this binary> test` (a child process), so
/// every case is the same black box a user runs. Then, per fault, its contrast cases with the
/// fault (a second `test` in <out>/<ID>/contrast) and the diagnosis across them, the faulty
/// case and the Reference, which must name the row's expected_diagnosis.
/// Returns: 0 every fault detected, each blamed where the catalog expects (expected_blame) and
///   diagnosed as expected, and every fault-free twin clean; 1 otherwise (a fault detected but
///   blamed elsewhere is named on a NOT LOCALIZED line); 14-17 a case that could not run
///   (infrastructure). Throws: mih::Error{kInvalidSpec} for an unknown fault.
int run_faults(const FaultsOptions& options);

}  // namespace mih::cases
