// Every conformance verdict on real evidence (cases of the llama and vlm specs launched once
// for the whole test binary), and on a copy with one file broken the way a real bug would
// leave it: each verdict passes on the first and fails on the second, naming what broke. Also:
// the plain backend's reference equals the Trainer's, and a rank that dies is a transport
// failure, not a verdict.
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "harness/base/error.h"
#include "harness/cases/case_runner.h"
#include "harness/compare/compare.h"
#include "harness/compare/suite_reads.h"
#include "harness/compare/verdicts.h"
#include "harness/session/backend.h"
#include "suites/suite_table.h"
#include "tests/support/temp_dir.h"

namespace mih {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using ::testing::HasSubstr;
using verdicts::CaseEvidence;
using verdicts::Quantity;
using verdicts::Verdict;

// A backend whose rank 0 dies in the first step: the launcher must report it.
class CrashingBackend : public TrainingBackend {
 public:
  void build(const spec::ModelSpec& spec, DeviceMesh& mesh, const ParallelConfig& config, const TrainerOptions& options,
             TrainingHooks& hooks) override {
    inner_->build(spec, mesh, config, options, hooks);
    rank_ = mesh.rank();
  }
  StepMetrics step() override {
    if (rank_ == 0) std::abort();
    return inner_->step();
  }
  int64_t next_step() const override { return inner_->next_step(); }
  TrainingState state() override { return inner_->state(); }
  at::Tensor gather_full(const ShardedParameter& p, const std::string& what) override { return inner_->gather_full(p, what); }
  void save(const fs::path& dir) override { inner_->save(dir); }
  void load(const fs::path& dir) override { inner_->load(dir); }

 private:
  std::unique_ptr<TrainingBackend> inner_ = make_trainer_backend();
  int rank_ = 0;
};
MIH_REGISTER_TRAINING_BACKEND(crashing, CrashingBackend);

// Runs `case_name` of the spec's cpu-smoke matrix under `root`, as `mih run` does.
cases::CaseRunResult run(const std::string& spec_name, const std::string& case_name, const fs::path& root,
                         const std::string& training_backend = "trainer") {
  const spec::ModelSpec& s = spec::SpecRegistry::instance().get(spec_name);
  const spec::CaseMatrix m = spec::resolve_matrix_source(s, "cpu-smoke");
  CaseRequest q;
  q.spec = s.name;
  q.c = m.at(case_name);
  q.matrix = MatrixSource::parse("cpu-smoke");
  q.training_backend = training_backend;
  return cases::run_case(q, {.evidence_root = root});
}

class VerdictsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = new fs::path(testing::temp_dir("verdicts"));
    for (const auto& [spec, c] : std::vector<std::pair<std::string, std::string>>{
             {"llama", "Reference"}, {"llama", "DpShard2"}, {"llama", "DpShard2Ac"}, {"llama", "Tp2"},
             {"llama", "ResumeDpShard2ToTp2"}, {"vlm", "Reference"}}) {
      const cases::CaseRunResult r = run(spec, c, *root_);
      ASSERT_EQ(r.outcome, Outcome::kRan) << spec << "/" << c << ": " << r.error;
    }
  }
  static void TearDownTestSuite() { delete root_; }

  static fs::path real(const std::string& spec, const std::string& c) { return *root_ / spec / c; }
  // A copy of a real case directory to break.
  fs::path copy(const std::string& spec, const std::string& c) {
    const fs::path to = testing::temp_dir("broken_" + std::to_string(++copies_)) / c;
    fs::copy(real(spec, c), to, fs::copy_options::recursive);
    return to;
  }
  static json read(const fs::path& f) { return json::parse(std::ifstream(f)); }
  static void write(const fs::path& f, const json& j) { std::ofstream(f) << j.dump(2); }
  static std::vector<json> read_lines(const fs::path& f) {
    std::vector<json> out;
    std::ifstream in(f);
    for (std::string line; std::getline(in, line);) {
      if (!line.empty()) out.push_back(json::parse(line));
    }
    return out;
  }
  static void write_lines(const fs::path& f, const std::vector<json>& rows) {
    std::ofstream out(f);
    for (const auto& r : rows) out << r.dump() << "\n";
  }

  static fs::path* root_;
  int copies_ = 0;
};
fs::path* VerdictsTest::root_ = nullptr;

