// The Structure, OptimizerLayout and FsdpUnits verdicts that judge the evidence files (and so
// another writer's evidence, `mih check`), on a real FSDP x TP case of the llama spec launched
// once for the test binary, and on a copy with one file broken the way a real bug would leave
// it: each passes on the first, saying what it examined, and fails on the second, naming the
// parameter. And `mih check` of that case renamed another writer's: the suites are instantiated
// on it through the same verdicts, and each fails on a copy broken its way.
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <fstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "harness/cases/case_runner.h"
#include "harness/compare/suite_reads.h"
#include "harness/compare/verdicts.h"
#include "harness/runtime/launcher.h"
#include "harness/runtime/worker.h"
#include "suites/suite_table.h"
#include "tests/support/mih_cli.h"
#include "tests/support/temp_dir.h"

namespace mih {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using ::testing::HasSubstr;
using verdicts::CaseEvidence;
using verdicts::Verdict;

constexpr char kCase[] = "DpShard2Tp2Sp";
constexpr char kQ[] = "layers.0.self_attn.q_proj.weight";

class LayoutVerdictsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = new fs::path(testing::temp_dir("layout_verdicts"));
    const spec::ModelSpec& s = spec::SpecRegistry::instance().get("llama");
    CaseRequest q;
    q.spec = s.name;
    q.matrix = MatrixSource::parse("cpu-smoke");
    q.training_backend = "trainer";
    for (const char* c : {"Reference", kCase}) {
      q.c = spec::resolve_matrix_source(s, "cpu-smoke").at(c);
      const cases::CaseRunResult r = cases::run_case(q, {.evidence_root = *root_});
      ASSERT_EQ(r.outcome, Outcome::kRan) << c << ": " << r.error;
    }
  }
  static void TearDownTestSuite() { delete root_; }

  static fs::path real() { return *root_ / "llama" / kCase; }
  fs::path copy() {
    const fs::path to = testing::temp_dir("layout_broken_" + std::to_string(++copies_)) / kCase;
    fs::copy(real(), to, fs::copy_options::recursive);
    return to;
  }
  static void edit(const fs::path& f, const std::function<void(json&)>& change) {
    json j = json::parse(std::ifstream(f));
    change(j);
    std::ofstream(f) << j.dump(2);
  }
  // The row of `fqn` in a parsed structure.json.
  static json& row(json& structure, const std::string& fqn) {
    for (json& r : structure["parameters"]) {
      if (r["fqn"] == fqn) return r;
    }
    throw std::runtime_error("no row " + fqn);
  }

  static fs::path* root_;
  int copies_ = 0;
};
fs::path* LayoutVerdictsTest::root_ = nullptr;

using testing::CliRun;

// `mih check <root> --no-progress`, everything it prints.
CliRun mih_check(const fs::path& root) {
  return testing::run_mih("check " + shell_quote(root.string()) + " --no-progress");
}

void expect_pass(const Verdict& v, const std::string& needle) {
  EXPECT_TRUE(v.passed()) << v.message;
  EXPECT_THAT(v.message, HasSubstr(needle));
}
void expect_fail(const Verdict& v, const std::string& needle) {
  EXPECT_EQ(v.status, Verdict::Status::kFail) << v.message;
  EXPECT_THAT(v.message, HasSubstr(needle));
}

