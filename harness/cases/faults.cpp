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

#include "harness/contract/case_record.h"
#include "harness/base/error.h"
#include "harness/contract/evidence_layout.h"
#include "harness/contract/findings_file.h"
#include "harness/base/fault.h"
#include "harness/base/files.h"
#include "harness/base/json_fields.h"
#include "harness/cases/fault_diagnosis_internal.h"
#include "harness/compare/compare.h"
#include "harness/compare/verdicts.h"
#include "harness/evidence/report.h"
#include "harness/spec/case_matrix.h"
#include "harness/spec/case_trainer.h"
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

// The faults a run covers: --fault's IDs, each naming one, or the whole catalog.
std::vector<const FaultEntry*> selected_faults(const std::vector<std::string>& only) {
  std::set<std::string> wanted;
  for (const auto& id : only) {
    const fault::Fault f = fault::parse(id);
    // An empty name (`--fault ''`, a CI variable left unset) would select nothing and pass.
    MIH_CHECK(f != fault::Fault::kNone, "--fault '", id, "' names no fault: give catalog IDs such as F03 or F23,F24 ",
              "(`mih faults --list`), or leave --fault out to run them all");
    wanted.insert(fault::name(f));
  }
  std::vector<const FaultEntry*> faults;
  for (const auto& f : fault_catalog()) {
    if (wanted.empty() || wanted.count(f.id)) faults.push_back(&f);
  }
  return faults;
}

// A case with a trainer of its own runs in the float64 lane only (spec/case_trainer.h): in a
// reduced lane its faults are left out, named on stderr, never counted as detected or missed.
// Throws: mih::Error{kInvalidSpec} when that leaves none of the selected faults.
std::vector<const FaultEntry*> runnable_in_lane(const std::vector<const FaultEntry*>& faults, const std::string& dtype) {
  if (dtype == "float64") return faults;
  std::vector<const FaultEntry*> kept;
  std::vector<std::string> left;
  // The matrix's own rule (case_trainer_lane_problem), on the fault's case and its contrasts.
  auto lane_problem = [](const json& entry) {
    const bool own = entry.is_object() && entry.contains("trainer");
    return own ? spec::case_trainer_lane_problem(entry.at("trainer"), true) : "";
  };
  for (const auto* f : faults) {
    bool own = !lane_problem(f->case_entry).empty();
    for (const auto& k : f->contrast) own = own || !lane_problem(k).empty();
    if (own) {
      left.push_back(f->id);
    } else {
      kept.push_back(f);
    }
  }
  MIH_CHECK(!kept.empty(), "mih faults: none of the selected faults runs in the ", dtype, " lane: ", join(left, ", "),
            " train with a case's own trainer, which runs in the float64 lane only; run them without --dtype");
  if (!left.empty()) {
    std::fprintf(stderr, "mih faults: %s left out of the %s lane: their cases train with a trainer of their own (an "
                 "optimizer or schedule the case sets), which runs in the float64 lane only\n",
                 join(left, ", ").c_str(), dtype.c_str());
  }
  return kept;
}

void list_faults(const std::vector<const FaultEntry*>& faults) {
  for (const auto* f : faults) {
    std::string expected = join(f->expected, ", ");
    std::printf("%s  %-34s %s/%s  (%s)\n      %s\n      expected: %s\n", f->id.c_str(), f->kind.c_str(),
                f->spec.c_str(), f->case_entry.dump().c_str(), f->where.c_str(), f->fault.c_str(), expected.c_str());
    std::printf("      diagnosis: %s (contrasts %s)\n", f->expected_diagnosis.c_str(), json(f->contrast).dump().c_str());
  }
}

// One matrix per spec, of the cases its faults manifest under; the case name of each fault.
struct FaultPlan {
  std::map<std::string, fs::path> matrix_file;                          // spec -> its fault matrix
  std::map<std::string, spec::CaseMatrix> matrices;                     // spec -> that matrix resolved
  std::map<std::string, std::string> prefix_of;                         // spec -> registration prefix
  std::map<const FaultEntry*, std::string> case_of;                     // the case the fault runs in
  std::map<const FaultEntry*, std::vector<std::string>> contrast_of;    // its contrasts' case names
};

