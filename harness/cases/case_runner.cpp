// The case runner and its worker task (see case_runner.h). The task is defined here, next to
// run_case, so that linking run_case links the registration too.
#include "harness/cases/case_runner.h"

#include <fcntl.h>
#include <sys/file.h>
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
#include <sstream>

#include <nlohmann/json.hpp>

#include "harness/base/error.h"
#include "harness/base/fault.h"
#include "harness/base/files.h"
#include "harness/base/json_fields.h"
#include "harness/base/sha256.h"
#include "harness/cases/faults.h"
#include "harness/cases/hf_interop.h"
#include "harness/compat/collectives.h"
#include "harness/evidence/evidence_store.h"
#include "harness/runtime/launcher.h"
#include "harness/runtime/rendezvous.h"
#include "harness/runtime/worker.h"
#include "harness/session/backend.h"
#include "harness/session/session.h"
#include "harness/spec/case_matrix.h"

namespace mih::cases {
namespace {

namespace fs = std::filesystem;

// SHA-256 of the full value of every parameter and AdamW state (float64 bytes, row-major),
// gathered through the backend: the same under every sharding, so a checkpoint that loads
// bit-exact under another config gives the same hashes. A collective; rank 0 writes.
nlohmann::json tensor_hashes(TrainingBackend& backend) {
  nlohmann::json out = nlohmann::json::object();
  TrainingState st = backend.state();
  for (const auto& p : st.context->parameters()) {
    for (const char* what : {"param", "exp_avg", "exp_avg_sq"}) {
      if (std::string(what) != "param" && !p->local.requires_grad()) continue;
      const at::Tensor full = backend.gather_full(*p, what);
      if (!full.defined()) continue;
      const at::Tensor flat = full.detach().to(at::kCPU, at::kDouble).contiguous();
      const std::string_view bytes(static_cast<const char*>(flat.data_ptr()), flat.numel() * sizeof(double));
      out[std::string(what) == "param" ? p->fqn : p->fqn + "/" + what] = {{"sha256", sha256_hex(bytes)},
                                                                           {"shape", full.sizes().vec()}};
    }
  }
  return {{"tensors", out}, {"next_step", backend.next_step()}};
}

// The spec's module parity cases (on the reference case's rank): check/module_parity.json,
// one object per case (spec::ModuleParityResult::to_json).
nlohmann::json module_parity_evidence(const spec::ModelSpec& s) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& pc : s.parity_cases) out[pc.name] = spec::run_module_parity(pc).to_json();
  return out;
}

