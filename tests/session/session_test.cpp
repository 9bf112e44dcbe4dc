// The validation session and its checks and probes on the reference specs: each check passes
// on the correct model and fails on an input that breaks its rule, on real modules and real
// 2-rank Gloo groups (threads as ranks); the input-identity hash is the same for every split
// of one global batch; probe statistics do not depend on the sharding; the evidence layout is
// written; a check that raises sets the case FAILED with the reason.
#include <fstream>
#include <limits>

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/optim/adamw.h>

#include "harness/base/error.h"
#include "harness/base/fault.h"
#include "harness/checkpoint/safetensors.h"
#include "harness/checks/checks.h"
#include "harness/contract/contract.h"
#include "harness/findings/codes.h"
#include "harness/probes/probes.h"
#include "harness/session/session.h"
#include "reference_models/llama.h"
#include "tests/support/temp_dir.h"
#include "tests/support/thread_ranks.h"

// CaseOptions are given with designated initializers, the rest defaulted; GCC 12 warns about
// the defaulted members anyway.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

namespace mih {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

std::vector<std::string> codes(const FindingReport& r) {
  std::vector<std::string> out;
  for (const auto& f : r.findings()) out.push_back(f.code + " " + f.owner);
  return out;
}

bool has_code(const FindingReport& r, const std::string& code) {
  for (const auto& f : r.findings()) {
    if (f.code == code) return true;
  }
  return false;
}

spec::ModelSpec get(const std::string& name) { return spec::SpecRegistry::instance().get(name); }

// Hooks that run `before` on a hook point and then forward to the session.
struct Tamper : TrainingHooks {
  TrainingHooks* inner;
  TrainingState state;
  std::function<void(int64_t, const TrainingState&)> before_grad_checks, before_optimizer_checks;
  explicit Tamper(TrainingHooks* s) : inner(s) {}
  void attach_optimizer(const TrainingState& s) override {
    state = s;
    inner->attach_optimizer(s);
  }
  void attach_data_pipeline(const BatchSource& b) override { inner->attach_data_pipeline(b); }
  void begin_step(int64_t step) override { inner->begin_step(step); }
  void record_batch(int64_t step, int mb, int64_t row, const Batch& b) override { inner->record_batch(step, mb, row, b); }
  std::function<void(int64_t, const TrainingState&)> before_sync;
  void before_gradient_sync(int64_t step) override {
    if (before_sync) before_sync(step, state);
    inner->before_gradient_sync(step);
  }
  void after_backward_before_clip(int64_t step) override {
    if (before_grad_checks) before_grad_checks(step, state);
    inner->after_backward_before_clip(step);
  }
  std::function<void(int64_t, const TrainingState&)> after_clip_checks;
  void after_clip(int64_t step, double norm) override {
    inner->after_clip(step, norm);
    if (after_clip_checks) after_clip_checks(step, state);
  }
  void after_optimizer(int64_t step) override {
    if (before_optimizer_checks) before_optimizer_checks(step, state);
    inner->after_optimizer(step);
  }
  void record_token_losses(int64_t step, int mb, const at::Tensor& losses, const Batch& b) override {
    inner->record_token_losses(step, mb, losses, b);
  }
  std::function<void(StepMetrics&)> before_end_step;
  void end_step(const StepMetrics& m) override {
    StepMetrics changed = m;
    if (before_end_step) before_end_step(changed);
    inner->end_step(changed);
  }
  void record_fsdp_trace(int64_t step) override { inner->record_fsdp_trace(step); }
};

struct CaseRun {
  FindingReport findings;
  std::vector<json> identity, metrics;
  std::vector<std::string> errors;
};

struct CaseOptions {
  int64_t steps = 1;
  SessionMode mode = SessionMode::kRuntime;
  fs::path evidence;
  std::function<void(Tamper&)> tamper;
  std::function<BatchSource(BatchSource)> batches;
  /// Changes the trainer options the runner derives from the spec (a backend that ignores one).
  std::function<TrainerOptions(TrainerOptions)> trainer;
};

// Runs `steps` steps of `s` under `c` on thread ranks with a session; rank 0's view.
CaseRun run_case(const spec::ModelSpec& s, ParallelConfig c, const CaseOptions& o = {}) {
  CaseRun out;
  // As the case runner derives them.
  TrainerOptions options = s.data.apply_sharding(s.trainer).frozen(s.frozen);
  if (o.trainer) options = o.trainer(options);
  out.errors = testing::run_mesh(c, [&](DeviceMesh& mesh) {
    SessionOptions so;
    so.mode = o.mode;
    so.evidence_dir = o.evidence;
    so.config = c;
    so.trainer = options;
    ValidationSession session(s, so, mesh);
    Tamper tamper(&session);
    if (o.tamper) o.tamper(tamper);
    BatchSource batches = o.batches ? o.batches(s.data.make_batches()) : s.data.make_batches();
    try {
      Trainer t(mesh, c, s.factory, batches, options, &tamper);
      t.run(o.steps);
    } catch (const std::exception& e) {
      session.fail_case(e.what());
      throw;
    }
    session.finish();
    if (mesh.rank() == 0) {
      out.findings = session.findings();
      out.identity = session.input_identity();
      out.metrics = session.metrics();
    }
  });
  return out;
}

ParallelConfig config(int dp_shard = 1, int tp = 1, int cp = 1) {
  ParallelConfig c;
  c.dp_shard = dp_shard;
  c.tp = tp;
  c.cp = cp;
  c.dtype = DType::kFloat64;
  return c;
}

// ---- the correct models pass every check ----

class SessionOnReferenceSpecTest : public ::testing::TestWithParam<std::string> {};

TEST_P(SessionOnReferenceSpecTest, RuntimeSessionFindsNothingUnderDpShard2) {
  CaseRun r = run_case(get(GetParam()), config(2), {.steps = 2});
  ASSERT_THAT(r.errors, IsEmpty());
  EXPECT_THAT(codes(r.findings), IsEmpty()) << r.findings.summary();
  ASSERT_EQ(r.metrics.size(), 2u);
}

INSTANTIATE_TEST_SUITE_P(Specs, SessionOnReferenceSpecTest, ::testing::Values("llama", "moe", "vlm"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

TEST(SessionTest, TensorParallelSpAndActivationCheckpointingFindNothing) {
  ParallelConfig c = config(1, 2);
  c.sequence_parallel = true;
  c.activation_checkpointing = true;
  CaseRun r = run_case(get("moe"), c);
  ASSERT_THAT(r.errors, IsEmpty());
  EXPECT_THAT(codes(r.findings), IsEmpty()) << r.findings.summary();
}

TEST(SessionTest, GradientAccumulationFindsNothing) {
  ParallelConfig c = config(2);
  c.micro_batches = 2;
  CaseRun r = run_case(get("moe"), c);  // its runtime invariant counts one micro-batch's tokens
  ASSERT_THAT(r.errors, IsEmpty());
  EXPECT_THAT(codes(r.findings), IsEmpty()) << r.findings.summary();
}

// ---- evidence and the case state ----

TEST(SessionTest, WritesTheEvidenceLayoutAndValidatesTheCase) {
  const fs::path dir = testing::temp_dir("layout");
  CaseRun r = run_case(get("llama"), config(2), {.steps = 2, .evidence = dir});
  ASSERT_THAT(r.errors, IsEmpty());
  EvidenceDir ev(dir);
  for (const char* f :
       {"environment.json", "integration_state.json", "spec.resolved.json", "config.resolved.json", "check/findings.json",
        "check/structure.json", "check/parameter_ownership.csv", "check/fsdp_units.json",
        "check/optimizer_layout_initial.json", "check/activation_checkpoint.json", "check/parameter_watchlist.json",
        "data/field_ownership.json", "data/observed_forward_fields.json", "data/input_identity.jsonl",
        "checkpoint/coverage.json", "cases/runtime/metrics.jsonl", "cases/runtime/performance_rank0.jsonl",
        "cases/runtime/performance_rank1.jsonl", "cases/runtime/shared_state_step1.json",
        "cases/runtime/optimizer_layout_step1.json", "cases/runtime/replicas_step1.json", "probes/rank0.jsonl",
        "data/batch_documents.json", "cases/runtime/reduction_paths.json"}) {
    EXPECT_TRUE(fs::exists(ev.root() / f)) << f;
  }
  // The reduction paths the runtime took, with their parameters (what `mih reach` reads).
  const json paths = ev.read_json("cases/runtime/reduction_paths.json")["paths"];
  ASSERT_TRUE(paths.contains("dense.fsdp.dp_shard")) << paths.dump();
  EXPECT_EQ(paths["dense.fsdp.dp_shard"]["axis_size"], 2);
  EXPECT_EQ(paths["dense.fsdp.dp_shard"]["site"], "grad_sync.dense.fsdp.dp_shard");
  EXPECT_THAT(paths["dense.fsdp.dp_shard"]["parameters"], Contains("norm.weight"));
  EXPECT_EQ(ev.read_json("data/batch_documents.json")["fields"]["position_ids"]["differing"], 0);
  EXPECT_EQ(ev.read_json("integration_state.json")["state"], "STRUCTURE_VALIDATED");
  EXPECT_EQ(ev.read_json("check/findings.json")["status"], "PASS");
  const std::vector<json> metrics = ev.read_jsonl("cases/runtime/metrics.jsonl");
  ASSERT_EQ(metrics.size(), 2u);
  for (const char* k : {"loss", "grad_norm_pre_clip", "grad_norm_post_clip", "lr", "input_hash", "step_ms",
                        "tokens_per_s", "samples_per_s", "peak_memory_bytes", "comm_bytes"}) {
    EXPECT_TRUE(metrics[1].contains(k)) << k;
  }
  EXPECT_GT(metrics[1]["peak_memory_bytes"].get<int64_t>(), 0);
  EXPECT_EQ(metrics[0]["input_hash"].get<std::string>().size(), 64u);
  // Step 0: the parameters before it, the activations (forward outputs, output gradients), the
  // gradients before and after clipping, the parameters after the optimizer and its state;
  // step 1 (the second, probed whole too) the same less the parameters before it (they are
  // step 0's after_optimizer).
  std::vector<std::string> stages;
  for (const auto& line : ev.read_jsonl("probes/rank0.jsonl")) {
    stages.push_back(std::to_string(line["step"].get<int64_t>()) + " " + line["stage"].get<std::string>());
  }
  EXPECT_THAT(stages, ::testing::ElementsAre("0 model_before", "0 grad_before_clip", "0 forward_output", "0 output_grad",
                                             "0 grad_after_clip", "0 after_optimizer", "0 optimizer_state",
                                             "1 grad_before_clip", "1 forward_output", "1 output_grad",
                                             "1 grad_after_clip", "1 after_optimizer", "1 optimizer_state"));
  EXPECT_THAT(ev.read_json("check/activation_checkpoint.json")["regions"].dump(), HasSubstr("layers.0"));
  // Every file the session wrote follows the published evidence contract, which names it.
  const contract::Validation v = contract::validate_case_dir(dir);
  EXPECT_TRUE(v.ok()) << contract::summary(v, 20);
  EXPECT_THAT(v.writer, ::testing::StartsWith("mih "));
  EXPECT_GE(v.files, 24);
}

TEST(SessionTest, ACheckThatRaisesSetsTheCaseFailedWithTheReason) {
  const fs::path dir = testing::temp_dir("raises");
  spec::ModelSpec s = get("vlm");
  s.modalities[0].parameter_patterns = {"vison_tower.*"};  // a typo: matches nothing
  CaseRun r = run_case(s, config(2), {.evidence = dir});
  ASSERT_EQ(r.errors.size(), 2u);
  EXPECT_THAT(r.errors[0], HasSubstr("pattern 'vison_tower.*' matches no parameter or module"));
  const json state = EvidenceDir(dir).read_json("integration_state.json");
  EXPECT_EQ(state["state"], "FAILED");
  EXPECT_THAT(state["reason"].get<std::string>(), HasSubstr("attach_optimizer raised"));
  EXPECT_THAT(state["reason"].get<std::string>(), HasSubstr("vison_tower.*"));
}

TEST(SessionTest, FindingsWithErrorsSetTheCaseFailed) {
  const fs::path dir = testing::temp_dir("findings");
  spec::ModelSpec s = get("llama");
  s.data.labels_are_shifted = false;  // the pipeline does shift them
  CaseRun r = run_case(s, config(), {.mode = SessionMode::kBuild, .evidence = dir});
  ASSERT_THAT(r.errors, IsEmpty());
  EXPECT_THAT(codes(r.findings), Contains("MIH-DATA-004 labels"));
  EvidenceDir ev(dir);
  EXPECT_EQ(ev.read_json("integration_state.json")["state"], "FAILED");
  EXPECT_EQ(ev.read_json("check/findings.json")["status"], "FAIL");
  EXPECT_FALSE(fs::exists(ev.root() / "probes/rank0.jsonl"));  // build mode: no probes
}

TEST(SessionTest, OffModeIsNoOpHooksAndTrainsIdentically) {
  spec::ModelSpec s = get("llama");
  std::vector<double> losses[2];
  for (int i = 0; i < 2; ++i) {
    auto errors = testing::run_mesh(ParallelConfig{}, [&](DeviceMesh& mesh) {
      SessionOptions so;
      so.mode = i == 0 ? SessionMode::kOff : SessionMode::kRuntime;
      std::unique_ptr<TrainingHooks> hooks = make_session(s, so, mesh);
      EXPECT_EQ(dynamic_cast<ValidationSession*>(hooks.get()) == nullptr, i == 0);
      Trainer t(mesh, config(), s.factory, s.data.make_batches(), s.data.apply_sharding(TrainerOptions()), hooks.get());
      for (const auto& m : t.run(2)) losses[i].push_back(m.loss);
    });
    ASSERT_THAT(errors, IsEmpty());
  }
  EXPECT_EQ(losses[0], losses[1]);  // the session observes, it never changes training
  EXPECT_THROW(parse_session_mode("verbose"), Error);
}

// ---- structure ----

TEST(StructureCheckTest, NamesAnUntiedTieANonFiniteParameterAndAnInconsistentShape) {
  spec::ModelSpec s = get("llama");
  s.checkpoint.tied = {{"embed_tokens.weight", "lm_head.weight"}};  // the model does not tie them
  auto errors = testing::run_mesh(ParallelConfig::parse_mesh("dp_shard=2"), [&](DeviceMesh& mesh) {
    Trainer t(mesh, config(2), s.factory, s.data.make_batches(), s.data.apply_sharding(TrainerOptions()));
    EXPECT_THAT(codes(checks::check_structure(t.state(), get("llama")).findings), IsEmpty());
    const auto& params = t.context().parameters();
    params[1]->local.detach().view({-1})[0] = std::nan("");
    params[2]->local_shape[0] += 1;
    const FindingReport r = checks::check_structure(t.state(), s).findings;
    EXPECT_THAT(codes(r), Contains("MIH-STRUCT-004 embed_tokens.weight"));
    EXPECT_THAT(codes(r), Contains("MIH-STRUCT-003 " + params[1]->fqn));
    EXPECT_THAT(codes(r), Contains("MIH-STRUCT-001 " + params[2]->fqn));
    EXPECT_THAT(checks::parameter_ownership_csv(t.context()), HasSubstr("dp_shard=Shard(0)"));
  });
  EXPECT_THAT(errors, IsEmpty());
}

// Issue 52: one tensor under two names is a finding naming both unless the spec declares the
// tie (in either order). llama_tied's model registers the embedding's weight again as the head's.
TEST(StructureCheckTest, AnAliasTheSpecDoesNotDeclareTiedIsNamedWithBothNames) {
  const spec::ModelSpec tied = get("llama_tied");
  spec::ModelSpec reversed = tied, undeclared = tied, globbed = tied;
  reversed.checkpoint.tied = {{"lm_head.weight", "embed_tokens.weight"}};
  undeclared.checkpoint.tied.clear();
  // Names compare exactly (as MIH-STRUCT-004 finds the tie's names): a glob declares nothing.
  globbed.checkpoint.tied = {{"embed_*.weight", "lm_head.*"}};
  auto errors = testing::run_mesh(ParallelConfig::parse_mesh("dp_shard=2"), [&](DeviceMesh& mesh) {
    Trainer t(mesh, config(2), tied.factory, tied.data.make_batches(), tied.data.apply_sharding(TrainerOptions()));
    EXPECT_THAT(codes(checks::check_structure(t.state(), tied).findings), IsEmpty());
    EXPECT_THAT(codes(checks::check_structure(t.state(), reversed).findings), IsEmpty());
    const FindingReport r = checks::check_structure(t.state(), undeclared).findings;
    EXPECT_THAT(codes(r), ::testing::ElementsAre("MIH-STRUCT-008 embed_tokens.weight"));
    for (const auto& f : r.findings()) {
      EXPECT_THAT(f.message, HasSubstr("'embed_tokens.weight' and 'lm_head.weight' name the same tensor"));
      EXPECT_THAT(f.remediation, HasSubstr("declare {\"embed_tokens.weight\", \"lm_head.weight\"}"));
    }
    EXPECT_THAT(codes(checks::check_structure(t.state(), globbed).findings),
                ::testing::Contains("MIH-STRUCT-008 embed_tokens.weight"));
    EXPECT_EQ(codes::check_of(codes::kStructAliasUndeclared), codes::kCheckStructure);
  });
  EXPECT_THAT(errors, IsEmpty());
}

// ---- optimizer layout ----

// The seed's HP-FSDP-004 and 005 under expert parallelism: the routed experts (EXPERT domain,
// FSDP over edp) never share a unit with dense parameters and are never in the root unit.
TEST(StructureCheckTest, ExpertsGetAUnitOfTheirOwnNeverTheRootNorADenseOne) {
  ParallelConfig c = config(4);
  c.ep = 2;
  auto errors = testing::run_mesh(c, [&](DeviceMesh& mesh) {
    Trainer t(mesh, c, get("moe").factory, get("moe").data.make_batches(), get("moe").data.apply_sharding(TrainerOptions()));
    EXPECT_THAT(codes(checks::check_structure(t.state(), get("moe")).findings), IsEmpty());
    std::vector<ShardedParameter*> experts;
    for (const auto& p : t.context().parameters()) {
      if (p->expert_parallel()) experts.push_back(p.get());
    }
    ASSERT_EQ(experts.size(), 2u);
    EXPECT_TRUE(experts[0]->fsdp);
    EXPECT_EQ(experts[0]->fsdp_axis, MeshAxis::kEdp);
    EXPECT_EQ(experts[0]->unit, "layers.1.mlp.experts");
    EXPECT_THAT(checks::parameter_ownership_csv(t.context()),
                HasSubstr("layers.1.mlp.experts.gate_up_proj,layers.1.mlp.experts,,EXPERT,edp,"));
    for (ShardedParameter* p : experts) p->unit = "layers.1";  // with the decoder layer's dense parameters
    EXPECT_THAT(codes(checks::check_structure(t.state(), get("moe")).findings), Contains("MIH-STRUCT-006 layers.1"));
    for (ShardedParameter* p : experts) p->unit = t.context().root_unit();
    const FindingReport r = checks::check_structure(t.state(), get("moe")).findings;
    EXPECT_THAT(codes(r), Contains("MIH-STRUCT-007 layers.1.mlp.experts.gate_up_proj"));
    EXPECT_EQ(t.context().root_unit(), "root");
  });
  EXPECT_THAT(errors, IsEmpty());
}

TEST(OptimizerLayoutCheckTest, NamesTensorsThatAreNotLiveShardsFrozenAndMisgroupedParameters) {
  spec::ModelSpec s = get("llama");
  auto errors = testing::run_mesh(ParallelConfig::parse_mesh("dp_shard=2"), [&](DeviceMesh& mesh) {
    const TrainerOptions options = s.data.apply_sharding(TrainerOptions());
    Trainer t(mesh, config(2), s.factory, s.data.make_batches(), options);
    EXPECT_THAT(codes(checks::check_optimizer_layout(t.state(), options, spec::Phase::kStructure).findings), IsEmpty());
    // An optimizer built over the full (unsharded) tensors: none is a live shard.
    std::vector<at::Tensor> full;
    for (const auto& p : t.context().parameters()) full.push_back(t.gather_full(*p).requires_grad_());
    torch::optim::AdamW before_sharding(full, torch::optim::AdamWOptions(1e-3));
    TrainingState wrong = t.state();
    wrong.optimizer = &before_sharding;
    const FindingReport r = checks::check_optimizer_layout(wrong, options, spec::Phase::kStructure).findings;
    EXPECT_TRUE(has_code(r, "MIH-OPTIM-001"));
    EXPECT_THAT(codes(r), Contains("MIH-OPTIM-004 embed_tokens.weight"));
    // Declared: no decay for nothing; the optimizer exempts norms and biases.
    const FindingReport wd = checks::check_optimizer_layout(t.state(), TrainerOptions().no_weight_decay({}), spec::Phase::kStructure).findings;
    EXPECT_THAT(codes(wd), Contains("MIH-OPTIM-005 norm.weight"));
    // A frozen parameter left in the optimizer.
    t.context().parameters()[0]->local.requires_grad_(false);
    EXPECT_THAT(codes(checks::check_optimizer_layout(t.state(), options, spec::Phase::kStructure).findings),
                Contains("MIH-OPTIM-003 embed_tokens.weight"));
  });
  EXPECT_THAT(errors, IsEmpty());
}

// ---- data contract ----

TEST(DataContractCheckTest, NamesADoubleShiftAnUndeclaredFieldAndAMissingOne) {
  spec::ModelSpec s = get("llama");
  Batch b = s.data.make_batches()(0);
  EXPECT_THAT(codes(checks::check_data_contract(s.data, b).findings), IsEmpty());
  Batch shifted_twice = b;
  shifted_twice.labels = at::roll(b.labels, -1, 1);
  const FindingReport r = checks::check_data_contract(s.data, shifted_twice).findings;
  ASSERT_THAT(codes(r), Contains("MIH-DATA-004 labels"));
  EXPECT_THAT(r.findings()[0].message, HasSubstr("labels are declared shifted, but on"));
  Batch extra = b;
  extra.fields["token_type_ids"] = at::zeros_like(b.input_ids);
  extra.fields.erase("loss_mask");
  const FindingReport e = checks::check_data_contract(s.data, extra).findings;
  EXPECT_THAT(codes(e), Contains("MIH-DATA-001 token_type_ids"));
  EXPECT_THAT(codes(e), Contains("MIH-DATA-002 loss_mask"));
  spec::DataSpec runtime = s.data;
  runtime.runtime_fields = {"attention_mask"};
  EXPECT_THAT(codes(checks::check_data_contract(runtime, b).findings), Contains("MIH-DATA-003 attention_mask"));
}

TEST(DataContractCheckTest, AVlmBatchWithoutPixelValuesAtTheFirstMicroBatchIsNamed) {
  spec::ModelSpec s = get("vlm");
  Batch b = s.data.make_batches()(0);
  EXPECT_THAT(codes(checks::check_forward_fields(s.data, b).findings), IsEmpty());
  b.fields.erase("pixel_values");
  EXPECT_THAT(codes(checks::check_forward_fields(s.data, b).findings), Contains("MIH-DATA-005 pixel_values"));
}

TEST(DataContractCheckTest, TokenLossesMustFollowTheLabelsTheModelIsGiven) {
  // Per-token cross entropy of random logits: zero exactly where the label is ignored.
  at::manual_seed(3);
  Batch b;
  b.input_ids = at::randint(0, 7, {2, 6}, at::kLong);
  b.labels = at::randint(0, 7, {2, 6}, at::kLong);
  b.labels[0][2] = -100;
  b.labels[1][0] = -100;
  const at::Tensor logits = at::randn({12, 7}, at::kDouble);
  auto token_losses = [&](const at::Tensor& labels) {
    return at::cross_entropy_loss(logits, labels.reshape(-1), {}, at::Reduction::None, -100).view({2, 6});
  };
  EXPECT_THAT(codes(checks::check_token_losses(b, token_losses(b.labels)).findings), IsEmpty());
  // The model shifts the (already shifted) labels again: it scores position t against t + 1.
  const at::Tensor again = at::cat({b.labels.narrow(1, 1, 5), at::full({2, 1}, -100, at::kLong)}, 1);
  const checks::CheckOutput shifted = checks::check_token_losses(b, token_losses(again));
  EXPECT_THAT(codes(shifted.findings), Contains("MIH-DATA-006 labels"));
  EXPECT_THAT(shifted.findings.findings().at(0).message, HasSubstr("are the labels shifted again inside the model?"));
  EXPECT_EQ(shifted.evidence["loss_at_ignored_positions"], 2);
  // One loss per label, not one per row.
  EXPECT_THAT(codes(checks::check_token_losses(b, token_losses(b.labels).sum(1)).findings),
              Contains("MIH-DATA-006 labels"));
}

// ---- input identity ----

TEST(InputIdentityTest, OneHashForEverySplitOfTheGlobalBatchAndAnotherWhenARowChanges) {
  spec::ModelSpec s = get("vlm");
  const json reference = checks::input_identity_of(s.data.make_batches()(0));
  ParallelConfig replicate2 = config(), mb2 = config(), cp2zz = config(1, 1, 2);
  replicate2.dp_replicate = 2;
  mb2.micro_batches = 2;
  cp2zz.cp_layout = CpLayout::kZigzag;
  const std::vector<ParallelConfig> splits = {config(), config(2), replicate2, mb2, config(1, 1, 2), cp2zz};
  for (const ParallelConfig& c : splits) {
    CaseRun r = run_case(s, c);
    ASSERT_THAT(r.errors, IsEmpty()) << c.name();
    ASSERT_EQ(r.identity.size(), 1u);
    EXPECT_EQ(r.identity[0]["global"], reference["global"]) << c.name() << ": " << r.identity[0].dump();
  }
  // One changed token in one row; the per-field hashes name the field.
  Batch changed = s.data.make_batches()(0);
  changed.input_ids[5][3] = (changed.input_ids[5][3].item<int64_t>() + 1) % 200;
  const json other = checks::input_identity_of(changed);
  EXPECT_NE(other["global"], reference["global"]);
  EXPECT_NE(other["fields"]["input_ids"], reference["fields"]["input_ids"]);
  EXPECT_EQ(other["fields"]["labels"], reference["fields"]["labels"]);
  // Rows swapped between two dp ranks' halves: same multiset of rows, another hash.
  Batch swapped = s.data.make_batches()(0);
  swapped.input_ids = at::cat({swapped.input_ids.narrow(0, 4, 4), swapped.input_ids.narrow(0, 0, 4)});
  EXPECT_NE(checks::input_identity_of(swapped)["fields"]["input_ids"], reference["fields"]["input_ids"]);
  // The storage dtype does not count: int32 ids hash like int64 ones.
  Batch narrow = s.data.make_batches()(0);
  narrow.input_ids = narrow.input_ids.to(at::kInt);
  EXPECT_EQ(checks::input_identity_of(narrow)["global"], reference["global"]);
}

TEST(InputIdentityTest, EveryDpRankReadingTheSameRowsChangesTheGlobalHash) {
  spec::ModelSpec s = get("llama");
  const json reference = checks::input_identity_of(s.data.make_batches()(0));
  // A pipeline whose global batch repeats its first half (what every dp rank reading the
  // same micro-batch amounts to).
  CaseRun r = run_case(s, config(2), {.batches = [](BatchSource inner) -> BatchSource {
                                        return [inner](int64_t step) {
                                          Batch b = inner(step);
                                          auto dup = [](const at::Tensor& t) { return at::cat({t.narrow(0, 0, 4), t.narrow(0, 0, 4)}); };
                                          b.input_ids = dup(b.input_ids);
                                          b.labels = dup(b.labels);
                                          for (auto& [n, t] : b.fields) t = dup(t);
                                          return b;
                                        };
                                      }});
  ASSERT_THAT(r.errors, IsEmpty());
  EXPECT_NE(r.identity[0]["global"], reference["global"]);
}

// ---- checkpoint coverage ----

TEST(CheckpointCoverageCheckTest, NamesAnUnmappedParameterABrokenTransformAndUnexpectedSourceKeys) {
  spec::ModelSpec s = get("llama");
  auto errors = testing::run_mesh(ParallelConfig{}, [&](DeviceMesh& mesh) {
    Trainer t(mesh, config(), s.factory, s.data.make_batches(), s.data.apply_sharding(TrainerOptions()));
    checks::CheckOutput ok = checks::check_checkpoint_coverage(t.context(), s.checkpoint, nullptr);
    EXPECT_THAT(codes(ok.findings), IsEmpty());
    EXPECT_EQ(ok.evidence["targets"]["layers.0.mlp.gate_up_proj.weight"]["status"], "transformed");
    std::vector<std::string> source;
    for (const auto& [fqn, target] : ok.evidence["targets"].items()) {
      for (const auto& k : target["external"]) source.push_back(k.get<std::string>());
    }
    source.push_back("model.layers.0.self_attn.rotary_emb.inv_freq");  // declared inference-only
    EXPECT_THAT(codes(checks::check_checkpoint_coverage(t.context(), s.checkpoint, &source).findings), IsEmpty());
    source.push_back("model.layers.0.self_attn.q_norm.weight");
    source.erase(source.begin());
    const FindingReport src = checks::check_checkpoint_coverage(t.context(), s.checkpoint, &source).findings;
    EXPECT_THAT(codes(src), Contains("MIH-CKPT-003 model.layers.0.self_attn.q_norm.weight"));
    EXPECT_TRUE(has_code(src, "MIH-CKPT-004"));
    // The key map loses the final norm, and a copy-pasted template sends gate and up to one
    // key (so import rebuilds [gate; gate]... from the last one written).
    spec::CheckpointSpec broken = s.checkpoint;
    for (auto& rule : broken.key_map) {
      if (rule.internal == "norm\\.weight") rule.internal = "final_norm\\.weight";
      if (rule.external.size() == 2) rule.external[1] = rule.external[0];
    }
    const FindingReport r = checks::check_checkpoint_coverage(t.context(), broken, nullptr).findings;
    EXPECT_THAT(codes(r), Contains("MIH-CKPT-001 norm.weight"));
    EXPECT_THAT(codes(r), Contains("MIH-CKPT-002 layers.0.mlp.gate_up_proj.weight"));
  });
  EXPECT_THAT(errors, IsEmpty());
}

// ---- shared state ----

TEST(SharedStateCheckTest, NamesMissingProducersAndConsumersEarlyConsumesAndRepublication) {
  const std::vector<spec::SharedStateSpec> declared = {{"rotary.cos", "rotary_emb", {"layers.*"}},
                                                       {"vision.features", "vision_tower", {"multi_modal_projector"}}};
  const std::vector<SharedStateEvent> good = {
      {"rotary.cos", "publish", "rotary_emb", "rotary_emb", 0, 0, ""},
      {"rotary.cos", "consume", "layers.0", "rotary_emb", 0, 0, ""},
      {"vision.features", "publish", "vision_tower", "vision_tower", 1, 0, ""},
      {"vision.features", "consume", "multi_modal_projector", "vision_tower", 1, 0, ""},
      {"rotary.cos", "consume", "layers.0", "rotary_emb", 0, 0, "layers.0"}};
  EXPECT_THAT(codes(checks::check_shared_state(good, declared, 0).findings), IsEmpty());
  const std::vector<SharedStateEvent> bad = {
      {"rotary.cos", "consume", "layers.0", "", -1, 0, ""},
      {"rotary.cos", "publish", "layers.0.self_attn", "layers.0.self_attn", 2, 0, ""},
      {"rotary.cos", "publish", "layers.0.self_attn", "layers.0.self_attn", 3, 0, "layers.0"},
      {"routing.counts", "publish", "layers.1.mlp", "layers.1.mlp", 4, 0, ""}};
  const FindingReport r = checks::check_shared_state(bad, declared, 3).findings;
  EXPECT_THAT(codes(r), Contains("MIH-SHARED-003 rotary.cos"));
  EXPECT_THAT(codes(r), Contains("MIH-SHARED-004 rotary.cos"));
  EXPECT_THAT(codes(r), Contains("MIH-SHARED-005 rotary.cos"));
  EXPECT_THAT(codes(r), Contains("MIH-SHARED-001 vision.features"));
  EXPECT_THAT(codes(r), Contains("MIH-SHARED-006 routing.counts"));
  EXPECT_TRUE(r.failed()) << "an undeclared key is an error: nothing checks who publishes or reads it";
  for (const auto& f : r.findings()) {
    if (f.code == "MIH-SHARED-006") {
      EXPECT_EQ(f.severity, Severity::kError);
    }
  }
  for (const auto& f : r.findings()) {
    if (f.code == "MIH-SHARED-004") {
      EXPECT_THAT(f.message, HasSubstr("published 2 times in forward 0 (again in the activation-checkpoint recompute of region 'layers.0')"));
    }
  }
  const std::vector<SharedStateEvent> unconsumed = {{"vision.features", "publish", "vision_tower", "vision_tower", 0, 0, ""}};
  EXPECT_THAT(codes(checks::check_shared_state(unconsumed, {declared[1]}, 0).findings),
              Contains("MIH-SHARED-002 vision.features"));
}

TEST(SharedStateCheckTest, AStateThatRequiresAFieldIsNotRequiredInAStepWithoutIt) {
  spec::SharedStateSpec vision{"vision.features", "vision_tower", {"multi_modal_projector"}, "pixel_values"};
  const std::set<std::string> text_only = {"attention_mask", "loss_mask"};
  const std::set<std::string> with_images = {"attention_mask", "loss_mask", "image_token_index", "pixel_values"};
  // A text-only step (mixed instruction data): no vision tower ran, nothing to publish.
  checks::CheckOutput none = checks::check_shared_state({}, {vision}, 1, &text_only);
  EXPECT_THAT(codes(none.findings), IsEmpty());
  EXPECT_EQ(none.evidence["not_required"], json::array({"vision.features"}));
  // With images the rules hold as before; without the declaration too.
  EXPECT_THAT(codes(checks::check_shared_state({}, {vision}, 0, &with_images).findings),
              Contains("MIH-SHARED-001 vision.features"));
  vision.requires_field.clear();
  EXPECT_THAT(codes(checks::check_shared_state({}, {vision}, 1, &text_only).findings),
              Contains("MIH-SHARED-001 vision.features"));
  // Published anyway in a step without the field: the rules of a publication hold (here its consumer).
  vision.requires_field = "pixel_values";
  const std::vector<SharedStateEvent> published = {{"vision.features", "publish", "vision_tower", "vision_tower", 0, 0, ""}};
  EXPECT_THAT(codes(checks::check_shared_state(published, {vision}, 1, &text_only).findings),
              Contains("MIH-SHARED-002 vision.features"));
}

// ---- modality gradients ----

TEST(ModalityGradientsCheckTest, NamesTheVisionParametersWhenTheirGradientsAreCut) {
  CaseRun r = run_case(get("vlm"), config(2), {.tamper = [](Tamper& t) {
                                                 t.before_grad_checks = [](int64_t, const TrainingState& s) {
                                                   for (const auto& p : s.context->parameters()) {
                                                     if (p->fqn.rfind("vision_tower.", 0) == 0) p->local.mutable_grad() = at::Tensor();
                                                   }
                                                 };
                                               }});
  ASSERT_THAT(r.errors, IsEmpty());
  ASSERT_TRUE(has_code(r.findings, "MIH-MODAL-001"));
  // A one-step run in which the tower never got a gradient: the run-level check names it too.
  EXPECT_THAT(codes(r.findings), Contains("MIH-GRAD-004 vision_tower.embeddings.patch_embedding.weight"));
  for (const auto& f : r.findings.findings()) {
    if (f.code == "MIH-GRAD-004") continue;
    EXPECT_EQ(f.code, "MIH-MODAL-001") << f.message;
    EXPECT_THAT(f.owner, HasSubstr("vision_tower."));
    EXPECT_THAT(f.message, HasSubstr("has no gradient on 2 rank(s) at step 0 although 'pixel_values' reached the model"));
  }
}

// ---- state invariants ----

TEST(InvariantsCheckTest, AFailingAndAThrowingInvariantAreFindings) {
  spec::ModelSpec s = get("llama");
  s.invariants.push_back({"throws", spec::Phase::kStructure, [](const TrainingState&) -> spec::CheckResult {
                            MIH_THROW(Code::kInternal, "cannot read the state");
                          }});
  auto errors = testing::run_mesh(ParallelConfig{}, [&](DeviceMesh& mesh) {
    Trainer t(mesh, config(), s.factory, s.data.make_batches(), s.data.apply_sharding(TrainerOptions()));
    for (const auto& b : t.context().buffers()) b.tensor.zero_();  // rotary table never computed
    const checks::CheckOutput r = checks::run_invariants(s.invariants, spec::Phase::kStructure, t.state());
    EXPECT_THAT(codes(r.findings), Contains("MIH-INVAR-001 inv_freq_matches_formula"));
    EXPECT_THAT(codes(r.findings), Contains("MIH-INVAR-002 throws"));
    EXPECT_FALSE(r.evidence["inv_freq_matches_formula"]["passed"]);
  });
  EXPECT_THAT(errors, IsEmpty());
}

// ---- weights set after the build ----

// A materialization invariant and the finite check examine the weights the case trains from.
// The same planted NaN (what a broken checkpoint loads after the build): with
// weights_loaded_from they wait for weights_loaded() and see it, naming the weights; without
// it they ran at the build, on the build's weights, and saw nothing.
TEST(SessionTest, MaterializationChecksExamineWeightsLoadedAfterTheBuild) {
  spec::ModelSpec s = get("llama");
  s.invariants.push_back({"norm_weight_finite", spec::Phase::kMaterialization,
                          [](const TrainingState& t) -> spec::CheckResult {
                            for (const auto& p : t.context->parameters()) {
                              if (p->fqn == "norm.weight") return {at::isfinite(p->local).all().item<bool>(), {{"fqn", p->fqn}}};
                            }
                            return {false, {{"missing", "norm.weight"}}};
                          }});
  for (const bool loaded : {true, false}) {
    SCOPED_TRACE(loaded ? "weights loaded after the build" : "the build's weights");
    const fs::path dir = testing::temp_dir(loaded ? "weights_loaded" : "weights_built");
    FindingReport findings;
    auto errors = testing::run_mesh(config(), [&](DeviceMesh& mesh) {
      SessionOptions so;
      so.mode = SessionMode::kBuild;
      so.evidence_dir = dir;
      so.config = config();
      so.trainer = s.data.apply_sharding(s.trainer);
      if (loaded) so.weights_loaded_from = "checkpoint /planted";
      ValidationSession session(s, so, mesh);
      Trainer t(mesh, config(), s.factory, s.data.make_batches(), so.trainer, &session);
      {
        at::NoGradGuard no_grad;
        for (const auto& p : t.context().parameters()) {
          if (p->fqn == "norm.weight") p->local.fill_(std::numeric_limits<double>::quiet_NaN());
        }
      }
      if (loaded) session.weights_loaded();
      session.finish();
      if (mesh.rank() == 0) findings = session.findings();
    });
    ASSERT_THAT(errors, IsEmpty());
    const json inv = EvidenceDir(dir).read_json("check/invariants_materialization.json");
    EXPECT_EQ(inv["norm_weight_finite"]["passed"], !loaded);
    EXPECT_EQ(inv["norm_weight_finite"]["weights"], loaded ? "checkpoint /planted" : "the build's initialization (seed 0)");
    EXPECT_EQ(has_code(findings, "MIH-INVAR-001"), loaded);
    EXPECT_EQ(has_code(findings, "MIH-STRUCT-003"), loaded);
    if (loaded) {
      EXPECT_THAT(codes(findings), Contains("MIH-STRUCT-003 norm.weight"));
      EXPECT_THAT(findings.summary(), HasSubstr("in the weights of checkpoint /planted"));
      EXPECT_EQ(EvidenceDir(dir).read_json("check/loaded_values.json")["non_finite"], json::array({"norm.weight"}));
    }
  }
}

// A session told that weights come after the build fails its case when it never hears they
// came (its materialization checks would never have run), and refuses the call otherwise.
TEST(SessionTest, WeightsLoadedIsRequiredExactlyWhenDeclared) {
  spec::ModelSpec s = get("llama");
  const fs::path dir = testing::temp_dir("weights_never_loaded");
  auto errors = testing::run_mesh(config(), [&](DeviceMesh& mesh) {
    SessionOptions so;
    so.mode = SessionMode::kBuild;
    so.evidence_dir = dir;
    so.config = config();
    so.trainer = s.data.apply_sharding(s.trainer);
    so.weights_loaded_from = "checkpoint /never";
    ValidationSession session(s, so, mesh);
    Trainer t(mesh, config(), s.factory, s.data.make_batches(), so.trainer, &session);
    EXPECT_FALSE(session.finish());
  });
  ASSERT_THAT(errors, IsEmpty());
  const json state = EvidenceDir(dir).read_json("integration_state.json");
  EXPECT_EQ(state["state"], "FAILED");
  EXPECT_THAT(state["reason"].get<std::string>(), HasSubstr("the materialization invariants never ran"));
  auto errors2 = testing::run_mesh(config(), [&](DeviceMesh& mesh) {
    SessionOptions so;
    so.mode = SessionMode::kBuild;
    so.config = config();
    so.trainer = s.data.apply_sharding(s.trainer);
    ValidationSession session(s, so, mesh);
    Trainer t(mesh, config(), s.factory, s.data.make_batches(), so.trainer, &session);
    EXPECT_THAT([&] { session.weights_loaded(); }, ::testing::ThrowsMessage<Error>(HasSubstr("already ran")));
  });
  ASSERT_THAT(errors2, IsEmpty());
}

// ---- probes ----

TEST(ProbesTest, StatisticsAndSketchesDoNotDependOnTheSharding) {
  spec::ModelSpec s = get("llama");
  std::map<std::string, json> by_config;
  for (ParallelConfig c : {config(), config(2), config(1, 2)}) {
    auto errors = testing::run_mesh(c, [&](DeviceMesh& mesh) {
      Trainer t(mesh, c, s.factory, s.data.make_batches(), s.data.apply_sharding(TrainerOptions()));
      t.step();
      const auto watch = probes::build_watchlist(t.context(), {});
      json j = probes::probe_stage(t.context(), watch, probes::Stage::kAfterOptimizer, &t.optimizer(), {});
      json o = probes::probe_stage(t.context(), watch, probes::Stage::kOptimizerState, &t.optimizer(), {});
      if (mesh.rank() == 0) by_config[c.name()] = {{"param", j["tensors"]}, {"state", o["tensors"]}};
    });
    ASSERT_THAT(errors, IsEmpty());
  }
  const json& ref = by_config.at("single");
  ASSERT_TRUE(ref["param"].contains("norm.weight"));
  EXPECT_TRUE(ref["param"]["norm.weight"].contains("values"));
  for (const auto& [name, got] : by_config) {
    for (const char* part : {"param", "state"}) {
      for (const auto& [tensor, stats] : ref[part].items()) {
        const json& g = got[part][tensor];
        auto near = [](double a, double b) { return std::abs(a - b) <= 1e-9 * std::max({1.0, std::abs(a), std::abs(b)}); };
        EXPECT_TRUE(near(g["sum"], stats["sum"])) << name << " " << tensor;
        EXPECT_TRUE(near(g["sum_sq"], stats["sum_sq"])) << name << " " << tensor;
        EXPECT_TRUE(near(g["max"], stats["max"])) << name << " " << tensor;
        EXPECT_TRUE(near(g["min"], stats["min"])) << name << " " << tensor;
        for (size_t j = 0; j < stats["sketch"].size(); ++j) {
          EXPECT_TRUE(near(g["sketch"][j], stats["sketch"][j])) << name << " " << tensor << " sketch " << j;
        }
      }
    }
  }
  // The signs are a fixed function of the global index, about half positive.
  const at::Tensor signs = probes::projection_signs(at::arange(10000, at::kLong), 0);
  EXPECT_NEAR(signs.mean().item<double>(), 0.0, 0.05);
  EXPECT_FALSE(at::equal(signs, probes::projection_signs(at::arange(10000, at::kLong), 1)));
}

TEST(ProbesTest, OnePassStatisticsMatchAnIndependentComputationInFloat64AndFloat32WithNonFiniteElements) {
  spec::ModelSpec s = get("llama");
  auto errors = testing::run_mesh(config(), [&](DeviceMesh& mesh) {
    Trainer t(mesh, config(), s.factory, s.data.make_batches(), s.data.apply_sharding(TrainerOptions()));
    t.step();
    const ShardedParameter* embed = nullptr;
    for (const auto& p : t.context().parameters()) {
      if (p->fqn == "embed_tokens.weight") embed = p.get();
    }
    ASSERT_NE(embed, nullptr);
    const int64_t n = embed->local.numel();
    ASSERT_GT(n, 2 * 4096) << "the probe sums in blocks of 4096: the test needs more than one";
    // A NaN in the first block, infinities in the second and the last: they count, as 0 in the rest.
    at::Tensor flat = embed->local.detach().view({-1});
    flat[3] = std::nan("");
    flat[4097] = -std::numeric_limits<double>::infinity();
    flat[n - 1] = std::numeric_limits<double>::infinity();
    const auto watch = probes::build_watchlist(t.context(), {});
    for (at::ScalarType dtype : {at::kDouble, at::kFloat}) {
      if (dtype == at::kFloat) embed->local.set_data(embed->local.detach().to(at::kFloat));
      const json j = probes::probe_stage(t.context(), watch, probes::Stage::kAfterOptimizer, &t.optimizer(), {});
      const json& got = j["tensors"]["embed_tokens.weight"];
      const at::Tensor x = embed->local.detach().to(at::kDouble).reshape({-1});
      const at::Tensor x0 = at::where(at::isfinite(x), x, at::zeros_like(x));
      auto near = [](double a, double b) { return std::abs(a - b) <= 1e-12 * std::max({1.0, std::abs(a), std::abs(b)}); };
      const std::string what = at::toString(dtype);
      EXPECT_EQ(got["nonfinite"], 3) << what;
      EXPECT_TRUE(near(got["sum"], x0.sum().item<double>())) << what << " " << got["sum"];
      EXPECT_TRUE(near(got["sum_sq"], x0.dot(x0).item<double>())) << what;
      EXPECT_TRUE(near(got["max"], x0.max().item<double>())) << what;
      EXPECT_TRUE(near(got["min"], x0.min().item<double>())) << what;
      ASSERT_EQ(got["sketch"].size(), 4u);
      for (int64_t k = 0; k < 4; ++k) {
        const double expected = (probes::projection_signs(at::arange(n, at::kLong), k) * x0).sum().item<double>();
        EXPECT_TRUE(near(got["sketch"][static_cast<size_t>(k)], expected)) << what << " sketch " << k;
      }
    }
  });
  ASSERT_THAT(errors, IsEmpty());
}

TEST(ReplicaConsistencyTest, NamesAReplicatedParameterThatDivergedAcrossTpRanks) {
  ParallelConfig c = config(1, 2);
  c.sequence_parallel = true;
  CaseRun ok = run_case(get("llama"), c);
  ASSERT_THAT(ok.errors, IsEmpty());
  EXPECT_THAT(codes(ok.findings), IsEmpty());
  CaseRun r = run_case(get("llama"), c, {.tamper = [](Tamper& t) {
                                           t.before_optimizer_checks = [](int64_t, const TrainingState& s) {
                                             if (s.context->tp_rank() != 1) return;
                                             for (const auto& p : s.context->parameters()) {
                                               if (p->fqn == "norm.weight") p->local.detach().add_(1e-3);
                                             }
                                           };
                                         }});
  ASSERT_THAT(r.errors, IsEmpty());
  EXPECT_THAT(codes(r.findings), Contains("MIH-PROBE-001 norm.weight"));
}

// The per-rank digests ReplicaConsistency and GradientSync judge (verdicts_replicas.cpp, the
// same verdicts as another writer's evidence): every rank's SHA-256 and box of each parameter
// after the optimizer and of each gradient after the synchronization, one file per step.
json read_json(const fs::path& p) {
  std::ifstream in(p);
  EXPECT_TRUE(in.good()) << p << " was not written";
  return in.good() ? json::parse(in) : json::object();
}

TEST(ReplicaConsistencyTest, SessionRecordsEveryRanksDigestsOfParametersAndGradients) {
  ParallelConfig c = config(1, 2);
  c.sequence_parallel = true;
  const fs::path ok_dir = testing::temp_dir("digests_ok"), bad_dir = testing::temp_dir("digests_planted");
  ASSERT_THAT(run_case(get("llama"), c, {.evidence = ok_dir}).errors, IsEmpty());
  const json params = read_json(ok_dir / "cases/runtime/replicas_step0.json");
  const json grads = read_json(ok_dir / "cases/runtime/gradient_replicas_step0.json");
  ASSERT_EQ(params["parameters"].size(), 19u);
  ASSERT_EQ(grads["parameters"].size(), 19u);
  for (const json* j : {&params, &grads}) {
    for (const auto& [fqn, rec] : (*j)["parameters"].items()) {
      ASSERT_EQ(rec["digests"].size(), 2u) << fqn;
      ASSERT_EQ(rec["boxes"].size(), 2u) << fqn;
    }
  }
  // norm.weight is replicated over tp: one box, one value on both ranks; its gradient too.
  EXPECT_EQ(params["parameters"]["norm.weight"]["digests"][0], params["parameters"]["norm.weight"]["digests"][1]);
  EXPECT_EQ(grads["parameters"]["norm.weight"]["digests"][0], grads["parameters"]["norm.weight"]["digests"][1]);
  // A replica that diverged on tp rank 1 before the optimizer: its digests differ.
  ASSERT_THAT(run_case(get("llama"), c, {.evidence = bad_dir, .tamper = [](Tamper& t) {
                                           t.before_optimizer_checks = [](int64_t, const TrainingState& s) {
                                             if (s.context->tp_rank() != 1) return;
                                             for (const auto& p : s.context->parameters()) {
                                               if (p->fqn == "norm.weight") p->local.detach().add_(1e-3);
                                             }
                                           };
                                         }})
                  .errors,
              IsEmpty());
  const json bad = read_json(bad_dir / "cases/runtime/replicas_step0.json")["parameters"]["norm.weight"];
  EXPECT_EQ(bad["boxes"][0], bad["boxes"][1]);
  EXPECT_NE(bad["digests"][0], bad["digests"][1]);
}


// ---- what the checks examined, and what the trainer reports recounted ----

const CheckRun* run_of(const FindingReport& r, const std::string& check) {
  for (const auto& x : r.runs()) {
    if (x.check == check) return &x;
  }
  return nullptr;
}

TEST(CheckRecordsTest, EveryCheckOfARuntimeSessionRecordsWhatItExamined) {
  CaseRun r = run_case(get("llama"), config(2), {.steps = 2});
  EXPECT_THAT(codes(r.findings), IsEmpty());
  for (const char* check : {codes::kCheckStructure, codes::kCheckOptimizer, codes::kCheckDataContract,
                            codes::kCheckForwardFields, codes::kCheckTokenLosses, codes::kCheckValidTokens,
                            codes::kCheckCoverage, codes::kCheckSource, codes::kCheckSharedState,
                            codes::kCheckSharedEvents, codes::kCheckUndeclared, codes::kCheckInvariants,
                            codes::kCheckFsdpUnits, codes::kCheckLossNormalizer, codes::kCheckFrozen,
                            codes::kCheckGradReduction, codes::kCheckUpdateWithoutGradient,
                            codes::kCheckGradientsReceived}) {
    const CheckRun* run = run_of(r.findings, check);
    ASSERT_NE(run, nullptr) << check << " left no record";
    EXPECT_GT(run->examined, 0) << check << " examined nothing";
  }
  EXPECT_EQ(run_of(r.findings, codes::kCheckValidTokens)->runs, 2);
  EXPECT_EQ(run_of(r.findings, codes::kCheckStructure)->examined, 19);
  // llama declares no tie: the tie check ran and examined nothing (so its test fails if
  // instantiated; the suite table does not instantiate it).
  EXPECT_EQ(run_of(r.findings, codes::kCheckTies)->examined, 0);
  // Every code has its emitting check.
  for (const auto& row : codes::kAllCodes) EXPECT_EQ(codes::check_of(row.code), row.check);
  EXPECT_EQ(codes::check_of("MIH-NOPE-001"), "");
}

TEST(CheckRecordsTest, TheTrainersValidTokenCountAndLossNormalizerAreRecountedFromTheBatches) {
  // One token more than the micro-batches hold: the trainer counts what it did not train on.
  CaseRun more = run_case(get("llama"), config(2), {.tamper = [](Tamper& t) {
                                                      t.before_end_step = [](StepMetrics& m) { m.valid_tokens += 1; };
                                                    }});
  EXPECT_THAT(codes(more.findings), Contains("MIH-DATA-007 valid_tokens"));
  // A loss divided by this rank's own count (F05's bug): the recount names the rank.
  CaseRun own = run_case(get("llama"), config(2), {.tamper = [](Tamper& t) {
                                                     t.before_end_step = [](StepMetrics& m) { m.loss_normalizers[0] /= 2; };
                                                   }});
  EXPECT_THAT(codes(own.findings), Contains("MIH-DATA-008 loss_normalizer"));
  // A backend that reports no normalizer: the normalizer check examined nothing (its test
  // fails with "examined no loss normalizers"), the count check still ran.
  CaseRun none = run_case(get("llama"), config(2), {.tamper = [](Tamper& t) {
                                                      t.before_end_step = [](StepMetrics& m) { m.loss_normalizers.clear(); };
                                                    }});
  EXPECT_EQ(run_of(none.findings, codes::kCheckLossNormalizer)->examined, 0);
  EXPECT_EQ(run_of(none.findings, codes::kCheckValidTokens)->examined, 1);
  for (const auto& f : own.findings.findings()) {
    if (f.code == codes::kDataLossNormalizer) {
      EXPECT_THAT(f.message, HasSubstr("not by the"));
    }
  }
}

TEST(OptimizerLayoutCheckTest, WeightDecayOnANormTheDefaultsDoNotNameIsAFinding) {
  // GPT-2 names its norms ln_1, ln_2, ln_f: the default patterns (*bias, *norm*) miss them.
  // Here: llama with patterns that miss its norms the same way.
  spec::ModelSpec s = get("llama");
  auto errors = testing::run_mesh(ParallelConfig{}, [&](DeviceMesh& mesh) {
    const TrainerOptions misses = s.data.apply_sharding(TrainerOptions().no_weight_decay({"*bias", "*ln_*"}));
    Trainer t(mesh, config(), s.factory, s.data.make_batches(), misses);
    const FindingReport r = checks::check_optimizer_layout(t.state(), misses, spec::Phase::kStructure).findings;
    EXPECT_THAT(codes(r), Contains("MIH-OPTIM-007 norm.weight"));
    EXPECT_THAT(codes(r), Contains("MIH-OPTIM-007 layers.0.input_layernorm.weight"));
    EXPECT_FALSE(has_code(r, "MIH-OPTIM-005")) << "the groups are as the (wrong) options say";
    // Declared on purpose: no finding.
    EXPECT_THAT(codes(checks::check_optimizer_layout(t.state(), misses, spec::Phase::kStructure, {"*norm*"}).findings),
                IsEmpty());
  });
  EXPECT_THAT(errors, IsEmpty());
  // The spec's own trainer options reach the run (and its evidence).
  s.trainer.weight_decay(0.05).no_weight_decay({"*bias", "*norm*", "embed_tokens.*"});
  EXPECT_EQ(s.to_json()["trainer"]["weight_decay"], 0.05);
  CaseRun r = run_case(s, config());
  EXPECT_THAT(codes(r.findings), IsEmpty());
}

TEST(SourceCheckpointTest, KeysComeFromAnIndexOrSafetensorsFilesAndATypoIsNamed) {
  spec::ModelSpec s = get("llama");
  ASSERT_FALSE(s.checkpoint.source.empty());
  const std::vector<std::string> shipped = safetensors::checkpoint_keys(s.checkpoint.source);
  EXPECT_THAT(shipped, Contains("model.layers.1.mlp.gate_proj.weight"));
  const fs::path dir = testing::temp_dir("source_keys");
  // A key map with a typo (q_prj): the source's q_proj is unexpected, the typo absent.
  auto errors = testing::run_mesh(ParallelConfig{}, [&](DeviceMesh& mesh) {
    Trainer t(mesh, config(), s.factory, s.data.make_batches(), s.data.apply_sharding(s.trainer));
    EXPECT_THAT(codes(checks::check_checkpoint_coverage(t.context(), s.checkpoint, &shipped).findings), IsEmpty());
    spec::CheckpointSpec typo = s.checkpoint;
    for (auto& rule : typo.key_map) {
      for (auto& e : rule.external) {
        const auto at = e.find("$2_proj");
        if (e.find("self_attn") != std::string::npos && at != std::string::npos) e.replace(at, 7, "$2_prj");
      }
    }
    const FindingReport r = checks::check_checkpoint_coverage(t.context(), typo, &shipped).findings;
    EXPECT_THAT(codes(r), Contains("MIH-CKPT-003 model.layers.0.self_attn.q_proj.weight"));
    EXPECT_THAT(codes(r), Contains("MIH-CKPT-004 model.layers.0.self_attn.q_prj.weight"));
  });
  EXPECT_THAT(errors, IsEmpty());
  // *.safetensors files: their header names.
  const double x[2] = {1, 2};
  safetensors::write_file(dir / "st" / "model.safetensors", {{"b.weight", "F64", {2}, x, sizeof x}, {"a.weight", "F64", {1}, x, 8}});
  EXPECT_EQ(safetensors::checkpoint_keys(dir / "st"), (std::vector<std::string>{"a.weight", "b.weight"}));
  // Beside model.safetensors, other safetensors files (an export's batch) are not weights;
  // without it, every file's names are.
  safetensors::write_file(dir / "st" / "batch.safetensors", {{"input_ids", "F64", {2}, x, sizeof x}});
  EXPECT_EQ(safetensors::checkpoint_keys(dir / "st"), (std::vector<std::string>{"a.weight", "b.weight"}));
  std::filesystem::rename(dir / "st" / "model.safetensors", dir / "st" / "part1.safetensors");
  EXPECT_EQ(safetensors::checkpoint_keys(dir / "st"), (std::vector<std::string>{"a.weight", "b.weight", "input_ids"}));
  // Bad input: a clear error naming the directory or file.
  try {
    (void)safetensors::checkpoint_keys(dir / "nope");
    ADD_FAILURE() << "no error for a missing directory";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Code::kFailedPrecondition);
    EXPECT_THAT(e.what(), HasSubstr("does not exist"));
  }
  fs::create_directories(dir / "empty");
  EXPECT_THROW((void)safetensors::checkpoint_keys(dir / "empty"), Error);
  fs::create_directories(dir / "bad");
  std::ofstream(dir / "bad" / "model.safetensors.index.json") << R"({"metadata": {}})";
  try {
    (void)safetensors::checkpoint_keys(dir / "bad");
    ADD_FAILURE() << "no error for an index without weight_map";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("weight_map"));
  }
}

// ---- frozen parameters ----

TEST(FrozenParametersCheckTest, AFrozenVisionTowerTrainsNothingAndABackendThatIgnoresTheDeclarationIsNamed) {
  const spec::ModelSpec s = get("vlm_frozen_vision");
  // As declared: the tower has requires_grad false, no gradient and no AdamW state on both
  // ranks; the projector still trains from the pixels.
  CaseRun ok = run_case(s, config(2), {.steps = 2, .tamper = [](Tamper& t) {
                                         t.before_optimizer_checks = [](int64_t, const TrainingState& st) {
                                           for (const auto& p : st.context->parameters()) {
                                             if (p->fqn.rfind("vision_tower.", 0) != 0) continue;
                                             EXPECT_FALSE(p->local.requires_grad()) << p->fqn;
                                             EXPECT_FALSE(p->local.grad().defined()) << p->fqn;
                                           }
                                         };
                                       }});
  ASSERT_THAT(ok.errors, IsEmpty());
  EXPECT_THAT(codes(ok.findings), IsEmpty()) << ok.findings.summary();
  ASSERT_NE(run_of(ok.findings, codes::kCheckFrozen), nullptr);
  EXPECT_GT(run_of(ok.findings, codes::kCheckFrozen)->examined, 0);
  // A backend that ignores ModelSpec::frozen: the tower trains, and every point names it.
  CaseRun ignored = run_case(s, config(2), {.trainer = [](TrainerOptions o) { return o.frozen({}); }});
  ASSERT_THAT(ignored.errors, IsEmpty());
  EXPECT_THAT(codes(ignored.findings), Contains("MIH-FROZEN-001 vision_tower.embeddings.patch_embedding.weight"));
  EXPECT_THAT(codes(ignored.findings), Contains("MIH-FROZEN-003 vision_tower.embeddings.patch_embedding.weight"));
  EXPECT_THAT(codes(ignored.findings), Contains("MIH-FROZEN-004 vision_tower.embeddings.patch_embedding.weight"));
  // A synchronization that zero-fills the frozen gradients (to keep its buckets uniform).
  CaseRun filled = run_case(s, config(2), {.tamper = [](Tamper& t) {
                                             t.before_grad_checks = [](int64_t, const TrainingState& st) {
                                               for (const auto& p : st.context->parameters()) {
                                                 if (!p->local.requires_grad()) p->local.mutable_grad() = at::zeros_like(p->local);
                                               }
                                             };
                                           }});
  bool zero_named = false;
  for (const auto& f : filled.findings.findings()) {
    zero_named = zero_named || (f.code == codes::kFrozenGradient && f.message.find("all zeros") != std::string::npos);
  }
  EXPECT_TRUE(zero_named) << filled.findings.summary();
}

TEST(FrozenParametersCheckTest, AParameterFrozenWithoutADeclarationIsNamed) {
  // The trainer freezes the final norm; the spec does not say so.
  CaseRun r = run_case(get("llama"), config(2), {.trainer = [](TrainerOptions o) { return o.frozen({"norm.weight"}); }});
  ASSERT_THAT(r.errors, IsEmpty());
  EXPECT_THAT(codes(r.findings), Contains("MIH-FROZEN-002 norm.weight"));
  // A modality that must train a frozen parameter is a malformed spec.
  spec::ModelSpec s = get("vlm_frozen_vision");
  s.modalities = {{"pixel_values", {"vision_tower.*"}}};
  s.shared_state.clear();  // its patterns name modules this short FQN list does not hold
  s.checkpoint.training_only.clear();
  s.golden = {};  // its layer map names modules this short FQN list does not hold
  try {
    s.validate_against({"vision_tower.embeddings.patch_embedding.weight", "multi_modal_projector.linear_1.weight"});
    ADD_FAILURE() << "expected a rejection";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("frozen pattern 'vision_tower.*'"));
  }
}

