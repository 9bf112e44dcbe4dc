// The reference models' checkpoint key maps: every parameter maps to Hugging Face keys and
// back bit for bit (the export itself: tests/spec/hf_interop_test.cpp).
#include <set>

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "harness/base/error.h"
#include "reference_models/registry.h"
#include "tests/support/thread_ranks.h"

namespace mih {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;

class ReferenceModelTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ReferenceModelTest, KeyMapRoundTripsEveryParameter) {
  models::ReferenceModel model = models::reference_model(GetParam());
  auto errors = testing::run_mesh(ParallelConfig{}, [&](DeviceMesh& mesh) {
    ParallelConfig c;
    c.dtype = DType::kFloat64;
    Trainer t(mesh, c, model.factory, model.batches(data::TextPipelineOptions().seq_len(32).global_batch(2)),
              model.trainer_options);
    std::map<std::string, at::Tensor> external;
    for (const auto& p : t.context().parameters()) {
      for (auto& [key, tensor] : model.key_map.to_external(p->fqn, t.gather_full(*p))) {
        EXPECT_TRUE(external.emplace(key, tensor).second) << "two parameters map to " << key;
      }
    }
    for (const auto& p : t.context().parameters()) {
      EXPECT_TRUE(at::equal(model.key_map.from_external(p->fqn, external), t.gather_full(*p))) << p->fqn;
    }
    if (GetParam() == "llama") {
      EXPECT_TRUE(external.count("model.layers.1.mlp.gate_proj.weight"));
      EXPECT_TRUE(external.count("model.layers.1.mlp.up_proj.weight"));
    }
    if (GetParam() == "moe") {
      EXPECT_TRUE(external.count("model.layers.1.mlp.experts.3.up_proj.weight"));
      EXPECT_TRUE(external.count("model.layers.0.self_attn.q_norm.weight"));
    }
    if (GetParam() == "moe_qwen") {
      EXPECT_TRUE(external.count("model.layers.1.mlp.experts.3.up_proj.weight"));
      EXPECT_TRUE(external.count("model.layers.1.mlp.shared_expert_gate.weight"));
    }
    if (GetParam() == "qwen3") {
      EXPECT_TRUE(external.count("model.layers.1.self_attn.k_norm.weight"));
      EXPECT_TRUE(external.count("model.layers.1.self_attn.q_norm.weight"));
    }
    if (GetParam() == "gpt2") {
      EXPECT_TRUE(external.count("transformer.h.1.attn.c_attn.weight"));
      EXPECT_TRUE(external.count("transformer.wpe.weight"));
    }
    if (GetParam() == "vlm") {
      EXPECT_TRUE(external.count("language_model.model.embed_tokens.weight"));
    }
  });
  EXPECT_THAT(errors, IsEmpty());
}

INSTANTIATE_TEST_SUITE_P(Models, ReferenceModelTest, ::testing::Values("llama", "moe", "vlm", "moe_qwen", "gpt2", "qwen3"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

TEST(ReferenceModelCatalogTest, UnknownNameListsTheKnownOnes) {
  EXPECT_THAT([] { models::reference_model("gpt3"); },
              ::testing::ThrowsMessage<Error>(HasSubstr("unknown reference model 'gpt3'; known: llama, moe, vlm, moe_qwen, gpt2, qwen3")));
  KeyMap map(std::vector<KeyRule>{KeyRule{R"(a\.(\d+))", {"x.$1"}}});
  EXPECT_THAT([&] { map.external_keys("b.0"); }, ::testing::ThrowsMessage<Error>(HasSubstr("no rule maps the parameter 'b.0'")));
}

}  // namespace
}  // namespace mih
