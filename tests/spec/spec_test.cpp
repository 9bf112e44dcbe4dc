// The spec types and the reference specs (specs/): every registered spec validates, names
// only parameters and modules its model has, passes its state invariants and module parity
// cases; malformed specs are rejected naming the spec and field; invariants can fail; and the
// shared-state tracer records who published and consumed what, recompute included.
#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/nn/module.h>

#include "harness/base/error.h"
#include "harness/spec/model_spec.h"
#include "reference_models/llama.h"
#include "tests/support/thread_ranks.h"

namespace mih {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::ThrowsMessage;

// Every parameter FQN (aliases too) and module name of the model.
std::vector<std::string> names_of(Trainer& t) {
  std::vector<std::string> out;
  for (const auto& p : t.context().parameters()) {
    out.push_back(p->fqn);
    out.insert(out.end(), p->aliases.begin(), p->aliases.end());
  }
  for (const auto& m : t.model().named_modules("", /*include_self=*/false)) out.push_back(m.key());
  return out;
}

// Builds the spec's model at world size 1 in float64 and runs `body`.
void with_trainer(const spec::ModelSpec& s, const std::function<void(Trainer&)>& body) {
  auto errors = testing::run_mesh(ParallelConfig{}, [&](DeviceMesh& mesh) {
    ParallelConfig c;
    c.dtype = DType::kFloat64;
    Trainer t(mesh, c, s.factory, s.data.make_batches(), s.data.apply_sharding(TrainerOptions()));
    body(t);
  });
  EXPECT_THAT(errors, IsEmpty());
}

TEST(ReferenceSpecsTest, AllAreRegistered) {
  // The three reference ports, the llama variants the fault catalog needs, the variants of the
  // main job's layouts (the root module outside FSDP, a frozen vision tower) and the correct
  // ports the runtime tests use (one that observes no module, a vlm with text-only steps), and
  // the ports of the original model's config-invariant faults (gpt2, moe_qwen), and Qwen3's
  // attention on the llama port (qwen3), and the long-horizon llama whose data loader has epochs
  // (llama_epochs; llama_epochs_long for its 50-step matrix).
  EXPECT_THAT(spec::SpecRegistry::instance().names(),
              ElementsAre("gpt2", "llama", "llama_bias", "llama_deep", "llama_docs", "llama_dropout", "llama_epochs",
                          "llama_epochs_long", "llama_swa", "llama_tied", "llama_unobserved", "llama_unsharded_root",
                          "mla", "mla_docs", "moe", "moe_deep", "moe_qwen", "qwen3", "qwen3_docs", "vlm", "vlm_frozen_vision", "vlm_mixed"));
}

class ReferenceSpecTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ReferenceSpecTest, ValidatesAgainstItsModelAndPassesItsInvariants) {
  spec::ModelSpec s = spec::SpecRegistry::instance().get(GetParam());
  s.validate();
  with_trainer(s, [&](Trainer& t) {
    s.validate_against(names_of(t));
    for (const auto& phase : {spec::Phase::kStructure, spec::Phase::kRuntime}) {
      if (phase == spec::Phase::kRuntime) t.step();
      for (const auto& inv : s.invariants) {
        if (inv.phase != phase) continue;
        spec::CheckResult r = inv.check(t.state());
        EXPECT_TRUE(r.passed) << s.name << " invariant " << inv.name << ": " << r.facts.dump();
      }
    }
  });
  nlohmann::json j = s.to_json();
  EXPECT_EQ(j["name"], GetParam());
  EXPECT_TRUE(j["data"]["labels_are_shifted"]);
  EXPECT_FALSE(j["checkpoint"]["key_map"].empty());
}

TEST_P(ReferenceSpecTest, ModuleParityCasesPass) {
  spec::ModelSpec s = spec::SpecRegistry::instance().get(GetParam());
  ASSERT_FALSE(s.parity_cases.empty());
  for (const auto& c : s.parity_cases) {
    const spec::ModuleParityResult r = spec::run_module_parity(c);
    EXPECT_TRUE(r.passed()) << s.name << ": " << r.failure();
    // Forward and backward: the output and at least one gradient.
    ASSERT_GE(r.observations.size(), 2u) << c.name;
    EXPECT_EQ(r.observations.front().name, "output") << c.name;
  }
}