// The calibration of a reduced lane from a twin comparison: each quantity's noise is its own
// or its stage's median (an updated parameter: the stage's largest), its tolerance k (or
// k_update) times that, floored by the dtype's epsilon, times the oracle factor.
TEST(CalibrationTest, ToleranceIsKTimesTheNoiseFlooredByEpsilon) {
  Comparison twin;
  auto m = [](const char* kind, const char* name, int64_t step, const char* stage, double rel) {
    return Measurement{kind, name, step, stage, rel, 0};
  };
  twin.measurements = {m("tensor", "a", 0, "grad_before_clip", 1e-7), m("tensor", "b", 0, "grad_before_clip", 4e-6),
                       m("tensor", "c", 0, "grad_before_clip", 2e-6), m("tensor", "a", 0, "after_optimizer", 1e-8),
                       m("tensor", "b", 0, "after_optimizer", 3e-6), m("metric", "lr", 0, "metrics", 0)};
  Calibration settings;
  settings.k = 10;
  settings.k_update = 50;
  settings.floor_eps = 4;
  const Calibration c = calibrate(twin, "float32", settings);
  EXPECT_EQ(c.epsilon, std::ldexp(1.0, -23));
  // a's own noise (1e-7) is below its stage's median (2e-6): the median is its noise.
  EXPECT_DOUBLE_EQ(c.noise_of(m("tensor", "a", 0, "grad_before_clip", 0)), 2e-6);
  EXPECT_DOUBLE_EQ(c.tolerance_of(m("tensor", "a", 0, "grad_before_clip", 0)), 2e-5);
  EXPECT_DOUBLE_EQ(c.noise_of(m("tensor", "b", 0, "grad_before_clip", 0)), 4e-6);
  // An updated parameter: the stage's largest noise and k_update.
  EXPECT_DOUBLE_EQ(c.noise_of(m("tensor", "a", 0, "after_optimizer", 0)), 3e-6);
  EXPECT_DOUBLE_EQ(c.tolerance_of(m("tensor", "a", 0, "after_optimizer", 0)), 1.5e-4);
  // No noise (lr is the same in both): the floor, 4 epsilons.
  EXPECT_DOUBLE_EQ(c.tolerance_of(m("metric", "lr", 0, "metrics", 0)), 4 * std::ldexp(1.0, -23));
  // A gradient norm: at least the median noise of the gradients at its step (2e-6), however
  // small its own sample; at a step without gradients its own noise.
  twin.measurements.push_back(m("metric", "grad_norm_pre_clip", 0, "metrics", 1e-9));
  twin.measurements.push_back(m("metric", "grad_norm_post_clip", 1, "metrics", 3e-9));
  const Calibration norms = calibrate(twin, "float32", settings);
  EXPECT_DOUBLE_EQ(norms.noise_of(m("metric", "grad_norm_pre_clip", 0, "metrics", 0)), 2e-6);
  EXPECT_DOUBLE_EQ(norms.tolerance_of(m("metric", "grad_norm_pre_clip", 0, "metrics", 0)), 2e-5);
  EXPECT_DOUBLE_EQ(norms.noise_of(m("metric", "grad_norm_post_clip", 1, "metrics", 0)), 3e-9);
  EXPECT_DOUBLE_EQ(norms.noise_of(m("metric", "lr", 0, "metrics", 0)), 1e-9);
  twin.measurements.resize(twin.measurements.size() - 2);
  // The loss: its noise at a step is at least its noise at every earlier step (one sample
  // each; a small later one does not shrink the tolerance).
  twin.measurements.push_back(m("metric", "loss", 0, "metrics", 5e-6));
  twin.measurements.push_back(m("metric", "loss", 2, "metrics", 1e-9));
  const Calibration loss = calibrate(twin, "float32", settings);
  EXPECT_DOUBLE_EQ(loss.noise_of(m("metric", "loss", 0, "metrics", 0)), 5e-6);
  EXPECT_DOUBLE_EQ(loss.noise_of(m("metric", "loss", 2, "metrics", 0)), 5e-6);
  EXPECT_DOUBLE_EQ(loss.tolerance_of(m("metric", "loss", 2, "metrics", 0)), 5e-5);
  twin.measurements.resize(twin.measurements.size() - 2);
  // Not recorded by the twin: noise -1, the floor.
  EXPECT_EQ(c.noise_of(m("tensor", "z", 0, "grad_before_clip", 0)), -1);
  EXPECT_DOUBLE_EQ(c.tolerance_of(m("tensor", "z", 0, "grad_before_clip", 0)), 4 * std::ldexp(1.0, -23));
  settings.factor = 4;
  EXPECT_DOUBLE_EQ(calibrate(twin, "float32", settings).tolerance_of(m("tensor", "a", 0, "grad_before_clip", 0)), 8e-5);
  // k = 0 leaves the floor alone.
  settings.k = settings.k_update = 0;
  // In bfloat16 (autocast) the floor is float32's for what is held in float32, bfloat16's for
  // activations.
  const Calibration bf16 = calibrate(twin, "bfloat16", settings);
  EXPECT_DOUBLE_EQ(bf16.tolerance_of(m("tensor", "b", 0, "grad_before_clip", 0)), 4 * 4 * std::ldexp(1.0, -23));
  EXPECT_DOUBLE_EQ(bf16.tolerance_of(m("activation", "layers.0", 0, "forward_output", 0)), 4 * 4 * std::ldexp(1.0, -7));
  settings.k = -1;
  EXPECT_THROW(calibrate(twin, "float32", settings), Error);
  settings.k = 1;
  EXPECT_THROW(calibrate(twin, "int8", settings), Error);
}

void expect_fail(const Verdict& v, const std::string& needle) {
  EXPECT_EQ(v.status, Verdict::Status::kFail) << v.message;
  EXPECT_THAT(v.message, HasSubstr(needle));
}

// `judge` refuses the evidence (kFailedPrecondition, never a verdict) naming each of `named`.
void expect_refused(const std::function<void()>& judge, const std::vector<std::string>& named) {
  try {
    judge();
    ADD_FAILURE() << "judged, not refused";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Code::kFailedPrecondition) << e.message();
    for (const auto& what : named) EXPECT_THAT(e.message(), HasSubstr(what));
  }
}

TEST_F(VerdictsTest, FindingsVerdictFailsOnAnErrorFindingOfItsCodes) {
  EXPECT_TRUE(verdicts::no_error_findings(CaseEvidence(real("llama", "DpShard2")), {"MIH-STRUCT-001"}).passed());
  const fs::path dir = copy("llama", "DpShard2");
  json f = read(dir / "check/findings.json");
  f["findings"].push_back({{"code", "MIH-STRUCT-001"}, {"phase", "structure"}, {"severity", "error"},
                           {"owner", "layers.0.mlp.down_proj.weight"}, {"facts", json::object()},
                           {"message", "local shape [64, 8] is not the Shard(1) piece"}, {"remediation", "fix it"}});
  write(dir / "check/findings.json", f);
  CaseEvidence ev(dir);
  expect_fail(verdicts::no_error_findings(ev, {"MIH-STRUCT-001"}), "MIH-STRUCT-001 layers.0.mlp.down_proj.weight");
  EXPECT_TRUE(verdicts::no_error_findings(ev, {"MIH-STRUCT-002"}).passed()) << "another code is not this verdict's";
  // A finding without its severity was read as an error: it is refused, naming the field.
  f["findings"].back().erase("severity");
  write(dir / "check/findings.json", f);
  try {
    (void)verdicts::no_error_findings(CaseEvidence(dir), {"MIH-STRUCT-001"});
    ADD_FAILURE() << "a finding without its severity was judged";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Code::kFailedPrecondition);
    EXPECT_THAT(e.what(), HasSubstr("check/findings.json"));
    EXPECT_THAT(e.what(), HasSubstr("severity"));
  }
}

