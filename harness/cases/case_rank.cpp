// The rank side of a conformance case: the `case` worker task each rank process runs
// (`mih worker ... case --evidence DIR --phase train|save|load`), reading run/case.json (never
// the matrix) and training the spec's model under the case's config with a runtime validation
// session that writes the case's evidence (see case_runner.h).
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
#include "harness/contract/evidence_layout.h"
#include "harness/base/fault.h"
#include "harness/base/files.h"
#include "harness/base/json_fields.h"
#include "harness/base/process_stat.h"
#include "harness/base/sha256.h"
#include "harness/cases/faults.h"
#include "harness/cases/hf_interop.h"
#include "harness/compat/collectives.h"
#include "harness/compat/optim.h"
#include "harness/evidence/evidence_store.h"
#include "harness/runtime/communicator.h"
#include "harness/runtime/launcher.h"
#include "harness/runtime/rendezvous.h"
#include "harness/runtime/worker.h"
#include "harness/session/backend.h"
#include "harness/session/session.h"
#include "harness/spec/case_matrix.h"
#include "harness/spec/case_trainer.h"

namespace mih::cases {
namespace {

namespace fs = std::filesystem;

// SHA-256 of the full value of every parameter and optimizer state (float64 bytes, row-major),
// gathered through the backend: the same under every sharding, so a checkpoint that loads
// bit-exact under another config gives the same hashes. A collective; rank 0 writes.
nlohmann::json tensor_hashes(TrainingBackend& backend) {
  nlohmann::json out = nlohmann::json::object();
  TrainingState st = backend.state();
  for (const auto& p : st.context->parameters()) {
    if (!p->pp_counted) continue;  // a copy tied across pipeline stages: its first stage's
    std::vector<std::string> whats = {"param"};
    if (p->local.requires_grad()) {
      for (const std::string& s : compat::state_names(*st.optimizer)) whats.push_back(s);
    }
    for (const std::string& what : whats) {
      const at::Tensor full = backend.gather_full(*p, what);
      if (!full.defined()) continue;
      const at::Tensor flat = full.detach().to(at::kCPU, at::kDouble).contiguous();
      const std::string_view bytes(static_cast<const char*>(flat.data_ptr()), flat.numel() * sizeof(double));
      out[what == "param" ? p->fqn : p->fqn + "/" + what] = {{"sha256", sha256_hex(bytes)},
                                                                           {"shape", full.sizes().vec()}};
    }
  }
  // Under pp each stage hashed its own parameters: every stage's (a collective over pp).
  DeviceMesh& mesh = st.context->mesh();
  if (mesh.config().pp > 1) {
    nlohmann::json every = nlohmann::json::object();
    for (const auto& stage : all_gather_json(mesh.comm(MeshAxis::kPp), out, st.context->device(), "mih.case.tensor_hashes")) {
      every.update(stage);
    }
    out = std::move(every);
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

// Seconds since this process was exec'd: the cost of starting a rank (loading libtorch)
// before run_phase runs. -1 if unreadable.
double seconds_since_exec() { return process_age_seconds().value_or(-1); }

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

// The phase asked for must be one of the case's, and the rank must inject the request's fault.
void check_phase(const CaseRequest& file, const std::string& phase) {
  const spec::Case& c = file.c;
  // The fault this rank injects is the request's (a local launch passes it as --fault; the
  // rank command `mih run --prepare` prints carries it too): a rank started without it would
  // run the correct code under a request that says otherwise.
  const std::string running = fault::name(fault::current());
  MIH_CHECK(running == file.fault, "case ", file.spec, "/", c.name, ": its request (", layout::kCaseRequest,
            ") injects fault '", file.fault, "' but this rank runs with '", running,
            "': start every rank with the command `mih run --prepare` printed (its --fault)");
  MIH_CHECK(std::find(kCasePhases.begin(), kCasePhases.end(), phase) != kCasePhases.end(), "case phase '", phase,
            "': use train, save or load");
  const std::vector<CasePhase> phases = case_phases(c);
  MIH_CHECK(std::any_of(phases.begin(), phases.end(), [&](const CasePhase& p) { return p.name == phase; }), "case '",
            c.name, "' (", spec::case_kind_name(c.kind), ") has ",
            phases.size() == 1 ? "the one phase " + phases[0].name : "the phases " + phases[0].name + " and " + phases[1].name,
            ", not '", phase, "' (`mih run --prepare` prints the rank command of each phase)");
}

// The validation session of the phase: where its evidence goes, its steps, the trainer on this
// rank's device, where its weights come from and the environment it records.
SessionOptions phase_session(WorkerContext& ctx, const CaseRequest& file, const spec::ModelSpec& s,
                             const std::string& phase, const ParallelConfig& config, const DeviceMesh& mesh) {
  const spec::Case& c = file.c;
  const fs::path evidence = ctx.option("evidence");
  SessionOptions so;
  so.mode = SessionMode::kRuntime;
  so.evidence_dir = phase == "save" ? evidence / layout::kBeforeSave : evidence;
  so.config = config;
  so.last_step = (phase == "save" ? c.resume_at : c.steps) - 1;
  // A resume's load phase continues the save phase's run (the run-level gradient check).
  if (phase == "load") so.continues_evidence = evidence / layout::kBeforeSave;
  so.run_continues = phase == "save";
  so.trainer = spec::with_case_trainer(s.data.apply_sharding(s.trainer).frozen(s.frozen), c.trainer);
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
    so.weights_loaded_from = "the resume checkpoint " + (evidence / layout::kCheckpointDir).string();
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
  return so;
}

// The port's weights from the request's checkpoint. The parent checked it before any rank
// started: failing here means its files changed or became unreadable since, input or
// environment, not the model's failure; the rank's record (run_case reads it) says so.
size_t load_init_from(const CaseRequest& file, const spec::ModelSpec& s, const fs::path& evidence,
                      const std::string& phase, int rank, TrainingBackend& backend, bool* failed) {
  try {
    return load_hf_weights(s, file.init_from, *backend.state().context, file.init_from_sha256);
  } catch (const Error& e) {
    *failed = true;
    EvidenceDir(evidence / layout::run_phase_dir(phase))
        .write_json(layout::init_from_failed_rank(rank),
                    {{"checkpoint", file.init_from}, {"code", code_name(e.code())}, {"error", e.what()}});
    throw;
  }
}

// What one phase trains: the backend built, its weights loaded (the request's checkpoint, or the
// resume's), its steps run and a save's checkpoint written; each part's time into `timing`, `t`
// the start of the last. An error fails the case unless it is the transport's (a peer that died,
// a collective past its timeout: infrastructure) or the checkpoint's (recorded above).
void train_phase(const CaseRequest& file, const spec::ModelSpec& s, const std::string& phase, const fs::path& evidence,
                 const ParallelConfig& config, DeviceMesh& mesh, const SessionOptions& so, ValidationSession& session,
                 nlohmann::json& timing, std::chrono::steady_clock::time_point& t) {
  const spec::Case& c = file.c;
  const bool rank0 = mesh.rank() == 0;
  bool init_failed = false;
  try {
    std::unique_ptr<TrainingBackend> backend = TrainingBackendRegistry::instance().make(file.training_backend);
    t = std::chrono::steady_clock::now();
    backend->build(s, mesh, config, so.trainer, session);
    timing["build_s"] = since(t);
    if (!file.init_from.empty() && phase != "load") {
      t = std::chrono::steady_clock::now();
      const size_t loaded = load_init_from(file, s, evidence, phase, mesh.rank(), *backend, &init_failed);
      timing["init_from_s"] = since(t);
      timing["init_from_parameters"] = loaded;
      session.weights_loaded();
    }
    if (phase == "load") {
      backend->load(evidence / layout::kCheckpointDir);
      session.weights_loaded();
      nlohmann::json hashes = tensor_hashes(*backend);
      hashes["comm_bytes"] = session.take_comm_bytes();  // the gathers are no step's traffic
      if (rank0) EvidenceDir(evidence).write_json(layout::kRoundtripLoad, hashes);
    }
    const int64_t steps = phase == "save" ? c.resume_at : phase == "load" ? c.steps - c.resume_at : c.steps;
    t = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < steps; ++i) backend->step();
    timing["steps_s"] = since(t);
    t = std::chrono::steady_clock::now();
    if (phase == "save") {
      backend->save(evidence / layout::kCheckpointDir);
      const nlohmann::json hashes = tensor_hashes(*backend);
      if (rank0) EvidenceDir(evidence).write_json(layout::before_save(layout::kRoundtripSave), hashes);
    }
  } catch (const Error& e) {
    if (!init_failed && e.code() != Code::kUnavailable && e.code() != Code::kDeadlineExceeded) {
      session.fail_case(std::string("training raised: ") + e.what());
    }
    throw;
  } catch (const std::exception& e) {
    session.fail_case(std::string("training raised: ") + e.what());
    throw;
  }
}

// The phase's end: the Reference's module parity, the session's findings, this rank's timing
// and whether it ran the fault's code (run_case reads it: a fault no rank reached is bad
// input, not a pass).
void finish_phase(const CaseRequest& file, const spec::ModelSpec& s, const std::string& phase, const fs::path& evidence,
                  const DeviceMesh& mesh, ValidationSession& session, nlohmann::json& timing,
                  std::chrono::steady_clock::time_point t) {
  if (file.c.kind == spec::CaseKind::kReference && mesh.rank() == 0 && !s.parity_cases.empty()) {
    EvidenceDir(evidence).write_json(layout::kModuleParity, module_parity_evidence(s));
  }
  session.finish();
  timing["end_s"] = since(t);
  double session_s = 0;  // the checks and probes inside build and steps
  for (const auto& row : session.metrics()) session_s += row.at("session_ms").get<double>() / 1e3;  // every step has it
  timing["session_s"] = session_s;
  EvidenceDir run_dir(evidence / layout::run_phase_dir(phase));
  run_dir.write_json(layout::timing_rank(mesh.rank()), timing);
  if (!file.fault.empty()) {
    run_dir.write_json(layout::fault_rank(mesh.rank()),
                       {{"fault", file.fault}, {"reached", fault::reached()}});
  }
}

// One phase of a case on this rank: "train" (the whole case), "save" (a resume's first
// resume_at steps, then the checkpoint) or "load" (the checkpoint, then the other steps).
int run_phase(WorkerContext& ctx) {
  fault::check_environment();  // a MIH_FAULT that names no fault is an error, not a fault-free run
  const fs::path evidence = ctx.option("evidence");
  // The case as the parent resolved it: the matrix is never read again here.
  const CaseRequest file = read_case_request(evidence / layout::kCaseRequest);
  // case.json says whether the port starts from a checkpoint (the parent resolved the spec's
  // init_from and --init-from); that checkpoint is then the source the key map is checked on.
  const spec::ModelSpec s = spec::initialized_from(spec::SpecRegistry::instance().get(file.spec), file.init_from);
  const std::string phase = ctx.option("phase");
  check_phase(file, phase);
  const ParallelConfig config = phase == "save" ? *file.c.save_config : file.c.config;
  // Where this rank's time goes (run/<phase>/timing_rank<r>.json; the runner sums rank 0's
  // into case_run.json): process start, rendezvous, model build with the attach checks,
  // steps, and the end (checkpoint hashes, parity cases, findings).
  nlohmann::json timing = {{"process_start_s", seconds_since_exec()}};
  auto t = std::chrono::steady_clock::now();
  DeviceMesh mesh = ctx.build_mesh(config);
  timing["rendezvous_s"] = since(t);
  const SessionOptions so = phase_session(ctx, file, s, phase, config, mesh);
  ValidationSession session(s, so, mesh);
  train_phase(file, s, phase, evidence, config, mesh, so, session, timing, t);
  finish_phase(file, s, phase, evidence, mesh, session, timing, t);
  return 0;
}

MIH_WORKER_TASK(case,
                "trains one phase of a conformance case with a runtime validation session; the case is "
                "<evidence>/run/case.json, written by the parent (mih run, mih test)",
                {"evidence", "the case's evidence directory (holds run/case.json)", ""},
                {"phase", "train, save or load", "train"}) {
  return run_phase(ctx);
}

}  // namespace

// Referenced by run_case (case_runner.cpp): linking the parent side links this task.
void link_case_task() {}

}  // namespace mih::cases
