// `mih check <evidence>`: the options a check derives from the evidence (check_arguments.h).
#include "harness/cli/check_arguments.h"

#include <cstdio>
#include <map>
#include <regex>
#include <set>

#include <nlohmann/json.hpp>

#include "harness/contract/case_record.h"
#include "harness/base/error.h"
#include "harness/contract/evidence_layout.h"
#include "harness/base/fault.h"
#include "harness/base/files.h"
#include "harness/base/json_fields.h"
#include "harness/base/strings.h"
#include "harness/cases/registrations.h"
#include "harness/compare/verdicts.h"
#include "harness/contract/contract.h"
#include "harness/contract/run_record.h"
#include "harness/spec/model_spec.h"

namespace mih::cli {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// "<Prefix>/<Suite>.<Test>/<Case>", the name of a conformance test (GoogleTest's for a
// value-parameterized test): no character GoogleTest's filter would read as a pattern.
bool conformance_test_name(const std::string& name) {
  static const std::regex kName("[A-Za-z0-9_]+/[A-Za-z0-9_]+\\.[A-Za-z0-9_]+/[A-Za-z0-9_]+");
  return name.size() < 512 && std::regex_match(name, kName);
}

// The tests the run of `root` recorded it would run: the start line of each of its processes
// in results.jsonl (ResultsWriter), in order, once each; empty when there is none.
// Throws: mih::Error{kFailedPrecondition} naming the file and line for a line that is not
//   JSON (but a torn last one) or a start line whose tests are not conformance test names.
std::vector<std::string> recorded_tests(const fs::path& root) {
  const fs::path file = root / layout::kResults;
  std::error_code ec;
  if (fs::symlink_status(file, ec).type() == fs::file_type::not_found) return {};
  std::string text;
  MIH_CHECK_CODE(read_file(file, &text), Code::kFailedPrecondition, "mih check: ", file.string(),
                 " cannot be read as a file: it is not the record of a run mih wrote");
  std::vector<std::string> out;
  std::set<std::string> seen;
  size_t start = 0;
  for (int line_number = 1; start < text.size(); ++line_number) {
    size_t end = text.find('\n', start);
    const bool terminated = end != std::string::npos;
    if (!terminated) end = text.size();
    const std::string line = text.substr(start, end - start);
    start = end + 1;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    json j;
    std::string problem;
    const bool parsed = parse_json_bounded(line, &j, &problem);  // bounded: a line nested 100000 deep
    if (!parsed && !terminated) break;                            // a writer died mid-line
    const std::string where = file.string() + " line " + std::to_string(line_number);
    MIH_CHECK_CODE(parsed, Code::kFailedPrecondition, "mih check: ", where, " is not JSON mih wrote (", problem,
                   "): the run's record was truncated or edited, so what it ran cannot be read; rerun it");
    // A test's line has no "run"; a process's end line has another event.
    if (!j.is_object() || !j.contains("run") || !j["run"].is_object() || !j["run"].contains("event") ||
        j["run"]["event"] != "start") {
      continue;
    }
    const json& run = j["run"];
    const json& tests = run.contains("tests") ? run["tests"] : json();
    MIH_CHECK_CODE(tests.is_array(), Code::kFailedPrecondition, "mih check: ", where, ": a start line lists no 'tests'");
    for (const auto& t : tests) {
      MIH_CHECK_CODE(t.is_string() && conformance_test_name(t.get<std::string>()), Code::kFailedPrecondition,
                     "mih check: ", where, ": ", t.is_string() ? "'" + t.get<std::string>().substr(0, 200) + "'" : t.type_name(),
                     " is not a conformance test name mih wrote (<Prefix>/<Suite>.<Test>/<Case>)");
      if (seen.insert(t.get<std::string>()).second) out.push_back(t.get<std::string>());
    }
  }
  return out;
}

// The fault of the catalog the record of `case_dir` names: its case_run.json, or the run/case.json
// of a case launched by torchrun or srun (which has no case_run.json); "" for none, no record,
// or a name that is no fault (the verify-only run then refuses the record, naming the field).
std::string recorded_fault(const fs::path& case_dir) {
  std::error_code ec;
  try {
    const std::string named = fs::exists(case_dir / layout::kCaseRecord, ec)
                                  ? read_case_record(case_dir / layout::kCaseRecord).fault
                                  : read_case_request(case_dir / layout::kCaseRequest).fault;
    return named.empty() ? std::string() : fault::name(fault::parse(named));
  } catch (const Error&) {
    return "";
  }
}

// The matrix a case's record names, checked to resolve here: one that does not is the
// record's problem (a file moved, an edit), said as such.
std::string recorded_matrix(const fs::path& file, const std::string& spec_name) {
  const MatrixSource matrix = read_case_record(file).matrix;
  const spec::ModelSpec& spec = spec::SpecRegistry::instance().get(spec_name);  // not compiled in: 11
  try {
    (void)spec::resolve_matrix_source(spec, matrix);
  } catch (const Error& e) {
    MIH_THROW(Code::kFailedPrecondition, "evidence file ", file.string(), ": its matrix '", matrix.text().substr(0, 200),
              "' does not resolve here (", e.message(), "); check the case from the directory its matrix file "
              "is relative to, or rerun it");
  }
  return matrix.text();
}

// A case directory's arguments: its root, spec, matrix, checkpoint, registrations and fault.
void case_dir_arguments(const fs::path& target, std::vector<std::string>& args, std::string* filter) {
  const verdicts::CaseEvidence ev(target);
  const std::string spec_name = ev.spec_name();
  fs::path dir = fs::absolute(target).lexically_normal();
  if (dir.filename().empty()) dir = dir.parent_path();  // a trailing '/'
  const fs::path root = dir.parent_path().parent_path();
  // The verdicts read <root>/<spec>/<case>: a directory holding another case's evidence
  // (a copy, a rename) would have them check that other case instead.
  const std::string case_name = ev.resolved_case().name;
  MIH_CHECK_CODE(dir.filename() == case_name && dir.parent_path().filename() == spec_name, Code::kFailedPrecondition,
                 "mih check: ", target.string(), " holds the evidence of ", spec_name, "/", case_name,
                 " (its spec.resolved.json and case info), not of ", dir.parent_path().filename().string(), "/",
                 dir.filename().string(), "; check a case where it was written: <root>/", spec_name, "/", case_name);
  args.insert(args.end(), {"--evidence-root", root.string(), "--only-spec", spec_name});
  // The record's matrix is what this check resolves the case from.
  if (ev.has(layout::kCaseRecord)) args.insert(args.end(), {"--matrix", recorded_matrix(dir / layout::kCaseRecord, spec_name)});
  // A case that started from a checkpoint is checked as one (its source keys included).
  if (ev.has(layout::kCaseRequest)) {
    const CaseRequest request = read_case_request(dir / layout::kCaseRequest);
    if (!request.init_from.empty()) args.insert(args.end(), {"--init-from", request.init_from});
  }
  // Name the spec's registrations: an on-request one (a fault-catalog variant) runs only then.
  std::string prefixes;
  for (const auto& r : cases::registrations()) {
    if (r.spec == spec_name) prefixes += (prefixes.empty() ? "" : ",") + r.prefix;
  }
  if (!prefixes.empty()) args.insert(args.end(), {"--prefixes", prefixes});
  // A case run with a fault of the catalog is checked as that fault run, never as the port.
  if (const std::string fault = recorded_fault(dir); !fault.empty()) {
    args.insert(args.end(), {"--fault", fault, "--fault-cases", case_name});
    std::fprintf(stderr, "mih check: %s/%s ran with fault %s of the catalog injected (its case record): checked as "
                 "that fault run, never as the fault-free port\n", spec_name.c_str(), case_name.c_str(), fault.c_str());
  }
  *filter = "*/*.*/" + ev.resolved_case().name;
}

// What a run root's run ran: the tests its processes recorded in results.jsonl's start lines,
// their registrations ("<prefix>") and cases ("<prefix>/<case>"), each registration linked here.
struct RecordedRun {
  std::vector<std::string> tests;
  std::set<std::string> prefixes, cases;
  // The spec's evidence is judged: recorded by the run, or (no record) a <spec>/ folder there.
  bool covers(const fs::path& target, const cases::Registration& r) const {
    std::error_code ec;
    return tests.empty() ? fs::is_directory(target / r.spec, ec) : prefixes.count(r.prefix) > 0;
  }
};

RecordedRun recorded_run(const fs::path& target) {
  RecordedRun run;
  run.tests = recorded_tests(target);
  for (const auto& name : run.tests) {
    const std::string prefix = name.substr(0, name.find('/'));
    run.cases.insert(prefix + "/" + name.substr(name.rfind('/') + 1));
    MIH_CHECK_CODE(cases::find_registration(prefix) != nullptr, Code::kFailedPrecondition, "mih check: ",
                   (target / layout::kResults).string(), " records test ", name, " of registration '", prefix,
                   "', which this mih does not link; check the run with the conformance binary that ran it");
    run.prefixes.insert(prefix);
  }
  return run;
}

// The matrix the run ran (run.json's, or the one every recorded registration ran, its lane
// included) and the checkpoint a run of one spec started from.
void run_record_arguments(const fs::path& target, const RecordedRun& recorded, std::vector<std::string>& args) {
  std::string matrix;
  if (fs::exists(target / layout::kRunRecord)) {
    const contract::RunRecord run = contract::read_run_record(target / layout::kRunRecord);
    matrix = run.matrix.value_or("");
    std::set<std::string> ran;
    for (const auto& r : run.registrations.value_or(std::vector<contract::RunRegistration>{})) {
      if (recorded.prefixes.count(r.prefix)) ran.insert(r.matrix);
    }
    if (ran.size() == 1 && !ran.begin()->empty()) matrix = *ran.begin();
    // A run of one spec from a checkpoint (`mih test --only-spec S --init-from DIR`).
    const auto init_from = run.init_from.value_or(std::map<std::string, contract::RunInitSource>{});
    if (init_from.size() == 1 && fs::is_directory(target / init_from.begin()->first)) {
      std::set<std::string> spec_dirs;
      for (const auto& r : cases::registrations()) {
        if (fs::is_directory(target / r.spec)) spec_dirs.insert(r.spec);
      }
      if (spec_dirs.size() == 1 && !init_from.begin()->second.dir.empty()) {
        args.insert(args.end(), {"--init-from", init_from.begin()->second.dir});
      }
    }
  }
  if (!matrix.empty()) args.insert(args.end(), {"--matrix", matrix});
}

// Every case's record must be readable: a truncated or foreign case_run.json is named here,
// not reported as hundreds of failing tests.
void check_case_records(const fs::path& target) {
  for (const auto& r : cases::registrations()) {
    std::error_code ec;
    if (!fs::is_directory(target / r.spec, ec)) continue;
    for (const auto& entry : fs::directory_iterator(target / r.spec, ec)) {
      const fs::path record = entry.path() / layout::kCaseRecord;
      if (!fs::exists(record, ec)) continue;
      try {
        (void)read_case_record(record);
      } catch (const Error& e) {
        MIH_THROW(Code::kFailedPrecondition, "mih check: ", e.message(), ": mih run --spec ", r.spec, " --case ",
                  entry.path().filename().string(), " --evidence-root ", target.string());
      }
    }
  }
}

// The cases run with a fault of the catalog (their case_run.json) are checked as that fault
// run, never as the port: `mih test --fault F --fault-cases ...` as the run was.
void fault_arguments(const fs::path& target, const RecordedRun& recorded, std::vector<std::string>& args) {
  std::map<std::string, std::set<std::string>> fault_cases;  // fault -> case names
  for (const auto& r : cases::registrations()) {
    std::error_code ec;
    if (!recorded.covers(target, r)) continue;
    for (const auto& entry : fs::directory_iterator(target / r.spec, ec)) {
      if (!recorded.tests.empty() && !recorded.cases.count(r.prefix + "/" + entry.path().filename().string())) continue;
      const std::string fault = recorded_fault(entry.path());
      if (fault.empty()) continue;
      fault_cases[fault].insert(entry.path().filename().string());
      std::fprintf(stderr, "mih check: %s/%s ran with fault %s of the catalog injected (its case record): checked "
                   "as that fault run, never as the fault-free port\n", r.spec.c_str(),
                   entry.path().filename().string().c_str(), fault.c_str());
    }
  }
  MIH_CHECK_CODE(fault_cases.size() <= 1, Code::kFailedPrecondition, "mih check: the cases of ", target.string(),
                 " ran with different faults of the catalog (", fault_cases.begin()->first, " and ",
                 std::next(fault_cases.begin())->first, "), which no one run injects; check each case directory");
  if (!fault_cases.empty()) {
    std::string names = join(fault_cases.begin()->second, ",");
    args.insert(args.end(), {"--fault", fault_cases.begin()->first, "--fault-cases", names});
  }
}

// A run root's arguments. A check of a filtered run judges what it ran, never the whole
// default matrix (whose other cases were never asked for); a root without that record (cases
// launched by torchrun or srun) is checked over the matrix of every spec with evidence there.
void run_root_arguments(const fs::path& target, std::vector<std::string>& args, std::string* filter,
                        std::vector<std::string>* recorded_out) {
  args.insert(args.end(), {"--evidence-root", fs::absolute(target).string()});
  const RecordedRun recorded = recorded_run(target);
  run_record_arguments(target, recorded, args);
  // Only the specs with evidence under this root.
  std::string specs, prefixes;
  for (const auto& r : cases::registrations()) {
    if (recorded.tests.empty() ? !fs::is_directory(target / r.spec) : !recorded.prefixes.count(r.prefix)) continue;
    specs += (specs.empty() ? "" : ":") + r.prefix + "/*";
    prefixes += (prefixes.empty() ? "" : ",") + r.prefix;
  }
  MIH_CHECK_CODE(!specs.empty(), Code::kFailedPrecondition, "mih check: ", target.string(),
                 " holds no evidence of a registered spec (no <spec>/ folder); is it a run root?");
  check_case_records(target);
  args.insert(args.end(), {"--prefixes", prefixes});
  fault_arguments(target, recorded, args);
  if (recorded.tests.empty()) {
    *filter = specs;
  } else {
    *recorded_out = recorded.tests;
    *filter = "";
    for (const auto& name : recorded.tests) *filter += (filter->empty() ? "" : ":") + name;
  }
}

}  // namespace

// `mih check <dir>`: a case directory (<root>/<spec>/<case>) or a run root.
std::vector<std::string> check_arguments(const fs::path& target, std::string* filter, std::vector<std::string>* recorded_out) {
  MIH_CHECK_CODE(fs::is_directory(target), Code::kFailedPrecondition, "mih check: ", target.string(),
                 " is not a directory; give a case's evidence directory (<root>/<spec>/<case>) or a run root");
  std::vector<std::string> args = {"--verify-only"};
  // A case directory: the contract before any of its files is read here (a run root's cases
  // are validated one by one as the run reaches them, cases::verify_only_outcome).
  if (fs::exists(target / layout::kEnvironment) || fs::exists(target / layout::kCaseRecord)) {
    contract::require_valid_case_dir(target, "a check reads only evidence that does: rerun the case, or fix the writer "
                                             "that produced it");
  }
  if (fs::exists(target / layout::kEnvironment) && fs::exists(target / layout::kSpecResolved)) {
    case_dir_arguments(target, args, filter);
  } else {
    run_root_arguments(target, args, filter, recorded_out);
  }
  return args;
}

}  // namespace mih::cli