// No finding is a pass only when the check that emits the code ran and examined something;
// a passing verdict says what it examined.
TEST_F(VerdictsTest, FindingsVerdictFailsWhenItsCheckDidNotRunOrExaminedNothing) {
  const Verdict ok = verdicts::no_error_findings(CaseEvidence(real("llama", "DpShard2")), {"MIH-STRUCT-001"});
  EXPECT_TRUE(ok.passed()) << ok.message;
  EXPECT_THAT(ok.message, HasSubstr("structure examined 19 parameters"));
  // llama declares no tie: the tie check examined no pair.
  expect_fail(verdicts::no_error_findings(CaseEvidence(real("llama", "DpShard2")), {"MIH-STRUCT-004"}),
              "check ties ran 1 time(s) and examined no declared tied pairs");
  // The record of the structure check removed (a session that never reached it, or evidence
  // of a version without records): not a pass.
  const fs::path dir = copy("llama", "DpShard2");
  json f = read(dir / "check/findings.json");
  f["checks"].erase("structure");
  write(dir / "check/findings.json", f);
  expect_fail(verdicts::no_error_findings(CaseEvidence(dir), {"MIH-STRUCT-001"}),
              "check structure did not run on this case");
}

TEST_F(VerdictsTest, ParityNamesTheFirstDivergentQuantity) {
  CaseEvidence ref(real("llama", "Reference"));
  for (Quantity q : {Quantity::kInput, Quantity::kLoss, Quantity::kGradNorms, Quantity::kLr, Quantity::kTensors}) {
    EXPECT_TRUE(verdicts::parity(ref, CaseEvidence(real("llama", "DpShard2")), q, 1e-10).passed());
  }
  const fs::path dir = copy("llama", "DpShard2");
  auto rows = read_lines(dir / "cases/runtime/metrics.jsonl");
  rows[1]["loss"] = rows[1]["loss"].get<double>() * (1 + 1e-7);
  write_lines(dir / "cases/runtime/metrics.jsonl", rows);
  auto probes = read_lines(dir / "probes/rank0.jsonl");
  for (auto& p : probes) {
    // A small tensor: compared elementwise, from its values.
    if (p["step"] == 2 && p["stage"] == "after_optimizer") p["tensors"]["norm.weight"]["values"][5] = 1.5;
    // A large one: compared by its statistics.
    if (p["step"] == 1 && p["stage"] == "grad_before_clip") {
      ASSERT_FALSE(p["tensors"]["lm_head.weight"].contains("values"));
      p["tensors"]["lm_head.weight"]["sketch"][2] = p["tensors"]["lm_head.weight"]["sketch"][2].get<double>() + 1e-4;
    }
  }
  write_lines(dir / "probes/rank0.jsonl", probes);
  CaseEvidence ev(dir);
  expect_fail(verdicts::parity(ref, ev, Quantity::kLoss, 1e-10), "metric 'loss' at step 1");
  expect_fail(verdicts::parity(ref, ev, Quantity::kTensors, 1e-10), "parameter 'lm_head.weight' at step 1, stage grad_before_clip");
  EXPECT_THAT(verdicts::parity(ref, ev, Quantity::kTensors, 1e-10).message, HasSubstr("the next: norm.weight at step 2, after_optimizer"));
  EXPECT_TRUE(verdicts::parity(ref, ev, Quantity::kGradNorms, 1e-10).passed());
  EXPECT_TRUE(verdicts::parity(ref, ev, Quantity::kLoss, 1e-6).passed()) << "within a looser tolerance";
}

// A gradient zero in exact arithmetic (CLIP's key bias, which softmax ignores) is rounding
// residue on both sides, in different digits: compared against the step's gradient norm, it
// matches; a gradient where the reference's is residue still diverges, named.
TEST_F(VerdictsTest, AGradientZeroInExactArithmeticIsComparedAgainstTheStepsGradientNorm) {
  const fs::path ref_dir = copy("llama", "Reference"), dir = copy("llama", "DpShard2");
  auto set = [&](const fs::path& d, double odd, double even) {
    auto probes = read_lines(d / "probes/rank0.jsonl");
    for (auto& p : probes) {
      if (p["step"] != 0 || p["stage"] != "grad_before_clip") continue;
      json& values = p["tensors"]["norm.weight"]["values"];
      ASSERT_TRUE(values.is_array() && !values.empty());
      for (size_t i = 0; i < values.size(); ++i) values[i] = i % 2 ? odd : even;
    }
    write_lines(d / "probes/rank0.jsonl", probes);
  };
  set(ref_dir, 1e-22, -3e-22);
  set(dir, -2e-22, 5e-23);
  const Verdict residue = verdicts::parity(CaseEvidence(ref_dir), CaseEvidence(dir), Quantity::kTensors, 1e-10);
  EXPECT_TRUE(residue.passed()) << residue.message;
  set(dir, 1e-6, 1e-6);
  expect_fail(verdicts::parity(CaseEvidence(ref_dir), CaseEvidence(dir), Quantity::kTensors, 1e-10),
              "parameter 'norm.weight' at step 0, stage grad_before_clip");
}

// A metric that went non-finite is written as null (JSON has no NaN): a divergence naming it,
// never an exception (mih compare answered such a run with an internal error).
TEST_F(VerdictsTest, ANonFiniteMetricIsADivergenceNotACrash) {
  const fs::path dir = copy("llama", "DpShard2");
  auto rows = read_lines(dir / "cases/runtime/metrics.jsonl");
  rows[1]["loss"] = nullptr;
  rows[1]["grad_norm_pre_clip"] = nullptr;
  write_lines(dir / "cases/runtime/metrics.jsonl", rows);
  const Comparison c = compare_evidence(real("llama", "Reference"), dir, {});
  ASSERT_FALSE(c.passed());
  EXPECT_THAT(c.divergences.front().message, HasSubstr("metric 'loss' at step 1"));
  CaseEvidence ref(real("llama", "Reference"));
  expect_fail(verdicts::parity(ref, CaseEvidence(dir), Quantity::kGradNorms, 1e-10), "metric 'grad_norm_pre_clip' at step 1");
}