// torch.chunk's first chunk, the tp piece before the FSDP rows; partitions cut first.
TEST(ExpectedRank0ShapeTest, CutsTheTpPieceThenTheFsdpRows) {
  const std::map<std::string, int64_t> degrees = {{"tp", 2}, {"dp_shard", 4}, {"ep", 2}, {"edp", 1}};
  std::vector<int64_t> shape;
  // 259 rows: tp's first chunk 130, then dp_shard's first chunk of that 33 (not 259 / 8 = 32.4).
  EXPECT_EQ(verdicts::expected_rank0_shape({259, 64}, {{"dp_shard", "Shard(0)"}, {"tp", "Shard(0)"}}, degrees, &shape), "");
  EXPECT_EQ(shape, (std::vector<int64_t>{33, 64}));
  EXPECT_EQ(verdicts::expected_rank0_shape({256, 64}, {{"tp", "Shard(0, partitions=2)"}}, degrees, &shape), "");
  EXPECT_EQ(shape, (std::vector<int64_t>{128, 64}));
  EXPECT_EQ(verdicts::expected_rank0_shape({8, 6}, {{"ep", "Shard(0)"}, {"tp", "Shard(1)"}, {"edp", "Replicate()"}}, degrees, &shape), "");
  EXPECT_EQ(shape, (std::vector<int64_t>{4, 3}));
  EXPECT_THAT(verdicts::expected_rank0_shape({8}, {{"tp", "Shard(1)"}}, degrees, &shape), HasSubstr("shards dim 1 of a 1-dim tensor"));
  EXPECT_THAT(verdicts::expected_rank0_shape({8}, {{"tp", "_StridedShard(dim=0)"}}, degrees, &shape),
              HasSubstr("is none of Replicate(), Shard(<dim>)"));
  EXPECT_THAT(verdicts::expected_rank0_shape({8}, {{"dp", "Shard(0)"}}, degrees, &shape), HasSubstr("axis 'dp' is no mesh axis"));
  EXPECT_EQ(verdicts::master_dtype_name("bfloat16"), "float32");
  EXPECT_EQ(verdicts::master_dtype_name("float64"), "float64");
}

TEST_F(LayoutVerdictsTest, LocalShapesMatchThePlacements) {
  expect_pass(verdicts::local_shapes_match_placements(CaseEvidence(real())), "examined the local shapes of 19 parameters");
  EXPECT_EQ(verdicts::structure_examinable(CaseEvidence(real())), "");
  // q_proj's tp piece whole on rank 0, as a layer that forgot to shard it over dp_shard.
  const fs::path dir = copy();
  edit(dir / layout::kStructure, [](json& s) { row(s, kQ)["local_shape"] = {32, 64}; });
  expect_fail(verdicts::local_shapes_match_placements(CaseEvidence(dir)),
              "'layers.0.self_attn.q_proj.weight' holds local shape [32,64] on rank 0, but");
  // A row without its global shape cannot be judged: a failure, never a pass; none: nothing to examine.
  const fs::path bare = copy();
  edit(bare / layout::kStructure, [](json& s) { row(s, kQ).erase("global_shape"); });
  expect_fail(verdicts::local_shapes_match_placements(CaseEvidence(bare)), "records no global_shape");
  edit(bare / layout::kStructure, [](json& s) {
    for (json& r : s["parameters"]) r.erase("global_shape");
  });
  EXPECT_THAT(verdicts::structure_examinable(CaseEvidence(bare)), HasSubstr("records its global_shape"));
}

TEST_F(LayoutVerdictsTest, DtypesAndDevicesAsConfigured) {
  expect_pass(verdicts::dtypes_as_configured(CaseEvidence(real())), "all float64 (the float64 lane), on cpu");
  const fs::path dir = copy();
  edit(dir / layout::kStructure, [](json& s) { row(s, "norm.weight")["dtype"] = "float32"; });
  expect_fail(verdicts::dtypes_as_configured(CaseEvidence(dir)), "'norm.weight' is float32, the float64 lane's parameters are float64");
  const fs::path two = copy();
  edit(two / layout::kStructure, [](json& s) { row(s, "norm.weight")["device"] = "cuda:0"; });
  expect_fail(verdicts::dtypes_as_configured(CaseEvidence(two)), "one device expected");
}

