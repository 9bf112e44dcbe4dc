// Memoized case launches and the run's exit status (see memo.h).
#include "harness/cases/memo.h"
#include "harness/cases/memo_internal.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <ostream>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/contract/case_record.h"
#include "harness/contract/evidence_layout.h"
#include "harness/base/files.h"
#include "harness/base/process_stat.h"
#include "harness/base/version.h"
#include "harness/base/json_fields.h"
#include "harness/evidence/case_completion_internal.h"
#include "harness/contract/contract.h"
#include "harness/evidence/evidence_store.h"
#include "harness/base/sha256.h"
#include "harness/base/strings.h"
#include "harness/cases/case_runner.h"
#include "harness/cases/conformance_run.h"
#include "harness/evidence/scheduler_jobs.h"
#include "harness/compare/verdicts.h"

namespace mih::cases {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// "tolerances.cross_topology.float64" for the JSON pointer "/tolerances/cross_topology/float64".
std::string field_name(const std::string& pointer) {
  std::string out;
  for (size_t i = 0; i < pointer.size(); ++i) {
    if (pointer[i] == '/') {
      if (i > 0) out += '.';
    } else if (pointer[i] == '~' && i + 1 < pointer.size()) {
      out += pointer[++i] == '1' ? '/' : '~';
    } else {
      out += pointer[i];
    }
  }
  return out.empty() ? "the whole value" : out;
}

// Why evidence file `relative` of case directory `dir` is not the one its run wrote with
// SHA-256 `digest` ("is missing", "changed after its run wrote it", ...), or "" when it is: a
// case writes regular files inside its directory, so a symbolic link (possibly out of it), a
// FIFO or a directory in its place is not its evidence.
std::string digest_problem(const fs::path& dir, const std::string& relative, const std::string& digest) {
  std::error_code ec;
  const fs::path file = dir / relative;
  // Every parent inside the case directory too: a linked check/ would lead out of it.
  for (fs::path part = fs::path(relative).parent_path(); !part.empty(); part = part.parent_path()) {
    if (fs::is_symlink(dir / part, ec)) return "lies under a symbolic link (" + part.string() + ")";
  }
  const fs::file_status st = fs::symlink_status(file, ec);
  if (!fs::exists(st)) return "is missing";
  if (fs::is_symlink(st)) return "is a symbolic link, not the file its run wrote";
  if (!fs::is_regular_file(st)) return "is not a regular file";
  std::string text;
  if (!read_file(file, &text)) return "cannot be read";
  if (sha256_hex(text) != digest) return "changed after its run wrote it";
  return "";
}

// Appends "<file>: <field> is <x> in the evidence, <y> in this mih" for each field where
// `evidence` differs from `compiled` (a JSON Patch from one to the other, nlohmann::json::diff;
// its recursion is bounded by the compiled value's depth).
void add_differences(const std::string& file, const json& evidence, const json& compiled, std::vector<std::string>* out) {
  for (const auto& op : json::diff(evidence, compiled)) {
    const std::string path = op.at("path").get<std::string>();
    std::string theirs = "absent", ours = "absent";
    try {
      const json::json_pointer pointer(path);
      if (evidence.contains(pointer)) theirs = json_summary(evidence.at(pointer));
      if (compiled.contains(pointer)) ours = json_summary(compiled.at(pointer));
    } catch (const json::exception&) {
      theirs = ours = "(see the file)";
    }
    if (op.contains("value") && ours == "absent") ours = json_summary(op["value"]);  // an element this mih adds
    out->push_back(file + ": " + field_name(path) + " is " + theirs + " in the evidence, " + ours + " in this mih");
  }
}

// Where the case's evidence in `ev` disagrees with what this binary compiled and this run
// gives the case: the spec (spec.resolved.json, of each phase), the case of the matrix
// (environment.json "case", run/case.json "case", case_run.json's copy of it), the parallel
// config (config.resolved.json's ParallelConfig fields; the save phase's before_save/), and
// the fault its records name against the fault this run injects into the case (its request's).
// Every verdict reads its tolerances, spec and case from these files, so evidence that
// passes here is judged by the compiled ones.
std::vector<std::string> disagreements(const CaseRequest& p, const verdicts::CaseEvidence& ev) {
  std::vector<std::string> out;
  const spec::Case& c = p.c;
  const json spec_json = spec_of_run(p.spec).to_json();
  const json case_json = c;
  const std::string& fault = p.fault;
  // The fault a record names (its typed read) against the fault this run injects.
  auto fault_of_record = [&](const std::string& file, const std::string& named) {
    if (named == fault) return;
    out.push_back(file + ": fault is " + json_summary(json(named)) + " in the evidence, " +
                  (fault.empty() ? std::string("and this run checks the case fault-free") : "\"" + fault + "\" in this run") +
                  (named.empty() ? std::string()
                                 : " (the evidence is of the catalog's bug " + named + ", not of the port: check it as the "
                                   "fault run it is, --fault " + named + " --fault-cases " + p.c.name +
                                   ", which `mih check` passes from the record)"));
  };
  std::optional<CaseRecord> typed;  // read once: both checks below compare it
  if (ev.has(layout::kCaseRecord)) {
    typed = read_case_record(ev.dir() / layout::kCaseRecord);
    fault_of_record(layout::kCaseRecord, typed->fault);
    if (typed->spec != p.spec || typed->case_name != p.c.name) {
      out.push_back(std::string(layout::kCaseRecord) + ": it is the record of " + typed->spec + "/" + typed->case_name +
                    ", not of " + p.spec + "/" + p.c.name + " (a record copied or edited)");
    }
    const json record = *typed;
    json recorded = json::object(), compiled = json::object();
    for (const char* key : {"kind", "group", "world_size", "config", "compare_to"}) {
      recorded[key] = record.at(key);
      compiled[key] = case_json.contains(key) ? case_json[key] : json();
    }
    add_differences(layout::kCaseRecord, recorded, compiled, &out);
  }
  if (ev.has(layout::kCaseRequest)) {
    const CaseRequest request = read_case_request(ev.dir() / layout::kCaseRequest);
    fault_of_record(layout::kCaseRequest, request.fault);
    if (typed) {
      // The record copies the request its ranks read (record_of): a field that differs was
      // edited in one of the two (the request's digest is in the record).
      const json recorded = *typed;
      const json requested = record_of(request);
      for (const auto& [key, value] : requested.items()) {
        static const std::set<std::string> kRun = {"seconds", "launch_seconds", "timing", "started_by", "state",
                                                   "outcome", "error", "files", "fault_reached"};
        if (kRun.count(key) || recorded.at(key) == value) continue;
        out.push_back(std::string(layout::kCaseRecord) + ": " + key + " is " + json_summary(recorded.at(key)) +
                      ", but " + layout::kCaseRequest + ", the request its ranks read, says " + json_summary(value) +
                      " (one of the two was edited)");
      }
    }
    if (request.spec != p.spec) {
      out.push_back(std::string(layout::kCaseRequest) + ": spec is " + request.spec + ", not " + p.spec);
    }
    add_differences(std::string(layout::kCaseRequest) + ": case", json(request.c), case_json, &out);
  }
  for (const std::string& phase : {std::string(), layout::before_save("")}) {
    if (!phase.empty() && !ev.has(phase + layout::kEnvironment)) continue;
    add_differences(phase + layout::kSpecResolved, ev.json(phase + layout::kSpecResolved), spec_json, &out);
    const json& env = ev.json(phase + layout::kEnvironment);
    add_differences(phase + layout::kEnvironment + ": case", env.is_object() && env.contains("case") ? env["case"] : json(),
                    case_json, &out);
    const json config = phase.empty() || !c.save_config ? json(c.config) : json(*c.save_config);
    const json& file = ev.json(phase + layout::kConfigResolved);
    json recorded = json::object();
    for (const auto& item : config.items()) {
      if (file.is_object() && file.contains(item.key())) recorded[item.key()] = file[item.key()];
    }
    add_differences(phase + layout::kConfigResolved, recorded, config, &out);
  }
  return out;
}

// The outcome of a case that has no record of its run: record_of(p) with `outcome` and `error`.
CaseOutcome unrecorded(const CaseRequest& p, const fs::path& dir, Outcome outcome, std::string error, Code code) {
  CaseOutcome out;
  static_cast<CaseRecord&>(out) = record_of(p);
  out.outcome = outcome;
  out.error = std::move(error);
  out.evidence = dir;
  out.code = code;
  return out;
}

// The outcome its record `run` says, with the code of its outcome's class (outcome_code), the
// one mapping a live run applies too (an environment problem is 12, not a crashed rank's 16).
CaseOutcome recorded(CaseRecord run, const fs::path& dir) {
  CaseOutcome out;
  static_cast<CaseRecord&>(out) = std::move(run);
  out.evidence = dir;
  out.code = outcome_code(out.outcome, Code::kOk);
  return out;
}

// A night `mih submit` ran: a job of this case that did not complete (cancelled, timed out,
// its node lost, or failed before the case left evidence) is the case's infrastructure
// outcome, whatever partial evidence it left; never a verdict, never a model failure.
std::optional<CaseOutcome> night_job_outcome(const CaseRequest& p, const fs::path& dir) {
  const auto job = infrastructure_job(run_options().evidence_root, p.spec, p.c.name, dir);
  if (!job) return std::nullopt;
  return unrecorded(p, dir, Outcome::kTransportFailure, describe_job_failure(*job),
                    job->state == "TIMEOUT" || job->state == "DEADLINE" ? Code::kDeadlineExceeded : Code::kUnavailable);
}

// The record of the case's run, or nullopt when it has none or one that does not read (read
// again and refused where it is needed, naming the problem).
std::optional<CaseRecord> readable_record(const fs::path& dir) {
  if (!fs::exists(dir / layout::kCaseRecord)) return std::nullopt;
  try {
    return read_case_record(dir / layout::kCaseRecord);
  } catch (const Error&) {
    return std::nullopt;
  }
}

// The evidence directory exists, and evidence of mih's case runner has its record: the runner
// writes case_run.json when its launches end, and its digests are what the check trusts, so
// evidence it launched without one is a run that did not finish or a record removed, never an
// external launch's to judge file by file (`mih launch` and the outside launchers run their
// ranks in a run directory of their own).
void check_evidence_present(const CaseRequest& p, const fs::path& dir, bool has_record) {
  MIH_CHECK_CODE(fs::is_directory(dir), Code::kFailedPrecondition, "verify-only: no evidence for case ", p.spec, "/",
                 p.c.name, " at ", dir.string(), "; produce it first, e.g. `mih run --spec ", p.spec, " --case ",
                 p.c.name, " --matrix ", p.matrix.text(), " --evidence-root ", run_options().evidence_root.string(),
                 "` or the torchrun/srun launch of docs/gpu-nightly.md, or restrict the run with --gtest_filter");
  if (has_record) return;
  MIH_CHECK_CODE(fs::exists(dir / layout::kCaseRecord) || !launched_by_case_runner(dir), Code::kFailedPrecondition,
                 "evidence ", dir.string(), " of case ", p.spec, "/", p.c.name, " was launched by mih's case runner (",
                 layout::kEnvironment, ": launcher 'mih', its ranks' run directory the case's own) and has no ",
                 layout::kCaseRecord, ", which the runner writes when the launch ends: the case is incomplete (its run "
                 "did not finish, or the record was removed); rerun it");
}

// The evidence is of case p (its resolved case and spec), and of this mih's version unless the
// user allows another (another writer of the contract has no mih version to match).
void check_evidence_is_of(const CaseRequest& p, const fs::path& dir, const verdicts::CaseEvidence& ev, bool mih_wrote) {
  const std::string& held = ev.resolved_case().name;
  MIH_CHECK_CODE(held == p.c.name, Code::kFailedPrecondition, "evidence ", dir.string(),
                 " holds case '", held, "', not '", p.c.name,
                 "': this directory belongs to another run or matrix; point --evidence-root at the run that produced it");
  const std::string spec_name = ev.spec_name();
  MIH_CHECK_CODE(spec_name == p.spec, Code::kFailedPrecondition, "evidence ", dir.string(), " is of spec '", spec_name,
                 "', not '", p.spec, "': point --evidence-root at the run of this spec");
  // Evidence of another harness release may mean other checks, formats or tolerances: it is
  // not this binary's to judge unless the user says so.
  if (!mih_wrote || run_options().allow_other_version) return;
  const json& env = ev.json(layout::kEnvironment);
  const json* recorded = env.contains("versions") && env["versions"].is_object() && env["versions"].contains("mih")
                             ? &env["versions"]["mih"]
                             : nullptr;
  MIH_CHECK_CODE(!recorded || recorded->is_string(), Code::kFailedPrecondition, "evidence ",
                 (dir / layout::kEnvironment).string(), ": versions.mih is ", recorded ? recorded->dump() : "",
                 ", not a version string: it is not evidence this harness wrote; rerun the case");
  const std::string theirs = recorded ? recorded->get<std::string>() : "";
  MIH_CHECK_CODE(theirs == harness_version(), Code::kFailedPrecondition, "evidence ", dir.string(),
                 " was written by ", theirs.empty() ? std::string("a harness that records no version (before 0.2.0)")
                                                    : "mih " + theirs,
                 ", and this is mih ", harness_version(), ": rerun the case with this harness, or pass "
                 "--allow-other-version to check it anyway");
}

// Evidence that is not what its run wrote is not that run's evidence: stale or damaged (a
// truncated file that no verdict reads would pass), never checked as if it were.
void check_digests(const fs::path& dir, const CaseRecord& run) {
  if (run_options().allow_edited_evidence) return;
  for (const auto& [relative, digest] : run.files) {
    const std::string problem = digest_problem(dir, relative, digest);
    MIH_CHECK_CODE(problem.empty(), Code::kFailedPrecondition, "evidence file ", (dir / relative).string(), " ", problem,
                   " (case_run.json records its SHA-256): it is not the run's evidence; rerun the case, or pass "
                   "--allow-edited-evidence to check it as it is");
  }
}

// The tolerances, the spec, the case and the fault a verdict applies are the compiled ones
// (and this run's): evidence that says otherwise is not this case's to judge by them.
void check_agreement(const CaseRequest& p, const fs::path& dir, const verdicts::CaseEvidence& ev) {
  const std::vector<std::string> differ = disagreements(p, ev);
  if (differ.empty()) return;
  std::string list;
  for (size_t i = 0; i < differ.size() && i < 12; ++i) list += "\n  " + differ[i];
  if (differ.size() > 12) list += "\n  ... and " + std::to_string(differ.size() - 12) + " more";
  MIH_THROW(Code::kFailedPrecondition, "evidence ", dir.string(), " of case ", p.spec, "/", p.c.name,
            " disagrees with the spec, matrix and fault this mih compiled and this run checks it with, and a "
            "verdict applies only those:", list,
            "\n  rerun the case with this mih, or check it with the matrix and --fault it ran under");
}

CaseOutcome verify_only_outcome(const CaseRequest& p, const fs::path& dir) {
  if (std::optional<CaseOutcome> job = night_job_outcome(p, dir)) return std::move(*job);
  // A case whose own run recorded that it did not complete (a rank killed, a timeout) gets no
  // verdict, so nothing else of it is read: its outcome is the answer, even where the dead rank
  // left a torn file behind (an edit that claims such an outcome only turns a case into "not
  // judged", never into a pass).
  std::optional<CaseRecord> record = fs::is_directory(dir) ? readable_record(dir) : std::nullopt;
  check_evidence_present(p, dir, record.has_value());
  if (record && classify(record->outcome) == OutcomeClass::kInfrastructure) return recorded(std::move(*record), dir);
  // The contract first: nothing below reads a file it has not validated (docs/evidence.md).
  const contract::Validation valid = contract::require_valid_case_dir(
      dir, "a check reads only evidence that does: rerun the case, or fix the writer that produced it");
  if (!valid.writer.empty()) progress(p.spec + "/" + p.c.name + ": evidence written by " + valid.writer);
  verdicts::CaseEvidence ev(dir);
  check_evidence_is_of(p, dir, ev, valid.writer.empty() || valid.writer.rfind("mih ", 0) == 0);
  CaseOutcome out = unrecorded(p, dir, Outcome::kVerifyOnly, "", Code::kOk);
  if (ev.has(layout::kCaseRecord)) {
    CaseRecord run = record ? std::move(*record) : read_case_record(dir / layout::kCaseRecord);
    check_digests(dir, run);
    out = recorded(std::move(run), dir);
  }
  // (A case that did not complete gets no verdict: its outcome is reported.)
  if (has_verdict(out.outcome)) check_agreement(p, dir, ev);
  out.code = outcome_code(out.outcome, Code::kOk);
  return out;
}

// What of `run`'s record differs from request `q` where their fingerprints differ: the
// timeouts, the fault, the training backend or the case, else the binary (its size and
// modification time are part of every fingerprint).
std::string fingerprint_difference(const CaseRecord& run, const CaseRequest& q) {
  auto ms = [](std::chrono::milliseconds t) { return std::to_string(t.count()) + " ms"; };
  std::vector<std::string> d;
  if (run.case_timeout != q.case_timeout) d.push_back("case timeout (" + ms(run.case_timeout) + ", this run " + ms(q.case_timeout) + ")");
  if (run.collective_timeout != q.collective_timeout) {
    d.push_back("collective timeout (" + ms(run.collective_timeout) + ", this run " + ms(q.collective_timeout) + "; 0 is the case timeout)");
  }
  if (run.fault != q.fault) d.push_back("fault ('" + run.fault + "', this run '" + q.fault + "')");
  if (run.training_backend != q.training_backend) {
    d.push_back("training backend (" + run.training_backend + ", this run " + q.training_backend + ")");
  }
  if (run.config != q.c.config || run.kind != q.c.kind || run.compare_to != q.c.compare_to || run.group != q.c.group) {
    d.push_back("case definition (" + run.config.name() + ", this run " + q.c.config.name() + ")");
  }
  if (d.empty()) return "it was produced by another mih binary, or another definition of the case (steps, resume point)";
  return "it was produced under another " + join(d, ", another ");
}

// Why the evidence in `dir` cannot stand for a run of request `q`, or "" when it can: only a
// case that completed (Outcome::kRan), with q's fingerprint, and whose every evidence file is
// still the one its run wrote (case_run.json's digests) is reused. `run` receives the record.
std::string why_not_reusable(const fs::path& dir, const CaseRequest& q, CaseRecord& run) {
  const std::string& fp = q.fingerprint;
  const std::string& init_from_sha256 = q.init_from_sha256;
  try {
    run = read_case_record(dir / layout::kCaseRecord);
  } catch (const Error& e) {
    return "its record cannot be trusted (" + e.message() + ")";
  }
  try {
    const EvidenceDir evidence(dir);
    IntegrationState state;
    (void)IntegrationStateMachine(evidence).current(&state);
  } catch (const Error& e) {
    return "its integration state cannot be read (" + e.message() + ")";
  }
  if (run.outcome != Outcome::kRan) {
    return "its last run did not complete (outcome '" + std::string(outcome_name(run.outcome)) + "'" +
           (run.error.empty() ? std::string() : ": " + run.error.substr(0, 200)) + ")";
  }
  const std::string& started_from = run.init_from_sha256;
  if (started_from != init_from_sha256) {
    auto weights = [](const std::string& sha) {
      return sha.empty() ? std::string("the seed's weights") : "a checkpoint with SHA-256 " + sha.substr(0, 16) + "...";
    };
    return "it started from " + weights(started_from) + ", this run starts from " + weights(init_from_sha256);
  }
  if (run.fingerprint != fp) return fingerprint_difference(run, q);
  if (run.files.empty()) return "its case_run.json lists no evidence digests";
  for (const auto& [relative, digest] : run.files) {
    if (std::string problem = digest_problem(dir, relative, digest); !problem.empty()) {
      return "evidence file " + relative + " " + problem;
    }
  }
  return "";
}

std::string seconds_text(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", s);
  return buf;
}

}  // namespace

