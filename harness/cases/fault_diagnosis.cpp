// The diagnosis across a catalog fault's cases (fault_diagnosis_internal.h).
#include "harness/cases/fault_diagnosis_internal.h"

#include <algorithm>
#include <exception>
#include <map>

#include "harness/contract/case_record.h"
#include "harness/base/error.h"
#include "harness/contract/evidence_layout.h"
#include "harness/base/json_fields.h"
#include "harness/evidence/diagnosis.h"
#include "harness/evidence/report.h"
#include "harness/base/strings.h"

namespace mih::cases {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// The cases of spec `spec` under `root` (none when nothing ran there).
std::vector<DiagnosisCase> cases_under(const fs::path& root, const std::string& spec) {
  std::error_code ec;
  if (!fs::exists(root / layout::kResults, ec)) return {};
  std::vector<DiagnosisCase> out;
  for (auto& c : diagnosis_cases(read_run_results(root))) {
    if (c.spec == spec) out.push_back(std::move(c));
  }
  return out;
}

const DiagnosisCase* named(const std::vector<DiagnosisCase>& cases, const std::string& name) {
  const auto it = std::find_if(cases.begin(), cases.end(), [&](const DiagnosisCase& c) { return c.name == name; });
  return it == cases.end() ? nullptr : &*it;
}

DiagnosisCase did_not_run(const FaultEntry& f, const std::string& name) {
  DiagnosisCase c;
  c.spec = f.spec;
  c.name = name;
  c.no_verdict = "no test of it ran";
  return c;
}

}  // namespace

int run_contrasts(const FaultEntry& f, const FaultRuns& runs, const std::map<std::string, std::string>& compared_with,
                  const FaultTest& test) {
  const fs::path& dir = runs.contrast_root;
  fs::remove_all(dir);
  fs::create_directories(dir / f.spec);
  // What the contrasts are compared with stays fault-free: every case of the matrix is first
  // the fault-free twin's, and a contrast that another contrast is compared with (a resume's
  // uninterrupted twin) runs with the fault only in a later round, after that one.
  for (const auto& [c, target] : compared_with) {
    if (fs::exists(runs.clean_root / f.spec / c)) fs::create_directory_symlink(runs.clean_root / f.spec / c, dir / f.spec / c);
  }
  std::vector<std::string> left = runs.contrast_names;
  for (int round = 0; !left.empty(); ++round) {
    std::vector<std::string> now, later;
    for (const auto& n : left) {
      const bool target = std::any_of(left.begin(), left.end(), [&](const std::string& m) {
        const auto it = compared_with.find(m);
        return m != n && it != compared_with.end() && it->second == n;
      });
      (target ? later : now).push_back(n);
    }
    MIH_INTERNAL_ASSERT(!now.empty(), "fault ", f.id, ": its contrast cases are compared with one another in a cycle");
    std::string filter, cases;
    for (const auto& n : now) {
      filter += (filter.empty() ? "" : ":") + f.prefix + "/*.*/" + n;
      cases += (cases.empty() ? "" : ",") + n;
      fs::remove(dir / f.spec / n);  // the fault-free twin's symlink
    }
    const int rc = test(dir, filter, cases, dir / layout::contrast_test_log(round));
    bool not_reached = false;
    if (rc == exit_status(Code::kInvalidSpec)) {
      // A contrast that never reached the fault's code is what the fault spares, not bad input.
      for (const auto& n : now) {
        try {
          not_reached = not_reached ||
                        read_case_record(dir / f.spec / n / layout::kCaseRecord).outcome == Outcome::kFaultNotReached;
        } catch (const std::exception&) {
          // No record of it: the exit status says why.
        }
      }
    }
    if (rc != 0 && rc != 1 && !not_reached) return rc;
    left = later;
  }
  return 0;
}