// ---- gradient synchronization against the gradient domain ----

TEST(GradientSyncCheckTest, AnAxisLeftOutOfTheSynchronizationIsNamedPerParameter) {
  CaseRun ok = run_case(get("llama"), config(2));
  ASSERT_NE(run_of(ok.findings, codes::kCheckGradReduction), nullptr);
  EXPECT_EQ(run_of(ok.findings, codes::kCheckGradReduction)->examined, 19);
  // As if no collective had reduced anything this step (FSDP's reduce-scatters skipped).
  CaseRun r = run_case(get("llama"), config(2), {.tamper = [](Tamper& t) {
                                                   t.before_grad_checks = [](int64_t, const TrainingState& st) {
                                                     st.context->reset_gradient_reductions();
                                                   };
                                                 }});
  EXPECT_THAT(codes(r.findings), Contains("MIH-GRAD-001 norm.weight"));
  for (const auto& f : r.findings.findings()) {
    if (f.code == codes::kGradReduction) {
      EXPECT_THAT(f.message, HasSubstr("never reduced over {dp_shard}"));
    }
  }
}

TEST(GradientSyncCheckTest, PartialSumsOverTpAreMeasuredNotTakenFromTheDeclaration) {
  ParallelConfig sp = config(1, 2);
  sp.sequence_parallel = true;
  CaseRun ok = run_case(get("llama"), sp);
  ASSERT_THAT(ok.errors, IsEmpty());
  EXPECT_THAT(codes(ok.findings), IsEmpty()) << ok.findings.summary();
  EXPECT_GT(run_of(ok.findings, codes::kCheckTpPartial)->examined, 0);
  {
    // F01: under SP the final norm's gradient is partial and the model does not say so.
    fault::ScopedFault f01(fault::Fault::kF01);
    CaseRun r = run_case(get("llama"), sp);
    EXPECT_THAT(codes(r.findings), Contains("MIH-GRAD-002 norm.weight"));
  }
  // Without SP every tp rank sees every token: a norm declared partial is all-reduced into
  // twice its gradient.
  CaseRun doubled = run_case(get("llama"), config(1, 2), {.tamper = [](Tamper& t) {
                                                            t.before_sync = [](int64_t, const TrainingState& st) {
                                                              for (const auto& p : st.context->parameters()) {
                                                                if (p->fqn == "norm.weight") p->tp_partial_grad = true;
                                                              }
                                                            };
                                                          }});
  EXPECT_THAT(codes(doubled.findings), Contains("MIH-GRAD-003 norm.weight"));
}

