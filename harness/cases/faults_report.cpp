// `mih faults`' report (internal to harness/cases; faults.cpp runs the matrix): the detection
// matrix as JSON, as Markdown and as a table on stdout, and the run's exit status.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/contract/evidence_layout.h"
#include "harness/base/files.h"
#include "harness/base/strings.h"
#include "harness/cases/fault_diagnosis_internal.h"

namespace mih::cases {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// The detection matrix as a Markdown table (next to the JSON, for a CI job's summary).
std::string markdown_table(const json& report) {
  auto cell = [](std::string text) {
    std::string out;
    for (char c : text) out += c == '|' ? std::string("\\|") : c == '\n' ? std::string(" ") : std::string(1, c);
    return out.size() > 240 ? out.substr(0, 237) + "..." : out;
  };
  std::string md = "# Fault catalog: " + std::to_string(report["detected"].get<int>()) + " of " +
                   std::to_string(report["total"].get<size_t>()) + " faults detected, " +
                   std::to_string(report["localized"].get<int>()) + " localized to the expected place, " +
                   std::to_string(report["fault_free_failures"].get<int>()) + " fault-free twin(s) failed\n\n";
  md += "| ID | kind | case | detected | caught by | blamed (expected) | suites failed | twin | message |\n";
  md += "|----|------|------|----------|-----------|-------------------|---------------|------|---------|\n";
  for (const auto& r : report["faults"]) {
    std::string suites = join(r["suites_failed"], ", ", [](const json& x) { return x.get<std::string>(); });
    std::string message = r["message"].get<std::string>();
    if (message.rfind("Failed\n", 0) == 0) message = message.substr(7);
    md += "| " + r["id"].get<std::string>() + " | " + cell(r["kind"].get<std::string>()) + " | " +
          r["spec"].get<std::string>() + " " + r["case"].get<std::string>() + " | " +
          (r["detected"].get<bool>() ? "yes" : "**no**") + " | " + r["caught_by"].get<std::string>() + " | " +
          r["blamed"].get<std::string>() +
          (r["localized"].get<bool>() ? "" : " (**" + r["expected_blame"].get<std::string>() + "**)") + " | " + suites +
          " | " + (r["twin_passed"].get<bool>() ? "passed" : "**failed**") + " | " + cell(message) + " |\n";
  }
  return md;
}

// A fault caught but blamed elsewhere than where it lives sends its author to the wrong place:
// a failure of the catalog like a miss, named row by row.
std::vector<std::string> not_localized_rows(const json& rows) {
  std::vector<std::string> not_localized;
  for (const auto& r : rows) {
    if (!r["detected"].get<bool>() || r["localized"].get<bool>()) continue;
    const std::string blamed = r["blamed"].get<std::string>();
    not_localized.push_back(r["id"].get<std::string>() + " (" + r["kind"].get<std::string>() + ", " +
                            r["spec"].get<std::string>() + "/" + r["case"].get<std::string>() + "): detected by " +
                            r["caught_by"].get<std::string>() + ", but blamed " +
                            (blamed.empty() ? std::string("nothing") : "'" + blamed + "'") + " (" +
                            r["blame_reason"].get<std::string>() + "), where the catalog expects '" +
                            r["expected_blame"].get<std::string>() + "'");
  }
  return not_localized;
}

void print_matrix(const json& rows) {
  std::printf("%-4s %-36s %-28s %-10s %-44s %-7s %s\n", "ID", "kind", "case", "detected", "caught by", "twin",
              "blamed (expected)");
  for (const auto& r : rows) {
    const std::string blamed = r["blamed"].get<std::string>(), expected = r["expected_blame"].get<std::string>();
    std::printf("%-4s %-36s %-28s %-10s %-44s %-7s %s\n", r["id"].get<std::string>().c_str(),
                r["kind"].get<std::string>().c_str(),
                (r["spec"].get<std::string>() + "/" + r["case"].get<std::string>()).c_str(),
                r["detected"].get<bool>() ? "yes" : "NO", r["caught_by"].get<std::string>().c_str(),
                r["twin_passed"].get<bool>() ? "passed" : "FAILED",
                (r["localized"].get<bool>() ? blamed : blamed + " (expected " + expected + ")").c_str());
  }
}

}  // namespace

int report_fault_matrix(const FaultsOptions& options, const fs::path& out, int infrastructure, const json& rows,
                        std::chrono::steady_clock::time_point start) {
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  int detected = 0, twin_failures = 0, localized = 0, diagnosed = 0;
  for (const auto& r : rows) {
    detected += r["detected"].get<bool>();
    twin_failures += !r["twin_passed"].get<bool>();
    localized += r["localized"].get<bool>();
    diagnosed += r["diagnosed"].get<bool>();
  }
  const std::vector<std::string> not_localized = not_localized_rows(rows);
  const json report = {{"faults", rows},
                       {"dtype", options.dtype},
                       {"total", rows.size()},
                       {"detected", detected},
                       {"localized", localized},
                       {"not_localized", not_localized},
                       {"fault_free_failures", twin_failures},
                       {"diagnosed", diagnosed},
                       {"seconds", elapsed()},
                       {"evidence", out.string()}};
  const std::string& json_out = options.json_out;
  const fs::path json_path = json_out.empty() ? out / layout::kFaultsReport : fs::path(json_out);
  write_file_atomic(json_path, report.dump(2) + "\n");
  write_file_atomic(fs::path(json_path).replace_extension(layout::kMarkdownExtension), markdown_table(report) + diagnosis_section(report));
  print_matrix(rows);
  std::printf("%s lane: %d of %zu faults detected, %d localized to the expected place; %d fault-free twin(s) failed; "
              "%.1f s; matrix: %s\n",
              options.dtype.c_str(), detected, rows.size(), localized, twin_failures, elapsed(), json_path.c_str());
  for (const auto& line : not_localized) std::printf("NOT LOCALIZED %s\n", line.c_str());
  std::printf("%d of %zu diagnoses across each fault's cases name the expected feature\n", diagnosed, rows.size());
  if (!infrastructure && diagnosed != static_cast<int>(rows.size())) return 1;
  if (infrastructure) return infrastructure;
  return detected == static_cast<int>(rows.size()) && twin_failures == 0 && not_localized.empty() ? 0 : 1;
}


}  // namespace mih::cases
