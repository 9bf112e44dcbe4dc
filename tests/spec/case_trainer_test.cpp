// A case's own trainer in a case matrix: a case listing "trainer" is named with its suffix,
// compared with the world-size-1 reference of the same changes (which the matrix adds), and a
// resume with its uninterrupted twin of the same changes; the runner's TrainerOptions carry
// them; malformed changes are refused naming the case and field.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "harness/base/error.h"
#include "harness/spec/case_matrix.h"
#include "harness/spec/case_trainer.h"

namespace mih::spec {
namespace {

using nlohmann::json;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

const json kSgdCosine = {{"optimizer", "sgd"}, {"warmup_steps", 2}, {"decay_steps", 2}, {"max_grad_norm", 0}};

json matrix(const json& cases, const std::string& dtype = "float64") {
  return {{"name", "t"}, {"dtype", dtype}, {"steps", 3}, {"max_world_size", 4}, {"cases", cases}};
}

TEST(CaseTrainerTest, NamesTheCaseAndAddsItsReferenceAndTwin) {
  const json cases = {{{"dp_shard", 2}, {"trainer", kSgdCosine}},
                      {{"kind", "resume"}, {"config", {{"dp_shard", 2}}}, {"resume_at", 2}, {"trainer", kSgdCosine}},
                      {{"kind", "resume"}, {"config", {{"tp", 2}}}, {"resume_at", 2}, {"trainer", {{"optimizer", "adam"}}}}};
  const CaseMatrix m = resolve_matrix(SpecRegistry::instance().get("llama"), matrix(cases));
  EXPECT_EQ(m.listed, (std::vector<std::string>{"DpShard2SgdCosine", "ResumeDpShard2SgdCosine", "ResumeTp2Adam"}));
  EXPECT_EQ(m.at("DpShard2SgdCosine").compare_to, "ReferenceSgdCosine");
  EXPECT_EQ(m.at("DpShard2SgdCosine").trainer, kSgdCosine);
  EXPECT_EQ(m.at("ResumeDpShard2SgdCosine").compare_to, "DpShard2SgdCosine");
  EXPECT_EQ(m.at("ResumeTp2Adam").compare_to, "Tp2Adam");
  EXPECT_EQ(m.at("Tp2Adam").compare_to, "ReferenceAdam") << "the resume's twin, with its changes";
  EXPECT_EQ(m.at("Tp2Adam").trainer, json({{"optimizer", "adam"}}));
  for (const char* ref : {"ReferenceSgdCosine", "ReferenceAdam"}) {
    const Case& r = m.at(ref);
    EXPECT_EQ(r.world_size(), 1) << ref;
    EXPECT_EQ(r.config.dtype, DType::kFloat64) << ref;
    EXPECT_TRUE(r.compare_to.empty()) << ref << " is compared with nothing, as the Reference";
    EXPECT_EQ(r.kind, CaseKind::kTrain) << ref << ": not the Reference (no golden of the original)";
  }
  EXPECT_EQ(m.at("Reference").trainer, json::object());
  const json round_trip = m.at("DpShard2SgdCosine");
  EXPECT_EQ(round_trip.get<Case>().trainer, kSgdCosine) << "case.json carries the changes";
}

TEST(CaseTrainerTest, TheRunnersOptionsCarryTheChanges) {
  const TrainerOptions o = with_case_trainer(TrainerOptions().lr(0.5), kSgdCosine);
  EXPECT_EQ(o.optimizer(), OptimizerKind::kSgd);
  EXPECT_EQ(o.warmup_steps(), 2);
  EXPECT_EQ(o.decay_steps(), 2);
  EXPECT_EQ(o.max_grad_norm(), 0);
  EXPECT_EQ(o.lr(), 0.5) << "what the case does not change stays the spec's";
  EXPECT_EQ(with_case_trainer(TrainerOptions(), json::object()).optimizer(), OptimizerKind::kAdamW);
}

TEST(CaseTrainerTest, RefusesMalformedChangesNamingTheCaseAndField) {
  const ModelSpec& llama = SpecRegistry::instance().get("llama");
  EXPECT_THAT([&] { resolve_matrix(llama, matrix({{{"dp_shard", 2}, {"trainer", {{"lr_decay", 1}}}}})); },
              ThrowsMessage<Error>(AllOf(HasSubstr("case 0"), HasSubstr("unknown trainer field 'lr_decay'"))));
  EXPECT_THAT([&] { resolve_matrix(llama, matrix({{{"dp_shard", 2}, {"trainer", {{"optimizer", "lion"}}}}})); },
              ThrowsMessage<Error>(HasSubstr("unknown optimizer 'lion'; valid: [adamw, adam, sgd]")));
  EXPECT_THAT([&] { resolve_matrix(llama, matrix({{{"dp_shard", 2}, {"trainer", {{"warmup_steps", -1}}}}})); },
              ThrowsMessage<Error>(HasSubstr("'warmup_steps' must be an integer >= 0")));
}

// A reduced lane calibrates its tolerances on the spec's trainer: a case with its own is
// rejected there with the reason (so `mih test --dtype float32` still runs the rest of a preset
// that lists one), never run uncalibrated.
TEST(CaseTrainerTest, AReducedLaneRejectsACaseWithItsOwnTrainerNamingWhy) {
  const ModelSpec& llama = SpecRegistry::instance().get("llama");
  const CaseMatrix m = resolve_matrix(llama, matrix({{{"dp_shard", 2}}, {{"dp_shard", 2}, {"trainer", kSgdCosine}}},
                                                    "float32"));
  EXPECT_TRUE(m.is_listed("DpShard2"));
  EXPECT_FALSE(m.is_listed("DpShard2SgdCosine")) << "run in a lane whose noise was not calibrated for it";
  for (const Case& c : m.cases) EXPECT_TRUE(c.trainer.empty()) << c.name;
  ASSERT_FALSE(m.rejected.empty());
  EXPECT_EQ(m.rejected[0].name, "DpShard2SgdCosine");
  EXPECT_THAT(m.rejected[0].reason, HasSubstr("runs in the float64 lane only"));
}

}  // namespace
}  // namespace mih::spec
