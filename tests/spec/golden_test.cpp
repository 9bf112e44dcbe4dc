// Goldens of the original model (harness/cases/golden.h) and the declared config against the
// original's defaults: a golden of an unknown format or version, with a stale tensors file, or
// of another export is refused naming what differs; `mih inspect` warns for a behaviour field
// the spec's config leaves to the original's default. The comparison itself runs through the
// real binary (tests/cli/golden.py).
#include <cmath>
#include <fstream>

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "harness/base/error.h"
#include "harness/cases/golden.h"
#include "harness/cases/hf_interop.h"
#include "harness/checkpoint/hf_checkpoint.h"
#include "harness/checkpoint/safetensors.h"
#include "harness/spec/model_spec.h"
#include "tests/support/temp_dir.h"

namespace mih {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

const std::string kA(64, 'a'), kB(64, 'b'), kC(64, 'c');

// A minimal golden directory: one tensor and a manifest that describes it.
fs::path write_golden(const std::string& tag, const std::function<void(nlohmann::json&)>& edit = {}) {
  const fs::path dir = testing::temp_dir("golden_" + tag);
  const double loss = 5.5;
  safetensors::write_file(dir / "golden.safetensors", {{"loss", "F64", {}, &loss, sizeof loss}});
  nlohmann::json m = {{"format", "mih-golden"},
                      {"version", 1},
                      {"implementation", {{"name", "builtin"}, {"version", "1"}, {"architecture", "llama"}}},
                      {"dtype", "float64"},
                      {"spec", "llama"},
                      {"checkpoint_sha256", kA},
                      {"batch_sha256", kB},
                      {"training_sha256", kC},
                      {"tensors_file", "golden.safetensors"},
                      {"tensors_sha256", hf::file_sha256(dir / "golden.safetensors")},
                      {"num_hidden_layers", 2},
                      {"compute_epsilon", 2.220446049250313e-16},
                      {"noise", {{"loss", 1e-16}}}};
  if (edit) edit(m);
  std::ofstream(dir / "golden.json") << m.dump(2);
  return dir;
}

TEST(GoldenFormatTest, ReadsAGoldenOfItsVersion) {
  const cases::Golden g = cases::read_golden(write_golden("ok"));
  EXPECT_EQ(g.num_hidden_layers, 2);
  EXPECT_EQ(g.checkpoint_sha256, kA);
  EXPECT_EQ(g.noise.at("loss"), 1e-16);
  EXPECT_THAT(g.implementation, HasSubstr("builtin 1 (llama"));
}

// A gradient zero in exact arithmetic (CLIP's key bias, which softmax ignores) is rounding
// residue: its run and noise twin disagree in every digit, so its noise is far above the cap.
// That noise is taken for such a gradient only: at rounding level of the gradients' norm.
TEST(GoldenFormatTest, NoiseAboveTheCapOnlyForAGradientAtRoundingLevel) {
  auto golden = [](const std::string& tag, const std::string& noisy, double noise, double w0 = 0.3) {
    const fs::path dir = write_golden(tag, [&](nlohmann::json& m) { m["noise"][noisy] = noise; });
    const double loss = 5.5, big[2] = {w0, 0.4}, small[2] = {3e-7, 4e-7}, residue[2] = {1e-19, -2e-19};
    safetensors::write_file(dir / "golden.safetensors", {{"loss", "F64", {}, &loss, sizeof loss},
                                                         {"grad.w", "F64", {2}, big, sizeof big},
                                                         {"grad.small", "F64", {2}, small, sizeof small},
                                                         {"grad.k_proj.bias", "F64", {2}, residue, sizeof residue}});
    nlohmann::json m = nlohmann::json::parse(std::ifstream(dir / "golden.json"));
    m["tensors_sha256"] = hf::file_sha256(dir / "golden.safetensors");
    std::ofstream(dir / "golden.json") << m.dump(2);
    return dir;
  };
  EXPECT_EQ(cases::read_golden(golden("residue", "grad.k_proj.bias", 0.9)).noise.at("grad.k_proj.bias"), 0.9);
  EXPECT_THAT([&] { cases::read_golden(golden("real", "grad.w", 0.9)); },
              ::testing::ThrowsMessage<Error>(AllOf(HasSubstr("noise of 'grad.w' must be a number in [0, "),
                                                    HasSubstr("only for a gradient at float64 rounding level"))));
  EXPECT_THAT([&] { cases::read_golden(golden("huge", "grad.k_proj.bias", 50)); },
              ::testing::ThrowsMessage<Error>(HasSubstr("noise of 'grad.k_proj.bias' must be a number in [0, ")));
  // A NaN in another gradient is named as such, not as the residue's noise.
  EXPECT_THAT([&] { cases::read_golden(golden("nan", "grad.k_proj.bias", 0.9, std::nan(""))); },
              ::testing::ThrowsMessage<Error>(HasSubstr("tensor 'grad.w' holds non-finite value(s)")));
  // The value as golden.json has it, not rounded to 6 digits.
  EXPECT_THAT([&] { cases::read_golden(golden("over", "grad.k_proj.bias", 10.0000001)); },
              ::testing::ThrowsMessage<Error>(HasSubstr("got 10.0000001")));
  // A real but small gradient (1e-6 of the whole) is no residue: its noise stays capped.
  EXPECT_THAT([&] { cases::read_golden(golden("small", "grad.small", 0.9)); },
              ::testing::ThrowsMessage<Error>(HasSubstr("noise of 'grad.small' must be a number in [0, ")));
  EXPECT_THAT([&] { cases::read_golden(golden("loss", "loss", 0.9)); },
              ::testing::ThrowsMessage<Error>(HasSubstr("noise of 'loss' must be a number in [0, ")));
}

TEST(GoldenFormatTest, RefusesAnUnknownVersionOrFormat) {
  const fs::path v2 = write_golden("v2", [](nlohmann::json& m) { m["version"] = 2; });
  EXPECT_THAT([&] { cases::read_golden(v2); },
              ::testing::ThrowsMessage<Error>(AllOf(HasSubstr("golden format version 2 is not one this mih reads"),
                                                    HasSubstr("it reads version 1"))));
  try {
    cases::read_golden(v2);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Code::kInvalidSpec) << "bad input: exit 11";
  }
  const fs::path other = write_golden("format", [](nlohmann::json& m) { m["format"] = "safetensors"; });
  EXPECT_THAT([&] { cases::read_golden(other); }, ::testing::ThrowsMessage<Error>(HasSubstr("this is not a mih golden")));
  const fs::path hash = write_golden("hash", [](nlohmann::json& m) { m["batch_sha256"] = "xyz"; });
  EXPECT_THAT([&] { cases::read_golden(hash); },
              ::testing::ThrowsMessage<Error>(HasSubstr("\"batch_sha256\" must be a SHA-256")));
  const fs::path escape = write_golden("escape", [](nlohmann::json& m) { m["tensors_file"] = "../x.safetensors"; });
  EXPECT_THAT([&] { cases::read_golden(escape); },
              ::testing::ThrowsMessage<Error>(HasSubstr("must be a file name in the golden's directory")));
}