// Seconds since this process was exec'd (/proc/self/stat starttime against the uptime):
// the cost of starting a rank (loading libtorch) before run_phase runs. -1 if unreadable.
double seconds_since_exec() {
  std::ifstream stat("/proc/self/stat"), uptime("/proc/uptime");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const auto close = text.rfind(')');
  double up = 0;
  if (close == std::string::npos || !(uptime >> up)) return -1;
  std::istringstream rest(text.substr(close + 2));
  std::string field;
  for (int i = 3; i < 22 && rest >> field; ++i) {
  }
  unsigned long long start_ticks = 0;
  if (!(rest >> start_ticks)) return -1;
  return up - static_cast<double>(start_ticks) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

// Who started this rank, for environment.json: "mih" (its local launcher), "mih --launcher"
// (a command template: srun, mpirun ... started it), "torchrun" (its agent's variables),
// "env" (RANK/WORLD_SIZE set by hand or a script), "slurm", "openmpi", "single-process".
std::string launcher_of(const World& world, const Env& env) {
  if (find_env(env, kLauncherPidVar)) return "mih";
  if (find_env(env, kLauncherStoreVar)) return "mih --launcher";
  if (world.source == LaunchSource::kTorchrun) {
    return find_env(env, "TORCHELASTIC_RUN_ID") || find_env(env, kAgentStoreVar) ? "torchrun" : "env";
  }
  return std::string(launch_source_name(world.source));
}

double since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// One phase of a case on this rank: "train" (the whole case), "save" (a resume's first
// resume_at steps, then the checkpoint) or "load" (the checkpoint, then the other steps).
int run_phase(WorkerContext& ctx) {
  fault::check_environment();  // a MIH_FAULT that names no fault is an error, not a fault-free run
  const fs::path evidence = ctx.option("evidence");
  // The case as the parent resolved it: the matrix is never read again here.
  const CaseFile file = read_case_file(evidence / "run" / "case.json");
  // case.json says whether the port starts from a checkpoint (the parent resolved the spec's
  // init_from and --init-from); that checkpoint is then the source the key map is checked on.
  const spec::ModelSpec s = spec::initialized_from(spec::SpecRegistry::instance().get(file.spec), file.init_from);
  const spec::Case& c = file.c;
  const std::string phase = ctx.option("phase");
  MIH_CHECK(phase == "train" || phase == "save" || phase == "load", "case phase '", phase, "': use train, save or load");
  MIH_CHECK(phase == "train" ? !c.save_config.has_value() : c.save_config.has_value(), "case '", c.name, "' (",
            spec::case_kind_name(c.kind), ") has ", c.save_config ? "the phases save and load" : "the one phase train",
            ", not '", phase, "' (`mih run --prepare` prints the rank command of each phase)");
  const ParallelConfig config = phase == "save" ? *c.save_config : c.config;
  // Where this rank's time goes (run/<phase>/timing_rank<r>.json; the runner sums rank 0's
  // into case_run.json): process start, rendezvous, model build with the attach checks,
  // steps, and the end (checkpoint hashes, parity cases, findings).
  nlohmann::json timing = {{"process_start_s", seconds_since_exec()}};
  auto t = std::chrono::steady_clock::now();
  DeviceMesh mesh = ctx.build_mesh(config);
  timing["rendezvous_s"] = since(t);
  SessionOptions so;
  so.mode = SessionMode::kRuntime;
  so.evidence_dir = phase == "save" ? evidence / "before_save" : evidence;
  so.config = config;
  so.last_step = (phase == "save" ? c.resume_at : c.steps) - 1;
  // A resume's load phase continues the save phase's run (the run-level gradient check).
  if (phase == "load") so.continues_evidence = evidence / "before_save";
  so.run_continues = phase == "save";
  so.trainer = s.data.apply_sharding(s.trainer).frozen(s.frozen);
  c10::Device device(c10::DeviceType::CPU);
  if (c.device == "cuda") {
    // One GPU per rank, the one the NCCL group was built on (WorkerContext::build_mesh): the
    // local rank (LOCAL_RANK from mih's launcher or torchrun, SLURM_LOCALID under srun).
    device = c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(ctx.world().local_rank));
  }
  so.trainer.device(device);
  // Weights set after the build are what the materialization invariants must examine.
  if (!file.init_from.empty() && phase != "load") {
    so.weights_loaded_from = "checkpoint " + file.init_from +
                             (file.init_from_sha256.empty() ? "" : " (SHA-256 " + file.init_from_sha256.substr(0, 16) + "...)");
  } else if (phase == "load") {
    so.weights_loaded_from = "the resume checkpoint " + (evidence / "checkpoint").string();
  }
  so.environment = {{"case", c},
                    {"phase", phase},
                    {"matrix", file.matrix},
                    {"pg_backend", c.pg_backend},
                    {"training_backend", file.training_backend},
                    {"init_from", file.init_from.empty() ? nlohmann::json() : nlohmann::json(file.init_from)},
                    {"launcher", launcher_of(ctx.world(), process_env())},
                    {"run_id", ctx.world().run_id.empty() ? nlohmann::json() : nlohmann::json(ctx.world().run_id)}};
  if (mesh.rank() == 0) so.environment["ranks"] = join_records(ctx.store(), mesh.world_size());
  ValidationSession session(s, so, mesh);
  const bool rank0 = mesh.rank() == 0;
  bool init_failed = false;
  try {
    std::unique_ptr<TrainingBackend> backend = TrainingBackendRegistry::instance().make(file.training_backend);
    t = std::chrono::steady_clock::now();
    backend->build(s, mesh, config, so.trainer, session);
    timing["build_s"] = since(t);
    if (!file.init_from.empty() && phase != "load") {
      t = std::chrono::steady_clock::now();
      size_t loaded = 0;
      try {
        loaded = load_hf_weights(s, file.init_from, *backend->state().context, file.init_from_sha256);
      } catch (const Error& e) {
        // The parent checked this checkpoint before any rank started: failing here means its
        // files changed or became unreadable since. Input or environment, not the model's
        // failure; run_case reads this record.
        init_failed = true;
        EvidenceDir(evidence / "run" / phase)
            .write_json("init_from_failed_rank" + std::to_string(mesh.rank()) + ".json",
                        {{"checkpoint", file.init_from}, {"code", code_name(e.code())}, {"error", e.what()}});
        throw;
      }
      timing["init_from_s"] = since(t);
      timing["init_from_parameters"] = loaded;
      session.weights_loaded();
    }
    if (phase == "load") {
      backend->load(evidence / "checkpoint");
      session.weights_loaded();
      nlohmann::json hashes = tensor_hashes(*backend);
      hashes["comm_bytes"] = session.take_comm_bytes();  // the gathers are no step's traffic
      if (rank0) EvidenceDir(evidence).write_json("checkpoint/roundtrip_load.json", hashes);
    }
    const int64_t steps = phase == "save" ? c.resume_at : phase == "load" ? c.steps - c.resume_at : c.steps;
    t = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < steps; ++i) backend->step();
    timing["steps_s"] = since(t);
    t = std::chrono::steady_clock::now();
    if (phase == "save") {
      backend->save(evidence / "checkpoint");
      const nlohmann::json hashes = tensor_hashes(*backend);
      if (rank0) EvidenceDir(evidence).write_json("before_save/checkpoint/roundtrip_save.json", hashes);
    }
  } catch (const Error& e) {
    // A peer that died or a collective past its timeout is the transport's failure: the
    // launcher reports it as infrastructure; the case is not FAILED on the model's account.
    // Nor is a checkpoint that could not be loaded (recorded above).
    if (!init_failed && e.code() != Code::kUnavailable && e.code() != Code::kDeadlineExceeded) {
      session.fail_case(std::string("training raised: ") + e.what());
    }
    throw;
  } catch (const std::exception& e) {
    session.fail_case(std::string("training raised: ") + e.what());
    throw;
  }
  if (c.kind == spec::CaseKind::kReference && rank0 && !s.parity_cases.empty()) {
    EvidenceDir(evidence).write_json("check/module_parity.json", module_parity_evidence(s));
  }
  session.finish();
  timing["end_s"] = since(t);
  double session_s = 0;  // the checks and probes inside build and steps
  for (const auto& row : session.metrics()) session_s += row.value("session_ms", 0.0) / 1e3;
  timing["session_s"] = session_s;
  EvidenceDir run_dir(evidence / "run" / phase);
  run_dir.write_json("timing_rank" + std::to_string(mesh.rank()) + ".json", timing);
  // Whether this rank ran the fault's code (run_case reads it: a fault no rank reached is
  // bad input, not a pass).
  if (!file.fault.empty()) {
    run_dir.write_json("fault_rank" + std::to_string(mesh.rank()) + ".json",
                       {{"fault", file.fault}, {"reached", fault::reached()}});
  }
  return 0;
}

