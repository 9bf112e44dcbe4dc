// `mih submit`: a spec's matrix as SLURM batch jobs with their dependencies (each case's
// comparison after its reference, a resume's load after its save) and a final job after all of
// them, whatever their outcome, that runs `mih test --verify-only` and writes the reports.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/base/error.h"
#include "harness/contract/evidence_layout.h"
#include "harness/base/files.h"
#include "harness/base/json_fields.h"
#include "harness/base/safe_open.h"
#include "harness/cases/case_runner.h"
#include "harness/compat/collectives.h"
#include "harness/contract/case_record.h"
#include "harness/runtime/worker.h"
#include "harness/cases/hf_interop.h"
#include "harness/cases/registrations.h"
#include "harness/evidence/scheduler_jobs.h"
#include "harness/cli/commands.h"
#include "harness/spec/model_spec.h"

namespace mih::cli {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// A value of one line that a batch script may carry: no control character (a newline would
// start a command of its own, and a log line could be forged).
// Throws: mih::Error{kInvalidSpec} naming `what` and the character.
void check_one_line(const std::string& what, const std::string& value) {
  for (unsigned char c : value) {
    MIH_CHECK_CODE(c >= 0x20 && c != 0x7f, Code::kInvalidSpec, "mih submit: ", what,
                   ": expected one line of printable characters (it goes into a batch script), got control character "
                   "0x", "0123456789abcdef"[c >> 4], "0123456789abcdef"[c & 15], "; give it without");
  }
}

// A value of an #SBATCH line, which sbatch reads as options split at spaces, with no quoting:
// only characters that cannot end the value or start another option.
// Throws: mih::Error{kInvalidSpec} naming `what` and the first character it cannot take.
void check_sbatch_value(const std::string& what, const std::string& value) {
  check_one_line(what, value);
  const size_t bad = value.find_first_not_of(
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._,:/+=@%~-");
  MIH_CHECK_CODE(bad == std::string::npos && value.rfind('-', 0) != 0, Code::kInvalidSpec, "mih submit: ", what, " '",
                 value, "' goes into an #SBATCH line, which cannot quote: expected letters, digits and ._,:/+=@%~- ",
                 "(not first), got ", bad == std::string::npos ? std::string("a leading '-'")
                                                               : "'" + value.substr(bad, 1) + "'",
                 "; give it without (an evidence root: a path without spaces)");
}

// A file name for #SBATCH --output: sbatch replaces %j, %x ... in it, so a '%' of the path is %%.
std::string sbatch_output_path(const std::string& path_with_job_id) {
  const size_t at = path_with_job_id.rfind("%j");
  std::string out;
  for (size_t i = 0; i < path_with_job_id.size(); ++i) {
    out += path_with_job_id[i] == '%' && i != at ? "%%" : std::string(1, path_with_job_id[i]);
  }
  return out;
}

// `s` as one shell word: single-quoted, each ' as '\''.
std::string quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// A site value that is several words (srun_args, container): each word quoted, so the words
// are arguments and nothing of them is run as shell (no ;, $(...), redirection).
std::string quote_words(const std::string& what, const std::string& value) {
  check_one_line(what, value);
  std::string out;
  size_t start = 0;
  while ((start = value.find_first_not_of(' ', start)) != std::string::npos) {
    const size_t end = std::min(value.find(' ', start), value.size());
    out += (out.empty() ? "" : " ") + quote(value.substr(start, end - start));
    start = end;
  }
  return out;
}

// Where a site's cluster differs (a JSON file; every key optional, none other accepted).
struct Site {
  std::string partition, account, container, srun_args, mih;
  int gpus_per_node = 0;
  int time_minutes = 0;
  std::vector<std::string> modules;
  std::string pg_backend;  // "" : the case's
};

Site read_site(const std::string& path) {
  Site s;
  if (path.empty()) return s;
  const json j = read_json_file(path);
  MIH_CHECK_CODE(j.is_object(), Code::kInvalidSpec, "site file ", path, ": expected a JSON object");
  static const std::set<std::string> known = {"partition", "account", "container", "srun_args", "mih",
                                              "gpus_per_node", "time_minutes", "modules", "pg_backend"};
  for (const auto& [k, v] : j.items()) {
    MIH_CHECK_CODE(known.count(k), Code::kInvalidSpec, "site file ", path, ": unknown key '", k,
                   "' (partition, account, gpus_per_node, time_minutes, modules, container, srun_args, pg_backend, mih)");
  }
  auto text = [&](const char* k, std::string* out) {
    if (!j.contains(k)) return;
    MIH_CHECK_CODE(j[k].is_string(), Code::kInvalidSpec, "site file ", path, ": '", k, "' must be a string of one line");
    *out = j[k].get<std::string>();
    check_one_line("site file " + path + ": '" + k + "'", *out);
  };
  text("partition", &s.partition);
  text("account", &s.account);
  text("container", &s.container);
  text("srun_args", &s.srun_args);
  text("mih", &s.mih);
  text("pg_backend", &s.pg_backend);
  if (!s.partition.empty()) check_sbatch_value("site file " + path + ": 'partition'", s.partition);
  if (!s.account.empty()) check_sbatch_value("site file " + path + ": 'account'", s.account);
  MIH_CHECK_CODE(s.pg_backend.empty() || s.pg_backend == "gloo" || s.pg_backend == "nccl", Code::kInvalidSpec,
                 "site file ", path, ": pg_backend must be gloo or nccl");
  for (const char* k : {"gpus_per_node", "time_minutes"}) {
    if (!j.contains(k)) continue;
    MIH_CHECK_CODE(j[k].is_number_integer() && j[k].get<int64_t>() >= 0 && j[k].get<int64_t>() <= 100000,
                   Code::kInvalidSpec, "site file ", path, ": '", k, "' must be a non-negative integer");
    (std::string(k) == "gpus_per_node" ? s.gpus_per_node : s.time_minutes) = j[k].get<int>();
  }
  if (j.contains("modules")) {
    MIH_CHECK_CODE(j["modules"].is_array(), Code::kInvalidSpec, "site file ", path, ": 'modules' must be a list");
    for (const json& m : j["modules"]) {
      MIH_CHECK_CODE(m.is_string(), Code::kInvalidSpec, "site file ", path, ": each module is a string of one line");
      check_one_line("site file " + path + ": a module", m.get<std::string>());
      s.modules.push_back(m.get<std::string>());
    }
  }
  return s;
}

// One batch job of the night.
struct Job {
  std::string name;    // "llama/Tp2Sp:train", "verify"
  std::string script;  // the batch script's text
  fs::path path;       // where it is written
  std::vector<std::pair<std::string, std::string>> after;  // (job name, "afterany" | "afterok")
  std::string id;      // SLURM's job id, once submitted
};

std::string header(const Site& site, const std::string& name, int tasks, const fs::path& log) {
  check_sbatch_value("the job name", name);
  check_sbatch_value("the log path", log.string());
  std::string h = "#!/bin/bash\n#SBATCH --job-name=" + name + "\n#SBATCH --output=" + sbatch_output_path(log.string()) + "\n";
  if (tasks > 0) h += "#SBATCH --ntasks=" + std::to_string(tasks) + "\n";
  if (!site.partition.empty()) h += "#SBATCH --partition=" + site.partition + "\n";
  if (!site.account.empty()) h += "#SBATCH --account=" + site.account + "\n";
  if (site.gpus_per_node > 0 && tasks > 0) h += "#SBATCH --gpus-per-node=" + std::to_string(site.gpus_per_node) + "\n";
  if (site.time_minutes > 0) h += "#SBATCH --time=" + std::to_string(site.time_minutes) + "\n";
  // A requeued job would run the case again over the first run's evidence in the same case
  // directory (the verdict reads a requeued run as incomplete, SLURM_RESTART_COUNT): never requeued.
  h += "#SBATCH --no-requeue\n";
  h += "set -u\n";
  for (const std::string& m : site.modules) h += "module load " + quote(m) + "\n";
  return h;
}

// Runs `args` (args[0] looked up in PATH) with stdout and stderr into one pipe; returns its
// exit status (127: it could not be started) and what it printed.
std::pair<int, std::string> capture(std::vector<std::string> args) {
  int out[2];
  MIH_CHECK_CODE(::pipe(out) == 0, Code::kUnavailable, "mih submit: pipe failed");
  const pid_t pid = ::fork();
  MIH_CHECK_CODE(pid >= 0, Code::kUnavailable, "mih submit: fork failed");
  if (pid == 0) {
    ::dup2(out[1], 1);
    ::dup2(out[1], 2);
    ::close(out[0]);
    ::close(out[1]);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execvp(argv[0], argv.data());
    std::fprintf(stderr, "cannot run %s: not on PATH\n", argv[0]);
    ::_exit(127);
  }
  ::close(out[1]);
  std::string text;
  char buf[4096];
  for (ssize_t n; (n = ::read(out[0], buf, sizeof buf)) > 0;) text.append(buf, static_cast<size_t>(n));
  ::close(out[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), text};
}

// Runs sbatch --parsable with `options` on `script`; returns the job id.
std::string sbatch(const std::vector<std::string>& options, const fs::path& script) {
  std::vector<std::string> args = {"sbatch", "--parsable"};
  args.insert(args.end(), options.begin(), options.end());
  args.push_back(script.string());
  const auto [status, text] = capture(args);
  const std::string id = text.substr(0, text.find(';'));
  MIH_CHECK_CODE(status == 0 && !id.empty() && id.find_first_not_of("0123456789") == std::string::npos,
                 Code::kUnavailable, "mih submit: sbatch ", script.string(), " failed: ", text.substr(0, 500),
                 " (jobs submitted before it stay queued; `scancel --name` them or rerun)");
  return id;
}

// Refuses to submit spec `spec`'s night on `root` again while a job of its last submission
// (jobs.json) is still queued or running (squeue): a second set would run beside it on the
// same case directories, and jobs.json would lose the first set's ids.
// Throws: mih::Error{kFailedPrecondition} naming the jobs and the fix (wait, or scancel);
//   kUnavailable when squeue cannot say.
void refuse_pending(const fs::path& root, const std::string& spec) {
  const fs::path file = root / layout::submit_jobs(spec);
  std::error_code ec;
  if (!fs::exists(file, ec)) return;
  const json record = read_json_file(file);
  MIH_CHECK_CODE(record.is_object(), Code::kFailedPrecondition, "mih submit: ", file.string(),
                 ": expected the JSON object of job ids mih submit writes, got ", json_summary(record));
  std::set<std::string> recorded;
  std::string ids;
  for (const auto& [name, id] : record.items()) {
    if (!id.is_string() || id.get<std::string>().empty() ||
        id.get<std::string>().find_first_not_of("0123456789") != std::string::npos) {
      continue;
    }
    if (recorded.insert(id.get<std::string>()).second) ids += (ids.empty() ? "" : ",") + id.get<std::string>();
  }
  if (recorded.empty()) return;
  const auto [status, text] = capture({"squeue", "--noheader", "--format=%i", "--jobs=" + ids,
                                            "--states=PENDING,CONFIGURING,RUNNING,SUSPENDED,COMPLETING"});
  if (status != 0 && text.find("Invalid job id") != std::string::npos) return;  // none known any more
  MIH_CHECK_CODE(status == 0, Code::kUnavailable, "mih submit: cannot ask squeue whether the jobs of ", file.string(),
                 " are still queued: ", text.substr(0, 300), "; run mih submit where squeue works (nothing was submitted)");
  std::string pending;
  size_t start = 0;
  while (start < text.size()) {
    const size_t end = std::min(text.find('\n', start), text.size());
    const std::string id = text.substr(start, end - start);
    if (recorded.count(id)) pending += (pending.empty() ? "" : " ") + id;
    start = end + 1;
  }
  MIH_CHECK_CODE(pending.empty(), Code::kFailedPrecondition, "mih submit: jobs ", pending, " of the last submission of ",
                 spec, "'s night on ", root.string(), " are still queued or running (squeue; ", file.string(),
                 "): expected none, since a second set would run beside them on the same cases and their ids would be "
                 "lost; wait until they end, or cancel them (scancel ", pending, "), then submit again (nothing was "
                 "submitted)");
}

// `mih submit`'s flags.
struct NightFlags {
  std::string spec, matrix = "cpu-smoke", root, site, previous;
  std::vector<std::string> cases;
  bool dry_run = false;
};

// The cases asked for and, transitively, those they are compared with, each after the case it
// is compared with (whose job it waits for), else in matrix order; `wanted` their names.
std::vector<const spec::Case*> night_cases(const spec::CaseMatrix& matrix, const NightFlags& f, const std::string& spec,
                                           std::set<std::string>& wanted) {
  std::map<std::string, const spec::Case*> by_name;
  for (const spec::Case& c : matrix.cases) by_name[c.name] = &c;
  for (const std::string& name : f.cases) {
    MIH_CHECK_CODE(by_name.count(name), Code::kInvalidSpec, "mih submit: matrix ", f.matrix, " of spec ", spec,
                   " has no case '", name, "' (see `mih matrix --spec ", spec, "`)");
  }
  const std::set<std::string> asked(f.cases.begin(), f.cases.end());
  std::vector<const spec::Case*> order;
  std::function<void(const std::string&)> want = [&](const std::string& name) {
    if (!by_name.count(name) || !wanted.insert(name).second) return;
    if (!by_name[name]->compare_to.empty()) want(by_name[name]->compare_to);
    order.push_back(by_name[name]);
  };
  for (const spec::Case& c : matrix.cases) {
    if (asked.empty() || asked.count(c.name)) want(c.name);
  }
  return order;
}

// What the night runs, where, with which `mih` and site settings.
struct Night {
  const NightFlags& f;
  const Site site;
  const std::string mih;
  const spec::ModelSpec& s;
  const fs::path root;
};

// A night submitted again: a case complete in an earlier submission is kept (its jobs into
// `kept`); true when it is.
bool kept_from_before(const Night& n, const spec::Case& c, std::map<std::string, std::string>& kept) {
  std::error_code ec;
  const fs::path dir = layout::case_dir(n.root, n.s.name, c.name);
  const bool has_evidence = fs::exists(dir / layout::kEnvironment, ec) || fs::exists(dir / layout::kCaseRecord, ec);
  const std::vector<SubmittedJob> before = submitted_jobs(n.root, n.s.name, c.name);
  const bool complete = has_evidence && !before.empty() &&
                        std::all_of(before.begin(), before.end(),
                                    [](const SubmittedJob& j) { return j.state == "COMPLETED"; });
  if (!complete) return false;
  std::printf("%s/%s: complete in an earlier submission (jobs", n.s.name.c_str(), c.name.c_str());
  for (const SubmittedJob& j : before) {
    std::printf(" %s", j.id.c_str());
    kept[j.name] = j.id;
  }
  std::printf("): kept\n");
  return true;
}

// The case's run/case.json, what an incomplete earlier submission left set aside first.
void prepare_night_case(const Night& n, const spec::Case& c, const CaseRequest& q) {
  const fs::path dir = layout::case_dir(n.root, n.s.name, c.name);
  std::error_code ec;
  const bool has_evidence = fs::exists(dir / layout::kEnvironment, ec) || fs::exists(dir / layout::kCaseRecord, ec);
  if (has_evidence && !submitted_jobs(n.root, n.s.name, c.name).empty()) {
    const fs::path aside = n.root / layout::submit_dir(n.s.name) / "incomplete" /
                           (c.name + "." + std::to_string(std::time(nullptr)));
    fs::create_directories(aside.parent_path());
    fs::rename(dir, aside);
    std::printf("%s/%s: its last submission did not complete; its evidence moved to %s\n", n.s.name.c_str(),
                c.name.c_str(), aside.c_str());
  }
  cases::CaseRunOptions o;
  o.evidence_root = n.root;
  cases::prepare_case(q, o);  // run/case.json; refuses a directory that holds a run's evidence
}

CaseRequest night_request(const Night& n, const spec::Case& c) {
  CaseRequest q;
  q.spec = n.s.name;
  q.matrix = MatrixSource::parse(n.f.matrix);
  q.c = c;
  q.training_backend = "trainer";
  if (!n.s.checkpoint.init_from.empty()) {
    const cases::InitSource checked = cases::check_init_from(n.s, n.s.checkpoint.init_from);
    q.init_from = checked.dir.string();
    q.init_from_sha256 = checked.sha256;
  }
  return q;
}

// The case's jobs, one per phase (save then load, or train), appended to `jobs`; returns the
// name of its last phase's job.
std::string add_case_jobs(const Night& n, const spec::Case& c, const CaseRequest& q,
                          const std::map<std::string, std::string>& last_job, std::vector<Job>& jobs) {
  const fs::path dir = layout::case_dir(n.root, n.s.name, c.name);
  const Site& site = n.site;
  std::string previous_phase;
  for (const CasePhase& phase : case_phases(c)) {
    WorkerOptions rank = cases::case_rank_options(q, dir, phase.name);
    if (!site.pg_backend.empty()) rank.pg_backend = compat::parse_backend(site.pg_backend);
    Job j;
    j.name = n.s.name + "/" + c.name + ":" + phase.name;
    j.path = n.root / layout::submit_script(n.s.name, c.name + "." + phase.name);
    j.script = header(site, "mih:" + j.name, phase.world_size,
                      n.root / layout::submit_log(n.s.name, c.name + "." + phase.name, "%j")) +
               "export MASTER_ADDR=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1)\n"
               "export MASTER_PORT=$((20000 + SLURM_JOB_ID % 20000))\n"
               // A rank that dies stops its peers at once (as torchrun does): a failed job,
               // not peers waiting in a collective until the job's time limit.
               "srun --kill-on-bad-exit=1 --ntasks=" + std::to_string(phase.world_size) +
               (site.srun_args.empty() ? "" : " " + quote_words("srun_args", site.srun_args)) + " " +
               (site.container.empty() ? "" : quote_words("container", site.container) + " ") + quote(n.mih) + " " +
               cases::case_rank_shell_line(rank, dir, phase.name) + "\n";
    if (!previous_phase.empty()) j.after.push_back({previous_phase, "afterok"});  // load after its save
    if (previous_phase.empty() && last_job.count(c.compare_to)) {
      j.after.push_back({last_job.at(c.compare_to), "afterany"});  // compared after its reference ran (unless kept)
    }
    previous_phase = j.name;
    jobs.push_back(std::move(j));
  }
  return previous_phase;
}

// The verdict of the whole night, after every job whatever its outcome.
Job verify_job(const Night& n, const std::string& prefix, const std::string& filter,
               const std::set<std::string>& wanted, const std::vector<Job>& jobs) {
  const std::string& mih = n.mih;
  const fs::path& root = n.root;
  Job verify;
  verify.name = n.s.name + ":verify";
  verify.path = root / layout::submit_script(n.s.name, "verify");
  // What the scheduler says of every job (sacct where accounting runs, scontrol while the
  // controller remembers them): a job that did not complete is the case's infrastructure
  // outcome in the verdict, never a model failure (cases/scheduler_jobs.h).
  verify.script = header(n.site, "mih:" + verify.name, 1, root / layout::submit_log(n.s.name, "verify", "%j")) +
                  "ids=@JOB_IDS@\n(sacct -n -P -o JobID,State,ExitCode -j \"$ids\" 2>/dev/null; for id in ${ids//,/ }; do "
                  "scontrol show job -o \"$id\" 2>/dev/null; done) > " +
                  quote((root / layout::submit_states(n.s.name)).string()) + "\n" +
                  quote(mih) + " test --verify-only --evidence-root " + quote(root.string()) + " --matrix " +
                  quote(n.f.matrix) + (prefix.empty() ? "" : " --prefixes " + prefix) + " --no-progress " +
                  quote("--gtest_filter=" + filter) + " " + quote("--gtest_output=xml:" + (root / layout::kNightJunit).string()) +
                  "\nrc=$?\n" + quote(mih) + " report " + quote(root.string()) + " --format md -o " +
                  quote((root / layout::kNightReportMd).string()) + "\n" + quote(mih) + " report " + quote(root.string()) +
                  " --format html -o " + quote((root / layout::kNightReportHtml).string()) + "\n";
  if (!n.f.previous.empty()) {
    for (const std::string& name : wanted) {
      verify.script += quote(mih) + " compare " + quote(layout::case_dir(fs::absolute(n.f.previous), n.s.name, name).string()) + " " +
                       quote(layout::case_dir(root, n.s.name, name).string()) + " >> " +
                       quote((root / layout::kNightCompare).string()) + " 2>&1\n";
    }
  }
  verify.script += "exit $rc\n";
  for (const Job& j : jobs) verify.after.push_back({j.name, "afterany"});
  return verify;
}

std::string with_ids(std::string script, const std::string& ids) {
  const size_t at = script.find("@JOB_IDS@");
  if (at != std::string::npos) script.replace(at, 9, ids);
  return script;
}

// The batch scripts (a dry run) and the dependency graph.
void print_night(const Night& n, const std::vector<Job>& jobs) {
  if (n.f.dry_run) {
    for (const Job& j : jobs) {
      std::printf("== %s (%s)\n%s\n", j.name.c_str(), j.path.c_str(), with_ids(j.script, "'<the job ids>'").c_str());
    }
  }
  std::printf("dependency graph of %s's night (%zu jobs):\n", n.s.name.c_str(), jobs.size());
  for (const Job& j : jobs) {
    std::string deps;
    for (const auto& [name, kind] : j.after) deps += (deps.empty() ? "" : ", ") + kind + ":" + name;
    std::printf("  %s%s%s\n", j.name.c_str(), deps.empty() ? "" : " after ", deps.c_str());
  }
}

// Each job through sbatch, after the jobs it depends on; their ids (and the kept ones) to
// the night's jobs.json.
void submit_jobs(const Night& n, std::vector<Job>& jobs, const std::map<std::string, std::string>& kept) {
  std::map<std::string, std::string> ids;
  json record = json::object();
  for (const auto& [name, id] : kept) record[name] = id;
  std::string all_ids;
  for (Job& j : jobs) {
    j.script = with_ids(j.script, all_ids);  // the final job's: every job before it
    write_file_atomic(j.path, j.script);
    std::string dependency;
    for (const auto& [name, kind] : j.after) dependency += (dependency.empty() ? "" : ",") + kind + ":" + ids.at(name);
    std::vector<std::string> options;
    if (!dependency.empty()) options.push_back("--dependency=" + dependency);
    // A load whose save failed never runs: cancelled at once, so the final job still comes.
    for (const auto& [name, kind] : j.after) {
      if (kind == "afterok") {
        options.push_back("--kill-on-invalid-dep=yes");
        break;
      }
    }
    j.id = sbatch(options, j.path);
    all_ids += (all_ids.empty() ? "" : ",") + j.id;
    ids[j.name] = j.id;
    record[j.name] = j.id;
    std::printf("submitted %s: job %s\n", j.name.c_str(), j.id.c_str());
  }
  write_file_atomic(n.root / layout::submit_jobs(n.s.name), record.dump(2) + "\n");
  std::printf("the night's verdict: %s (%s, %s, %s) when job %s ends\n", n.root.c_str(), layout::kNightReportMd,
              layout::kNightReportHtml, layout::kNightJunit, ids.at(jobs.back().name).c_str());
}

int submit_night(const NightFlags& f, const std::string& self) {
  check_one_line("--evidence-root", f.root);
  check_one_line("--previous", f.previous);
  check_one_line("--matrix", f.matrix);
  const Site site = read_site(f.site);
  const spec::ModelSpec& s = spec::SpecRegistry::instance().get(f.spec);
  const spec::CaseMatrix matrix = spec::resolve_matrix_source(s, f.matrix);
  const Night n{f, site, site.mih.empty() ? self : site.mih, s, fs::absolute(f.root)};
  if (!f.dry_run) {
    // The root is shared (/shared/mih/<date>): a .mih-submit another user planted, a link or a
    // directory of theirs, would receive the batch scripts and jobs.json (issue 53).
    make_secure_directory(n.root / layout::submit_dir(s.name), "give another --evidence-root (nothing was submitted)");
    refuse_pending(n.root, s.name);
  }
  std::string prefix;
  for (const cases::Registration& r : cases::registrations()) {
    if (r.spec == s.name && prefix.empty()) prefix = r.prefix;
  }
  std::set<std::string> wanted;
  const std::vector<const spec::Case*> order = night_cases(matrix, f, s.name, wanted);
  std::vector<Job> jobs;
  std::map<std::string, std::string> last_job;  // case -> the name of its last phase's job
  std::map<std::string, std::string> kept;      // job name -> id, of cases complete before
  std::string filter;
  for (const spec::Case* case_ptr : order) {
    const spec::Case& c = *case_ptr;
    filter += (filter.empty() ? "" : ":") + std::string("*/") + c.name;
    const CaseRequest q = night_request(n, c);
    if (kept_from_before(n, c, kept)) continue;
    if (!f.dry_run) prepare_night_case(n, c, q);
    last_job[c.name] = add_case_jobs(n, c, q, last_job, jobs);
  }
  jobs.push_back(verify_job(n, prefix, filter, wanted, jobs));
  print_night(n, jobs);
  if (f.dry_run) return 0;
  submit_jobs(n, jobs, kept);
  return 0;
}

}  // namespace

CommandRun setup_submit(CLI::App& sub, const Invocation& inv) {
  auto f = std::make_shared<NightFlags>();
  sub.add_option("--spec", f->spec, "registered spec (see `mih list`)")->required();
  sub.add_option("--preset,--matrix", f->matrix, "preset or JSON matrix file")->capture_default_str();
  sub.add_option("--evidence-root", f->root, "the night's evidence root, on a file system every node sees")->required();
  sub.add_option("--cases", f->cases, "only these cases (and the cases they are compared with)")->delimiter(',');
  sub.add_option("--site", f->site, "site settings: a JSON file (partition, account, gpus_per_node, time_minutes, "
                                    "modules, container, srun_args, pg_backend, mih)");
  sub.add_option("--previous", f->previous, "last night's evidence root: the final job compares each case with it");
  sub.add_flag("--dry-run", f->dry_run, "print the batch scripts and the dependency graph; submit nothing, write nothing");
  const std::string self = inv.argc > 0 ? fs::weakly_canonical(fs::absolute(fs::path(inv.argv[0]))).string() : "mih";
  return [f, self] { return submit_night(*f, self); };
}

}  // namespace mih::cli