json diagnose_fault(const FaultEntry& f, const FaultRuns& runs) {
  const std::vector<DiagnosisCase> clean = cases_under(runs.clean_root, f.spec);
  const std::vector<DiagnosisCase> faulty = cases_under(runs.detection_root, f.spec);
  const std::vector<DiagnosisCase> contrast = cases_under(runs.contrast_root, f.spec);
  std::vector<DiagnosisCase> table;
  const DiagnosisCase* c = named(faulty, runs.case_name);
  table.push_back(c ? *c : did_not_run(f, runs.case_name));
  for (const auto& name : runs.contrast_names) {
    const DiagnosisCase* k = named(contrast, name);
    if (!k) {
      table.push_back(did_not_run(f, name));
      continue;
    }
    DiagnosisCase row = *k;
    if (row.verdict == DiagnosisCase::Verdict::kNone && row.no_verdict == outcome_name(Outcome::kFaultNotReached)) {
      // Its ranks never ran the fault's code: the correct code ran, whose verdict is its twin's.
      row.fault_not_reached = true;
      if (const DiagnosisCase* twin = named(clean, name); twin && twin->verdict != DiagnosisCase::Verdict::kNone) {
        row.verdict = twin->verdict;
        row.failed_suites = twin->failed_suites;
        row.passed_suites = twin->passed_suites;
        row.no_verdict.clear();
      }
    }
    table.push_back(std::move(row));
  }
  if (std::find(runs.contrast_names.begin(), runs.contrast_names.end(), "Reference") == runs.contrast_names.end()) {
    // A config-invariant fault ran in the Reference too (faults.cpp): that one, not the clean one.
    const DiagnosisCase* faulty_reference = f.config_invariant ? named(faulty, "Reference") : nullptr;
    if (faulty_reference) {
      table.push_back(*faulty_reference);
    } else if (const DiagnosisCase* r = named(clean, "Reference")) {
      table.push_back(*r);
    }
  }
  const Diagnosis d = diagnose(table);
  // Named, and said as a finding: a separation, every case failing, or every parallel case
  // failing (two of them at least: one is "too few cases to tell").
  const bool kind_ok = d.kind == Diagnosis::Kind::kSeparated || d.kind == Diagnosis::Kind::kEveryCase ||
                       d.kind == Diagnosis::Kind::kOriginalModel ||
                       (d.kind == Diagnosis::Kind::kEveryParallel && d.failing.size() >= 2);
  // A config-invariant row is said as the port not computing the original model, first.
  const bool names_it =
      std::find(d.features.begin(), d.features.end(), f.expected_diagnosis) != d.features.end() &&
      (f.expected_diagnosis != "original_model" || d.summary().rfind(kNotTheOriginalModel, 0) == 0);
  return {{"contrast", runs.contrast_names},
          {"expected_diagnosis", f.expected_diagnosis},
          {"diagnosis", d.to_json()},
          {"diagnosed", kind_ok && names_it && !f.expected_diagnosis.empty()}};
}

std::string diagnosis_section(const json& report) {
  std::string md = "\n## Diagnosis across each fault's cases\n\n" + std::to_string(report.value("diagnosed", 0)) +
                   " of " + std::to_string(report.value("total", size_t{0})) +
                   " name the expected feature. Each fault also runs on its contrast cases; the diagnosis reads them, "
                   "the faulty case and the Reference.\n\n| ID | contrast cases | expected | diagnosis |\n"
                   "|----|---|---|---|\n";
  for (const auto& r : report.value("faults", json::array())) {
    std::string contrast = join(r.value("contrast", json::array()), ", ", [](const json& n) { return n.get<std::string>(); });
    std::string summary = r.contains("diagnosis") ? r["diagnosis"].value("summary", "") : "";
    for (char& c : summary) c = c == '|' ? '/' : c;
    md += "| " + r.value("id", "") + " | " + contrast + " | " + r.value("expected_diagnosis", "") +
          (r.value("diagnosed", false) ? "" : " (**not named**)") + " | " + summary + " |\n";
  }
  return md;
}

}  // namespace mih::cases