MIH_WORKER_TASK(case,
                "trains one phase of a conformance case with a runtime validation session; the case is "
                "<evidence>/run/case.json, written by the parent (mih run, mih test)",
                {"evidence", "the case's evidence directory (holds run/case.json)", ""},
                {"phase", "train, save or load", "train"}) {
  return run_phase(ctx);
}

nlohmann::json case_file_json(const CaseFile& f) {
  nlohmann::json j;
  to_json(j, f);
  return j;
}

}  // namespace

fs::path prepare_case(const spec::ModelSpec& s, const spec::Case& c, const CaseRunOptions& o) {
  const fs::path evidence = fs::absolute(o.evidence_root / s.name / c.name);
  fs::remove_all(evidence);
  EvidenceDir dir(evidence);  // fails early, naming the path, when it is unwritable
  // The one resolved copy of the case every rank reads.
  dir.write_json("run/case.json",
                 case_file_json({s.name, c, o.matrix, o.training_backend, o.fault,
                                 o.init_from.empty() ? std::string() : fs::absolute(o.init_from).string(),
                                 o.init_from_sha256}));
  return evidence;
}

void to_json(nlohmann::json& j, const CaseFile& f) {
  j = {{"spec", f.spec},
       {"case", f.c},
       {"matrix", f.matrix},
       {"training_backend", f.training_backend},
       {"fault", f.fault},
       {"init_from", f.init_from},
       {"init_from_sha256", f.init_from_sha256}};
}