TEST(GoldenFormatTest, RefusesAStaleTensorsFileAndAMissingDirectory) {
  const fs::path dir = write_golden("stale");
  const double other = 6.5;
  safetensors::write_file(dir / "golden.safetensors", {{"loss", "F64", {}, &other, sizeof other}});
  EXPECT_THAT([&] { cases::read_golden(dir); },
              ::testing::ThrowsMessage<Error>(AllOf(HasSubstr("is not the file golden.json was written with"),
                                                    HasSubstr("tensors_sha256"), HasSubstr("a stale or edited golden"))));
  try {
    cases::read_golden(dir / "nope");
    ADD_FAILURE() << "a missing golden directory was read";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Code::kFailedPrecondition) << e.what();
    EXPECT_THAT(e.what(), HasSubstr("mih golden --spec NAME --out"));
  }
}

TEST(GoldenFormatTest, AGoldenOfAnotherExportIsRefusedNamingTheHash) {
  spec::ModelSpec s = spec::SpecRegistry::instance().get("llama");
  s.golden.layers = {{"layers.0", 1}};
  const cases::Golden g = cases::read_golden(write_golden("match"));
  EXPECT_NO_THROW(cases::check_golden_matches(s, g, {kA, kB, kC, 0, {}}));
  EXPECT_THAT([&] { cases::check_golden_matches(s, g, {kA, std::string(64, 'd'), kC, 0, {}}); },
              ::testing::ThrowsMessage<Error>(
                  AllOf(HasSubstr("its batch_sha256 is " + kB), HasSubstr("hashes to " + std::string(64, 'd')),
                        HasSubstr("mih golden --spec llama"))));
  EXPECT_THAT([&] { cases::check_golden_matches(s, g, {std::string(64, 'e'), kB, kC, 0, {}}); },
              ::testing::ThrowsMessage<Error>(HasSubstr("its checkpoint_sha256 is " + kA)));
  // The fix writes the golden of the run's own start, into a new directory.
  EXPECT_THAT([&] { cases::check_golden_matches(s, g, {std::string(64, 'e'), kB, kC, 1, "/ckpt"}); },
              ::testing::ThrowsMessage<Error>(HasSubstr("mih golden --spec llama --seed 1 --init-from /ckpt --out NEW_DIR")));
  EXPECT_THAT([&] { cases::check_golden_matches(s, g, {kA, kB, std::string(64, 'f'), 0, {}}); },
              ::testing::ThrowsMessage<Error>(HasSubstr("its training_sha256 is " + kC)));
  s.golden.layers = {{"norm", 4}};
  EXPECT_THAT([&] { cases::check_golden_matches(s, g, {kA, kB, kC, 0, {}}); },
              ::testing::ThrowsMessage<Error>(HasSubstr("holds hidden states 0 .. 3")));
  s.name = "moe";
  EXPECT_THAT([&] { cases::check_golden_matches(s, g, {kA, kB, kC, 0, {}}); },
              ::testing::ThrowsMessage<Error>(HasSubstr("from an export of spec 'llama', not of 'moe'")));
}