// The activation probes of real evidence: every module the llama port observes, in forward
// order, at the first two steps and the last (here steps 0, 1 and 2), on every case.
TEST_F(VerdictsTest, ActivationProbesListEveryObservedModuleInForwardOrder) {
  for (const char* c : {"Reference", "DpShard2", "Tp2", "DpShard2Ac"}) {
    using Key = std::pair<int64_t, std::string>;
    std::map<Key, json> lines;
    for (const auto& p : read_lines(real("llama", c) / "probes/rank0.jsonl")) {
      lines[Key(p["step"].get<int64_t>(), p["stage"].get<std::string>())] = p;
    }
    for (int64_t step : {0, 1, 2}) {
      ASSERT_TRUE(lines.count(Key(step, "forward_output"))) << c << " step " << step;
      const json& order = lines[Key(step, "forward_output")]["order"];
      const json& grads = lines[Key(step, "output_grad")]["tensors"];
      ASSERT_GE(order.size(), 12u) << c;
      EXPECT_EQ(order.front(), "embed_tokens") << c;
      EXPECT_EQ(order[1], "layers.0.input_layernorm") << c;
      EXPECT_EQ(order.back(), "lm_head") << c;
      for (const auto& m : order) {
        EXPECT_TRUE(grads.contains(m)) << c << ": no output gradient of " << m;
      }
    }
    // The parameters before a step only at the first (then they are the last after_optimizer).
    EXPECT_TRUE(lines.count(Key(0, "model_before"))) << c;
    EXPECT_FALSE(lines.count(Key(1, "model_before"))) << c;
  }
  json order;
  for (const auto& p : read_lines(real("vlm", "Reference") / "probes/rank0.jsonl")) {
    if (p["stage"] == "forward_output" && order.is_null()) order = p["order"];
  }
  ASSERT_TRUE(order.is_array());
  EXPECT_EQ(order.front(), "vision_tower.encoder.layers.0");
  EXPECT_THAT(order.dump(), HasSubstr("\"multi_modal_projector\""));
}

// Localization: the first module whose forward output diverges (forward order); else, in
// backward order, the module whose backward produced the first divergent output gradient
// (the loss when it is the head's); else the module of the first divergent parameter gradient.
TEST_F(VerdictsTest, ParityLocalizesTheModuleAtFault) {
  CaseEvidence ref(real("llama", "Reference"));
  auto broken = [&](const std::string& stage, const std::string& name, int64_t step = 0) {
    const fs::path dir = copy("llama", "Tp2");
    auto probes = read_lines(dir / "probes/rank0.jsonl");
    bool edited = false;
    for (auto& p : probes) {
      if (p["step"] == step && p["stage"] == stage) {
        auto& t = p["tensors"][name];
        EXPECT_TRUE(t.is_object()) << stage << " has no " << name;
        t["sketch"][1] = t["sketch"][1].get<double>() * (1 + 1e-6);
        edited = true;
      }
    }
    EXPECT_TRUE(edited);
    write_lines(dir / "probes/rank0.jsonl", probes);
    return verdicts::parity(ref, CaseEvidence(dir), Quantity::kTensors, 1e-10);
  };
  EXPECT_TRUE(verdicts::parity(ref, CaseEvidence(real("llama", "Tp2")), Quantity::kTensors, 1e-10).passed());
  expect_fail(broken("forward_output", "layers.1.self_attn"),
              "localized to 'layers.1.self_attn': its forward output is the first to diverge at step 0");
  expect_fail(broken("output_grad", "layers.0.post_attention_layernorm"), "localized to 'layers.0.mlp'");
  expect_fail(broken("output_grad", "layers.1"), "localized to 'norm'");
  expect_fail(broken("output_grad", "lm_head"), "localized to 'loss'");
  expect_fail(broken("grad_before_clip", "layers.0.mlp.down_proj.weight"),
              "localized to 'layers.0.mlp.down_proj': the activations and their gradients match at step 0");
  // A module one side does not observe is a divergence naming it, never a skip.
  const fs::path dir = copy("llama", "Tp2");
  auto probes = read_lines(dir / "probes/rank0.jsonl");
  for (auto& p : probes) {
    if (p["stage"] == "forward_output") p["tensors"].erase("layers.0.mlp");
  }
  write_lines(dir / "probes/rank0.jsonl", probes);
  const Verdict v = verdicts::parity(ref, CaseEvidence(dir), Quantity::kTensors, 1e-10);
  expect_fail(v, "localized to 'layers.0.mlp'");
  EXPECT_THAT(v.message, HasSubstr("recorded by the reference, missing from the candidate"));
  EXPECT_EQ(verdicts::blame(CaseEvidence(dir), "NumericParity", v.message).blamed, "layers.0.mlp");
  // A module that records half its elements (its shard, not the global activation) says so.
  const fs::path half = copy("llama", "Tp2");
  probes = read_lines(half / "probes/rank0.jsonl");
  int64_t numel = 0;
  for (auto& p : probes) {
    if (p["step"] == 0 && p["stage"] == "forward_output") {
      numel = p["tensors"]["layers.0.mlp"]["numel"].get<int64_t>();
      p["tensors"]["layers.0.mlp"]["numel"] = numel / 2;
    }
  }
  write_lines(half / "probes/rank0.jsonl", probes);
  expect_fail(verdicts::parity(ref, CaseEvidence(half), Quantity::kTensors, 1e-10),
              "holds " + std::to_string(numel / 2) + " elements, the reference's " + std::to_string(numel));
}