TEST_F(LayoutVerdictsTest, EveryTrainableParameterInExactlyOneGroup) {
  expect_pass(verdicts::optimizer_groups_cover_trainable(CaseEvidence(real())), "the groups of 19 parameters");
  EXPECT_EQ(verdicts::optimizer_layout_examinable(CaseEvidence(real())), "");
  const fs::path dir = copy();
  edit(dir / layout::optimizer_layout_step(1), [](json& l) {
    json& p = l["groups"][0]["parameters"];
    p.erase(std::find(p.begin(), p.end(), kQ));
  });
  expect_fail(verdicts::optimizer_groups_cover_trainable(CaseEvidence(dir)),
              "cases/runtime/optimizer_layout_step1.json: trainable parameter 'layers.0.self_attn.q_proj.weight' is in no optimizer group");
  const fs::path twice = copy();
  edit(twice / layout::kOptimizerLayoutInitial, [](json& l) { l["groups"][1]["parameters"].push_back(kQ); });
  expect_fail(verdicts::optimizer_groups_cover_trainable(CaseEvidence(twice)), "is listed 2 times (groups [0,1])");
  const fs::path stray = copy();
  edit(stray / layout::kOptimizerLayoutInitial, [](json& l) { l["groups"][1]["parameters"].push_back("layers.9.norm.weight"); });
  expect_fail(verdicts::optimizer_groups_cover_trainable(CaseEvidence(stray)), "lists 'layers.9.norm.weight', which is no parameter");
  // No layout record at all: nothing to examine (the foreign check names it and does not instantiate).
  const fs::path none = copy();
  fs::remove(none / layout::kOptimizerLayoutInitial);
  for (int64_t k = 0; fs::exists(none / layout::optimizer_layout_step(k)); ++k) fs::remove(none / layout::optimizer_layout_step(k));
  EXPECT_THAT(verdicts::optimizer_layout_examinable(CaseEvidence(none)), HasSubstr("no optimizer layout record"));
}

TEST_F(LayoutVerdictsTest, NoFrozenParameterInAGroup) {
  expect_pass(verdicts::optimizer_holds_no_frozen(CaseEvidence(real())), "against 0 frozen parameter(s)");
  const fs::path dir = copy();
  edit(dir / layout::kStructure, [](json& s) { row(s, "norm.weight")["requires_grad"] = false; });
  expect_fail(verdicts::optimizer_holds_no_frozen(CaseEvidence(dir)),
              "frozen parameter 'norm.weight' (requires_grad false) is in optimizer group 1");
}

TEST_F(LayoutVerdictsTest, NoWeightDecayOnANormOrABias) {
  expect_pass(verdicts::no_decay_on_norms_or_biases(CaseEvidence(real())), "listings of 1-D parameters");
  // The trainer's no_weight_decay patterns lost: the norms sit in a decaying group.
  const fs::path dir = copy();
  edit(dir / layout::kConfigResolved, [](json& c) { c["no_weight_decay"] = json::array(); });
  edit(dir / layout::kOptimizerLayoutInitial, [](json& l) {
    for (const json& p : l["groups"][1]["parameters"]) l["groups"][0]["parameters"].push_back(p);
    l["groups"][1]["parameters"] = json::array();
  });
  expect_fail(verdicts::no_decay_on_norms_or_biases(CaseEvidence(dir)),
              "1-D parameter 'layers.0.input_layernorm.weight' (a norm scale or a bias) has weight decay 0.1 in group 0");
  // Declared intended: by another writer in its config, or by mih's spec (ModelSpec::decayed_1d).
  const fs::path writer = copy();
  fs::copy_file(dir / layout::kConfigResolved, writer / layout::kConfigResolved, fs::copy_options::overwrite_existing);
  fs::copy_file(dir / layout::kOptimizerLayoutInitial, writer / layout::kOptimizerLayoutInitial,
                fs::copy_options::overwrite_existing);
  edit(writer / layout::kConfigResolved, [](json& c) { c["decayed_1d"] = {"*norm*"}; });
  EXPECT_TRUE(verdicts::no_decay_on_norms_or_biases(CaseEvidence(writer)).passed());
  edit(dir / layout::kSpecResolved, [](json& s) { s["decayed_1d"] = {"*norm*"}; });
  EXPECT_TRUE(verdicts::no_decay_on_norms_or_biases(CaseEvidence(dir)).passed());
}

