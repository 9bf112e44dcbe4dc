// The case matrix: the presets resolve for every reference spec within their rank limit, a
// case the spec's topology cannot take is rejected with the arithmetic, a resume gets its
// uninterrupted twin, and malformed matrices are rejected naming the case and field.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "harness/base/error.h"
#include "harness/base/files.h"
#include "harness/spec/case_matrix.h"
#include "tests/support/temp_dir.h"

namespace mih::spec {
namespace {

using nlohmann::json;
using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

std::vector<std::string> names(const CaseMatrix& m) {
  std::vector<std::string> out;
  for (const auto& c : m.cases) out.push_back(c.name);
  return out;
}

class PresetTest : public ::testing::TestWithParam<std::string> {};

TEST_P(PresetTest, ResolvesForEveryReferenceSpecWithinItsRankLimit) {
  for (const std::string& spec : SpecRegistry::instance().names()) {
    const CaseMatrix m = resolve_matrix_source(SpecRegistry::instance().get(spec), GetParam());
    ASSERT_FALSE(m.cases.empty());
    EXPECT_EQ(m.cases[0].name, "Reference");
    EXPECT_EQ(m.cases[0].config.dtype, DType::kFloat64);
    EXPECT_EQ(m.cases[0].world_size(), 1);
    for (const auto& c : m.cases) {
      EXPECT_LE(c.world_size(), 4) << c.name;
      EXPECT_NO_THROW(c.config.validate(c.world_size())) << c.name;
      if (c.kind != CaseKind::kReference && !c.compare_to.empty()) {  // a case trainer's Reference<suffix>
        EXPECT_THAT(names(m), Contains(c.compare_to)) << c.name;
      }
    }
    // cpu-smoke rejects only its ep cases, on the specs without routed experts, and its pp
    // cases, on the specs whose port builds no pipeline stages.
    for (const auto& r : m.rejected) {
      if (GetParam() == "cpu-full") continue;
      if (r.name.rfind("Pp", 0) == 0 || r.name.find("Pp2") != std::string::npos) {
        EXPECT_THAT(r.reason, HasSubstr("(ModelSpec::pipeline_layers is 0: the port builds no stages)")) << spec << " " << r.name;
        EXPECT_EQ(SpecRegistry::instance().get(spec).pipeline_layers, 0) << spec;
        continue;
      }
      EXPECT_THAT(r.reason, HasSubstr("has none (ModelSpec::num_experts is 0)")) << spec << " " << r.name;
      EXPECT_EQ(SpecRegistry::instance().get(spec).num_experts, 0) << spec;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Presets, PresetTest, ::testing::Values("cpu-smoke", "cpu-full"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param == "cpu-smoke" ? std::string("CpuSmoke") : std::string("CpuFull");
                         });

TEST(CaseMatrixTest, NamesKindsGroupsAndTwins) {
  const CaseMatrix m = resolve_matrix_source(SpecRegistry::instance().get("llama"), "cpu-smoke");
  EXPECT_THAT(names(m), ::testing::ElementsAre("Reference", "DpShard2", "DpReplicate2", "Tp2", "Tp2Sp", "Tp4", "Cp2Zz",
                                               "DpShard2Cp2", "DpShard2Tp2Sp",
                                               "DpShard2Ac", "DpShard2Mb2", "Pp2", "Pp2Mb4", "Pp2DpShard2Mb2", "Pp2Tp2SpMb2",
                                               "Pp2AcMb4", "ResumeDpShard2", "ResumeDpShard2ToTp2", "ResumePp2ToDpShard2",
                                               "ResumeDpShard2ToPp2", "ResumeDpShard2SgdCosine", "DpShard2SgdCosine",
                                               "ReferenceSgdCosine"));
  EXPECT_EQ(m.at("ResumeDpShard2SgdCosine").compare_to, "DpShard2SgdCosine");
  EXPECT_EQ(m.at("DpShard2SgdCosine").compare_to, "ReferenceSgdCosine");
  EXPECT_EQ(m.at("DpShard2SgdCosine").trainer.at("optimizer"), "sgd");
  EXPECT_EQ(m.at("Pp2Mb4").group, "pipeline");
  EXPECT_EQ(m.at("Pp2Mb4").config.pp_schedule, pp::ScheduleKind::k1F1B);
  EXPECT_EQ(m.at("ResumeDpShard2ToPp2").compare_to, "Pp2");
  EXPECT_EQ(m.at("DpReplicate2").group, "axis");
  EXPECT_EQ(m.at("DpShard2Cp2").config.cp_layout, CpLayout::kContiguous);
  EXPECT_EQ(m.at("DpShard2Tp2Sp").group, "combined");
  EXPECT_EQ(m.at("DpShard2Ac").group, "activation_checkpoint");
  EXPECT_EQ(m.at("DpShard2Mb2").group, "grad_accumulation");
  const Case& cross = m.at("ResumeDpShard2ToTp2");
  EXPECT_EQ(cross.kind, CaseKind::kCrossResume);
  ASSERT_TRUE(cross.save_config.has_value());
  EXPECT_EQ(cross.save_config->dp_shard, 2);
  EXPECT_EQ(cross.config.tp, 2);
  EXPECT_EQ(cross.resume_at, 2);
  EXPECT_EQ(cross.compare_to, "Tp2");
  EXPECT_EQ(m.at("ResumeDpShard2").compare_to, "DpShard2");
  EXPECT_THAT([&] { m.at("Tp8"); }, ThrowsMessage<Error>(HasSubstr("has no case 'Tp8'; cases: Reference, DpShard2")));
  EXPECT_THAT(m.table(), HasSubstr("ResumeDpShard2ToTp2"));
}

// The main job's matrix holds each mesh axis alone at degree 2 (tp without sequence
// parallelism too): a bug on a plain single-axis path (DDP over dp_replicate alone, say) is not
// hidden behind a combination that happens to compensate it.
TEST(CaseMatrixTest, CpuSmokeHoldsEachAxisAloneAtDegreeTwo) {
  const CaseMatrix m = resolve_matrix_source(SpecRegistry::instance().get("llama"), "cpu-smoke");
  for (const auto& d : kMeshDims) {
    bool alone = false;
    for (const auto& c : m.cases) {
      // A pipeline needs micro-batches to overlap its stages: pp alone is pp with them.
      if (c.kind != CaseKind::kTrain || c.config.sequence_parallel || c.config.activation_checkpointing ||
          (c.config.micro_batches > 1 && d.name != "pp") || c.config.vpp > 1) {
        continue;
      }
      int others = 0;
      for (const auto& e : kMeshDims) others += e.name != d.name && c.config.*e.degree > 1;
      alone = alone || (c.config.*d.degree == 2 && others == 0);
    }
    EXPECT_TRUE(alone) << "no cpu-smoke case has " << d.name << "=2 alone:\n" << m.table();
  }
}

// The moe spec's cpu-smoke: its ep cases, each with its EP=1 control (the same config with the
// experts replicated), added when the matrix lacks it; the cross-topology resumes ep=2 <-> 1.
TEST(CaseMatrixTest, ExpertParallelCasesGetTheirEp1Control) {
  const CaseMatrix m = resolve_matrix_source(SpecRegistry::instance().get("moe"), "cpu-smoke");
  for (const char* c : {"DpShard2Ep2", "DpShard4Ep2", "DpShard2Tp2Ep2Sp", "DpShard2Ep2Ac", "DpReplicate2DpShard2Ep2",
                        "Cp4ZzEp2", "ResumeDpShard2Ep2ToDpShard2", "ResumeDpShard2ToDpShard2Ep2"}) {
    EXPECT_THAT(names(m), Contains(std::string(c))) << m.table();
  }
  EXPECT_EQ(m.at("DpShard2Ep2").group, "expert_parallel");
  EXPECT_EQ(m.at("DpShard2Ep2").config.ep, 2);
  // The expert gradients over dp_replicate (edp = 1: whole) and over edp without FSDP (ep
  // carved out of cp, dp_shard = 1).
  EXPECT_EQ(m.at("DpReplicate2DpShard2Ep2").config.dp_replicate, 2);
  EXPECT_EQ(m.at("Cp4ZzEp2").config.cp, 4);
  // The controls: DpShard2, DpShard2Tp2Sp and DpShard2Ac were listed; DpReplicate2DpShard2,
  // DpShard4 and Cp4Zz are added.
  ASSERT_THAT(names(m), Contains(std::string("DpShard4")));
  ASSERT_THAT(names(m), Contains(std::string("Cp4Zz")));
  EXPECT_EQ(m.at("DpShard4").config.ep, 1);
  EXPECT_EQ(m.at("DpShard4").config.dp_shard, 4);
  EXPECT_EQ(m.at("DpShard4").compare_to, "Reference");
  EXPECT_TRUE(m.rejected.empty()) << m.table();
  // A dense spec has no experts to shard; 4 experts do not split over ep=3.
  const json ep_cases = {{"name", "ep"},
                         {"max_world_size", 8},
                         {"cases", {{{"dp_shard", 2}, {"ep", 2}}, {{"dp_shard", 3}, {"ep", 3}}}}};
  const CaseMatrix dense = resolve_matrix(SpecRegistry::instance().get("llama"), ep_cases);
  ASSERT_EQ(dense.rejected.size(), 2u) << dense.table();
  EXPECT_THAT(dense.rejected[0].reason, HasSubstr("ep=2 shards routed experts, and spec 'llama' has none"));
  const CaseMatrix moe = resolve_matrix(SpecRegistry::instance().get("moe"), ep_cases);
  ASSERT_EQ(moe.rejected.size(), 1u) << moe.table();
  EXPECT_EQ(moe.rejected[0].name, "DpShard3Ep3");
  EXPECT_THAT(moe.rejected[0].reason, HasSubstr("ep=3 does not divide the 4 experts of spec 'moe' (4 % 3 = 1)"));
}

TEST(CaseMatrixTest, RejectsWhatTheTopologyCannotTakeWithTheArithmetic) {
  const ModelSpec llama = SpecRegistry::instance().get("llama");
  const json matrix = {{"name", "t"},
                       {"dtype", "float64"},
                       {"max_world_size", 8},
                       {"cases",
                        {{{"tp", 3}},
                         {{"cp", 3}, {"cp_layout", "zigzag"}},
                         {{"dp_shard", 3}},
                         {{"dp_shard", 4}, {"tp", 4}},
                         {{"dp_shard", 2}, {"micro_batches", 8}}}}};
  const CaseMatrix m = resolve_matrix(llama, matrix);
  ASSERT_EQ(m.rejected.size(), 5u) << m.table();
  EXPECT_THAT(m.rejected[0].reason, HasSubstr("tp=3 does not divide"));
  EXPECT_THAT(m.rejected[1].reason, HasSubstr("splits the sequence into 6 chunks; seq_len 64 % 6 = 4"));
  EXPECT_THAT(m.rejected[2].reason, HasSubstr("the global batch of 8 rows does not split over dp_replicate(1) x dp_shard(3)"));
  EXPECT_THAT(m.rejected[3].reason, HasSubstr("needs 16 ranks (dp_shard=4,tp=4), the matrix allows at most 8"));
  EXPECT_THAT(m.rejected[4].reason, HasSubstr("micro_batches(8) = 16 (remainder 8)"));
  EXPECT_EQ(names(m), std::vector<std::string>{"Reference"});
}

// tp above the key/value heads runs where it is a multiple of them (each KV head replicated
// over tp / num_key_value_heads ranks), and cpu-smoke has such a case for every reference spec
// with grouped-query attention (issue 52: a wrong KV head per rank at tp 4 was green there).
// tp neither dividing the KV heads nor a multiple of them is rejected with both remainders; the
// spec's JSON records the heads for the diagnosis.
TEST(CaseMatrixTest, TpAboveTheKvHeadsRunsWhereItIsAMultipleOfThem) {
  // The query heads the spec's Hugging Face config declares (a LLaVA's in its text_config).
  auto query_heads = [](const ModelSpec& s) {
    const json& f = s.checkpoint.hf.fields;
    return (f.contains("text_config") ? f["text_config"] : f).value("num_attention_heads", int64_t{0});
  };
  int64_t gqa_specs = 0;
  for (const std::string& name : SpecRegistry::instance().names()) {
    const ModelSpec spec = SpecRegistry::instance().get(name);
    if (spec.num_key_value_heads == 0 || query_heads(spec) <= spec.num_key_value_heads) continue;
    ++gqa_specs;
    for (const char* preset : {"cpu-smoke", "cpu-smoke-variants"}) {
      const CaseMatrix m = resolve_matrix_source(spec, preset);
      bool above = false;
      for (const auto& c : m.cases) above = above || (m.is_listed(c.name) && c.config.tp > spec.num_key_value_heads);
      EXPECT_TRUE(above) << "spec " << name << " on " << preset << " has no listed case with tp > its "
                         << spec.num_key_value_heads << " KV heads:\n" << m.table();
    }
  }
  EXPECT_GE(gqa_specs, 4) << "llama, moe, moe_qwen and vlm have grouped-query attention";
  EXPECT_EQ(SpecRegistry::instance().get("gpt2").num_key_value_heads, 4);  // one per query head
  const ModelSpec llama = SpecRegistry::instance().get("llama");
  EXPECT_EQ(llama.num_key_value_heads, 2);
  EXPECT_EQ(llama.to_json()["num_key_value_heads"], 2);
  EXPECT_TRUE(resolve_matrix_source(llama, "cpu-smoke").is_listed("Tp4"));
  ModelSpec three_kv = llama;
  three_kv.tp_divides = {};
  three_kv.num_key_value_heads = 3;
  const CaseMatrix m = resolve_matrix(three_kv, json{{"name", "t"}, {"cases", {{{"tp", 2}}, {{"tp", 3}}}}});
  EXPECT_EQ(names(m), (std::vector<std::string>{"Reference", "Tp3"})) << m.table();
  ASSERT_EQ(m.rejected.size(), 1u);
  EXPECT_THAT(m.rejected[0].reason,
              HasSubstr("tp=2 neither divides the 3 key/value heads of spec 'llama' nor is a multiple of them (3 % 2 = 1, "
                        "2 % 3 = 2)"));
}

// The moe's objective depends on the micro-batching (its load-balancing loss is over each
// micro-batch's routing), so it declares gradient accumulation not comparable: cpu-smoke lists
// a pp case of one micro-batch, on which NumericParity compares the moe under pp with the
// Reference (issue 52: every listed moe pp case had micro-batches).
TEST(CaseMatrixTest, CpuSmokeListsAMoePipelineCaseNumericParityCompares) {
  const ModelSpec moe = SpecRegistry::instance().get("moe");
  ASSERT_FALSE(moe.tolerances.grad_accumulation_reason.empty());
  const CaseMatrix m = resolve_matrix_source(moe, "cpu-smoke");
  std::vector<std::string> comparable;
  for (const auto& c : m.cases) {
    if (c.kind == CaseKind::kTrain && c.config.pp > 1 && c.config.micro_batches == 1 && m.is_listed(c.name)) {
      comparable.push_back(c.name);
    }
  }
  EXPECT_THAT(comparable, Contains("Pp2")) << m.table();
  EXPECT_EQ(m.at("Pp2").compare_to, "Reference");
}

// A pipeline-parallel case runs where the spec declares layers its port splits into stages
// (ModelSpec::pipeline_layers) that the stages divide; elsewhere it is rejected with the
// arithmetic, never trained on a model that builds no stages.
TEST(CaseMatrixTest, PipelineCasesNeedLayersTheStagesDivide) {
  const json matrix = {{"name", "t"}, {"dtype", "float64"},
                       {"cases", {{{"pp", 2}, {"micro_batches", 2}}, {{"pp", 2}, {"vpp", 2}, {"micro_batches", 2}}}}};
  const CaseMatrix llama = resolve_matrix(SpecRegistry::instance().get("llama"), matrix);
  EXPECT_EQ(names(llama), (std::vector<std::string>{"Reference", "Pp2Mb2"})) << llama.table();
  ASSERT_EQ(llama.rejected.size(), 1u);
  EXPECT_EQ(llama.rejected[0].name, "Pp2Vpp2Mb2");
  EXPECT_THAT(llama.rejected[0].reason, HasSubstr("pp(2) x vpp(2) = 4 stages do not divide the 2 layers of spec 'llama'"));
  const CaseMatrix vlm = resolve_matrix(SpecRegistry::instance().get("vlm"), matrix);
  EXPECT_EQ(names(vlm), std::vector<std::string>{"Reference"});
  ASSERT_EQ(vlm.rejected.size(), 2u);
  EXPECT_THAT(vlm.rejected[0].reason, HasSubstr("spec 'vlm' declares no layers to split (ModelSpec::pipeline_layers is 0"));
}

// A user's file without "dtype" is the float64 lane the presets are (the README's float64
// reference comparison), and `listed` holds only what its "cases" asked for: never the
// references, noise twin, resume twins or EP=1 controls resolve_matrix adds beside them.
TEST(CaseMatrixTest, AFileWithoutDtypeIsFloat64AndListsOnlyWhatItAskedFor) {
  const ModelSpec llama = SpecRegistry::instance().get("llama");
  const CaseMatrix tp3 = resolve_matrix(llama, json{{"name", "tp3"}, {"cases", {{{"tp", 3}}}}});
  EXPECT_EQ(names(tp3), std::vector<std::string>{"Reference"}) << tp3.table();
  EXPECT_TRUE(tp3.listed.empty());
  ASSERT_EQ(tp3.rejected.size(), 1u);
  EXPECT_EQ(tp3.rejected[0].name, "Tp3");
  EXPECT_THAT(tp3.table(), HasSubstr("no case the matrix lists can run spec llama"));
  EXPECT_EQ(tp3.to_json()["listed"], json::array());

  const CaseMatrix resume = resolve_matrix(
      llama, json{{"cases", {{{"kind", "resume"}, {"config", {{"dp_shard", 2}}}, {"resume_at", 2}}, {{"tp", 2}}, {{"tp", 2}}}}});
  EXPECT_EQ(names(resume), (std::vector<std::string>{"Reference", "ResumeDpShard2", "Tp2", "DpShard2"}));
  EXPECT_EQ(resume.listed, (std::vector<std::string>{"ResumeDpShard2", "Tp2"}));  // the twin DpShard2 is added
  EXPECT_FALSE(resume.is_listed("DpShard2"));
  for (const auto& c : resume.cases) EXPECT_EQ(c.config.dtype, DType::kFloat64) << c.name;

  const CaseMatrix ep = resolve_matrix(SpecRegistry::instance().get("moe"), json{{"cases", {{{"dp_shard", 2}, {"ep", 2}}}}});
  EXPECT_EQ(names(ep), (std::vector<std::string>{"Reference", "DpShard2Ep2", "DpShard2"}));
  EXPECT_EQ(ep.listed, std::vector<std::string>{"DpShard2Ep2"});  // its EP=1 control is added

  const CaseMatrix lane = resolve_matrix(llama, json{{"dtype", "float32"}, {"cases", {{{"tp", 3}}}}});
  EXPECT_EQ(names(lane), (std::vector<std::string>{"Reference", kLaneReference, kNoiseTwin}));
  EXPECT_TRUE(lane.listed.empty()) << "the lane's reference and noise twin are no case the matrix asked for";
}

TEST(CaseMatrixTest, MalformedMatricesNameTheCaseAndField) {
  const ModelSpec llama = SpecRegistry::instance().get("llama");
  auto rejected = [&](const json& cases, const std::string& says) {
    EXPECT_THAT([&] { resolve_matrix(llama, json{{"name", "bad"}, {"cases", cases}}); },
                ThrowsMessage<Error>(HasSubstr(says)))
        << cases.dump();
  };
  rejected({{{"tp", 2}, {"bogus", 1}}}, "'bogus'");
  rejected({{{"dp_shard", 0}}}, "case matrix 'bad' case 0");
  rejected({{{"tp", "two"}}}, "case matrix 'bad' case 0");
  rejected({{{"kind", "warmup"}}}, "unknown case kind 'warmup'; valid: reference, train, resume, cross_resume");
  rejected({{{"kind", "resume"}, {"config", {{"dp_shard", 2}}}}}, "resume_at must be in [1, 2] (steps 3), got 0");
  rejected({{{"kind", "cross_resume"}, {"load", {{"tp", 2}}}, {"resume_at", 1}}}, "a cross_resume case needs 'save'");
  rejected({{{"kind", "reference"}}}, "the reference case is implicit");
  EXPECT_THAT([&] { resolve_matrix(llama, json{{"cases", json::array()}, {"device", "tpu"}}); },
              ThrowsMessage<Error>(HasSubstr("device must be cpu or cuda, got 'tpu'")));
}

TEST(CaseMatrixTest, AReducedPrecisionLaneGetsItsReferenceAndNoiseTwin) {
  const ModelSpec llama = SpecRegistry::instance().get("llama");
  const CaseMatrix m = resolve_matrix_source(llama, "cpu-precision@bfloat16,seed=3");
  EXPECT_EQ(m.name, "cpu-precision@bfloat16,seed=3");
  EXPECT_THAT(names(m), ::testing::ElementsAre("Reference", kLaneReference, kNoiseTwin, "DpShard2", "Tp2Sp", "Cp2Zz"));
  EXPECT_EQ(m.cases[0].config.dtype, DType::kFloat64);
  EXPECT_EQ(m.cases[0].config.seed, 3u);  // the seed is every case's, the oracle's included
  for (size_t i = 1; i < m.cases.size(); ++i) {
    const Case& c = m.cases[i];
    EXPECT_EQ(c.config.dtype, DType::kBFloat16) << c.name;
    EXPECT_EQ(c.config.seed, 3u) << c.name;
    EXPECT_EQ(c.config.noise_twin, c.name == kNoiseTwin) << c.name;
    EXPECT_EQ(c.compare_to, i <= 2 ? "Reference" : kLaneReference) << c.name;
  }
  EXPECT_EQ(m.at(kNoiseTwin).world_size(), 1);
  EXPECT_EQ(m.at(kNoiseTwin).config.name(), "nt");
  // The float64 lane has no lane reference: every case against the oracle.
  const CaseMatrix oracle = resolve_matrix_source(llama, "cpu-precision@float64");
  EXPECT_THAT(names(oracle), ::testing::ElementsAre("Reference", "DpShard2", "Tp2Sp", "Cp2Zz"));
  EXPECT_EQ(oracle.at("Tp2Sp").compare_to, "Reference");
  // A resume in a reduced lane: its uninterrupted twin is compared with the lane's reference.
  const CaseMatrix resume = resolve_matrix(
      llama, json{{"dtype", "float32"}, {"cases", {{{"kind", "resume"}, {"config", {{"dp_shard", 2}}}, {"resume_at", 2}}}}});
  EXPECT_EQ(resume.at("ResumeDpShard2").compare_to, "DpShard2");
  EXPECT_EQ(resume.at("DpShard2").compare_to, kLaneReference);
  for (const auto& [source, message] : std::vector<std::pair<std::string, std::string>>{
           {"cpu-smoke@int8", "unknown dtype 'int8'"},
           {"cpu-smoke@bfloat16,seed=x", "seed 'x' is not an integer"},
           {"cpu-smoke@bfloat16,k=2", "unknown lane setting 'k'"},
           {"cpu-smoke@float32,float32", "'dtype' is given twice"}}) {
    EXPECT_THAT([&] { resolve_matrix_source(llama, source); }, ThrowsMessage<Error>(HasSubstr(message))) << source;
  }
}

TEST(CaseMatrixTest, TheGpuNightlyExampleFileResolves) {
  const std::string path = std::string(MIH_TEST_SOURCE_DIR) + "/../../suites/matrices/gpu-nightly.json";
  const CaseMatrix m = resolve_matrix_source(SpecRegistry::instance().get("llama"), path);
  EXPECT_EQ(m.name, "gpu-nightly");
  ASSERT_GT(m.cases.size(), 5u) << m.table();
  EXPECT_EQ(m.cases[1].pg_backend, "nccl");
  EXPECT_EQ(m.cases[1].device, "cuda");
  EXPECT_EQ(m.cases[1].config.dtype, DType::kBFloat16);
  EXPECT_EQ(m.cases[0].device, "cpu");  // the reference stays the CPU float64 oracle
}

// scripts/gpu-smoke's lane: every case on one GPU with NCCL, except the float64 Reference,
// which stays the CPU oracle (world size 1, Gloo) that the lane's reference and noise twin
// are compared with; the GPU cases are compared with the lane's reference.
TEST(CaseMatrixTest, TheGpuSmokeLaneRunsOnOneGpuAgainstTheCpuOracle) {
  for (const std::string spec : {"llama", "moe", "vlm"}) {
    for (const auto& [lane, dtype] : {std::pair{"float32", DType::kFloat32}, std::pair{"bfloat16", DType::kBFloat16}}) {
      const CaseMatrix m = resolve_matrix_source(SpecRegistry::instance().get(spec), std::string("gpu-smoke@") + lane);
      SCOPED_TRACE(spec + " " + lane + "\n" + m.table());
      EXPECT_TRUE(m.rejected.empty());
      ASSERT_THAT(names(m), ::testing::ElementsAre("Reference", kLaneReference, kNoiseTwin, "Ac", "ResumeSingle", "Single"));
      const Case& oracle = m.cases[0];
      EXPECT_EQ(oracle.kind, CaseKind::kReference);
      EXPECT_EQ(oracle.device, "cpu");
      EXPECT_EQ(oracle.pg_backend, "gloo");
      EXPECT_EQ(oracle.config.dtype, DType::kFloat64);
      EXPECT_EQ(oracle.world_size(), 1);
      for (size_t i = 1; i < m.cases.size(); ++i) {
        const Case& c = m.cases[i];
        EXPECT_EQ(c.device, "cuda") << c.name;
        EXPECT_EQ(c.pg_backend, "nccl") << c.name;
        EXPECT_EQ(c.config.dtype, dtype) << c.name;
        EXPECT_EQ(c.world_size(), 1) << c.name;
        if (c.save_config) {
          EXPECT_EQ(c.save_config->world_size(), 1) << c.name;
        }
      }
      EXPECT_EQ(m.at(kLaneReference).compare_to, "Reference");
      EXPECT_EQ(m.at(kNoiseTwin).compare_to, "Reference");
      EXPECT_EQ(m.at("Ac").compare_to, kLaneReference);
      EXPECT_EQ(m.at("Single").compare_to, kLaneReference);
      EXPECT_EQ(m.at("ResumeSingle").compare_to, "Single");
      EXPECT_THAT(m.table(), HasSubstr("single float64 on cpu (gloo)"));
      EXPECT_THAT(m.table(), HasSubstr(std::string("single ") + lane + " on cuda (nccl)"));
    }
  }
}

}  // namespace
}  // namespace mih::spec