TEST_F(VerdictsTest, InputIdentityNamesTheFieldThatDiffers) {
  CaseEvidence ref(real("llama", "Reference"));
  EXPECT_TRUE(verdicts::same_inputs_as_reference(ref, CaseEvidence(real("llama", "DpShard2"))).passed());
  const fs::path dir = copy("llama", "DpShard2");
  auto rows = read_lines(dir / "data/input_identity.jsonl");
  rows[0]["global"] = std::string(64, '0');
  rows[0]["fields"]["labels"] = std::string(64, '0');
  write_lines(dir / "data/input_identity.jsonl", rows);
  expect_fail(verdicts::same_inputs_as_reference(ref, CaseEvidence(dir)), "in field(s) labels");
  // A hash that is no SHA-256 is refused by the typed reading, naming the line and field.
  rows[0]["fields"]["labels"] = "0000";
  write_lines(dir / "data/input_identity.jsonl", rows);
  expect_fail(verdicts::same_inputs_as_reference(ref, CaseEvidence(dir)), "input_identity.jsonl, line 1 (step 0)");
  // A field's hash changed under the reference's global hash: not the same batch either.
  rows = read_lines(real("llama", "DpShard2") / "data/input_identity.jsonl");
  rows[1]["fields"]["labels"] = std::string(64, '0');
  write_lines(dir / "data/input_identity.jsonl", rows);
  expect_fail(verdicts::same_inputs_as_reference(ref, CaseEvidence(dir)), "step 1 differs from the reference's in field(s) labels");
  // Two rows of one step: which one is read would decide the verdict.
  rows = read_lines(real("llama", "DpShard2") / "data/input_identity.jsonl");
  rows.insert(rows.begin(), rows[0]);
  write_lines(dir / "data/input_identity.jsonl", rows);
  expect_fail(verdicts::same_inputs_as_reference(ref, CaseEvidence(dir)), "two rows for step 0");
}

// The suites' declared reads (MIH_SUITE_READS): what a case of any writer must hold for a suite
// to judge it, and the files a case lacks named with whose they are.
TEST_F(VerdictsTest, SuiteReadsNameTheFilesACaseLacks) {
  for (const char* suite : {"NumericParity", "InputIdentity", "CheckpointRoundTrip", "ReplicaConsistency", "GradientSync"}) {
    ASSERT_NE(conformance::suite_row(suite).reads(), nullptr) << suite;
  }
  EXPECT_EQ(conformance::suite_row("TiedParameters").reads(), nullptr);
  const CaseEvidence tp2(real("llama", "Tp2")), ref(real("llama", "Reference"));
  const verdicts::SuiteReads& parity = *conformance::suite_row("NumericParity").reads();
  EXPECT_TRUE(verdicts::missing_reads(parity, {tp2, &ref}).empty());
  EXPECT_THAT(verdicts::missing_reads(parity, {tp2}),
              ::testing::ElementsAre("cases/runtime/metrics.jsonl (of its compare_to case)",
                                     "probes/rank0.jsonl (of its compare_to case)",
                                     "check/parameter_watchlist.json (of its compare_to case)"));
  // "<k>": some step's record. mih's session writes replicas_step<k>.json and
  // gradient_replicas_step<k>.json on a one-stage case of several ranks (not a resume's capture),
  // and no gradient digests on the one-rank reference.
  const verdicts::SuiteReads reads{.files = {verdicts::any_step(&layout::replicas_step), layout::kRoundtripLoad,
                                             verdicts::any_step(&layout::gradient_replicas_step)}};
  EXPECT_THAT(verdicts::missing_reads(reads, {tp2}), ::testing::ElementsAre("checkpoint/roundtrip_load.json (of the case)"));
  const verdicts::SuiteReads gradients{.files = {verdicts::any_step(&layout::gradient_replicas_step)}};
  EXPECT_THAT(verdicts::missing_reads(gradients, {ref}),
              ::testing::ElementsAre("cases/runtime/gradient_replicas_step<k>.json (of the case)"));
}

TEST_F(VerdictsTest, FsdpUnitsMustCoverEveryShardedParameter) {
  EXPECT_TRUE(verdicts::fsdp_units_cover_parameters(CaseEvidence(real("llama", "DpShard2"))).passed());
  EXPECT_EQ(verdicts::fsdp_units_cover_parameters(CaseEvidence(real("llama", "Reference"))).status, Verdict::Status::kSkip);
  const fs::path dir = copy("llama", "DpShard2");
  json units = read(dir / "check/fsdp_units.json");
  auto& params = units["layers.0"]["parameters"];
  params.erase(params.begin());
  write(dir / "check/fsdp_units.json", units);
  expect_fail(verdicts::fsdp_units_cover_parameters(CaseEvidence(dir)), "is in no FSDP unit");
}

TEST_F(VerdictsTest, CheckpointRoundTripIsBitExact) {
  EXPECT_TRUE(verdicts::checkpoint_round_trip(CaseEvidence(real("llama", "ResumeDpShard2ToTp2"))).passed());
  EXPECT_TRUE(verdicts::resume_continues_step_count(CaseEvidence(real("llama", "ResumeDpShard2ToTp2"))).passed());
  const fs::path dir = copy("llama", "ResumeDpShard2ToTp2");
  json loaded = read(dir / "checkpoint/roundtrip_load.json");
  loaded["tensors"]["norm.weight/exp_avg"]["sha256"] = std::string(64, 'd');
  write(dir / "checkpoint/roundtrip_load.json", loaded);
  expect_fail(verdicts::checkpoint_round_trip(CaseEvidence(dir)), "'norm.weight/exp_avg' is not bit-exact after the load");
  // The same judge for a case of any writer (mih check of another writer's evidence).
  expect_fail(verdicts::restored_what_was_saved(CaseEvidence(dir)), "'norm.weight/exp_avg' is not bit-exact after the load");
  // A capture without its step counter is refused naming the file and the field, never read as -1.
  json no_step = loaded;
  no_step.erase("next_step");
  write(dir / "checkpoint/roundtrip_load.json", no_step);
  try {
    verdicts::restored_what_was_saved(CaseEvidence(dir));
    ADD_FAILURE() << "a load capture without next_step was judged";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Code::kFailedPrecondition);
    EXPECT_THAT(e.message(), HasSubstr("checkpoint/roundtrip_load.json"));
    EXPECT_THAT(e.message(), HasSubstr("next_step"));
  }
  write(dir / "checkpoint/roundtrip_load.json", loaded);
  auto rows = read_lines(dir / "cases/runtime/metrics.jsonl");
  rows.insert(rows.begin(), rows.front());
  rows.front()["step"] = 0;
  write_lines(dir / "cases/runtime/metrics.jsonl", rows);
  expect_fail(verdicts::resume_continues_step_count(CaseEvidence(dir)), "trained steps [0,2], expected [2]");
}