INSTANTIATE_TEST_SUITE_P(Specs, ReferenceSpecTest, ::testing::Values("llama", "moe", "vlm", "llama_tied", "llama_bias", "llama_dropout",
                                                                  "llama_unsharded_root", "vlm_frozen_vision", "qwen3"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

TEST(ReferenceSpecsTest, InvariantsCanFail) {
  spec::ModelSpec s = spec::SpecRegistry::instance().get("llama");
  with_trainer(s, [&](Trainer& t) {
    for (const auto& b : t.context().buffers()) b.tensor.mul_(2);  // a wrong rotary table
    for (const auto& inv : s.invariants) {
      if (inv.name == "inv_freq_matches_formula") {
        EXPECT_FALSE(inv.check(t.state()).passed);
      }
    }
  });
  // The tie invariant of the untied spec on a tied model.
  spec::ModelSpec tied = s;
  tied.factory = models::make_llama(models::LlamaOptions().tie_word_embeddings(true));
  with_trainer(tied, [&](Trainer& t) {
    for (const auto& inv : tied.invariants) {
      if (inv.name == "embedding_and_head_tied_as_configured") {
        EXPECT_FALSE(inv.check(t.state()).passed);
      }
    }
  });
}

TEST(ModelSpecTest, MalformedSpecsAreRejectedNamingTheField) {
  spec::ModelSpec base = spec::SpecRegistry::instance().get("vlm");
  auto expect_rejected = [](spec::ModelSpec s, const std::string& message) {
    EXPECT_THAT([&] { s.validate(); }, ThrowsMessage<Error>(HasSubstr(message)));
  };
  spec::ModelSpec dup = base;
  dup.data.fields.push_back({"pixel_values", true, false, spec::CpSharding::kReplicated});
  expect_rejected(dup, "spec 'vlm': data.fields declares 'pixel_values' twice");
  spec::ModelSpec modality = base;
  modality.modalities.push_back({"audio_values", {"audio_tower.*"}});
  expect_rejected(modality, "modality field 'audio_values' is not a data field");
  spec::ModelSpec shared = base;
  shared.shared_state.push_back({"vision.features", "x", {"y"}});
  expect_rejected(shared, "shared_state key 'vision.features' is declared twice");
  spec::ModelSpec no_check = base;
  no_check.invariants.push_back({"empty", spec::Phase::kStructure, nullptr});
  expect_rejected(no_check, "invariant 'empty' has no check");
  spec::ModelSpec bad_rule = base;
  bad_rule.checkpoint.key_map.push_back({"layers.(", {"x"}});
  expect_rejected(bad_rule, "key map rule 'layers.(': not a valid regex");
  EXPECT_THAT([] { spec::parse_phase("warmup"); },
              ThrowsMessage<Error>(HasSubstr("unknown phase 'warmup'; valid: structure, materialization")));
  EXPECT_THAT([] { spec::SpecRegistry::instance().get("gpt3"); },
              ThrowsMessage<Error>(HasSubstr("unknown spec 'gpt3'; registered: gpt2, llama, llama_bias, llama_deep, llama_docs, llama_dropout, llama_epochs, llama_epochs_long, llama_swa, llama_tied, llama_unobserved, llama_unsharded_root, mla, mla_docs, moe, moe_deep, moe_qwen, qwen3, qwen3_docs, vlm, vlm_frozen_vision, vlm_mixed")));
  // A pattern that matches nothing in the model.
  spec::ModelSpec typo = base;
  typo.modalities[0].parameter_patterns = {"vison_tower.*"};
  with_trainer(typo, [&](Trainer& t) {
    EXPECT_THAT([&] { typo.validate_against(names_of(t)); },
                ThrowsMessage<Error>(HasSubstr("modality 'pixel_values' pattern 'vison_tower.*' matches no parameter")));
  });
}

// The tracer: the rotary table published once per forward by rotary_emb and consumed by each
// layer; MoE routing statistics published once per forward, and read again (not republished)
// in the recompute of a checkpointed layer, marked as a recompute.
TEST(SharedStateTest, RecordsPublishAndConsumeWithRecompute) {
  spec::ModelSpec s = spec::SpecRegistry::instance().get("moe");
  auto errors = testing::run_mesh(ParallelConfig{}, [&](DeviceMesh& mesh) {
    ParallelConfig c;
    c.dtype = DType::kFloat64;
    c.activation_checkpointing = true;
    Trainer t(mesh, c, s.factory, s.data.make_batches(), s.data.apply_sharding(TrainerOptions()));
    t.context().shared_state().set_recording(true);
    t.step();
    std::vector<std::string> seen;
    for (const auto& e : t.context().shared_state().events()) {
      seen.push_back(e.action + " " + e.key + " " + e.layer + (e.recompute_region.empty() ? "" : " (recompute of " + e.recompute_region + ")"));
    }
    EXPECT_THAT(seen, ElementsAre("publish rotary.cos rotary_emb", "publish rotary.sin rotary_emb",
                                  "consume rotary.cos layers.0", "consume rotary.sin layers.0",
                                  "consume rotary.cos layers.1", "consume rotary.sin layers.1",
                                  "publish layers.1.mlp.expert_counts layers.1.mlp",
                                  "consume layers.1.mlp.expert_counts layers.1.mlp",
                                  "consume layers.1.mlp.expert_counts layers.1.mlp (recompute of layers.1)"));
    EXPECT_THAT([&] { t.context().shared_state().consume("vision.features", "merge"); },
                ThrowsMessage<Error>(HasSubstr("shared state 'vision.features' is consumed by 'merge' before any layer")));
  });
  EXPECT_THAT(errors, IsEmpty());
}

}  // namespace
}  // namespace mih