// ---- gradient presence ----

// The vlm's batches with the images of the steps `text_only` says removed (pixel_values and
// image_token_index: the model runs text-only, as on a text-only batch of mixed data).
std::function<BatchSource(BatchSource)> without_images(std::function<bool(int64_t)> text_only) {
  return [text_only](BatchSource inner) {
    return BatchSource([inner, text_only](int64_t step) {
      Batch b = inner(step);
      if (text_only(step)) {
        b.fields.erase("pixel_values");
        b.fields.erase("image_token_index");
      }
      return b;
    });
  };
}

// Zeros for every trainable parameter without a gradient, before the optimizer (what the
// runtime did before it followed PyTorch's semantics): AdamW then decays and moves them.
void zero_fill_absent_gradients(Tamper& t) {
  t.after_clip_checks = [](int64_t, const TrainingState& s) {
    for (const auto& p : s.context->parameters()) {
      if (p->local.requires_grad() && !p->local.grad().defined()) p->local.mutable_grad() = at::zeros_like(p->local);
    }
  };
}

TEST(GradientPresenceCheckTest, AnOptimizerThatMovesAParameterWithoutGradientIsNamed) {
  // Step 1 text-only: the tower and projector get no gradient on any rank.
  const auto step1 = without_images([](int64_t step) { return step == 1; });
  CaseRun clean = run_case(get("vlm"), config(2), {.steps = 2, .batches = step1});
  ASSERT_THAT(clean.errors, IsEmpty());
  EXPECT_THAT(codes(clean.findings), IsEmpty());
  ASSERT_NE(run_of(clean.findings, codes::kCheckUpdateWithoutGradient), nullptr);
  EXPECT_GT(run_of(clean.findings, codes::kCheckUpdateWithoutGradient)->examined, 0);
  CaseRun moved = run_case(get("vlm"), config(2), {.steps = 2, .tamper = zero_fill_absent_gradients, .batches = step1});
  ASSERT_THAT(moved.errors, IsEmpty());
  EXPECT_THAT(codes(moved.findings), Contains("MIH-OPTIM-008 vision_tower.embeddings.patch_embedding.weight"));
  EXPECT_THAT(codes(moved.findings), Contains("MIH-OPTIM-008 multi_modal_projector.linear_1.weight"));
  for (const auto& f : moved.findings.findings()) {
    EXPECT_EQ(f.code, "MIH-OPTIM-008") << f.message;
    EXPECT_THAT(f.message, HasSubstr("had no gradient on any rank at step 1 and the optimizer step changed it"));
  }
}