TEST_F(VerdictsTest, StateInvariantsAndModuleParityNameTheFailedOne) {
  CaseEvidence ref(real("llama", "Reference"));
  EXPECT_TRUE(verdicts::state_invariants(ref).passed());
  EXPECT_TRUE(verdicts::module_parity(ref).passed());
  EXPECT_EQ(verdicts::module_parity(CaseEvidence(real("llama", "DpShard2"))).status, Verdict::Status::kSkip);
  const fs::path dir = copy("llama", "Reference");
  json inv = read(dir / "check/invariants_structure.json");
  const std::string name = inv.begin().key();
  inv[name]["passed"] = false;
  write(dir / "check/invariants_structure.json", inv);
  json parity = read(dir / "check/module_parity.json");
  // The real evidence: per case, each observation with its error and tolerance.
  const json& swiglu = parity["fused_swiglu_vs_unfused"];
  ASSERT_EQ(swiglu["observations"].size(), 4u) << swiglu.dump();
  for (const auto& o : swiglu["observations"]) {
    EXPECT_TRUE(o["passed"].get<bool>()) << o.dump();
    EXPECT_LE(o["relative_error"].get<double>(), o["tolerance"].get<double>()) << o.dump();
  }
  EXPECT_EQ(swiglu["observations"][3]["name"], "grad:down_proj.weight");
  // A gradient observation over its tolerance: the verdict names case, observation, error,
  // tolerance and file.
  json broken = parity;
  broken["fused_swiglu_vs_unfused"]["observations"][3]["relative_error"] = 0.5;
  broken["fused_swiglu_vs_unfused"]["observations"][3]["max_abs_error"] = 0.25;
  broken["fused_swiglu_vs_unfused"]["observations"][3]["passed"] = false;
  broken["fused_swiglu_vs_unfused"]["passed"] = false;
  write(dir / "check/module_parity.json", broken);
  CaseEvidence ev(dir);
  expect_fail(verdicts::state_invariants(ev), "invariant '" + name + "' failed");
  expect_fail(verdicts::module_parity(ev),
              "module parity case 'fused_swiglu_vs_unfused': observation 'grad:down_proj.weight' relative error 0.5 > "
              "tolerance 1e-12 (max abs error 0.25) (open " + (dir / "check/module_parity.json").string() + ")");
  // An observation the file says passed at a tolerance the spec does not declare: the
  // declared one decides, and the evidence is refused.
  json loosened = parity;
  loosened["fused_swiglu_vs_unfused"]["observations"][3]["relative_error"] = 0.5;
  loosened["fused_swiglu_vs_unfused"]["observations"][3]["tolerance"] = 1e6;
  write(dir / "check/module_parity.json", loosened);
  EXPECT_THAT([&] { verdicts::module_parity(CaseEvidence(dir)); },
              ::testing::ThrowsMessage<Error>(HasSubstr("observation 'grad:down_proj.weight' was judged at tolerance "
                                                        "1e+06, and the spec declares 1e-12")));
  loosened["fused_swiglu_vs_unfused"]["observations"][3]["tolerance"] = 1e-12;
  write(dir / "check/module_parity.json", loosened);
  EXPECT_THAT([&] { verdicts::module_parity(CaseEvidence(dir)); },
              ::testing::ThrowsMessage<Error>(HasSubstr("says passed true at relative error 0.5 and tolerance 1e-12")));
  // A parameter the adapter left unmapped.
  broken = parity;
  broken["fused_swiglu_vs_unfused"] = {{"passed", false}, {"trainable", {"gate_up_proj.weight", "down_proj.weight"}},
                                       {"unmapped", {"down_proj.weight"}}, {"observations", json::array()}};
  write(dir / "check/module_parity.json", broken);
  expect_fail(verdicts::module_parity(CaseEvidence(dir)), "the weight adapter maps no reference weight from the "
                                                          "candidate's trainable parameter(s) [\"down_proj.weight\"]");
  // A case that recorded no observation is not a pass.
  broken["fused_swiglu_vs_unfused"] = {{"passed", true}, {"unmapped", json::array()}, {"observations", json::array()}};
  write(dir / "check/module_parity.json", broken);
  expect_fail(verdicts::module_parity(CaseEvidence(dir)), "module parity case 'fused_swiglu_vs_unfused' recorded no observation");
}

TEST_F(VerdictsTest, ModalityGradientsFailOnAModalityWithoutGradient) {
  EXPECT_EQ(verdicts::modality_gradients(CaseEvidence(real("llama", "Reference"))).status, Verdict::Status::kSkip);
  EXPECT_TRUE(verdicts::modality_gradients(CaseEvidence(real("vlm", "Reference"))).passed());
  const fs::path dir = copy("vlm", "Reference");
  json f = read(dir / "check/findings.json");
  f["findings"].push_back({{"code", "MIH-MODAL-001"}, {"phase", "runtime"}, {"severity", "error"},
                           {"owner", "vision_tower.patch_embed.weight"}, {"facts", json::object()},
                           {"message", "no gradient"}, {"remediation", "r"}});
  write(dir / "check/findings.json", f);
  expect_fail(verdicts::modality_gradients(CaseEvidence(dir)), "vision_tower.patch_embed.weight");
  fs::remove(dir / "cases/runtime/modality_gradients_step1.json");
  f["findings"].erase(f["findings"].size() - 1);
  write(dir / "check/findings.json", f);
  expect_fail(verdicts::modality_gradients(CaseEvidence(dir)), "no modality gradient evidence for step 1");
}