FaultPlan plan_faults(const std::vector<const FaultEntry*>& faults, const fs::path& out, const std::string& dtype) {
  FaultPlan plan;
  std::map<std::string, std::vector<json>> entries;  // spec -> unique case entries
  for (const auto* f : faults) {
    auto& list_of = entries[f->spec];
    if (std::find(list_of.begin(), list_of.end(), f->case_entry) == list_of.end()) list_of.push_back(f->case_entry);
    for (const auto& k : f->contrast) {  // the diagnosis's contrasts ("Reference" is always there)
      if (k.is_object() && std::find(list_of.begin(), list_of.end(), k) == list_of.end()) list_of.push_back(k);
    }
    plan.prefix_of[f->spec] = f->prefix;
  }
  for (const auto& [spec_name, cases] : entries) {
    const json m = matrix_json("faults-" + spec_name, cases, dtype);
    const fs::path file = plan.matrix_file[spec_name] = out / layout::fault_matrix(spec_name);
    // Rewritten only when it changes: its content is part of every case's fingerprint.
    std::string old;
    if (!read_file(file, &old) || old != m.dump(2)) write_file_atomic(file, m.dump(2));
    plan.matrices.emplace(spec_name, spec::resolve_matrix(spec::SpecRegistry::instance().get(spec_name), m));
  }
  for (const auto* f : faults) {
    const spec::ModelSpec& s = spec::SpecRegistry::instance().get(f->spec);
    const spec::CaseMatrix one = spec::resolve_matrix(s, matrix_json("one", {f->case_entry}, dtype));
    const auto it = std::find_if(one.cases.begin(), one.cases.end(), [](const spec::Case& c) { return !added_case(c.name); });
    MIH_CHECK(it != one.cases.end(), "fault ", f->id, ": its case ", f->case_entry.dump(), " does not fit spec ", f->spec,
              (one.rejected.empty() ? std::string() : ": " + one.rejected.front().reason));
    plan.case_of[f] = it->name;
    plan.contrast_of[f] = contrast_names(*f, s, dtype);
  }
  return plan;
}

// What one fault's detection and diagnosis run with; `infrastructure` keeps the first exit
// status that is neither a pass nor a failure.
struct FaultContext {
  const FaultsOptions& options;
  double case_timeout_s;
  const FaultPlan& plan;
  fs::path out, clean;
  std::vector<TestResult> clean_results;
  std::map<std::string, std::string> blame_override;
  int infrastructure = 0;

  void infrastructure_failed(int rc) { infrastructure = infrastructure ? infrastructure : rc; }
  std::string expected_blame(const FaultEntry& f) const {
    const auto it = blame_override.find(f.id);
    return it == blame_override.end() ? f.expected_blame : it->second;
  }
};

// The fault-free twins: every case of each spec's matrix, with the reference, once.
void run_twins(FaultContext& ctx) {
  const bool progress = ctx.options.progress;
  fs::create_directories(ctx.clean);
  fs::remove(ctx.clean / layout::kResults);
  for (const auto& [spec_name, file] : ctx.plan.matrix_file) {
    say(progress, "fault-free twins of " + spec_name + " (" +
                      std::to_string(ctx.plan.matrices.at(spec_name).cases.size()) + " cases) ...");
    const int rc = mih_test(ctx.clean, ctx.plan.prefix_of.at(spec_name), file, ctx.case_timeout_s, "", "", "",
                            ctx.clean / layout::twins_test_log(spec_name));
    if (rc != 0 && rc != 1) {
      ctx.infrastructure_failed(rc);
      say(progress, "  exit " + std::to_string(rc) + ": see " + (ctx.clean / layout::twins_test_log(spec_name)).string());
    }
  }
  ctx.clean_results = run_tests_of(ctx.clean);
}

// The cases that run with the fault: its case, or for a config-invariant fault every case of
// the row (the reference included; the rest of the spec's matrix stays fault-free).
std::set<std::string> faulty_cases(const FaultEntry& f, const std::string& case_name, const spec::CaseMatrix& matrix) {
  std::set<std::string> faulty = {case_name};
  if (f.config_invariant) {
    for (const auto& c : matrix.cases) {
      if (c.name == case_name || added_case(c.name)) faulty.insert(c.name);
    }
  }
  return faulty;
}

