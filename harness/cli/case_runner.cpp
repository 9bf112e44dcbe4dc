// The case runner and its worker task (see case_runner.h). The task is defined here, next to
// run_case, so that linking run_case links the registration too.
#include "harness/cli/case_runner.h"

#include <nlohmann/json.hpp>

#include "harness/base/error.h"
#include "harness/base/files.h"
#include "harness/evidence/evidence_store.h"
#include "harness/runtime/launcher.h"
#include "harness/runtime/worker.h"
#include "harness/session/session.h"
#include "harness/spec/case_matrix.h"

namespace mih {
namespace {

namespace fs = std::filesystem;

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
  so.environment = {{"case", c}, {"phase", phase}, {"matrix", matrix.name}, {"backend", c.backend}};
  ValidationSession session(s, so, mesh);
  try {
    Trainer trainer(mesh, config, s.factory, s.data.make_batches(), so.trainer, &session);
    if (phase == "load") trainer.load(evidence / "checkpoint");
    const int64_t steps = phase == "save" ? c.resume_at : phase == "load" ? c.steps - c.resume_at : c.steps;
    trainer.run(steps);
    if (phase == "save") trainer.save(evidence / "checkpoint");
  } catch (const std::exception& e) {
    session.fail_case(std::string("training raised: ") + e.what());
    throw;
  }
  session.finish();
  return 0;
}

MIH_WORKER_TASK(case, "trains one conformance case (spec, matrix, case, phase) with a runtime validation session",
                {"spec", "registered spec", ""}, {"matrix", "preset or JSON matrix file", "cpu-smoke"},
                {"case", "case name (see mih matrix)", ""}, {"phase", "train, save or load", "train"},
                {"evidence", "the case's evidence directory", ""}) {
  return run_phase(ctx);
}

}  // namespace

CaseRunResult run_case(const CaseRunOptions& o) {
  // Bad input is rejected here, before any rank starts.
  const spec::ModelSpec s = spec::SpecRegistry::instance().get(o.spec);
  s.validate();
  const spec::CaseMatrix matrix = spec::resolve_matrix_source(s, o.matrix);
  const spec::Case& c = matrix.at(o.case_name);
  MIH_CHECK(c.device == "cpu", "case '", c.name, "' runs on ", c.device, "; this runner launches CPU cases only so far");
  CaseRunResult result;
  result.evidence = fs::absolute(o.evidence_root / s.name / c.name);
  fs::remove_all(result.evidence);
  EvidenceDir dir(result.evidence);  // fails early, naming the path, when it is unwritable
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
                                 result.evidence.string()});
    const LaunchResult r = launch(lo);
    result.seconds += r.seconds;
    if (!r.ok()) MIH_THROW(r.code(), "case ", s.name, "/", c.name, " (", phase, "): ", r.report());
  };
  if (c.save_config) {
    launch_phase("save", c.save_config->dims().product());
    launch_phase("load", c.world_size());
  } else {
    launch_phase("train", c.world_size());
  }
  IntegrationState state;
  result.state = IntegrationStateMachine(dir).current(&state) ? state_name(state) : "NONE";
  return result;
}

}  // namespace mih