TEST(GoldenFormatTest, TheExportDigestsAreTheExportsFiles) {
  const spec::ModelSpec s = spec::SpecRegistry::instance().get("llama");
  const cases::ExportDigests d = cases::export_digests(s, 0, "");
  cases::HfExportOptions o;
  o.out = testing::temp_dir("golden_export");
  o.dtype = "float64";
  cases::export_hf(s, o);
  EXPECT_EQ(d.checkpoint_sha256, cases::checkpoint_digest(hf::read_checkpoint(o.out)));
  EXPECT_EQ(d.batch_sha256, hf::file_sha256(o.out / "batch.safetensors"));
  EXPECT_EQ(d.training_sha256, hf::file_sha256(o.out / "training.json"));
  EXPECT_NE(cases::export_digests(s, 1, "").checkpoint_sha256, d.checkpoint_sha256) << "another seed, other weights";
  const nlohmann::json training = nlohmann::json::parse(std::ifstream(o.out / "training.json"));
  EXPECT_EQ(training["tensors"]["model.layers.0.mlp.gate_proj.weight"]["weight_decay"], true);
  EXPECT_EQ(training["tensors"]["model.norm.weight"]["weight_decay"], false);
  EXPECT_EQ(training["trainer"]["max_grad_norm"], 1.0);
  EXPECT_EQ(training["labels_are_shifted"], true);
}

TEST(InspectWarningTest, AnUndeclaredBehaviourFieldWarnsWithTheOriginalsDefault) {
  const spec::ModelSpec s = spec::SpecRegistry::instance().get("moe");
  cases::HfExportOptions o;
  o.out = testing::temp_dir("golden_inspect_export");
  cases::export_hf(s, o);
  cases::HfInspectOptions io;
  io.checkpoint = o.out;
  io.out = testing::temp_dir("golden_inspect_clean");
  const cases::HfInspectResult clean = cases::inspect_hf(s, io);
  EXPECT_EQ(clean.differences, 0u);
  EXPECT_TRUE(clean.diff["config_warnings"].empty()) << clean.diff["config_warnings"].dump(2);

  spec::ModelSpec loose = s;
  loose.checkpoint.hf.fields.erase("rope_theta");
  loose.checkpoint.hf.fields.erase("output_router_logits");
  io.out = testing::temp_dir("golden_inspect_loose");
  const cases::HfInspectResult r = cases::inspect_hf(loose, io);
  EXPECT_EQ(r.differences, 0u) << "a warning, not a difference";
  std::map<std::string, nlohmann::json> warned;
  for (const auto& w : r.diff["config_warnings"]) warned[w["field"].get<std::string>()] = w;
  ASSERT_EQ(warned.size(), 2u) << r.diff["config_warnings"].dump(2);
  // moe is a Qwen3-MoE: Qwen3MoeConfig's default theta is 1e4 (released Qwen3 checkpoints declare 1e6), which
  // ConfigMatchesTransformers holds against transformers' own class.
  EXPECT_EQ(warned["rope_theta"]["default"], 1e4) << "Qwen3-MoE's default theta";
  EXPECT_EQ(warned["output_router_logits"]["default"], false);
  EXPECT_THAT(warned["rope_theta"]["why"].get<std::string>(),
              AllOf(HasSubstr("declares no 'rope_theta'"), HasSubstr("(qwen3_moe) computes with its default 10000.0")));
}

}  // namespace
}  // namespace mih