// `mih test` of the faulty cases under <out>/<ID>, the fault-free cases they are compared with
// shared with the twins' run; returns its exit status.
int run_detection(const FaultContext& ctx, const FaultEntry& f, const std::set<std::string>& faulty) {
  const fs::path root = ctx.out / f.id;
  fs::remove_all(root);
  fs::create_directories(root / f.spec);
  std::string faulty_list, filter;
  for (const auto& c : faulty) {
    faulty_list += (faulty_list.empty() ? "" : ",") + c;
    filter += (filter.empty() ? "" : ":") + f.prefix + "/*.*/" + c;
  }
  for (const auto& c : ctx.plan.matrices.at(f.spec).cases) {
    if (!faulty.count(c.name) && fs::exists(ctx.clean / f.spec / c.name)) {
      fs::create_directory_symlink(ctx.clean / f.spec / c.name, root / f.spec / c.name);
    }
  }
  say(ctx.options.progress, f.id + " " + f.kind + ": " + f.spec + "/" + faulty_list + " with MIH_FAULT=" + f.id + " ...");
  return mih_test(root, f.prefix, ctx.plan.matrix_file.at(f.spec), ctx.case_timeout_s, filter, f.id, faulty_list,
                  root / layout::kTestLog);
}

// The failed tests of the faulty cases: which caught the fault (the expected test, its message
// naming the cause), and what the harness blames: the catching test, else the first failed one,
// on the case it failed on (a config-invariant fault is caught on the reference).
struct Failures {
  std::set<std::string> suites;
  json tests = json::array();
  std::string caught_by, message;
  std::string blame_test, blame_message, blame_case;
  json others_failed = json::array();  // config-invariant: tests of other suites that failed
};

Failures failures_of(const FaultEntry& f, const fs::path& root, const std::string& case_name,
                     const std::set<std::string>& faulty) {
  Failures out;
  out.blame_case = case_name;
  for (const auto& r : run_tests_of(root)) {
    if (!faulty.count(r.case_name) || r.status != TestStatus::kFailed) continue;
    const std::string test = r.suite + "." + r.test;
    out.suites.insert(r.suite);
    out.tests.push_back(test);
    if (f.config_invariant && !expected_test(f, r)) out.others_failed.push_back(test + "/" + r.case_name);
    if (out.blame_test.empty()) {
      out.blame_test = test;
      out.blame_message = r.message;
      out.blame_case = r.case_name;
    }
    if (out.caught_by.empty() && expected_test(f, r) && names_cause(f, r.message)) {
      out.caught_by = test;
      out.message = r.message;
      out.blame_case = r.case_name;
    }
  }
  if (!out.caught_by.empty()) {
    out.blame_test = out.caught_by;
    out.blame_message = out.message;
  }
  return out;
}