TEST_F(VerdictsTest, ActivationCheckpointMustBeOnWhenAsked) {
  EXPECT_TRUE(verdicts::activation_checkpoint_enabled(CaseEvidence(real("llama", "DpShard2Ac"))).passed());
  EXPECT_EQ(verdicts::activation_checkpoint_enabled(CaseEvidence(real("llama", "DpShard2"))).status, Verdict::Status::kSkip);
  const fs::path dir = copy("llama", "DpShard2Ac");
  json ac = read(dir / "check/activation_checkpoint.json");
  ASSERT_FALSE(ac["steps"].empty()) << "mih's session writes the runtime's counts from the first step on";
  ac["enabled"] = false;  // the runtime's steps as they were, the config flag off
  write(dir / "check/activation_checkpoint.json", ac);
  expect_fail(verdicts::activation_checkpoint_enabled(CaseEvidence(dir)), "ran without it");
  // A record without steps is not mih's (its session writes them): refused naming the field,
  // where it was a failed verdict that blamed the runtime.
  ac.erase("steps");
  write(dir / "check/activation_checkpoint.json", ac);
  expect_refused([&] { verdicts::activation_checkpoint_enabled(CaseEvidence(dir)); },
                 {"check/activation_checkpoint.json", "steps"});
  // Steps recorded and none of them with a recompute: the runtime recomputed nothing.
  ac["enabled"] = true;
  ac["steps"] = json::array();
  write(dir / "check/activation_checkpoint.json", ac);
  expect_fail(verdicts::activation_checkpoint_enabled(CaseEvidence(dir)), "records no step of what the runtime recomputed");
}

// The checks' evidence the verdicts judge is read typed, never with a default: a unit without
// dtypes was "holds []", an invariant without passed a failed invariant, an observation without
// its tolerance "judged at tolerance not finite", a parity case declared without grad_tolerance
// judged the gradients at the output's tolerance, and a finding without severity was handed on.
// Each is now refused naming the file and the field.
TEST_F(VerdictsTest, ChecksEvidenceMissingAFieldIsRefusedByName) {
  const fs::path shard = copy("llama", "DpShard2");
  json units = read(shard / "check/fsdp_units.json");
  units["layers.0"].erase("dtypes");
  write(shard / "check/fsdp_units.json", units);
  expect_refused([&] { verdicts::fsdp_units_cover_parameters(CaseEvidence(shard)); },
                 {"check/fsdp_units.json", "dtypes"});
  const fs::path dir = copy("llama", "Reference");
  const json inv = read(dir / "check/invariants_structure.json");
  json no_passed = inv;
  no_passed.begin().value().erase("passed");
  write(dir / "check/invariants_structure.json", no_passed);
  expect_refused([&] { verdicts::state_invariants(CaseEvidence(dir)); }, {"check/invariants_structure.json", "passed"});
  write(dir / "check/invariants_structure.json", inv);
  const json parity = read(dir / "check/module_parity.json");
  json no_tolerance = parity;
  no_tolerance["fused_swiglu_vs_unfused"]["observations"][0].erase("tolerance");
  write(dir / "check/module_parity.json", no_tolerance);
  expect_refused([&] { verdicts::module_parity(CaseEvidence(dir)); }, {"check/module_parity.json", "tolerance"});
  write(dir / "check/module_parity.json", parity);
  const json spec = read(dir / "spec.resolved.json");
  json no_grad_tolerance = spec;
  ASSERT_FALSE(no_grad_tolerance["module_parity_cases"].empty());
  no_grad_tolerance["module_parity_cases"][0].erase("grad_tolerance");
  write(dir / "spec.resolved.json", no_grad_tolerance);
  expect_refused([&] { verdicts::module_parity(CaseEvidence(dir)); }, {"spec.resolved.json", "grad_tolerance"});
  json no_invariant_name = spec;
  ASSERT_FALSE(no_invariant_name["invariants"].empty());
  no_invariant_name["invariants"][0].erase("name");
  write(dir / "spec.resolved.json", no_invariant_name);
  expect_refused([&] { verdicts::state_invariants(CaseEvidence(dir)); }, {"spec.resolved.json", "invariants"});
  write(dir / "spec.resolved.json", spec);
  json findings = read(dir / "check/findings.json");
  findings["findings"].push_back({{"code", "MIH-STRUCT-001"}, {"phase", "structure"}, {"owner", "w"},
                                  {"message", "m"}, {"facts", json::object()}, {"remediation", "r"}});
  write(dir / "check/findings.json", findings);
  expect_refused([&] { (void)CaseEvidence(dir).findings(); }, {"check/findings.json", "severity"});
}

TEST_F(VerdictsTest, CommVolumeMatchesTheConfig) {
  for (const char* c : {"Reference", "DpShard2", "DpShard2Ac", "Tp2", "ResumeDpShard2ToTp2"}) {
    const Verdict v = verdicts::comm_volume(CaseEvidence(real("llama", c)));
    EXPECT_TRUE(v.passed()) << c << ": " << v.message;
  }
  const fs::path dir = copy("llama", "DpShard2");
  auto rows = read_lines(dir / "cases/runtime/metrics.jsonl");
  const auto original = rows;
  rows[1]["comm_bytes"]["dp_shard"] = rows[1]["comm_bytes"]["dp_shard"].get<int64_t>() / 2;  // a reduce-scatter skipped
  write_lines(dir / "cases/runtime/metrics.jsonl", rows);
  expect_fail(verdicts::comm_volume(CaseEvidence(dir)), "axis dp_shard moved");
  rows = original;
  rows[0]["comm_bytes"]["tp"] = 64;
  write_lines(dir / "cases/runtime/metrics.jsonl", rows);
  expect_fail(verdicts::comm_volume(CaseEvidence(dir)), "axis tp has degree 1 and moved 64 bytes");

  // tp is exact per call site: a row-parallel all-reduce issued twice (the output reduced
  // again) is named with the layers that declare the site.
  const fs::path tp = copy("llama", "Tp2");
  rows = read_lines(tp / "cases/runtime/metrics.jsonl");
  const int64_t once = rows[0]["comm_sites"]["tp"]["region.reduce_from"].get<int64_t>();
  rows[0]["comm_sites"]["tp"]["region.reduce_from"] = once + once / 5;  // one of the 5 calls twice
  write_lines(tp / "cases/runtime/metrics.jsonl", rows);
  expect_fail(verdicts::comm_volume(CaseEvidence(tp)), "axis tp, call site region.reduce_from: moved");
  expect_fail(verdicts::comm_volume(CaseEvidence(tp)), "layers.0.self_attn.o_proj");
  // A site the ledger shows and no layer declares (a column-parallel input gradient reduced
  // by a layer that should not: here, the declarations removed) fails the same way.
  const fs::path sp = copy("llama", "Tp2");
  rows = read_lines(sp / "cases/runtime/metrics.jsonl");
  rows[0]["comm_expected"]["tp"]["region.copy_to.backward"] = 0;
  write_lines(sp / "cases/runtime/metrics.jsonl", rows);
  expect_fail(verdicts::comm_volume(CaseEvidence(sp)), "call site region.copy_to.backward");
}

