// The case runner and its worker task (see case_runner.h). The task is defined here, next to
// run_case, so that linking run_case links the registration too.
#include "harness/cli/case_runner.h"

#include <nlohmann/json.hpp>

#include "harness/base/error.h"
#include "harness/base/files.h"
#include "harness/base/sha256.h"
#include "harness/evidence/evidence_store.h"
#include "harness/runtime/launcher.h"
#include "harness/runtime/worker.h"
#include "harness/session/backend.h"
#include "harness/session/session.h"
#include "harness/spec/case_matrix.h"

namespace mih {
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

// The spec's module parity cases (on the reference case's rank): check/module_parity.json.
nlohmann::json run_module_parity(const spec::ModelSpec& s) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& pc : s.parity_cases) {
    try {
      const spec::CheckResult r = pc.run();
      out[pc.name] = {{"passed", r.passed}, {"facts", r.facts}};
    } catch (const std::exception& e) {
      out[pc.name] = {{"passed", false}, {"facts", {{"error", e.what()}}}};
    }
  }
  return out;
}

// One phase of a case on this rank: "train" (the whole case), "save" (a resume's first
// resume_at steps, then the checkpoint) or "load" (the checkpoint, then the other steps).
int run_phase(WorkerContext& ctx) {
  const spec::ModelSpec s = spec::SpecRegistry::instance().get(ctx.option("spec"));
  const spec::CaseMatrix matrix = spec::resolve_matrix_source(s, ctx.option("matrix"));
  const spec::Case& c = matrix.at(ctx.option("case"));
  const std::string phase = ctx.option("phase");
  const fs::path evidence = ctx.option("evidence");
  MIH_CHECK(phase == "train" || phase == "save" || phase == "load", "case phase '", phase, "': use train, save or load");
  const ParallelConfig config = phase == "save" ? *c.save_config : c.config;
  DeviceMesh mesh = ctx.build_mesh(config.dims());
  SessionOptions so;
  so.mode = SessionMode::kRuntime;
  so.evidence_dir = phase == "save" ? evidence / "before_save" : evidence;
  so.config = config;
  so.trainer = s.data.apply_sharding(TrainerOptions());
  so.environment = {{"case", c}, {"phase", phase}, {"matrix", matrix.name}, {"backend", c.backend},
                    {"training_backend", ctx.option("backend")}};
  ValidationSession session(s, so, mesh);
  const bool rank0 = mesh.rank() == 0;
  try {
    std::unique_ptr<TrainingBackend> backend = BackendRegistry::instance().make(ctx.option("backend"));
    backend->build(s, mesh, config, so.trainer, session);
    if (phase == "load") {
      backend->load(evidence / "checkpoint");
      nlohmann::json hashes = tensor_hashes(*backend);
      hashes["comm_bytes"] = session.take_comm_bytes();  // the gathers are no step's traffic
      if (rank0) EvidenceDir(evidence).write_json("checkpoint/roundtrip_load.json", hashes);
    }
    const int64_t steps = phase == "save" ? c.resume_at : phase == "load" ? c.steps - c.resume_at : c.steps;
    for (int64_t i = 0; i < steps; ++i) backend->step();
    if (phase == "save") {
      backend->save(evidence / "checkpoint");
      const nlohmann::json hashes = tensor_hashes(*backend);
      if (rank0) EvidenceDir(evidence).write_json("before_save/checkpoint/roundtrip_save.json", hashes);
    }
  } catch (const std::exception& e) {
    session.fail_case(std::string("training raised: ") + e.what());
    throw;
  }
  if (c.kind == spec::CaseKind::kReference && rank0 && !s.parity_cases.empty()) {
    EvidenceDir(evidence).write_json("check/module_parity.json", run_module_parity(s));
  }
  session.finish();
  return 0;
}

MIH_WORKER_TASK(case, "trains one conformance case (spec, matrix, case, phase) with a runtime validation session",
                {"spec", "registered spec", ""}, {"matrix", "preset or JSON matrix file", "cpu-smoke"},
                {"case", "case name (see mih matrix)", ""}, {"phase", "train, save or load", "train"},
                {"evidence", "the case's evidence directory", ""},
                {"backend", "training backend (MIH_REGISTER_BACKEND)", "trainer"}) {
  return run_phase(ctx);
}

}  // namespace

CaseRunResult run_case(const CaseRunOptions& o) {
  // Bad input is rejected here, before any rank starts.
  const spec::ModelSpec s = spec::SpecRegistry::instance().get(o.spec);
  s.validate();
  const spec::CaseMatrix matrix = spec::resolve_matrix_source(s, o.matrix);
  const spec::Case& c = matrix.at(o.case_name);
  MIH_CHECK(c.device == "cpu", "case '", c.name, "' runs on ", c.device,
            "; the local launcher starts CPU cases; run GPU cases under torchrun or srun (README: the nightly "
            "matrix) and assert them with --verify-only");
  const std::string unsupported =
      BackendRegistry::instance().make(o.backend)->unsupported(c.config, c.save_config.has_value());
  MIH_CHECK(unsupported.empty(), "training backend '", o.backend, "' cannot run case ", s.name, "/", c.name, ": ",
            unsupported);
  CaseRunResult result;
  result.evidence = fs::absolute(o.evidence_root / s.name / c.name);
  fs::remove_all(result.evidence);
  EvidenceDir dir(result.evidence);  // fails early, naming the path, when it is unwritable
  nlohmann::json record = {{"spec", s.name},       {"case", c.name},         {"kind", spec::case_kind_name(c.kind)},
                           {"group", c.group},     {"world_size", c.world_size()}, {"config", c.config},
                           {"compare_to", c.compare_to}, {"matrix", o.matrix},   {"backend", o.backend},
                           {"fingerprint", o.fingerprint}};
  auto launch_phase = [&](const std::string& phase, int world_size) {
    WorkerOptions w;
    w.run_dir = result.evidence / "run" / phase;
    w.gloo_hostname = "127.0.0.1";
    LaunchOptions lo;
    lo.world_size = world_size;
    lo.run_dir = w.run_dir;
    lo.timeout = o.timeout;
    lo.command = worker_command("case", w,
                                {"--spec", s.name, "--matrix", o.matrix, "--case", c.name, "--phase", phase, "--evidence",
                                 result.evidence.string(), "--backend", o.backend});
    const LaunchResult r = launch(lo);
    result.seconds += r.seconds;
    result.launch_seconds.push_back(r.seconds);
    return r;
  };
  LaunchResult r;
  if (c.save_config) {
    r = launch_phase("save", c.save_config->dims().product());
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
    result.outcome = "ran";
  } else if (state == IntegrationState::kFailed && !reason.empty()) {
    // A hook or the model raised on some rank and the session recorded it: a conformance
    // failure with its reason, the launch report kept for the logs.
    result.outcome = "failed";
    result.error = reason;
  } else {
    result.outcome = "transport_failure";
    result.error = r.report();
    result.code = r.code();
  }
  record.update({{"seconds", result.seconds},
                 {"launch_seconds", result.launch_seconds},
                 {"state", result.state},
                 {"outcome", result.outcome},
                 {"error", result.error}});
  dir.write_json("case_run.json", record);
  return result;
}

}  // namespace mih