TEST_F(LayoutVerdictsTest, StateShapesMatchTheLocalShards) {
  // Before the session recorded the state's shapes, every case failed here: nothing examined.
  expect_pass(verdicts::optimizer_state_shapes_match(CaseEvidence(real())), "the local shapes of");
  const fs::path dir = copy();
  edit(dir / layout::optimizer_layout_step(2), [](json& l) { l["state"][kQ]["exp_avg"] = {32, 64}; });
  expect_fail(verdicts::optimizer_state_shapes_match(CaseEvidence(dir)),
              "optimizer_layout_step2.json: 'layers.0.self_attn.q_proj.weight' exp_avg has local shape [32,64], the "
              "parameter's local shard [16,64]");
  const fs::path none = copy();
  for (int64_t k = 0; fs::exists(none / layout::optimizer_layout_step(k)); ++k) {
    edit(none / layout::optimizer_layout_step(k), [](json& l) { l.erase("state"); });
  }
  expect_fail(verdicts::optimizer_state_shapes_match(CaseEvidence(none)), "no optimizer layout record holds optimizer state");
}

TEST_F(LayoutVerdictsTest, FsdpUnitsSayWhatTheyExamined) {
  expect_pass(verdicts::fsdp_units_cover_parameters(CaseEvidence(real())), "FSDP units against 19 parameters");
  EXPECT_EQ(verdicts::fsdp_units_examinable(CaseEvidence(real())), "");
}

// The suites judge any writer's evidence through these verdicts: they declare them, and a case
// holds what they read.
TEST_F(LayoutVerdictsTest, TheSuitesDeclareTheirReads) {
  const CaseEvidence ev(real());
  for (const char* suite : {"Structure", "OptimizerLayout", "FsdpUnits"}) {
    const verdicts::SuiteReads* reads = conformance::suite_row(suite).reads();
    ASSERT_NE(reads, nullptr) << suite;
    EXPECT_TRUE(verdicts::missing_reads(*reads, {ev}).empty()) << suite;
    EXPECT_EQ(reads->examinable({ev}), "") << suite;
    for (const auto& [test, verdict] : reads->tests) EXPECT_TRUE(verdict({ev}).passed()) << suite << "." << test;
  }
  std::vector<std::string> declared;
  for (const auto& [test, verdict] : conformance::suite_row("OptimizerLayout").reads()->tests) declared.push_back(test);
  EXPECT_THAT(declared, ::testing::UnorderedElementsAre("EveryTrainableParameterInExactlyOneGroup", "NoFrozenParameter",
                                                        "StateShapesMatchLocalShards", "NoWeightDecayOnNormsOrBiases"));
}