namespace {

// The outcomes of the cases this process asked for, by "<spec>/<case>/<backend>/<matrix>".
struct Memo {
  std::mutex mu;
  std::map<std::string, CaseOutcome> outcomes;
};

Memo& memo_table() {
  static Memo m;
  return m;
}

}  // namespace

const CaseOutcome* memoized_outcome(const std::string& spec, const std::string& case_name) {
  Memo& m = memo_table();
  std::lock_guard<std::mutex> lock(m.mu);
  const std::string prefix = spec + "/" + case_name + "/";
  const auto it = m.outcomes.lower_bound(prefix);
  return it != m.outcomes.end() && it->first.rfind(prefix, 0) == 0 ? &it->second : nullptr;
}

void PrintTo(const CaseParam& p, std::ostream* os) { *os << p.request->spec << "/" << p.request->c.name; }

void progress(const std::string& line) {
  if (!run_options().progress) return;
  std::fprintf(stderr, "[mih %6.1fs] %s\n", process_age_seconds().value_or(0), line.c_str());
}

namespace {

// Evidence without a record: an external launch's (torchrun, srun: never relaunched over, it may
// have cost hours of a cluster), refused; or a run of mih's that did not finish, relaunched.
void check_not_external(const CaseRequest& p, const fs::path& dir) {
  if (fs::exists(dir / layout::kCaseRecord) || !fs::exists(dir / layout::kEnvironment)) return;
  std::string launcher;
  try {
    const json env = read_json_file(dir / layout::kEnvironment);
    if (env.is_object() && env.contains("launcher") && env["launcher"].is_string()) launcher = env["launcher"];
  } catch (const Error&) {
  }
  MIH_CHECK_CODE(launcher.empty() || launcher.rfind("mih", 0) == 0, Code::kFailedPrecondition, "case ", p.spec, "/",
                 p.c.name, ": ", dir.string(), " holds the evidence of an external launch (launcher ", launcher,
                 ", no case_run.json), which this run would replace: check it with `mih check ", dir.string(),
                 "` (or mih test --verify-only), or remove that directory to launch the case here");
  std::fprintf(stderr, "mih: relaunching %s/%s: it has evidence but no case_run.json (its run did not finish)\n",
               p.spec.c_str(), p.c.name.c_str());
}

// The evidence in `dir` as the outcome of p when it can stand for a run of it (why_not_reusable,
// and evidence that still says what this mih compiled), else nullopt (saying why it relaunches).
std::optional<CaseOutcome> reused(const CaseRequest& p, const fs::path& dir) {
  if (!fs::exists(dir / layout::kCaseRecord)) return std::nullopt;
  CaseRecord run;
  std::string why = why_not_reusable(dir, p, run);
  if (why.empty()) {
    // Digests recomputed after an edit pass the check above: the evidence must still say
    // what this mih compiled.
    try {
      const std::vector<std::string> differ = disagreements(p, verdicts::CaseEvidence(dir));
      if (!differ.empty()) why = "its evidence disagrees with this mih: " + differ.front();
    } catch (const Error& e) {
      why = std::string("its evidence cannot be read: ") + e.what();
    }
  }
  if (why.empty()) return recorded(std::move(run), dir);  // outcome kRan: why_not_reusable reuses nothing else
  // Said whatever --no-progress says: a relaunch costs time and the user should know why.
  std::fprintf(stderr, "mih: relaunching %s/%s: %s\n", p.spec.c_str(), p.c.name.c_str(), why.c_str());
  return std::nullopt;
}

// The case launched here (its lock held); a case that could not run at all (an unwritable or
// full evidence root, a bad case) is remembered like an outcome, so the case's other tests say
// it rather than relaunching it.
CaseOutcome launched(const CaseRequest& p, const fs::path& root, const fs::path& dir) {
  const spec::Case& c = p.c;
  progress(p.spec + "/" + c.name + ": launching " + std::to_string(c.world_size()) + " rank(s) (" + c.config.name() +
           (c.save_config ? ", resume" : "") + (p.fault.empty() ? "" : ", fault " + p.fault) + ")");
  try {
    CaseOutcome out;
    static_cast<CaseRunResult&>(out) = run_case(p, {.evidence_root = root, .lock_held = true});
    out.launched_here = true;
    ConformanceRun* run = ConformanceRun::current();
    if (run) run->count_launch();
    progress(p.spec + "/" + p.c.name + ": " + std::string(outcome_name(out.outcome)) + " (" + out.state + ") in " +
             seconds_text(out.seconds) + " s; " + std::to_string(run ? run->cases_launched() : 0) + " case(s) launched");
    return out;
  } catch (const Error& e) {
    return unrecorded(p, dir, Outcome::kNotRun, e.what(), e.code());
  }
}

// Counts an outcome that is not a verdict into the run's exit status.
void note_outcome(CaseOutcome& out) {
  switch (classify(out.outcome)) {
    case OutcomeClass::kVerdict:
    case OutcomeClass::kConformanceFailure:
      break;
    case OutcomeClass::kInfrastructure:
      if (ConformanceRun* run = ConformanceRun::current()) run->note_infrastructure(outcome_code(out.outcome, out.code));
      break;
    case OutcomeClass::kBadInput:
      // Also in a verify-only run of its evidence: the case ran the correct code and checked
      // nothing (a rerun relaunches it: only kRan is reused).
      if (out.error.empty()) out.error = "its fault was injected, but no rank reached the fault's point";
      note_error(outcome_code(out.outcome, out.code));
      break;
    case OutcomeClass::kEnvironment:
      note_error(outcome_code(out.outcome, out.code));
      break;
  }
}

}  // namespace

const CaseOutcome& ensure_case(const CaseRequest& p) {
  Memo& m = memo_table();
  std::lock_guard<std::mutex> lock(m.mu);
  const std::string key = p.spec + "/" + p.c.name + "/" + p.training_backend + "/" + p.matrix.text();
  if (const auto it = m.outcomes.find(key); it != m.outcomes.end()) return it->second;
  const fs::path root = run_options().evidence_root;
  const fs::path dir = fs::absolute(root / p.spec / p.c.name);
  std::optional<CaseOutcome> out;
  if (run_options().verify_only) {
    out = verify_only_outcome(p, dir);
  } else {
    const CaseLock case_lock(layout::case_lock(root, p.spec, p.c.name), /*wait=*/true, p.spec + "/" + p.c.name);
    check_not_external(p, dir);
    out = reused(p, dir);
    if (!out) out = launched(p, root, dir);
  }
  note_outcome(*out);
  return m.outcomes.emplace(key, std::move(*out)).first->second;
}

}  // namespace mih::cases
