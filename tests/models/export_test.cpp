// The reference models' checkpoint key maps and `mih export`: every parameter maps to Hugging
// Face keys and back bit for bit; the export writes the weights under those keys, the first
// batch and the reference logits and loss, and a reader written independently in Python
// (json + struct only) recomputes the loss from the exported logits and labels.
#include <cstdlib>
#include <set>

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "harness/base/error.h"
#include "harness/checkpoint/safetensors.h"
#include "reference_models/registry.h"
#include "tests/support/temp_dir.h"
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
      EXPECT_TRUE(external.count("model.layers.1.block_sparse_moe.experts.3.w3.weight"));
    }
    if (GetParam() == "vlm") {
      EXPECT_TRUE(external.count("language_model.model.embed_tokens.weight"));
    }
  });
  EXPECT_THAT(errors, IsEmpty());
}

TEST_P(ReferenceModelTest, ExportIsReadableByAnIndependentReader) {
  models::ExportOptions o;
  o.model = GetParam();
  o.out = testing::temp_dir("export_" + GetParam());
  o.text = data::TextPipelineOptions().seq_len(32).global_batch(2);
  const double loss = models::export_reference_model(o);
  EXPECT_GT(loss, 4.0) << "an untrained byte-level model is near ln(259) = 5.56";
  safetensors::Reader weights(o.out / "model.safetensors");
  const std::string embed = GetParam() == "vlm" ? "language_model.model.embed_tokens.weight" : "model.embed_tokens.weight";
  EXPECT_TRUE(weights.contains(embed));
  safetensors::Reader batch(o.out / "batch.safetensors");
  EXPECT_EQ(batch.info("input_ids").shape, (std::vector<int64_t>{2, 32}));
  if (std::system("python3 -c 'import json, struct' > /dev/null 2>&1") != 0) GTEST_SKIP() << "no python3 here";
  const std::string command =
      std::string("python3 ") + MIH_TEST_SOURCE_DIR + "/check_export.py " + o.out.string() + " > " + (o.out / "check.txt").string();
  EXPECT_EQ(std::system(command.c_str()), 0) << "the independent reader disagrees; see " << (o.out / "check.txt");
}

INSTANTIATE_TEST_SUITE_P(Models, ReferenceModelTest, ::testing::Values("llama", "moe", "vlm"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

TEST(ReferenceModelCatalogTest, UnknownNameListsTheKnownOnes) {
  EXPECT_THAT([] { models::reference_model("gpt2"); },
              ::testing::ThrowsMessage<Error>(HasSubstr("unknown reference model 'gpt2'; known: llama, moe, vlm")));
  KeyMap map(std::vector<KeyRule>{KeyRule{R"(a\.(\d+))", {"x.$1"}}});
  EXPECT_THAT([&] { map.external_keys("b.0"); }, ::testing::ThrowsMessage<Error>(HasSubstr("no rule maps the parameter 'b.0'")));
}

}  // namespace
}  // namespace mih