// The error findings of the faulty case ("finding_codes"), and its first divergence from what it
// is compared with ("first_divergence"); "evidence_error" when its evidence cannot be read.
void read_detection_evidence(const fs::path& root, const FaultEntry& f, const std::string& case_name, json& row) {
  std::set<std::string> codes;
  json first = nullptr;
  try {
    const verdicts::CaseEvidence ev(root / f.spec / case_name);
    if (ev.has(layout::kFindings)) {
      const contract::FindingsFile findings =
          contract::findings_file(ev.json(layout::kFindings), layout::kFindings, (ev.dir() / layout::kFindings).string());
      for (const auto& finding : findings.findings) {
        if (finding.error()) codes.insert(finding.code);
      }
    }
    const std::string target = ev.resolved_case().compare_to;
    if (!target.empty() && fs::exists(root / f.spec / target)) {
      CompareOptions o;
      o.tolerance = verdicts::case_tolerance(ev);
      o.first_step = ev.resolved_case().resume_at;
      // A reduced lane: at the calibrated tolerances NumericParity judged it by.
      std::optional<Calibration> cal;
      const fs::path lane = root / f.spec / spec::kLaneReference, twin = root / f.spec / spec::kNoiseTwin;
      if (verdicts::calibrated_lane(ev) && fs::exists(lane) && fs::exists(twin)) {
        cal = verdicts::lane_calibration(verdicts::CaseEvidence(lane), verdicts::CaseEvidence(twin), ev);
        o.calibration = &*cal;
      }
      const Comparison c = compare_evidence(root / f.spec / target, ev.dir(), o);
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
  row["finding_codes"] = codes;
  row["first_divergence"] = first;
}

// Where the harness puts the blame for the failure that caught (or first failed on) the fault.
Localization blame_of(const fs::path& root, const FaultEntry& f, const Failures& failed) {
  Localization where;
  if (failed.blame_test.empty()) return where;
  try {
    const verdicts::CaseEvidence ev(root / f.spec / failed.blame_case);
    const std::string& m = failed.blame_message;
    const std::string text = m.rfind("Failed\n", 0) == 0 ? m.substr(7) : m;
    where = verdicts::blame(ev, failed.blame_test.substr(0, failed.blame_test.find('.')), text);
  } catch (const std::exception& e) {
    where.reason = e.what();
  }
  return where;
}

// The twin: every test of the same cases without the fault ("twin_tests", "twin_passed",
// "twin_failures").
void judge_twin(const std::vector<TestResult>& clean_results, const FaultEntry& f, const std::set<std::string>& faulty,
                json& row) {
  json twin_failed = json::array();
  int twin_tests = 0;
  for (const auto& r : clean_results) {
    if (r.spec != f.spec || !faulty.count(r.case_name)) continue;
    ++twin_tests;
    if (r.status == TestStatus::kFailed) {
      twin_failed.push_back({{"test", r.suite + "." + r.test}, {"message", first_lines(r.message, 3)}});
    }
  }
  row["twin_tests"] = twin_tests;
  row["twin_passed"] = twin_tests > 0 && twin_failed.empty();
  row["twin_failures"] = twin_failed;
}

// A fault no rank reached ran the correct code: nothing about it was checked, whatever failed.
bool fault_reached(const fs::path& case_dir) {
  try {
    const CaseRecord run = read_case_record(case_dir / layout::kCaseRecord);
    return run.fault_reached.value_or(true) && run.outcome != Outcome::kFaultNotReached;
  } catch (const std::exception&) {
    return true;  // no record: the launch failed, which the exit status reports
  }
}

// The diagnosis across the case, its contrasts (with the fault too) and the Reference.
void diagnose_across_contrasts(FaultContext& ctx, const FaultEntry& f, const std::string& case_name, json& row) {
  const fs::path root = ctx.out / f.id;
  const auto c0 = std::chrono::steady_clock::now();
  const FaultRuns runs{root, root / layout::kContrastDir, ctx.clean, case_name, ctx.plan.contrast_of.at(&f)};
  std::map<std::string, std::string> compared_with;
  for (const auto& c : ctx.plan.matrices.at(f.spec).cases) compared_with[c.name] = c.compare_to;
  const int contrast_rc = run_contrasts(f, runs, compared_with, [&](const fs::path& dir, const std::string& filter,
                                                                   const std::string& cases, const fs::path& log) {
    return mih_test(dir, f.prefix, ctx.plan.matrix_file.at(f.spec), ctx.case_timeout_s, filter, f.id, cases, log);
  });
  row["contrast_seconds"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - c0).count();
  if (contrast_rc != 0) ctx.infrastructure_failed(contrast_rc);
  row.update(diagnose_fault(f, runs));
  say(ctx.options.progress, "  diagnosis" +
                                std::string(row["diagnosed"].get<bool>() ? "" : " (NOT the expected " + f.expected_diagnosis + ")") +
                                ": " + row["diagnosis"]["summary"].get<std::string>());
}

// The progress line of one fault's verdict.
std::string verdict_line(const json& row, const Failures& failed, const std::string& expected_blame) {
  const bool ok = row["detected"].get<bool>();
  const std::string suites = join(failed.suites, ", ");
  return std::string("  ") +
         (ok                                  ? "DETECTED by " + failed.caught_by
          : !row["fault_reached"].get<bool>() ? "NOT REACHED (its code never ran)"
          : !failed.caught_by.empty()         ? "NOT DETECTED ALONE: also failed " + failed.others_failed.dump()
                                              : "NOT DETECTED") +
         (ok && !row["localized"].get<bool>()
              ? "; NOT LOCALIZED: blamed '" + row["blamed"].get<std::string>() + "', the catalog expects '" +
                    expected_blame + "'"
              : "") +
         (suites.empty() ? "" : "; failed: " + suites) + (row["twin_passed"].get<bool>() ? "" : "; FAULT-FREE TWIN FAILED") +
         " (" + std::to_string(row["seconds"].get<double>()).substr(0, 4) + " s)";
}

// One row of the detection matrix: the fault's cases run with it, judged against their twins,
// blamed and diagnosed.
json run_fault(FaultContext& ctx, const FaultEntry& f) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::string case_name = ctx.plan.case_of.at(&f);
  const fs::path root = ctx.out / f.id;
  const spec::CaseMatrix& matrix = ctx.plan.matrices.at(f.spec);
  const std::set<std::string> faulty = faulty_cases(f, case_name, matrix);
  const int rc = run_detection(ctx, f, faulty);
  json row = {{"id", f.id},
              {"kind", f.kind},
              {"fault", f.fault},
              {"where", f.where},
              {"spec", f.spec},
              {"case", case_name},
              {"config", matrix.at(case_name).config.name()},
              {"expected", f.expected},
              {"exit_status", rc},
              {"evidence", (root / f.spec / case_name).string()}};
  if (!f.report.empty()) row["report"] = f.report;
  const Failures failed = failures_of(f, root, case_name, faulty);
  row["suites_failed"] = failed.suites;
  row["failed_tests"] = failed.tests;
  read_detection_evidence(root, f, case_name, row);
  const Localization where = blame_of(root, f, failed);
  row["blamed"] = where.blamed;
  row["blame_reason"] = where.reason;
  row["expected_blame"] = ctx.expected_blame(f);
  if (ctx.blame_override.count(f.id)) row["expected_blame_from"] = kExpectedBlameVar;
  row["localized"] = !where.blamed.empty() && where.blamed == ctx.expected_blame(f);
  judge_twin(ctx.clean_results, f, faulty, row);
  const bool reached = fault_reached(root / f.spec / case_name);
  row["fault_reached"] = reached;
  // A config-invariant fault is the port computing another model the same way everywhere:
  // caught by the expected suite alone (every suite comparing the port with itself passes).
  if (f.config_invariant) {
    row["config_invariant"] = true;
    row["fault_cases"] = faulty;
    row["others_failed"] = failed.others_failed;
  }
  row["detected"] = reached && !failed.caught_by.empty() && failed.others_failed.empty();
  row["caught_by"] = failed.caught_by;
  row["message"] = first_lines(failed.message, 4);
  diagnose_across_contrasts(ctx, f, case_name, row);
  row["seconds"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (rc != 0 && rc != 1) {
    ctx.infrastructure_failed(rc);
    row["error"] = "mih test exited " + std::to_string(rc) + "; see " + (root / layout::kTestLog).string();
  }
  say(ctx.options.progress, verdict_line(row, failed, ctx.expected_blame(f)));
  return row;
}

}  // namespace

int run_faults(const FaultsOptions& options) {
  const std::vector<const FaultEntry*> selected = selected_faults(options.only);
  const std::map<std::string, std::string> blame_override = expected_blame_overrides();
  for (const auto& [id, place] : blame_override) {
    // Said even with --no-progress: it changes the verdict.
    std::fprintf(stderr, "mih faults: %s is set: %s is expected to be blamed on '%s', not the catalog's place (a test "
                 "hook)\n", kExpectedBlameVar, id.c_str(), place.c_str());
  }
  if (options.list) {
    list_faults(selected);
    return 0;
  }
  const std::vector<const FaultEntry*> faults = runnable_in_lane(selected, options.dtype);
  const auto start = std::chrono::steady_clock::now();
  const fs::path out = fs::absolute(options.out);
  fs::create_directories(out / layout::kMatricesDir);
  MIH_CHECK_CODE(fs::is_directory(out), Code::kFailedPrecondition, "mih faults: cannot create ", out.string());
  const FaultPlan plan = plan_faults(faults, out, options.dtype);
  FaultContext ctx{options, static_cast<double>(options.case_timeout.count()) / 1000.0, plan, out,
                   out / layout::kFaultFreeDir, {}, blame_override};
  run_twins(ctx);
  json rows = json::array();
  for (const auto* f : faults) rows.push_back(run_fault(ctx, *f));
  return report_fault_matrix(options, out, ctx.infrastructure, rows, start);
}

}  // namespace mih::cases
