// KeyMap's layout transforms against values written out by hand (not through the inverse),
// then both ways: external -> internal -> external and internal -> external -> internal are
// the identity, bit for bit. And the Hugging Face directory reader and sharded writer.
#include <fstream>

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "harness/base/error.h"
#include "harness/checkpoint/hf_checkpoint.h"
#include "harness/checkpoint/key_map.h"
#include "tests/support/temp_dir.h"

namespace mih {
namespace {

using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

at::Tensor arange(std::vector<int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return at::arange(n, at::kDouble).reshape(shape);
}

// to_external then from_external, and a random external set back and forth.
void expect_round_trip(const KeyMap& map, const std::string& fqn, const at::Tensor& internal) {
  std::map<std::string, at::Tensor> external;
  for (auto& [k, t] : map.to_external(fqn, internal)) external[k] = t;
  EXPECT_TRUE(at::equal(map.from_external(fqn, external), internal)) << fqn;
  std::map<std::string, at::Tensor> random;
  for (auto& [k, t] : external) random[k] = at::randn(t.sizes(), at::kDouble);
  std::map<std::string, at::Tensor> again;
  for (auto& [k, t] : map.to_external(fqn, map.from_external(fqn, random))) again[k] = t;
  for (auto& [k, t] : random) EXPECT_TRUE(at::equal(again.at(k), t)) << fqn << " -> " << k;
  auto shapes = map.external_shapes(fqn, internal.sizes().vec());
  ASSERT_EQ(shapes.size(), external.size());
  for (auto& [k, s] : shapes) EXPECT_EQ(s, external.at(k).sizes().vec()) << k;
}

TEST(KeyMapTest, TransposeIsConv1dLayout) {
  KeyMap map({{R"(h\.(\d+)\.fc\.weight)", {"transformer.h.$1.mlp.c_fc.weight"}, 0, /*transpose=*/true}});
  at::Tensor w = arange({3, 2});  // Linear [out=3, in=2]
  auto ext = map.to_external("h.0.fc.weight", w);
  ASSERT_EQ(ext.size(), 1u);
  EXPECT_EQ(ext[0].first, "transformer.h.0.mlp.c_fc.weight");
  EXPECT_EQ(ext[0].second.sizes().vec(), (std::vector<int64_t>{2, 3}));
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < 2; ++j) EXPECT_EQ(ext[0].second[j][i].item<double>(), w[i][j].item<double>());
  expect_round_trip(map, "h.0.fc.weight", w);
  EXPECT_THAT([&] { map.to_external("h.0.fc.weight", arange({4})); },
              ThrowsMessage<Error>(HasSubstr("transposed, which needs a 2-D tensor")));
}

TEST(KeyMapTest, SplitAndConcatAlongAnyDim) {
  // GPT-2's c_attn: one Conv1D [in, 3 * out]; internal q, k, v Linear [out, in] each fused
  // on dim 0 as [3 * out, in]: split on dim 0, transpose each part -> three [in, out].
  KeyMap dim1({{"w", {"a", "b"}, /*dim=*/1}});
  at::Tensor w = arange({2, 4});
  auto ext = dim1.to_external("w", w);
  EXPECT_TRUE(at::equal(ext[0].second, w.narrow(1, 0, 2)));
  EXPECT_TRUE(at::equal(ext[1].second, w.narrow(1, 2, 2)));
  expect_round_trip(dim1, "w", w);
  KeyMap split_t({{"qkv", {"q", "k", "v"}, 0, /*transpose=*/true}});
  at::Tensor qkv = arange({6, 2});
  auto parts = split_t.to_external("qkv", qkv);
  EXPECT_TRUE(at::equal(parts[2].second, qkv.narrow(0, 4, 2).t()));
  expect_round_trip(split_t, "qkv", qkv);
  EXPECT_THAT([&] { dim1.to_external("w", arange({2, 3})); },
              ThrowsMessage<Error>(HasSubstr("does not split into 2 equal parts on dim 1")));
  EXPECT_THAT([&] { dim1.to_external("w", arange({4})); }, ThrowsMessage<Error>(HasSubstr("has no dim 1")));
  EXPECT_THAT([&] { dim1.from_external("w", {{"a", arange({2, 2})}, {"b", arange({3, 2})}}); },
              ThrowsMessage<Error>(HasSubstr("must have one shape")));
}

TEST(KeyMapTest, FusedHeadsInterleavedOnEitherSide) {
  // 2 heads of head_dim 2, 3 projections: blocked rows [q0 q0 q1 q1 | k0 k0 k1 k1 | v0 ...],
  // interleaved (GPT-NeoX query_key_value) [q0 q0 k0 k0 v0 v0 | q1 q1 k1 k1 v1 v1].
  at::Tensor blocked = arange({12, 1});
  const std::vector<int64_t> interleaved_rows = {0, 1, 4, 5, 8, 9, 2, 3, 6, 7, 10, 11};
  at::Tensor interleaved = blocked.index_select(0, at::tensor(interleaved_rows, at::kLong));
  KeyRule ext_rule{"qkv", {"query_key_value"}};
  ext_rule.head_dim = 2;
  ext_rule.interleave = Interleave::kExternal;
  ext_rule.parts = 3;
  KeyMap to_neox({ext_rule});
  EXPECT_TRUE(at::equal(to_neox.to_external("qkv", blocked)[0].second, interleaved));
  expect_round_trip(to_neox, "qkv", blocked);
  // The internal tensor interleaved, the checkpoint with one key per projection.
  KeyRule int_rule{"qkv", {"q", "k", "v"}};
  int_rule.head_dim = 2;
  int_rule.interleave = Interleave::kInternal;
  KeyMap from_neox({int_rule});
  auto qkv = from_neox.to_external("qkv", interleaved);
  EXPECT_TRUE(at::equal(qkv[0].second, blocked.narrow(0, 0, 4)));
  EXPECT_TRUE(at::equal(qkv[1].second, blocked.narrow(0, 4, 4)));
  EXPECT_TRUE(at::equal(qkv[2].second, blocked.narrow(0, 8, 4)));
  expect_round_trip(from_neox, "qkv", interleaved);
  EXPECT_THAT([&] { to_neox.to_external("qkv", arange({10, 1})); },
              ThrowsMessage<Error>(HasSubstr("does not hold 3 fused projections of whole heads of 2")));
}

TEST(KeyMapTest, MalformedRulesAreRejectedNamingTheRule) {
  KeyRule no_dim{"a", {"b"}};
  no_dim.interleave = Interleave::kExternal;
  EXPECT_THAT([&] { KeyMap({no_dim}); }, ThrowsMessage<Error>(HasSubstr("rule 'a': head_dim (0) and interleave")));
  KeyRule many{"a", {"b", "c"}};
  many.head_dim = 2;
  many.interleave = Interleave::kExternal;
  EXPECT_THAT([&] { KeyMap({many}); }, ThrowsMessage<Error>(HasSubstr("interleave 'external' needs one external key")));
  KeyRule few{"a", {"b"}};
  few.head_dim = 2;
  few.interleave = Interleave::kExternal;
  EXPECT_THAT([&] { KeyMap({few}); }, ThrowsMessage<Error>(HasSubstr("needs parts >= 2")));
  EXPECT_THAT([] { KeyMap({{"a", {"b"}, -1}}); }, ThrowsMessage<Error>(HasSubstr("must be >= 0")));
}

void write_one(const std::filesystem::path& file, const std::vector<std::string>& names) {
  std::vector<float> data(6, 1.0f);
  std::vector<safetensors::TensorView> views;
  for (const auto& n : names) views.push_back({n, "F32", {2, 3}, data.data(), 24});
  safetensors::write_file(file, views);
}

TEST(HfCheckpointTest, ReadsShardsThroughTheIndexAndRefusesWhatIsNotThere) {
  const auto dir = testing::temp_dir("hf_sharded");
  std::vector<float> data(6, 1.0f);
  std::vector<safetensors::TensorView> views;
  for (const char* n : {"a", "b", "c"}) views.push_back({n, "F32", {2, 3}, data.data(), 24});
  auto files = hf::write_weights(dir, views, /*max_shard_bytes=*/50);
  EXPECT_EQ(files, (std::vector<std::string>{"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                                             "model.safetensors.index.json"}));
  EXPECT_THAT([&] { hf::read_checkpoint(dir); }, ThrowsMessage<Error>(HasSubstr("has no config.json")));
  { std::ofstream(dir / "config.json") << R"({"model_type": "llama"})"; }
  hf::Checkpoint c = hf::read_checkpoint(dir);
  EXPECT_TRUE(c.sharded);
  ASSERT_EQ(c.tensors.size(), 3u);
  EXPECT_EQ(c.find("c")->file, "model-00002-of-00002.safetensors");
  EXPECT_EQ(c.files.size(), 4u);
  EXPECT_EQ(c.files[0].sha256, hf::file_sha256(dir / "config.json"));
  // A shard left as a Git LFS pointer, then a missing shard.
  { std::ofstream(dir / "model-00002-of-00002.safetensors") << "version https://git-lfs.github.com/spec/v1\noid sha256:0\n"; }
  EXPECT_THAT([&] { hf::read_checkpoint(dir); },
              ThrowsMessage<Error>(HasSubstr("model-00002-of-00002.safetensors is a Git LFS pointer")));
  std::filesystem::remove(dir / "model-00002-of-00002.safetensors");
  EXPECT_THAT([&] { hf::read_checkpoint(dir); },
              ThrowsMessage<Error>(HasSubstr("the shard model-00002-of-00002.safetensors named by")));
  // A weights file the index does not name is refused (loaders would ignore it).
  hf::write_weights(dir, views, 50);
  EXPECT_NO_THROW(hf::read_checkpoint(dir));
  write_one(dir / "model-00003-of-00003.safetensors", {"d"});
  EXPECT_THAT([&] { hf::read_checkpoint(dir); },
              ThrowsMessage<Error>(HasSubstr("model-00003-of-00003.safetensors is not named by model.safetensors.index.json")));
  // One file again: the writer removes every weights file of the earlier write.
  EXPECT_EQ(hf::write_weights(dir, views), (std::vector<std::string>{"model.safetensors"}));
  EXPECT_FALSE(std::filesystem::exists(dir / "model.safetensors.index.json"));
  EXPECT_FALSE(std::filesystem::exists(dir / "model-00001-of-00002.safetensors"));
  EXPECT_FALSE(std::filesystem::exists(dir / "model-00003-of-00003.safetensors"));
  EXPECT_TRUE(std::filesystem::exists(dir / "config.json"));
  for (const char* url : {"https://huggingface.co/x", "hf://meta-llama/Llama", "http://x"}) {
    EXPECT_THAT([&] { hf::read_checkpoint(url); }, ThrowsMessage<Error>(HasSubstr("mih never downloads"))) << url;
  }
}

TEST(HfCheckpointTest, AKeyTheIndexDoesNotPlaceThereIsAnError) {
  const auto dir = testing::temp_dir("hf_index_mismatch");
  write_one(dir / "s1.safetensors", {"a", "b"});
  { std::ofstream(dir / "config.json") << "{}"; }
  { std::ofstream(dir / "model.safetensors.index.json") << R"({"weight_map": {"a": "s1.safetensors"}})"; }
  EXPECT_THAT([&] { hf::read_checkpoint(dir); },
              ThrowsMessage<Error>(HasSubstr("s1.safetensors holds 'b', which model.safetensors.index.json does not list")));
  { std::ofstream(dir / "model.safetensors.index.json") << R"({"weight_map": {"a": "s1.safetensors", "b": "s1.safetensors", "z": "s1.safetensors"}})"; }
  EXPECT_THAT([&] { hf::read_checkpoint(dir); }, ThrowsMessage<Error>(HasSubstr("places 'z' in s1.safetensors")));
  for (const char* shard : {"../s1.safetensors", "/etc/passwd", ""}) {
    { std::ofstream(dir / "model.safetensors.index.json") << nlohmann::json({{"weight_map", {{"a", shard}}}}).dump(); }
    EXPECT_THAT([&] { hf::read_checkpoint(dir); },
                ThrowsMessage<Error>(HasSubstr("a shard is a file inside the checkpoint directory"))) << shard;
  }
}

TEST(HfCheckpointTest, PicklesOnlyAreNamed) {
  const auto dir = testing::temp_dir("hf_bin_only");
  { std::ofstream(dir / "config.json") << "{}"; }
  { std::ofstream(dir / "pytorch_model.bin") << "x"; }
  EXPECT_THAT([&] { hf::read_checkpoint(dir); }, ThrowsMessage<Error>(HasSubstr("has neither model.safetensors nor model.safetensors.index.json (it holds pytorch_model.bin;")));
}

}  // namespace
}  // namespace mih
