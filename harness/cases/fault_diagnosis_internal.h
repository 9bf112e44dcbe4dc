// The diagnosis across a catalog fault's cases (internal to harness/cases; `mih faults`,
// faults.cpp): the faulty case, its contrast cases run with the same fault, and the Reference.
#pragma once

#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/cases/faults.h"

namespace mih::cases {

/// Where a fault's cases ran (the roots `mih faults` writes).
struct FaultRuns {
  std::filesystem::path detection_root;  ///< <out>/<ID>: the faulty case
  std::filesystem::path contrast_root;   ///< <out>/<ID>/contrast: the contrast cases, with the fault
  std::filesystem::path clean_root;      ///< <out>/fault-free: every case without it
  std::string case_name;                 ///< the faulty case
  std::vector<std::string> contrast_names;  ///< FaultEntry::contrast resolved ("Reference" included)
};

/// `mih test` under `root` of the tests `filter` selects, with the fault in the cases
/// `fault_cases` (comma-separated), its output to `log`; returns its exit status.
using FaultTest = std::function<int(const std::filesystem::path& root, const std::string& filter,
                                    const std::string& fault_cases, const std::filesystem::path& log)>;

/// Runs `runs.contrast_names` with the fault under `runs.contrast_root` (recreated) through
/// `test`, every other case of the matrix (`compared_with`: each case's name and the case it is
/// compared with) shared from `runs.clean_root` (symlinks): what a contrast is compared with
/// stays fault-free, a contrast that another one is compared with running in a later round.
/// Returns 0, or the exit status of an infrastructure failure; a contrast whose ranks never
/// reached the fault (exit 11, outcome fault_not_reached) is the diagnosis's to read.
int run_contrasts(const FaultEntry& f, const FaultRuns& runs, const std::map<std::string, std::string>& compared_with,
                  const FaultTest& test);

/// The diagnosis (evidence/diagnosis.h) across the faulty case, its contrasts and the
/// Reference (the faulty one when it is a contrast, else the fault-free one). A contrast whose
/// ranks never reached the fault ran the correct code: it gets its fault-free twin's verdict
/// and its rerun command leaves --fault out. A case that did not run has no verdict.
/// Returns {"contrast": names, "expected_diagnosis", "diagnosis": Diagnosis::to_json(),
/// "diagnosed": the diagnosis separates the cases (or finds every case failing, or every
/// parallel case when two or more do) and names the expected feature; a config-invariant row's
/// "original_model" only when the summary leads with kNotTheOriginalModel}.
nlohmann::json diagnose_fault(const FaultEntry& f, const FaultRuns& runs);

/// The diagnoses of a `mih faults` report (its "faults" rows and "diagnosed", "total") as a
/// Markdown section, for after the detection table.
std::string diagnosis_section(const nlohmann::json& report);

/// Writes the detection matrix of `mih faults` (its "faults" rows, counted) as JSON to
/// options.json_out (default <out>/faults.json) with its Markdown beside it, prints its table;
/// returns the run's exit status: `infrastructure` when set, else 1 when a fault was missed,
/// mislocalized or misdiagnosed or a twin failed, else 0 (faults_report.cpp).
int report_fault_matrix(const FaultsOptions& options, const std::filesystem::path& out, int infrastructure,
                        const nlohmann::json& rows, std::chrono::steady_clock::time_point start);

}  // namespace mih::cases
