// The case runner, the parent side of a case (see case_runner.h): run/case.json, the launches,
// the outcome and case_run.json. The rank side, the `case` worker task, is case_rank.cpp
// (referenced from here so that linking run_case links the task's registration too).
#include "harness/cases/case_runner.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <optional>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "harness/contract/case_record.h"
#include "harness/contract/rank_phase_records.h"
#include "harness/base/error.h"
#include "harness/contract/evidence_layout.h"
#include "harness/base/fault.h"
#include "harness/base/files.h"
#include "harness/base/json_fields.h"
#include "harness/base/process_stat.h"
#include "harness/base/safe_open.h"
#include "harness/base/sha256.h"
#include "harness/cases/faults.h"
#include "harness/cases/hf_interop.h"
#include "harness/compat/collectives.h"
#include "harness/evidence/case_completion_internal.h"
#include "harness/evidence/evidence_store.h"
#include "harness/runtime/launcher.h"
#include "harness/runtime/rendezvous.h"
#include "harness/runtime/worker.h"
#include "harness/session/backend.h"
#include "harness/session/session.h"
#include "harness/spec/case_matrix.h"
#include "harness/spec/model_spec.h"

namespace mih::cases {

namespace fs = std::filesystem;

std::string case_fingerprint(const CaseRequest& r) {
  std::string id = r.spec + "|" + nlohmann::json(r.c).dump() + "|" + r.training_backend + "|" + r.fault + "|" +
                   std::to_string(r.case_timeout.count()) + "ms|" + std::to_string(r.collective_timeout.count()) + "ms";
  if (!r.init_from_sha256.empty()) id += "|init_from:" + r.init_from_sha256;
  struct stat st {};
  if (::stat("/proc/self/exe", &st) == 0) id += "|" + std::to_string(st.st_size) + ":" + std::to_string(st.st_mtime);
  return sha256_hex(id).substr(0, 16);
}

namespace {

// The request as the ranks read it: an absolute init_from, checked (its digest) when the caller
// has not, and fingerprinted when the caller has not.
CaseRequest completed(const spec::ModelSpec& s, CaseRequest r) {
  if (!r.init_from.empty() && r.init_from_sha256.empty()) {
    const InitSource checked = check_init_from(s, r.init_from);
    r.init_from = checked.dir.string();
    r.init_from_sha256 = checked.sha256;
  }
  if (!r.init_from.empty()) r.init_from = fs::absolute(r.init_from).string();
  if (r.fingerprint.empty()) r.fingerprint = case_fingerprint(r);
  return r;
}

// Writes the request as the case's run/case.json in an emptied evidence directory.
fs::path write_request(const CaseRequest& r, const fs::path& evidence_root) {
  const fs::path evidence = fs::absolute(evidence_root / r.spec / r.c.name);
  // The spec directory first: a link planted there would send the removal elsewhere.
  make_secure_directory(evidence.parent_path(), "pass another --evidence-root");
  fs::remove_all(evidence);
  EvidenceDir dir(evidence);  // fails early, naming the path, when it is unwritable
  // The one resolved copy of the case every rank reads.
  dir.write_json(layout::kCaseRequest, nlohmann::json(r));
  return evidence;
}

}  // namespace

fs::path prepare_case(const CaseRequest& request, const CaseRunOptions& o) {
  // Preparing empties the case directory: never over the evidence of a run (an external
  // launch's may have cost hours of a cluster), only over nothing or an earlier preparation.
  const fs::path evidence = fs::absolute(o.evidence_root / request.spec / request.c.name);
  std::error_code ec;
  int64_t files = 0;
  for (auto it = fs::recursive_directory_iterator(evidence, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    if (!it->is_directory(ec) && fs::relative(it->path(), evidence, ec) != fs::path(layout::kCaseRequest)) ++files;
  }
  MIH_CHECK_CODE(files == 0, Code::kFailedPrecondition, "mih run --prepare: ", evidence.string(), " holds ", files,
                 " evidence file(s) of a run of ", request.spec, "/", request.c.name,
                 ", which preparing would delete: check them with `mih check ", evidence.string(),
                 "`, or remove that directory (or give another --evidence-root) to prepare the case again");
  return write_request(completed(spec::SpecRegistry::instance().get(request.spec), request), o.evidence_root);
}

namespace {

// SHA-256 of every evidence file of the case (relative path -> digest), case_run.json aside:
// what a later run checks before it reuses the case (memo.cpp).
std::map<std::string, std::string> evidence_digests(const fs::path& dir) {
  std::map<std::string, std::string> out;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    if (!it->is_regular_file(ec)) continue;
    const std::string relative = fs::relative(it->path(), dir, ec).string();
    // Not the run's: case_run.json is this record, and integration_state.json is advanced
    // by the verdicts after the run (validated once every suite passed).
    if (relative == layout::kCaseRecord || relative == layout::kIntegrationState) continue;
    std::string text;
    if (read_file(it->path(), &text)) out[relative] = sha256_hex(text);
  }
  return out;
}

// A transport failure of the launch: a rank that died by a signal, a launch past its timeout,
// or a rank that failed in a collective (a peer gone, a collective timeout).
bool infrastructure_failure(const LaunchResult& r) {
  if (r.status == LaunchResult::Status::kTimedOut) return true;
  for (const auto& rank : r.ranks) {
    if (rank.state == RankOutcome::State::kSignaled) return true;
    if (rank.error_code == code_name(Code::kUnavailable) || rank.error_code == code_name(Code::kDeadlineExceeded)) {
      return true;
    }
  }
  return false;
}

// An environment failure of the launch: a rank that could not write its evidence (a full
// disk, a read-only or unwritable file system). Returns what the rank said, or "".
std::string environment_failure(const LaunchResult& r) {
  for (const auto& rank : r.ranks) {
    if (rank.error_code != code_name(Code::kFailedPrecondition)) continue;
    for (int err : {ENOSPC, EDQUOT, EROFS, EACCES}) {
      if (rank.error_message.find(std::strerror(err)) != std::string::npos) {
        return "rank " + std::to_string(rank.rank) + " could not write its evidence: " + rank.error_message;
      }
    }
  }
  return "";
}

// A rank that could not initialize the port from the case's checkpoint (load_init_from's
// init_from_failed_rank<r>.json): the first such record of any phase, or nullopt.
std::optional<contract::RankInitFromFailure> init_from_failure(const fs::path& evidence) {
  std::error_code ec;
  for (const char* phase : kCasePhases) {
    std::vector<fs::path> records;
    for (auto it = fs::directory_iterator(evidence / layout::run_phase_dir(phase), ec); !ec && it != fs::directory_iterator();
         it.increment(ec)) {
      if (it->path().filename().string().rfind(layout::kInitFromFailedPrefix, 0) == 0) records.push_back(it->path());
    }
    ec.clear();
    std::sort(records.begin(), records.end());
    if (!records.empty()) return contract::read_rank_init_from_failure(records.front());
  }
  return std::nullopt;
}

}  // namespace

std::string local_launch_warning(const std::string& spec, const spec::Case& c) {
  const unsigned cores = std::thread::hardware_concurrency();
  const int ranks = std::max(c.world_size(), c.save_config ? c.save_config->world_size() : 0);
  if (cores == 0 || ranks <= 2 * static_cast<int>(cores)) return "";
  return "mih: warning: " + spec + "/" + c.name + " starts " + std::to_string(ranks) + " rank processes on this "
         "machine's " + std::to_string(cores) + " CPU cores: expect it to be slow or to pass --case-timeout (the local "
         "launcher's practical maximum is about 2 per core)";
}

void check_launchable_here(const std::string& spec, const spec::Case& c) {
  const int ranks = std::max(c.world_size(), c.save_config ? c.save_config->world_size() : 0);
  const std::string what = "case " + spec + "/" + c.name;
  const compat::BackendKind backend = compat::parse_backend(c.pg_backend);
  // A one-rank mesh needs no backend (DeviceMesh gives it a self group where this build lacks
  // it): the float64 CPU Reference of a GPU lane runs on a build without Gloo (a pip wheel's).
  MIH_CHECK_CODE(compat::backend_available(backend) || ranks == 1, Code::kUnimplemented, what, " runs ", ranks,
                 " ranks on process-group backend '", c.pg_backend, "', which this build lacks (libtorch ",
                 compat::torch_version(), c.pg_backend == "nccl" ? ", not a CUDA build" : ", no gloo headers at build time",
                 "); build mih against a libtorch that has it (docs/libtorch2.md)");
  if (c.device != "cuda") return;
  // Rank r of the local launcher runs on cuda:r (its LOCAL_RANK).
  const int gpus = compat::cuda_device_count();
  MIH_CHECK_CODE(ranks <= gpus, Code::kFailedPrecondition, what, " runs ", ranks, " rank", ranks == 1 ? "" : "s",
                 " on CUDA, one GPU each, and this process sees ", gpus, " CUDA device", gpus == 1 ? "" : "s",
                 compat::backend_available(compat::BackendKind::kNccl)
                     ? std::string()
                     : " (this mih is built against libtorch " + compat::torch_version() + " without CUDA)",
                 "; run it on a machine with ", ranks, " GPU", ranks == 1 ? "" : "s", " and a CUDA build of mih ",
                 "(scripts/gpu-smoke builds one), or under torchrun or srun across hosts (docs/gpu-nightly.md)");
}

CaseLock::CaseLock(const fs::path& file, bool wait, const std::string& what) {
  // Never through a link or into a directory another user planted (issue 53: the lock was
  // created wherever a planted spec directory link pointed).
  make_secure_directory(file.parent_path(), "pass another --evidence-root");
  std::string why;
  fd_ = open_own_file(file, O_RDWR, &why);
  MIH_CHECK_CODE(fd_ >= 0, Code::kFailedPrecondition, "cannot open the case lock ", file.string(), ": ", why,
                 "; is the evidence root writable?");
  while (::flock(fd_, wait ? LOCK_EX : LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    if (err == EINTR) continue;
    ::close(fd_);
    MIH_CHECK_CODE(err != EWOULDBLOCK, Code::kFailedPrecondition, "case ", what,
                   " is being run by another process on this evidence root (", file.string(),
                   " is locked); wait for it to finish, or use another --evidence-root");
    MIH_THROW(Code::kFailedPrecondition, "cannot lock ", file.string(), ": ", std::strerror(err));
  }
}

CaseLock::~CaseLock() { ::close(fd_); }

namespace {

// Whether any rank of any phase of the case ran its fault's code (run/<phase>/fault_rank<R>.json).
bool fault_reached(const fs::path& evidence) {
  std::error_code ec;
  for (const char* phase : kCasePhases) {
    const fs::path dir = evidence / layout::run_phase_dir(phase);
    if (!fs::is_directory(dir, ec)) continue;
    for (const auto& entry : fs::directory_iterator(dir, ec)) {
      if (entry.path().filename().string().rfind(layout::kFaultRankPrefix, 0) != 0) continue;
      if (contract::read_rank_fault_reach(entry.path()).reached) return true;
    }
  }
  return false;
}

// Why a case whose fault was never reached checked nothing, and where the fault does manifest.
std::string fault_not_reached_message(const spec::ModelSpec& s, const spec::Case& c, const std::string& fault) {
  std::string where, pairs;
  for (const FaultEntry& f : fault_catalog()) {
    if (f.id != fault) continue;
    where = f.where;
    pairs = f.spec + " (" + f.case_entry.dump() + ")";
  }
  return internal::str("fault ", fault, " was injected into case ", s.name, "/", c.name, " (", c.config.name(),
                       "), but no rank reached its fault point (", where.empty() ? std::string("?") : where,
                       "): this spec and configuration never run the faulty code, so the case ran the correct code and "
                       "its tests checked nothing about the fault. Inject it where that code runs: the catalog runs ",
                       fault, " on ", pairs.empty() ? std::string("?") : pairs, " (`mih faults --fault ", fault, "`)");
}

// Bad input is rejected here, before any rank starts: an unknown fault, a spec that does not
// validate, a case this machine or the training backend cannot run.
void check_runnable(const CaseRequest& request, const spec::ModelSpec& s) {
  const spec::Case& c = request.c;
  if (!request.fault.empty()) (void)fault::parse(request.fault);
  s.validate();
  check_launchable_here(s.name, c);
  const std::string unsupported = TrainingBackendRegistry::instance()
                                      .make(request.training_backend)
                                      ->unsupported(c.config, c.save_config.has_value());
  MIH_CHECK(unsupported.empty(), "training backend '", request.training_backend, "' cannot run case ", s.name, "/",
            c.name, ": ", unsupported);
  if (const std::string w = local_launch_warning(s.name, c); !w.empty()) std::fprintf(stderr, "%s\n", w.c_str());
}

// One phase's ranks through the launcher (how each started into the record's `started_by`, its
// time into its seconds).
LaunchResult launch_phase(const CaseRequest& q, const CasePhase& phase, CaseRunResult& result) {
  WorkerOptions w = case_rank_options(q, result.evidence, phase.name);
  w.gloo_hostname = "127.0.0.1";
  // The launcher's timeout ends the launch here (a transport failure it reports), not the
  // rank's watchdog.
  w.case_timeout = std::chrono::milliseconds(0);
  LaunchOptions lo;
  lo.world_size = phase.world_size;
  lo.run_dir = w.run_dir;
  lo.timeout = q.case_timeout;
  lo.extra_env["MIH_FAULT"] = "";  // --fault on the rank command line; no MIH_FAULT leaks in from here
  lo.command = case_rank_arguments(w, result.evidence, phase.name);
  lo.command.insert(lo.command.begin(), self_executable().string());
  const LaunchResult r = launch(lo);
  for (const auto& rank : r.ranks) result.started_by[phase.name].push_back(rank.started_by);
  result.seconds += r.seconds;
  result.launch_seconds.push_back(r.seconds);
  return r;
}

// The case's outcome from its launch and the state its session recorded.
void judge_launch(const LaunchResult& r, IntegrationState state, const std::string& reason, CaseRunResult& result) {
  if (r.ok()) {
    result.outcome = Outcome::kRan;
  } else if (r.status == LaunchResult::Status::kInterrupted) {
    // This process was asked to stop (SIGINT, SIGTERM): no verdict, relaunched on a rerun.
    result.outcome = Outcome::kInterrupted;
    result.error = r.report();
    result.code = Code::kAborted;
  } else if (const auto failed = init_from_failure(result.evidence)) {
    // The checkpoint changed or became unreadable after it was checked: no verdict on the model.
    result.outcome = Outcome::kNotRun;
    result.error = "the port could not be initialized from checkpoint " + failed->checkpoint + ": " + failed->error;
    result.code = failed->code == code_name(Code::kInvalidSpec) ? Code::kInvalidSpec : Code::kFailedPrecondition;
  } else if (const std::string why = environment_failure(r); !why.empty()) {
    // A full or read-only disk under the evidence: the environment, never a model failure.
    result.outcome = Outcome::kEnvironmentFailure;
    result.error = why + "\n" + r.report();
    result.code = Code::kFailedPrecondition;
  } else if (infrastructure_failure(r)) {
    // Whatever the session wrote: a rank that died, hung or lost its peers gives no verdict.
    result.outcome = Outcome::kTransportFailure;
    result.error = r.report();
    result.code = r.code() == Code::kOk ? Code::kAborted : r.code();
  } else if (state == IntegrationState::kFailed && !reason.empty()) {
    // A hook or the model raised on some rank and the session recorded it: a conformance
    // failure with its reason, the launch report kept for the logs.
    result.outcome = Outcome::kFailed;
    result.error = reason;
  } else {
    result.outcome = Outcome::kTransportFailure;
    result.error = r.report();
    result.code = r.code();
  }
}

// Rank 0's time by kind, over the phases: process start, rendezvous, training (build and steps
// less the session's checks), checks (the session's, and the end of the run), and the rest of
// the launch wall time (spawn, teardown, the launcher's waits).
CaseTiming rank0_timing(const fs::path& evidence, double seconds) {
  CaseTiming timing;
  std::error_code ec;
  for (const char* phase : kCasePhases) {
    const fs::path file = evidence / layout::run_phase_dir(phase) / layout::timing_rank(0);
    if (!fs::exists(file, ec)) continue;  // a phase the case has not, or one its rank 0 did not end
    const contract::RankTiming rank0 = contract::read_rank_timing(file);
    timing.process_start_s += rank0.process_start_s;
    timing.rendezvous_s += rank0.rendezvous_s;
    timing.training_s += rank0.build_s + rank0.steps_s - rank0.session_s;
    timing.checks_s += rank0.session_s + rank0.end_s;
  }
  timing.other_s = seconds - timing.process_start_s - timing.rendezvous_s - timing.training_s - timing.checks_s;
  return timing;
}

}  // namespace

void link_case_task();  // case_rank.cpp: the ranks' `case` task is linked wherever run_case is

CaseRunResult run_case(const CaseRequest& request, const CaseRunOptions& o) {
  link_case_task();
  const spec::ModelSpec& s = spec::SpecRegistry::instance().get(request.spec);
  const spec::Case& c = request.c;
  check_runnable(request, s);
  const CaseRequest q = completed(s, request);
  std::optional<CaseLock> lock;
  if (!o.lock_held) lock.emplace(layout::case_lock(o.evidence_root, s.name, c.name), false, s.name + "/" + c.name);
  CaseRunResult result;
  static_cast<CaseRecord&>(result) = record_of(q);
  result.evidence = write_request(q, o.evidence_root);
  EvidenceDir dir(result.evidence);
  LaunchResult r;
  for (const CasePhase& phase : case_phases(c)) {
    r = launch_phase(q, phase, result);
    if (!r.ok()) break;  // a resume loads only what its save wrote
  }
  // The state the session left (the one reader of integration_state.json; no record yet).
  const CaseState left = read_case_state(result.evidence);
  result.state = left.state.empty() ? "NONE" : left.state;
  judge_launch(r, left.state.empty() ? IntegrationState::kDiscovered : parse_state(left.state), left.reason, result);
  if (!q.fault.empty()) {
    result.fault_reached = fault_reached(result.evidence);
    if (result.outcome == Outcome::kRan && !*result.fault_reached) {
      // Every test of this case would pass on the correct code it ran: a green that lies.
      result.outcome = Outcome::kFaultNotReached;
      result.error = fault_not_reached_message(s, c, q.fault);
      result.code = Code::kInvalidSpec;
    }
  }
  result.timing = rank0_timing(result.evidence, result.seconds);
  result.files = evidence_digests(result.evidence);
  dir.write_json(layout::kCaseRecord, nlohmann::json(static_cast<const CaseRecord&>(result)));
  return result;
}

WorkerOptions case_rank_options(const CaseRequest& q, const fs::path& evidence, const std::string& phase) {
  WorkerOptions w;
  w.run_dir = evidence / layout::run_phase_dir(phase);
  w.pg_backend = compat::parse_backend(q.c.pg_backend);
  // Derived from the case timeout by default: a hung peer is the launch's timeout to report.
  w.collective_timeout = q.collective_timeout.count() > 0 ? q.collective_timeout : q.case_timeout;
  w.case_timeout = q.case_timeout;
  w.fault = q.fault;
  return w;
}

std::vector<std::string> case_rank_arguments(const WorkerOptions& w, const fs::path& evidence, const std::string& phase) {
  std::vector<std::string> args = {"worker"};
  const std::vector<std::string> options = w.to_args();
  args.insert(args.end(), options.begin(), options.end());
  args.insert(args.end(), {"case", "--evidence", evidence.string(), "--phase", phase});
  return args;
}

std::string case_rank_shell_line(const WorkerOptions& w, const fs::path& evidence, const std::string& phase) {
  std::string line;
  for (const std::string& arg : case_rank_arguments(w, evidence, phase)) line += (line.empty() ? "" : " ") + shell_quote(arg);
  return line;
}

}  // namespace mih::cases