// The resolved spec a comparison and the tolerances read is validated, never read with a
// default: a spec.resolved.json without its name was compared as a spec of no name, one without
// its cross-topology tolerances fell back to a default message of another code.
TEST_F(VerdictsTest, AResolvedSpecMissingAFieldIsRefusedByName) {
  const fs::path dir = copy("llama", "DpShard2");
  json spec = read(dir / "spec.resolved.json");
  spec.erase("name");
  write(dir / "spec.resolved.json", spec);
  try {
    (void)compare_evidence(real("llama", "Reference"), dir, {});
    ADD_FAILURE() << "evidence of a spec without its name was compared";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Code::kFailedPrecondition);
    EXPECT_THAT(e.what(), HasSubstr("spec.resolved.json"));
    EXPECT_THAT(e.what(), HasSubstr("'name'"));
  }
  spec = read(real("llama", "DpShard2") / "spec.resolved.json");
  spec["tolerances"].erase("cross_topology");
  write(dir / "spec.resolved.json", spec);
  try {
    (void)verdicts::case_tolerance(CaseEvidence(dir));
    ADD_FAILURE() << "a spec without its cross-topology tolerances gave one";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Code::kFailedPrecondition);
    EXPECT_THAT(e.what(), HasSubstr("cross_topology"));
  }
}

// CommVolume reads metrics and the parameter table typed: a row without comm_bytes was read as
// nothing moved (a world-size-1 case passed), a parameter without requires_grad as trainable.
TEST_F(VerdictsTest, CommVolumeRefusesEvidenceMissingAField) {
  const fs::path dir = copy("llama", "Reference");
  auto rows = read_lines(dir / "cases/runtime/metrics.jsonl");
  for (auto& r : rows) r.erase("comm_bytes");
  write_lines(dir / "cases/runtime/metrics.jsonl", rows);
  expect_fail(verdicts::comm_volume(CaseEvidence(dir)), "have no comm_bytes");
  const fs::path table = copy("llama", "Reference");
  json structure = read(table / "check/structure.json");
  structure["parameters"][0].erase("requires_grad");
  write(table / "check/structure.json", structure);
  try {
    (void)verdicts::comm_volume(CaseEvidence(table));
    ADD_FAILURE() << "a parameter without requires_grad was read as trainable";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Code::kFailedPrecondition);
    EXPECT_THAT(e.what(), HasSubstr("check/structure.json"));
    EXPECT_THAT(e.what(), HasSubstr("requires_grad"));
  }
}

TEST_F(VerdictsTest, MissingOrForeignEvidenceIsAClearError) {
  const fs::path dir = copy("llama", "DpShard2");
  fs::remove(dir / "check/findings.json");
  try {
    (void)verdicts::no_error_findings(CaseEvidence(dir), {"MIH-STRUCT-001"});
    ADD_FAILURE() << "no error for a missing findings.json";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Code::kFailedPrecondition);
    EXPECT_THAT(e.what(), HasSubstr("check/findings.json is missing"));
  }
  EXPECT_THROW(CaseEvidence(dir / "nope"), Error);
}

// The case the verdicts read is environment.json's, typed: a case whose kind was removed (it
// read as "train" with a default) or that names a field mih never writes is an evidence
// problem naming the file, never judged as another kind of case.
TEST_F(VerdictsTest, AnEditedCaseIsRefusedNotReadWithDefaults) {
  const fs::path dir = copy("llama", "ResumeDpShard2ToTp2");
  EXPECT_EQ(CaseEvidence(dir).resolved_case().kind, spec::CaseKind::kCrossResume);
  json env = read(dir / "environment.json");
  env["case"].erase("kind");
  write(dir / "environment.json", env);
  try {
    (void)verdicts::resume_continues_step_count(CaseEvidence(dir));
    ADD_FAILURE() << "a case without its kind was judged";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Code::kFailedPrecondition);
    EXPECT_THAT(e.what(), HasSubstr("environment.json"));
    EXPECT_THAT(e.what(), HasSubstr("kind"));
  }
  env = read(dir / "environment.json");
  env["case"]["kind"] = "cross_resume";
  env["case"]["resume_step"] = 1;
  write(dir / "environment.json", env);
  EXPECT_THROW((void)CaseEvidence(dir).resolved_case(), Error);
}

TEST_F(VerdictsTest, PlainBackendReproducesTheTrainerReference) {
  // The plain loop (its own optimizer groups, micro-batching and clip_grad_norm_) against the
  // Trainer on the same spec: every quantity within the float64 oracle tolerance.
  const fs::path plain_root = testing::temp_dir("plain");
  const cases::CaseRunResult r = run("llama", "Reference", plain_root, "plain");
  ASSERT_EQ(r.outcome, Outcome::kRan) << r.error;
  CompareOptions co;
  co.tolerance = 1e-10;
  const Comparison c = compare_evidence(real("llama", "Reference"), r.evidence, co);
  EXPECT_TRUE(c.passed()) << c.summary();
  EXPECT_GT(c.compared, 100);
  EXPECT_THROW(run("llama", "DpShard2", plain_root, "plain"), Error)
      << "the plain backend cannot run 2 ranks; rejected before any rank starts";
}

TEST_F(VerdictsTest, ADeadRankIsATransportFailureNotAVerdict) {
  const cases::CaseRunResult r = run("llama", "DpShard2", testing::temp_dir("crash"), "crashing");
  EXPECT_EQ(r.outcome, Outcome::kTransportFailure);
  EXPECT_THAT(r.error, HasSubstr("rank 0"));
  EXPECT_NE(r.code, Code::kOk);
  EXPECT_EQ(read(r.evidence / "case_run.json")["outcome"], "transport_failure");
}

}  // namespace
}  // namespace mih