TEST(GradientPresenceCheckTest, ATrainableParameterThatNeverGetsAGradientIsNamedUnlessDeclared) {
  const auto never = without_images([](int64_t) { return true; });
  spec::ModelSpec s = get("vlm");
  CaseRun r = run_case(s, config(2), {.steps = 2, .batches = never});
  ASSERT_THAT(r.errors, IsEmpty());
  EXPECT_THAT(codes(r.findings), Contains("MIH-GRAD-004 vision_tower.embeddings.patch_embedding.weight"));
  EXPECT_THAT(codes(r.findings), Contains("MIH-GRAD-004 multi_modal_projector.linear_2.weight"));
  EXPECT_FALSE(has_code(r.findings, "MIH-OPTIM-008"));
  for (const auto& f : r.findings.findings()) {
    if (f.code != "MIH-GRAD-004") continue;
    EXPECT_THAT(f.owner, ::testing::AnyOf(HasSubstr("vision_tower."), HasSubstr("multi_modal_projector.")));
    EXPECT_THAT(f.message, HasSubstr("no rank's backward gave it a gradient in any of the 2 steps (0 to 1) of the run"));
  }
  // Declared: the port knows some data never reaches them.
  s.unused_parameters = {"vision_tower.*", "multi_modal_projector.*"};
  CaseRun declared = run_case(s, config(2), {.steps = 2, .batches = never});
  ASSERT_THAT(declared.errors, IsEmpty());
  EXPECT_FALSE(has_code(declared.findings, "MIH-GRAD-004"));
  EXPECT_GT(run_of(declared.findings, codes::kCheckGradientsReceived)->examined, 0);
}

}  // namespace
}  // namespace mih