CaseFile read_case_file(const fs::path& path) {
  std::string text;
  MIH_CHECK_CODE(read_file(path, &text), Code::kFailedPrecondition, "case file ", path.string(),
                 " is missing: the parent (mih run, mih test) writes it before any rank starts; launch the case "
                 "with `mih run`, or write it as case_runner.h describes");
  const nlohmann::json j = parse_json_lenient(text);
  MIH_CHECK_CODE(!j.is_discarded() && j.is_object(), Code::kFailedPrecondition, "case file ", path.string(),
                 " is not a JSON object");
  return with_context("case file " + path.string(), [&] {
    try {
      CaseFile f;
      f.spec = j.at("spec").get<std::string>();
      f.c = j.at("case").get<spec::Case>();
      f.matrix = j.at("matrix").get<std::string>();
      f.training_backend = j.at("training_backend").get<std::string>();
      f.fault = j.at("fault").get<std::string>();
      f.init_from = j.value("init_from", std::string());
      f.init_from_sha256 = j.value("init_from_sha256", std::string());
      return f;
    } catch (const nlohmann::json::exception& e) {
      MIH_THROW(Code::kFailedPrecondition, e.what());
    }
  });
}

namespace {

// SHA-256 of every evidence file of the case (relative path -> digest), case_run.json aside:
// what a later run checks before it reuses the case (memo.cpp).
nlohmann::json evidence_digests(const fs::path& dir) {
  nlohmann::json out = nlohmann::json::object();
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    if (!it->is_regular_file(ec)) continue;
    const std::string relative = fs::relative(it->path(), dir, ec).string();
    // Not the run's: case_run.json is this record, and integration_state.json is advanced
    // by the verdicts after the run (validated once every suite passed).
    if (relative == "case_run.json" || relative == "integration_state.json") continue;
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

// A rank that could not initialize the port from the case's checkpoint (run_phase's
// init_from_failed_rank<r>.json): the first such record of any phase, or null.
nlohmann::json init_from_failure(const fs::path& evidence) {
  std::error_code ec;
  for (const char* phase : {"train", "save"}) {
    std::vector<fs::path> records;
    for (auto it = fs::directory_iterator(evidence / "run" / phase, ec); !ec && it != fs::directory_iterator();
         it.increment(ec)) {
      if (it->path().filename().string().rfind("init_from_failed_rank", 0) == 0) records.push_back(it->path());
    }
    ec.clear();
    std::sort(records.begin(), records.end());
    for (const auto& record : records) {
      std::string text;
      if (!read_file(record, &text)) continue;
      nlohmann::json j = parse_json_lenient(text);
      if (j.is_object()) return j;
    }
  }
  return nullptr;
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
  std::error_code ec;
  fs::create_directories(file.parent_path(), ec);
  MIH_CHECK_CODE(!ec, Code::kFailedPrecondition, "cannot create ", file.parent_path().string(), ": ", ec.message(),
                 "; is the evidence root writable?");
  fd_ = ::open(file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  MIH_CHECK_CODE(fd_ >= 0, Code::kFailedPrecondition, "cannot open the case lock ", file.string(), ": ",
                 std::strerror(errno), "; is the evidence root writable?");
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
  for (const char* phase : {"train", "save", "load"}) {
    const fs::path dir = evidence / "run" / phase;
    if (!fs::is_directory(dir, ec)) continue;
    for (const auto& entry : fs::directory_iterator(dir, ec)) {
      const std::string name = entry.path().filename().string();
      if (name.rfind("fault_rank", 0) != 0) continue;
      std::string text;
      if (!read_file(entry.path(), &text)) continue;
      const nlohmann::json j = parse_json_lenient(text);
      if (j.is_object() && j.value("reached", false)) return true;
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

}  // namespace

CaseRunResult run_case(const spec::ModelSpec& s, const spec::Case& c, const CaseRunOptions& given) {
  // Bad input is rejected here, before any rank starts.
  CaseRunOptions o = given;
  if (!o.fault.empty()) (void)fault::parse(o.fault);
  s.validate();
  check_launchable_here(s.name, c);
  const std::string unsupported =
      TrainingBackendRegistry::instance().make(o.training_backend)->unsupported(c.config, c.save_config.has_value());
  MIH_CHECK(unsupported.empty(), "training backend '", o.training_backend, "' cannot run case ", s.name, "/", c.name,
            ": ", unsupported);
  if (const std::string w = local_launch_warning(s.name, c); !w.empty()) std::fprintf(stderr, "%s\n", w.c_str());
  if (!o.init_from.empty() && o.init_from_sha256.empty()) {
    const InitSource checked = check_init_from(s, o.init_from);
    o.init_from = checked.dir;
    o.init_from_sha256 = checked.sha256;
  }
  std::optional<CaseLock> lock;
  if (!o.lock_held) lock.emplace(o.evidence_root / s.name / ("." + c.name + ".lock"), false, s.name + "/" + c.name);
  CaseRunResult result;
  result.evidence = prepare_case(s, c, o);
  EvidenceDir dir(result.evidence);
  nlohmann::json record = {{"spec", s.name},
                           {"case", c.name},
                           {"kind", spec::case_kind_name(c.kind)},
                           {"group", c.group},
                           {"world_size", c.world_size()},
                           {"config", c.config},
                           {"compare_to", c.compare_to},
                           {"matrix", o.matrix},
                           {"training_backend", o.training_backend},
                           {"fingerprint", o.fingerprint},
                           {"fault", o.fault},
                           {"init_from", o.init_from.empty() ? nlohmann::json() : nlohmann::json(o.init_from.string())},
                           {"init_from_sha256", o.init_from_sha256.empty() ? nlohmann::json()
                                                                           : nlohmann::json(o.init_from_sha256)}};
  nlohmann::json started_by = nlohmann::json::object();  // phase -> how each rank started (fork_server, exec)
  auto launch_phase = [&](const std::string& phase, int world_size) {
    WorkerOptions w;
    w.run_dir = result.evidence / "run" / phase;
    w.pg_backend = compat::parse_backend(c.pg_backend);
    w.gloo_hostname = "127.0.0.1";
    // Derived from the case timeout by default: a hung peer is the launcher's timeout to report.
    w.collective_timeout = o.collective_timeout.count() > 0 ? o.collective_timeout : o.timeout;
    LaunchOptions lo;
    lo.world_size = world_size;
    lo.run_dir = w.run_dir;
    lo.timeout = o.timeout;
    w.fault = o.fault;  // --fault on the rank command line; no MIH_FAULT leaks in from here
    lo.extra_env["MIH_FAULT"] = "";
    lo.command = worker_command("case", w, {"--evidence", result.evidence.string(), "--phase", phase});
    const LaunchResult r = launch(lo);
    for (const auto& rank : r.ranks) started_by[phase].push_back(rank.started_by);
    result.seconds += r.seconds;
    result.launch_seconds.push_back(r.seconds);
    return r;
  };
  LaunchResult r;
  if (c.save_config) {
    r = launch_phase("save", c.save_config->world_size());
    if (r.ok()) r = launch_phase("load", c.world_size());
  } else {
    r = launch_phase("train", c.world_size());
  }
  IntegrationState state = IntegrationState::kDiscovered;
  std::string reason;
  const IntegrationStateMachine machine(dir);
  if (machine.current(&state)) {
    result.state = state_name(state);
    reason = dir.read_json("integration_state.json").value("reason", "");
  } else {
    result.state = "NONE";
  }
  if (r.ok()) {
    result.outcome = Outcome::kRan;
  } else if (r.status == LaunchResult::Status::kInterrupted) {
    // This process was asked to stop (SIGINT, SIGTERM): no verdict, relaunched on a rerun.
    result.outcome = Outcome::kInterrupted;
    result.error = r.report();
    result.code = Code::kAborted;
  } else if (const nlohmann::json failed = init_from_failure(result.evidence); !failed.is_null()) {
    // The checkpoint changed or became unreadable after it was checked: no verdict on the model.
    result.outcome = Outcome::kNotRun;
    result.error = "the port could not be initialized from checkpoint " + failed.value("checkpoint", "") + ": " +
                   failed.value("error", "");
    result.code = failed.value("code", "") == code_name(Code::kInvalidSpec) ? Code::kInvalidSpec
                                                                            : Code::kFailedPrecondition;
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
  if (!o.fault.empty()) {
    const bool reached = fault_reached(result.evidence);
    record["fault_reached"] = reached;
    if (result.outcome == Outcome::kRan && !reached) {
      // Every test of this case would pass on the correct code it ran: a green that lies.
      result.outcome = Outcome::kFaultNotReached;
      result.error = fault_not_reached_message(s, c, o.fault);
      result.code = Code::kInvalidSpec;
    }
  }
  // Rank 0's time by kind, over the phases: process start, rendezvous, training (build and
  // steps less the session's checks), checks (the session's, and the end of the run), and
  // the rest of the launch wall time (spawn, teardown, the launcher's waits).
  nlohmann::json timing = {{"process_start_s", 0.0}, {"rendezvous_s", 0.0}, {"training_s", 0.0}, {"checks_s", 0.0}};
  for (const char* phase : {"train", "save", "load"}) {
    nlohmann::json rank0;
    std::string text;
    if (!read_file(result.evidence / "run" / phase / "timing_rank0.json", &text)) continue;
    rank0 = parse_json_lenient(text);
    if (rank0.is_discarded()) continue;
    timing["process_start_s"] = timing["process_start_s"].get<double>() + rank0.value("process_start_s", 0.0);
    timing["rendezvous_s"] = timing["rendezvous_s"].get<double>() + rank0.value("rendezvous_s", 0.0);
    timing["training_s"] = timing["training_s"].get<double>() + rank0.value("build_s", 0.0) +
                           rank0.value("steps_s", 0.0) - rank0.value("session_s", 0.0);
    timing["checks_s"] = timing["checks_s"].get<double>() + rank0.value("session_s", 0.0) + rank0.value("end_s", 0.0);
  }
  timing["other_s"] = result.seconds - timing["process_start_s"].get<double>() - timing["rendezvous_s"].get<double>() -
                      timing["training_s"].get<double>() - timing["checks_s"].get<double>();
  record.update({{"seconds", result.seconds},
                 {"timing", timing},
                 {"launch_seconds", result.launch_seconds},
                 {"started_by", started_by},
                 {"state", result.state},
                 {"outcome", outcome_name(result.outcome)},
                 {"error", result.error},
                 {"files", evidence_digests(result.evidence)}});
  dir.write_json("case_run.json", record);
  return result;
}

}  // namespace mih::cases