// The FSDP x TP case and its reference as another writer's evidence (`mih check`): mih's case
// records removed, the reference's one-rank replica records too (a 1-rank writer records none),
// the stamp naming another writer. Structure, OptimizerLayout and FsdpUnits run on it through the
// verdicts above, and each of their declared tests fails on a copy broken its way.
TEST_F(LayoutVerdictsTest, AForeignFsdpTpRunIsJudgedByTheSameVerdicts) {
  const fs::path root = testing::temp_dir("layout_foreign");
  for (const char* c : {"Reference", kCase}) {
    const fs::path dir = root / "llama" / c;
    fs::create_directories(dir.parent_path());
    fs::copy(*root_ / "llama" / c, dir, fs::copy_options::recursive);
    fs::remove(dir / layout::kCaseRecord);
    fs::remove(dir / layout::kCaseRequest);
    edit(dir / layout::kEnvironment, [](json& e) { e["evidence_contract"]["writer"] = "fsdp-tp-trainer 1.0"; });
  }
  for (const auto& f : fs::directory_iterator(root / "llama" / "Reference" / "cases" / "runtime")) {
    if (f.path().filename().string().find("replicas_step") != std::string::npos) fs::remove(f.path());
  }
  const std::string at = std::string("/llama/") + kCase;
  const CliRun good = mih_check(root);
  EXPECT_EQ(good.status, 0) << good.output;
  const std::vector<std::string> declared = {
      "Structure.LocalShapesMatchPlacements", "Structure.DtypeAndDeviceAsConfigured",
      "OptimizerLayout.EveryTrainableParameterInExactlyOneGroup", "OptimizerLayout.NoFrozenParameter",
      "OptimizerLayout.StateShapesMatchLocalShards", "OptimizerLayout.NoWeightDecayOnNormsOrBiases",
      "FsdpUnits.EveryShardedParameterInOneUnit"};
  for (const std::string& test : declared) EXPECT_THAT(good.output, HasSubstr("[       OK ] Foreign/" + test + at));
  // Each broken its way: the one test fails, naming the parameter.
  const std::vector<std::tuple<std::string, std::string, std::function<void(const fs::path&)>>> broken = {
      {"Structure.LocalShapesMatchPlacements", "holds local shape [32,64] on rank 0",
       [](const fs::path& d) { edit(d / layout::kStructure, [](json& s) { row(s, kQ)["local_shape"] = {32, 64}; }); }},
      {"Structure.DtypeAndDeviceAsConfigured", "'norm.weight' is float32",
       [](const fs::path& d) { edit(d / layout::kStructure, [](json& s) { row(s, "norm.weight")["dtype"] = "float32"; }); }},
      {"OptimizerLayout.EveryTrainableParameterInExactlyOneGroup", "is listed 2 times",
       [](const fs::path& d) { edit(d / layout::kOptimizerLayoutInitial, [](json& l) { l["groups"][1]["parameters"].push_back(kQ); }); }},
      {"OptimizerLayout.NoFrozenParameter", "frozen parameter 'norm.weight'",
       [](const fs::path& d) { edit(d / layout::kStructure, [](json& s) { row(s, "norm.weight")["requires_grad"] = false; }); }},
      {"OptimizerLayout.StateShapesMatchLocalShards", "exp_avg_sq has local shape [64,64]",
       [](const fs::path& d) { edit(d / layout::optimizer_layout_step(1), [](json& l) { l["state"][kQ]["exp_avg_sq"] = {64, 64}; }); }},
      {"OptimizerLayout.NoWeightDecayOnNormsOrBiases", "1-D parameter 'norm.weight'",
       [](const fs::path& d) {  // a writer that declares no no_weight_decay patterns
         edit(d / layout::kConfigResolved, [](json& c) { c.erase("no_weight_decay"); });
         edit(d / layout::kOptimizerLayoutInitial, [](json& l) {
           json& p = l["groups"][1]["parameters"];
           p.erase(std::find(p.begin(), p.end(), "norm.weight"));
           l["groups"][0]["parameters"].push_back("norm.weight");
         });
       }},
      {"FsdpUnits.EveryShardedParameterInOneUnit", "is in no FSDP unit",
       [](const fs::path& d) {
         edit(d / layout::kFsdpUnits, [](json& u) {
           for (auto& [name, unit] : u.items()) {
             json& p = unit["parameters"];
             if (const auto it = std::find(p.begin(), p.end(), kQ); it != p.end()) p.erase(it);
           }
         });
       }},
  };
  int i = 0;
  for (const auto& [test, needle, breaks] : broken) {
    const fs::path copy_root = testing::temp_dir("layout_foreign_broken_" + std::to_string(++i));
    fs::copy(root, copy_root, fs::copy_options::recursive);
    breaks(copy_root / "llama" / kCase);
    const CliRun bad = mih_check(copy_root);
    EXPECT_EQ(bad.status, 1) << test << "\n" << bad.output;
    EXPECT_THAT(bad.output, HasSubstr("[  FAILED  ] Foreign/" + test + at)) << test;
    EXPECT_THAT(bad.output, HasSubstr(needle)) << test;
  }
}

}  // namespace
}  // namespace mih
