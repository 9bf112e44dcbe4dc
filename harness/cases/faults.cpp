// `mih faults`: the detection matrix of the fault catalog (see faults.h).
#include "harness/cases/faults.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <sstream>

#include "harness/base/case_record.h"
#include "harness/base/error.h"
#include "harness/base/evidence_layout.h"
#include "harness/base/fault.h"
#include "harness/base/files.h"
#include "harness/base/json_fields.h"
#include "harness/cases/fault_diagnosis_internal.h"
#include "harness/compare/compare.h"
#include "harness/compare/verdicts.h"
#include "harness/evidence/report.h"
#include "harness/spec/case_matrix.h"
#include "harness/spec/model_spec.h"
#include "harness/base/strings.h"

extern char** environ;

namespace mih::cases {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kExpectedBlameVar = "MIH_TEST_EXPECTED_BLAME";

// Runs this binary with `args`, its output to `log`; returns its exit status (128 + signal
// when killed).
int run_self(const std::vector<std::string>& args, const fs::path& log) {
  std::vector<std::string> argv = {"/proc/self/exe"};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<char*> c_argv;
  for (auto& a : argv) c_argv.push_back(a.data());
  c_argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  pid_t pid = 0;
  const int rc = ::posix_spawn(&pid, "/proc/self/exe", &actions, nullptr, c_argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  MIH_CHECK_CODE(rc == 0, Code::kUnavailable, "mih faults: cannot start ", argv[0], ": ", std::strerror(rc));
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    MIH_CHECK_CODE(errno == EINTR, Code::kInternal, "mih faults: waitpid: ", std::strerror(errno));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// The tests of a `mih test` run (none when it ended before writing any).
std::vector<TestResult> run_tests_of(const fs::path& root) {
  return fs::exists(root / layout::kResults) ? read_run_results(root).tests : std::vector<TestResult>();
}

// The JSON of a matrix of `cases` (cpu-smoke's settings: CPU, 3 steps) in lane `dtype`.
json matrix_json(const std::string& name, const std::vector<json>& cases, const std::string& dtype) {
  return {{"name", name}, {"dtype", dtype},        {"device", "cpu"}, {"pg_backend", "gloo"},
          {"steps", 3},   {"max_world_size", 4}, {"cases", cases}};
}

// The case a fault's matrix entry resolves to: not one the matrix adds (the references, the
// noise twin).
bool added_case(const std::string& name) {
  return name == "Reference" || name == spec::kLaneReference || name == spec::kNoiseTwin;
}

bool expected_test(const FaultEntry& f, const TestResult& result) {
  for (const auto& e : f.expected) {
    if (e == result.suite || e == result.suite + "." + result.test) return true;
  }
  return false;
}

bool names_cause(const FaultEntry& f, const std::string& message) {
  for (const auto& c : f.causes) {
    if (std::regex_search(message, std::regex(c))) return true;
  }
  return false;
}

std::string first_lines(const std::string& text, int n) {
  std::string out;
  std::istringstream in(text);
  int i = 0;
  for (std::string line; i < n && std::getline(in, line); ++i) out += (out.empty() ? "" : "\n") + line;
  return out;
}

// `mih test` over the cases of a spec's fault matrix that `filter` selects (all when empty),
// with `fault` in `fault_case`'s ranks when given; its output to `log`. Returns its exit status.
int mih_test(const fs::path& root, const std::string& prefix, const fs::path& matrix, double case_timeout_s,
             const std::string& filter, const std::string& fault, const std::string& fault_case, const fs::path& log) {
  std::vector<std::string> args = {"test",   "--evidence-root", root.string(),   "--prefixes",
                                   prefix,   "--matrix",        matrix.string(), "--case-timeout",
                                   std::to_string(case_timeout_s), "--no-progress"};
  if (!fault.empty()) args.insert(args.end(), {"--fault", fault, "--fault-cases", fault_case});
  if (!filter.empty()) args.push_back("--gtest_filter=" + filter);
  return run_self(args, log);
}

void say(bool progress, const std::string& line) {
  if (progress) std::fprintf(stderr, "[mih faults] %s\n", line.c_str());
}

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

// The names of `f`'s contrast cases in lane `dtype` ("Reference" as it is).
std::vector<std::string> contrast_names(const FaultEntry& f, const spec::ModelSpec& s, const std::string& dtype) {
  std::vector<std::string> names;
  for (const auto& k : f.contrast) {
    if (k.is_string() && k.get<std::string>() == "Reference") {
      names.push_back("Reference");
      continue;
    }
    const spec::CaseMatrix one = spec::resolve_matrix(s, matrix_json("one", {k}, dtype));
    const auto it = std::find_if(one.cases.begin(), one.cases.end(), [](const spec::Case& c) { return !added_case(c.name); });
    MIH_CHECK(it != one.cases.end(), "fault ", f.id, ": its contrast case ", k.dump(), " does not fit spec ", f.spec,
              (one.rejected.empty() ? std::string() : ": " + one.rejected.front().reason));
    names.push_back(it->name);
  }
  return names;
}

// A test hook: MIH_TEST_EXPECTED_BLAME="F08=lm_head[,F01=...]" replaces the catalog's
// expected_blame of those rows, so that a test can make a detected fault deliberately
// mislocalized and check the NOT LOCALIZED gate without relying on a reduced lane's rounding
// (which differs between CPUs). Empty when unset. Throws: mih::Error{kInvalidSpec} for a
// malformed value or an ID of no catalog row.
std::map<std::string, std::string> expected_blame_overrides() {
  std::map<std::string, std::string> out;
  const char* value = std::getenv(kExpectedBlameVar);
  if (!value || !*value) return out;
  std::istringstream in(value);
  for (std::string item; std::getline(in, item, ',');) {
    const auto eq = item.find('=');
    const std::string id = eq == std::string::npos ? item : item.substr(0, eq);
    const bool known = std::any_of(fault_catalog().begin(), fault_catalog().end(),
                                   [&](const FaultEntry& f) { return f.id == id; });
    MIH_CHECK(eq != std::string::npos && eq + 1 < item.size() && known, kExpectedBlameVar, "='", value,
              "': expected comma-separated ID=place pairs of catalog rows (a test hook, e.g. F08=lm_head), got '", item,
              "'; unset it to use the catalog's places");
    out[id] = item.substr(eq + 1);
  }
  return out;
}

}  // namespace

int run_faults(const FaultsOptions& options) {
  const bool progress = options.progress;
  const double case_timeout_s = static_cast<double>(options.case_timeout.count()) / 1000.0;
  const std::vector<std::string>& only = options.only;
  const bool list = options.list;
  const std::string& json_out = options.json_out;
  fs::path out = options.out;

  std::vector<const FaultEntry*> faults;
  std::set<std::string> wanted;
  for (const auto& id : only) {
    const fault::Fault f = fault::parse(id);
    // An empty name (`--fault ''`, a CI variable left unset) would select nothing and pass.
    MIH_CHECK(f != fault::Fault::kNone, "--fault '", id, "' names no fault: give catalog IDs such as F03 or F23,F24 ",
              "(`mih faults --list`), or leave --fault out to run them all");
    wanted.insert(fault::name(f));
  }
  for (const auto& f : fault_catalog()) {
    if (wanted.empty() || wanted.count(f.id)) faults.push_back(&f);
  }
  const std::map<std::string, std::string> blame_override = expected_blame_overrides();
  auto expected_blame = [&](const FaultEntry& f) {
    const auto it = blame_override.find(f.id);
    return it == blame_override.end() ? f.expected_blame : it->second;
  };
  for (const auto& [id, place] : blame_override) {
    // Said even with --no-progress: it changes the verdict.
    std::fprintf(stderr, "mih faults: %s is set: %s is expected to be blamed on '%s', not the catalog's place (a test "
                 "hook)\n", kExpectedBlameVar, id.c_str(), place.c_str());
  }
  if (list) {
    for (const auto* f : faults) {
      std::string expected = join(f->expected, ", ");
      std::printf("%s  %-34s %s/%s  (%s)\n      %s\n      expected: %s\n", f->id.c_str(), f->kind.c_str(),
                  f->spec.c_str(), f->case_entry.dump().c_str(), f->where.c_str(), f->fault.c_str(), expected.c_str());
      std::printf("      diagnosis: %s (contrasts %s)\n", f->expected_diagnosis.c_str(), json(f->contrast).dump().c_str());
    }
    return 0;
  }
  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  out = fs::absolute(out);
  fs::create_directories(out / layout::kMatricesDir);
  MIH_CHECK_CODE(fs::is_directory(out), Code::kFailedPrecondition, "mih faults: cannot create ", out.string());

  // One matrix per spec, of the cases its faults manifest under; the case name of each fault.
  std::map<std::string, std::vector<json>> entries;  // spec -> unique case entries
  std::map<std::string, std::string> prefix_of;       // spec -> registration prefix
  for (const auto* f : faults) {
    auto& list_of = entries[f->spec];
    if (std::find(list_of.begin(), list_of.end(), f->case_entry) == list_of.end()) list_of.push_back(f->case_entry);
    for (const auto& k : f->contrast) {  // the diagnosis's contrasts ("Reference" is always there)
      if (k.is_object() && std::find(list_of.begin(), list_of.end(), k) == list_of.end()) list_of.push_back(k);
    }
    prefix_of[f->spec] = f->prefix;
  }
  std::map<std::string, fs::path> matrix_file;
  std::map<std::string, spec::CaseMatrix> matrices;
  for (const auto& [spec_name, cases] : entries) {
    const json m = matrix_json("faults-" + spec_name, cases, options.dtype);
    matrix_file[spec_name] = out / layout::fault_matrix(spec_name);
    // Rewritten only when it changes: its content is part of every case's fingerprint.
    std::string old;
    if (!read_file(matrix_file[spec_name], &old) || old != m.dump(2)) write_file_atomic(matrix_file[spec_name], m.dump(2));
    matrices.emplace(spec_name, spec::resolve_matrix(spec::SpecRegistry::instance().get(spec_name), m));
  }
  std::map<const FaultEntry*, std::string> case_of;
  std::map<const FaultEntry*, std::vector<std::string>> contrast_of;
  for (const auto* f : faults) {
    const spec::ModelSpec& s = spec::SpecRegistry::instance().get(f->spec);
    const spec::CaseMatrix one = spec::resolve_matrix(s, matrix_json("one", {f->case_entry}, options.dtype));
    const auto it = std::find_if(one.cases.begin(), one.cases.end(), [](const spec::Case& c) { return !added_case(c.name); });
    MIH_CHECK(it != one.cases.end(), "fault ", f->id, ": its case ", f->case_entry.dump(), " does not fit spec ", f->spec,
              (one.rejected.empty() ? std::string() : ": " + one.rejected.front().reason));
    case_of[f] = it->name;
    contrast_of[f] = contrast_names(*f, s, options.dtype);
  }

  // The fault-free twins: every case of each spec's matrix, with the reference, once.
  const fs::path clean = out / layout::kFaultFreeDir;
  fs::create_directories(clean);
  fs::remove(clean / layout::kResults);
  int infrastructure = 0;
  for (const auto& [spec_name, file] : matrix_file) {
    say(progress, "fault-free twins of " + spec_name + " (" + std::to_string(matrices.at(spec_name).cases.size()) +
                      " cases) ...");
    const int rc = mih_test(clean, prefix_of[spec_name], file, case_timeout_s, "", "", "",
                            clean / layout::twins_test_log(spec_name));
    if (rc != 0 && rc != 1) {
      infrastructure = infrastructure ? infrastructure : rc;
      say(progress, "  exit " + std::to_string(rc) + ": see " + (clean / layout::twins_test_log(spec_name)).string());
    }
  }
  const std::vector<TestResult> clean_results = run_tests_of(clean);

  json rows = json::array();
  int detected = 0, twin_failures = 0, localized = 0, diagnosed = 0;
  for (const auto* f : faults) {
    const auto t0 = std::chrono::steady_clock::now();
    const std::string case_name = case_of[f];
    const fs::path root = out / f->id;
    fs::remove_all(root);
    fs::create_directories(root / f->spec);
    // The cases that run with the fault: its case, or for a config-invariant fault every case
    // of the row (the reference included; the rest of the spec's matrix stays fault-free).
    std::set<std::string> faulty = {case_name};
    if (f->config_invariant) {
      for (const auto& c : matrices.at(f->spec).cases) {
        if (c.name == case_name || added_case(c.name)) faulty.insert(c.name);
      }
    }
    std::string faulty_list, filter;
    for (const auto& c : faulty) {
      faulty_list += (faulty_list.empty() ? "" : ",") + c;
      filter += (filter.empty() ? "" : ":") + f->prefix + "/*.*/" + c;
    }
    // The fault-free cases this one is compared with, shared with the twins' run.
    for (const auto& c : matrices.at(f->spec).cases) {
      if (!faulty.count(c.name) && fs::exists(clean / f->spec / c.name)) {
        fs::create_directory_symlink(clean / f->spec / c.name, root / f->spec / c.name);
      }
    }
    say(progress, f->id + " " + f->kind + ": " + f->spec + "/" + faulty_list + " with MIH_FAULT=" + f->id + " ...");
    const int rc = mih_test(root, f->prefix, matrix_file[f->spec], case_timeout_s, filter, f->id, faulty_list,
                            root / layout::kTestLog);
    json row = {{"id", f->id},
                {"kind", f->kind},
                {"fault", f->fault},
                {"where", f->where},
                {"spec", f->spec},
                {"case", case_name},
                {"config", matrices.at(f->spec).at(case_name).config.name()},
                {"expected", f->expected},
                {"exit_status", rc},
                {"evidence", (root / f->spec / case_name).string()}};
    if (!f->report.empty()) row["report"] = f->report;
    std::set<std::string> suites_failed;
    json failed_tests = json::array();
    std::string caught_by, message;
    // What the harness blames: the catching test, else the first failed one; and the case it
    // failed on (a config-invariant fault is caught on the reference).
    std::string blame_test, blame_message, blame_case = case_name;
    json others_failed = json::array();  // config-invariant: tests of other suites that failed
    for (const auto& r : run_tests_of(root)) {
      if (!faulty.count(r.case_name) || r.status != TestStatus::kFailed) continue;
      const std::string test = r.suite + "." + r.test;
      suites_failed.insert(r.suite);
      failed_tests.push_back(test);
      if (f->config_invariant && !expected_test(*f, r)) others_failed.push_back(test + "/" + r.case_name);
      if (blame_test.empty()) {
        blame_test = test;
        blame_message = r.message;
        blame_case = r.case_name;
      }
      if (caught_by.empty() && expected_test(*f, r) && names_cause(*f, r.message)) {
        caught_by = test;
        message = r.message;
        blame_case = r.case_name;
      }
    }
    row["suites_failed"] = suites_failed;
    row["failed_tests"] = failed_tests;
    // The error findings of the faulty case, and its first divergence from what it is compared with.
    std::set<std::string> codes;
    json first = nullptr;
    try {
      const verdicts::CaseEvidence ev(root / f->spec / case_name);
      if (ev.has(layout::kFindings)) {
        for (const auto& finding : ev.findings()) {
          if (finding.value("severity", "") == "error") codes.insert(finding.value("code", ""));
        }
      }
      const std::string target = ev.resolved_case().compare_to;
      if (!target.empty() && fs::exists(root / f->spec / target)) {
        CompareOptions o;
        o.tolerance = verdicts::case_tolerance(ev);
        o.first_step = ev.resolved_case().resume_at;
        // A reduced lane: at the calibrated tolerances NumericParity judged it by.
        std::optional<Calibration> cal;
        const fs::path lane = root / f->spec / spec::kLaneReference, twin = root / f->spec / spec::kNoiseTwin;
        if (verdicts::calibrated_lane(ev) && fs::exists(lane) && fs::exists(twin)) {
          cal = verdicts::lane_calibration(verdicts::CaseEvidence(lane), verdicts::CaseEvidence(twin), ev);
          o.calibration = &*cal;
        }
        const Comparison c = compare_evidence(root / f->spec / target, ev.dir(), o);
        if (!c.divergences.empty()) {
          const Divergence& d = c.divergences.front();
          first = {{"kind", d.kind}, {"name", d.name}, {"step", d.step}, {"stage", d.stage},
                   {"relative_error", d.relative_error}, {"tolerance", d.tolerance}, {"compared_with", target}};
          if (d.noise > 0) first["error_over_noise"] = d.relative_error / d.noise;
        }
      }
    } catch (const std::exception& e) {
      row["evidence_error"] = e.what();
    }
    if (!caught_by.empty()) {
      blame_test = caught_by;
      blame_message = message;
    }
    Localization where;
    if (!blame_test.empty()) {
      try {
        const verdicts::CaseEvidence ev(root / f->spec / blame_case);
        const std::string text = blame_message.rfind("Failed\n", 0) == 0 ? blame_message.substr(7) : blame_message;
        where = verdicts::blame(ev, blame_test.substr(0, blame_test.find('.')), text);
      } catch (const std::exception& e) {
        where.reason = e.what();
      }
    }
    row["blamed"] = where.blamed;
    row["blame_reason"] = where.reason;
    row["expected_blame"] = expected_blame(*f);
    if (blame_override.count(f->id)) row["expected_blame_from"] = kExpectedBlameVar;
    row["localized"] = !where.blamed.empty() && where.blamed == expected_blame(*f);
    localized += row["localized"].get<bool>();
    row["finding_codes"] = codes;
    row["first_divergence"] = first;
    // The twin: every test of the same case without the fault.
    json twin_failed = json::array();
    int twin_tests = 0;
    for (const auto& r : clean_results) {
      if (r.spec != f->spec || !faulty.count(r.case_name)) continue;
      ++twin_tests;
      if (r.status == TestStatus::kFailed) {
        twin_failed.push_back({{"test", r.suite + "." + r.test}, {"message", first_lines(r.message, 3)}});
      }
    }
    const bool twin_clean = twin_tests > 0 && twin_failed.empty();
    // A fault no rank reached ran the correct code: nothing about it was checked, whatever failed.
    bool reached = true;
    try {
      const CaseRecord run = read_case_record(root / f->spec / case_name / layout::kCaseRecord);
      reached = run.fault_reached.value_or(true) && run.outcome != Outcome::kFaultNotReached;
    } catch (const std::exception&) {
      // No record: the launch failed, which rc reports.
    }
    row["fault_reached"] = reached;
    // A config-invariant fault is the port computing another model the same way everywhere:
    // caught by the expected suite alone (every suite comparing the port with itself passes).
    if (f->config_invariant) {
      row["config_invariant"] = true;
      row["fault_cases"] = faulty;
      row["others_failed"] = others_failed;
    }
    const bool ok = reached && !caught_by.empty() && others_failed.empty();
    row["detected"] = ok;
    row["caught_by"] = caught_by;
    row["message"] = first_lines(message, 4);
    row["twin_tests"] = twin_tests;
    row["twin_passed"] = twin_clean;
    row["twin_failures"] = twin_failed;
    // The diagnosis across the case, its contrasts (with the fault too) and the Reference.
    const auto c0 = std::chrono::steady_clock::now();
    const FaultRuns runs{root, root / layout::kContrastDir, clean, case_name, contrast_of[f]};
    std::map<std::string, std::string> compared_with;
    for (const auto& c : matrices.at(f->spec).cases) compared_with[c.name] = c.compare_to;
    const int contrast_rc = run_contrasts(*f, runs, compared_with, [&](const fs::path& dir, const std::string& filter,
                                                                      const std::string& cases, const fs::path& log) {
      return mih_test(dir, f->prefix, matrix_file[f->spec], case_timeout_s, filter, f->id, cases, log);
    });
    row["contrast_seconds"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - c0).count();
    if (contrast_rc != 0) infrastructure = infrastructure ? infrastructure : contrast_rc;
    row.update(diagnose_fault(*f, runs));
    diagnosed += row["diagnosed"].get<bool>();
    say(progress, "  diagnosis" + std::string(row["diagnosed"].get<bool>() ? "" : " (NOT the expected " + f->expected_diagnosis + ")") +
                      ": " + row["diagnosis"]["summary"].get<std::string>());
    row["seconds"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (rc != 0 && rc != 1) {
      infrastructure = infrastructure ? infrastructure : rc;
      row["error"] = "mih test exited " + std::to_string(rc) + "; see " + (root / layout::kTestLog).string();
    }
    detected += ok;
    twin_failures += !twin_clean;
    std::string suites = join(suites_failed, ", ");
    say(progress, std::string("  ") +
                      (ok                    ? "DETECTED by " + caught_by
                       : !reached            ? "NOT REACHED (its code never ran)"
                       : !caught_by.empty()  ? "NOT DETECTED ALONE: also failed " + others_failed.dump()
                                             : "NOT DETECTED") +
                      (ok && !row["localized"].get<bool>()
                           ? "; NOT LOCALIZED: blamed '" + where.blamed + "', the catalog expects '" + expected_blame(*f) + "'"
                           : "") +
                      (suites.empty() ? "" : "; failed: " + suites) + (twin_clean ? "" : "; FAULT-FREE TWIN FAILED") +
                      " (" + std::to_string(row["seconds"].get<double>()).substr(0, 4) + " s)");
    rows.push_back(std::move(row));
  }

  // A fault caught but blamed elsewhere than where it lives sends its author to the wrong
  // place: a failure of the catalog like a miss, named row by row.
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
  const fs::path json_path = json_out.empty() ? out / layout::kFaultsReport : fs::path(json_out);
  write_file_atomic(json_path, report.dump(2) + "\n");
  write_file_atomic(fs::path(json_path).replace_extension(layout::kMarkdownExtension), markdown_table(report) + diagnosis_section(report));
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
