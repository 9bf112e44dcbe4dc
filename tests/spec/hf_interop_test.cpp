// Specs against Hugging Face checkpoints: every registered spec's key map round-trips every
// parameter both ways; the shipped specs export as Hugging Face checkpoints that a reader
// knowing only Hugging Face's names accepts, and `inspect` finds their exports clean, while a
// renamed key, a transposed weight or a changed config field is a difference naming it. A
// port initialized from a checkpoint: checked before any rank, fingerprinted by its bytes.
#include <cstdlib>
#include <fstream>

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "harness/base/error.h"
#include "harness/base/json_fields.h"
#include "harness/cases/case_runner.h"
#include "harness/cases/hf_interop.h"
#include "harness/cases/memo.h"
#include "harness/checkpoint/key_map.h"
#include "harness/checkpoint/safetensors.h"
#include "harness/parallel/parallel_context.h"
#include "harness/spec/model_spec.h"
#include "tests/support/temp_dir.h"
#include "tests/support/thread_ranks.h"

namespace mih {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

TEST(SpecKeyMapTest, EveryRegisteredSpecRoundTripsEveryParameterBothWays) {
  for (const std::string& name : spec::SpecRegistry::instance().names()) {
    SCOPED_TRACE(name);
    const spec::ModelSpec s = spec::SpecRegistry::instance().get(name);
    const KeyMap map(s.checkpoint.key_map);
    size_t checked = 0;
    auto errors = testing::run_mesh(ParallelConfig{}, [&](DeviceMesh& mesh) {
      ParallelConfig c;
      c.dtype = DType::kFloat64;
      Trainer t(mesh, c, s.factory, s.data.make_batches(), s.data.apply_sharding(s.trainer));
      for (const auto& p : t.context().parameters()) {
        const at::Tensor full = t.gather_full(*p);
        std::map<std::string, at::Tensor> external;
        for (auto& [key, tensor] : map.to_external(p->fqn, full)) external[key] = tensor;
        EXPECT_TRUE(at::equal(map.from_external(p->fqn, external), full)) << p->fqn;
        std::map<std::string, at::Tensor> random, again;
        for (auto& [key, tensor] : external) random[key] = at::randn(tensor.sizes(), at::kDouble);
        for (auto& [key, tensor] : map.to_external(p->fqn, map.from_external(p->fqn, random))) again[key] = tensor;
        for (auto& [key, tensor] : random) EXPECT_TRUE(at::equal(again.at(key), tensor)) << p->fqn << " -> " << key;
        ++checked;
      }
    });
    EXPECT_THAT(errors, ::testing::IsEmpty());
    EXPECT_GT(checked, 5u) << "a spec with almost no parameters checked proves nothing";
  }
}

// Every tensor of a safetensors file, rewritten through `edit` (rename, reshape, re-lay out).
void rewrite(const fs::path& file, const std::function<void(std::string&, std::vector<int64_t>&, std::vector<char>&)>& edit) {
  std::vector<std::string> names;
  std::vector<std::vector<int64_t>> shapes;
  std::vector<std::vector<char>> data;
  std::vector<std::string> dtypes;
  {
    safetensors::Reader r(file);
    for (const auto& n : r.names()) {
      const auto& info = r.info(n);
      std::vector<char> bytes(info.nbytes());
      r.read(n, bytes.data());
      names.push_back(n);
      shapes.push_back(info.shape);
      dtypes.push_back(info.dtype);
      data.push_back(std::move(bytes));
    }
  }
  std::vector<safetensors::TensorView> views;
  for (size_t i = 0; i < names.size(); ++i) {
    edit(names[i], shapes[i], data[i]);
    views.push_back({names[i], dtypes[i], shapes[i], data[i].data(), data[i].size()});
  }
  safetensors::write_file(file, views, {{"format", "pt"}});
}

fs::path copy_of(const fs::path& dir, const std::string& name) {
  const fs::path out = dir.parent_path() / (dir.filename().string() + "_" + name);
  fs::remove_all(out);
  fs::copy(dir, out, fs::copy_options::recursive);
  return out;
}

// Inspects `dir` into a new evidence directory (its path in *evidence when given).
cases::HfInspectResult inspect(const spec::ModelSpec& s, const fs::path& dir, const std::string& tag,
                               fs::path* evidence = nullptr) {
  cases::HfInspectOptions o;
  o.checkpoint = dir;
  o.out = testing::temp_dir("inspect_" + s.name + "_" + tag);
  if (evidence != nullptr) *evidence = o.out;
  return cases::inspect_hf(s, o);
}

int python_reader(const fs::path& dir) {
  const std::string command = std::string("python3 ") + MIH_TEST_SOURCE_DIR + "/check_hf_export.py " + dir.string() +
                              " > " + (dir.parent_path() / (dir.filename().string() + ".check.txt")).string() + " 2>&1";
  const int rc = std::system(command.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

class HfExportTest : public ::testing::TestWithParam<std::string> {};

TEST_P(HfExportTest, ExportInspectsCleanAndEachPlantedDifferenceIsNamed) {
  const spec::ModelSpec s = spec::SpecRegistry::instance().get(GetParam());
  cases::HfExportOptions o;
  o.out = testing::temp_dir("hf_export_" + GetParam());
  const cases::HfExportResult exported = cases::export_hf(s, o);
  EXPECT_GT(exported.loss, 4.0) << "an untrained byte-level model is near ln(259) = 5.56";
  EXPECT_TRUE(exported.logits);
  const nlohmann::json config = read_json_file(o.out / "config.json");
  EXPECT_EQ(config["model_type"], s.checkpoint.hf.model_type);
  EXPECT_EQ(config["torch_dtype"], "float32");

  // Clean: nothing differs, the state is DISCOVERED, the fingerprints are the files'.
  fs::path evidence;
  const cases::HfInspectResult clean = inspect(s, o.out, "clean", &evidence);
  EXPECT_EQ(clean.differences, 0u) << clean.diff.dump(2);
  EXPECT_EQ(clean.matched, exported.tensors);
  EXPECT_EQ(read_json_file(evidence / "integration_state.json")["state"], "DISCOVERED");
  std::string sums;
  ASSERT_TRUE(read_file(evidence / "inventory" / "fingerprints.sha256", &sums));
  EXPECT_THAT(sums, HasSubstr(hf::file_sha256(o.out / "model.safetensors") + "  model.safetensors"));
  EXPECT_TRUE(fs::exists(evidence / "inventory" / "candidate.json"));
  EXPECT_TRUE(fs::exists(evidence / "inventory" / "reference.json"));

  const bool python = std::system("python3 -c 'import json, struct' > /dev/null 2>&1") == 0;
  if (python) {
    EXPECT_EQ(python_reader(o.out), 0) << "the Hugging Face-names reader disagrees; see " << o.out << ".check.txt";
  }

  const std::string prefix = GetParam() == "vlm" ? "language_model." : "";
  const std::string down = prefix + "model.layers.0.mlp.down_proj.weight";  // [H, F], not square
  // A renamed key: missing under its name, unexpected under the new one.
  const fs::path renamed = copy_of(o.out, "renamed");
  rewrite(renamed / "model.safetensors", [&](std::string& name, std::vector<int64_t>&, std::vector<char>&) {
    if (name == down) name = prefix + "model.layers.0.mlp.down_prj.weight";
  });
  const cases::HfInspectResult r1 = inspect(s, renamed, "renamed");
  EXPECT_EQ(r1.differences, 2u);
  EXPECT_THAT(r1.diff["missing_keys"].dump(), HasSubstr(down));
  EXPECT_THAT(r1.diff["unexpected_keys"].dump(), HasSubstr("down_prj"));
  if (python) {
    EXPECT_NE(python_reader(renamed), 0) << "the reader must be able to fail";
  }

  // A transposed weight (Conv1D layout where the port reads a Linear's).
  const fs::path transposed = copy_of(o.out, "transposed");
  rewrite(transposed / "model.safetensors", [&](std::string& name, std::vector<int64_t>& shape, std::vector<char>& bytes) {
    if (name != down) return;
    at::Tensor t = at::from_blob(bytes.data(), shape, at::kFloat).t().contiguous();
    std::memcpy(bytes.data(), t.data_ptr(), bytes.size());
    std::swap(shape[0], shape[1]);
  });
  const cases::HfInspectResult r2 = inspect(s, transposed, "transposed");
  EXPECT_EQ(r2.differences, 1u);
  ASSERT_EQ(r2.diff["shape_mismatches"].size(), 1u);
  EXPECT_EQ(r2.diff["shape_mismatches"][0]["key"], down);
  EXPECT_EQ(r2.diff["shape_mismatches"][0]["likely_transposed"], true);
  EXPECT_THAT(r2.diff["shape_mismatches"][0]["why"].get<std::string>(), HasSubstr("likely transposed"));

  // A config field the loader reads, changed.
  const fs::path changed = copy_of(o.out, "config");
  nlohmann::json c = config;
  const std::string field = GetParam() == "vlm" ? "text_config.rope_theta" : "rope_theta";
  (GetParam() == "vlm" ? c["text_config"] : c)["rope_theta"] = 500000.0;
  { std::ofstream(changed / "config.json") << c.dump(2); }
  fs::path changed_evidence;
  const cases::HfInspectResult r3 = inspect(s, changed, "config", &changed_evidence);
  EXPECT_EQ(r3.differences, 1u);
  ASSERT_EQ(r3.diff["config_differences"].size(), 1u);
  EXPECT_EQ(r3.diff["config_differences"][0]["field"], field);
  EXPECT_TRUE(fs::exists(changed_evidence / "inventory" / "structure_diff.json"));
  EXPECT_FALSE(fs::exists(changed_evidence / "integration_state.json"))
      << "a directory with differences is not DISCOVERED";
}

INSTANTIATE_TEST_SUITE_P(Specs, HfExportTest, ::testing::Values("llama", "moe", "vlm", "qwen3"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

TEST(HfExportTest, ShardsAboveTheSizeWithTheIndexAndInspectsClean) {
  const spec::ModelSpec s = spec::SpecRegistry::instance().get("llama");
  cases::HfExportOptions o;
  o.out = testing::temp_dir("hf_export_sharded");
  o.max_shard_bytes = 64 * 1024;
  const cases::HfExportResult exported = cases::export_hf(s, o);
  ASSERT_GT(exported.weight_files.size(), 2u);
  EXPECT_EQ(exported.weight_files.back(), "model.safetensors.index.json");
  EXPECT_FALSE(fs::exists(o.out / "model.safetensors"));
  const cases::HfInspectResult r = inspect(s, o.out, "sharded");
  EXPECT_EQ(r.differences, 0u) << r.diff.dump(2);
  EXPECT_EQ(r.matched, exported.tensors);
}

std::map<std::string, at::Tensor> read_all(const fs::path& file) {
  safetensors::Reader r(file);
  std::map<std::string, at::Tensor> out;
  for (const auto& n : r.names()) {
    const auto& info = r.info(n);
    at::Tensor t = at::empty({static_cast<int64_t>(info.nbytes())}, at::kByte);
    r.read(n, t.data_ptr());
    out[n] = t;
  }
  return out;
}

TEST(HfInitFromTest, AnExportFromAnotherSeedInitializedFromTheCheckpointReproducesItBitForBit) {
  const spec::ModelSpec s = spec::SpecRegistry::instance().get("llama");
  cases::HfExportOptions a, b, c;
  a.out = testing::temp_dir("init_a");
  b.out = testing::temp_dir("init_b");
  c.out = testing::temp_dir("init_c");
  b.seed = c.seed = 7;
  b.init_from = a.out;
  cases::export_hf(s, a);
  cases::export_hf(s, b);
  cases::export_hf(s, c);
  const auto ref_a = read_all(a.out / "reference.safetensors"), ref_b = read_all(b.out / "reference.safetensors"),
             ref_c = read_all(c.out / "reference.safetensors");
  EXPECT_TRUE(at::equal(ref_a.at("logits"), ref_b.at("logits"))) << "the logits of the checkpoint's weights";
  EXPECT_FALSE(at::equal(ref_a.at("logits"), ref_c.at("logits"))) << "another seed without init_from must differ";
  const auto w_a = read_all(a.out / "model.safetensors"), w_b = read_all(b.out / "model.safetensors");
  ASSERT_EQ(w_a.size(), w_b.size());
  for (const auto& [k, t] : w_a) EXPECT_TRUE(at::equal(t, w_b.at(k))) << k;
}

// Under tp x FSDP (llama) and ep x FSDP (moe) every rank's piece is the checkpoint's: the
// gathered parameter equals the tensor rebuilt from the files, bit for bit.
TEST(HfInitFromTest, EveryShardedLayoutLoadsTheCheckpointsValues) {
  for (const auto& [name, config] : std::vector<std::pair<std::string, ParallelConfig>>{
           {"llama", [] { ParallelConfig c; c.tp = 2; c.dp_shard = 2; return c; }()},
           {"moe", [] { ParallelConfig c; c.dp_shard = 2; c.ep = 2; return c; }()}}) {
    SCOPED_TRACE(name);
    const spec::ModelSpec s = spec::SpecRegistry::instance().get(name);
    cases::HfExportOptions o;
    o.out = testing::temp_dir("init_layout_" + name);
    o.seed = 3;
    cases::export_hf(s, o);
    std::map<std::string, at::Tensor> files;
    {
      safetensors::Reader r(o.out / "model.safetensors");
      for (const auto& n : r.names()) {
        at::Tensor t = at::empty(r.info(n).shape, at::kFloat);
        r.read(n, t.data_ptr());
        files[n] = t;
      }
    }
    const KeyMap map(s.checkpoint.key_map);
    size_t compared = 0;
    auto errors = testing::run_mesh(config, [&](DeviceMesh& mesh) {
      Trainer t(mesh, config, s.factory, s.data.make_batches(), s.data.apply_sharding(s.trainer));
      EXPECT_EQ(cases::load_hf_weights(s, o.out, t.context()), t.context().parameters().size());
      for (const auto& p : t.context().parameters()) {
        EXPECT_TRUE(at::equal(t.gather_full(*p), map.from_external(p->fqn, files))) << p->fqn;
        if (mesh.rank() == 0) ++compared;
      }
    });
    EXPECT_THAT(errors, ::testing::IsEmpty());
    EXPECT_GT(compared, 10u);
  }
}

TEST(HfInitFromTest, AMissingOrTransposedWeightSetsNothing) {
  const spec::ModelSpec s = spec::SpecRegistry::instance().get("llama");
  cases::HfExportOptions o;
  o.out = testing::temp_dir("init_bad");
  cases::export_hf(s, o);
  const std::string down = "model.layers.1.mlp.down_proj.weight";
  rewrite(o.out / "model.safetensors", [&](std::string& name, std::vector<int64_t>& shape, std::vector<char>&) {
    if (name == down) std::swap(shape[0], shape[1]);
  });
  auto errors = testing::run_mesh(ParallelConfig{}, [&](DeviceMesh& mesh) {
    ParallelConfig c;
    c.seed = 9;
    Trainer t(mesh, c, s.factory, s.data.make_batches(), s.data.apply_sharding(s.trainer));
    const at::Tensor before = t.context().parameters().front()->local.clone();
    EXPECT_THAT([&] { cases::load_hf_weights(s, o.out, t.context()); },
                ::testing::ThrowsMessage<Error>(HasSubstr("'layers.1.mlp.down_proj.weight' rebuilt from " + down +
                                                          " has shape [128,64], the port's is [64,128] (likely transposed")));
    EXPECT_TRUE(at::equal(t.context().parameters().front()->local, before)) << "all or nothing: the embedding was set";
  });
  EXPECT_THAT(errors, ::testing::IsEmpty());
  rewrite(o.out / "model.safetensors", [&](std::string& name, std::vector<int64_t>&, std::vector<char>&) {
    if (name == down) name = "model.layers.1.mlp.down.weight";
  });
  auto errors2 = testing::run_mesh(ParallelConfig{}, [&](DeviceMesh& mesh) {
    Trainer t(mesh, ParallelConfig{}, s.factory, s.data.make_batches(), s.data.apply_sharding(s.trainer));
    EXPECT_THAT([&] { cases::load_hf_weights(s, o.out, t.context()); },
                ::testing::ThrowsMessage<Error>(HasSubstr("the checkpoint has no '" + down + "' (needed for 'layers.1.mlp.down_proj.weight')")));
  });
  EXPECT_THAT(errors2, ::testing::IsEmpty());
}

// One byte of a weight changed in place: the lowest byte of the first tensor's first element
// (a tiny change of its value, a different file).
void flip_first_weight_byte(const fs::path& file) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  uint64_t header = 0;
  f.read(reinterpret_cast<char*>(&header), sizeof header);
  const std::streamoff at = static_cast<std::streamoff>(sizeof header + header);
  f.seekg(at);
  char byte = 0;
  f.read(&byte, 1);
  byte = static_cast<char>(byte ^ 1);
  f.seekp(at);
  f.write(&byte, 1);
}

// What a run checks before any rank starts from a checkpoint: the port's keys, shapes and
// dtypes from the headers (every misfit listed, nothing run), and the digest of its bytes,
// which every case's fingerprint carries (one changed byte: another fingerprint).
TEST(HfInitFromTest, TheRunChecksTheCheckpointBeforeAnyRankAndItsBytesJoinTheFingerprint) {
  const spec::ModelSpec s = spec::SpecRegistry::instance().get("llama");
  cases::HfExportOptions o;
  o.out = testing::temp_dir("init_check");
  cases::export_hf(s, o);
  const cases::InitSource a = cases::check_init_from(s, o.out);
  EXPECT_EQ(a.dir, fs::absolute(o.out).lexically_normal());
  EXPECT_EQ(a.sha256.size(), 64u);
  EXPECT_EQ(a.sha256, cases::checkpoint_digest(hf::read_checkpoint(o.out)));
  const spec::Case c = spec::resolve_matrix_source(s, "cpu-smoke").at("Reference");
  auto fingerprint = [&](const std::string& sha) {
    CaseRequest q;
    q.spec = "llama";
    q.c = c;
    q.training_backend = "trainer";
    q.init_from_sha256 = sha;
    return cases::case_fingerprint(q);
  };
  EXPECT_NE(fingerprint(a.sha256), fingerprint("")) << "a case from the checkpoint is not the case from the seed";
  flip_first_weight_byte(o.out / "model.safetensors");
  const cases::InitSource b = cases::check_init_from(s, o.out);
  EXPECT_NE(b.sha256, a.sha256) << "one changed byte of a weight";
  EXPECT_NE(fingerprint(b.sha256), fingerprint(a.sha256));
  const fs::path copy = copy_of(o.out, "copy");
  EXPECT_EQ(cases::check_init_from(s, copy).sha256, b.sha256) << "the same bytes elsewhere are the same checkpoint";

  // A key the port loads is missing and another weight is transposed: both named, nothing run.
  rewrite(copy / "model.safetensors", [](std::string& name, std::vector<int64_t>& shape, std::vector<char>&) {
    if (name == "model.layers.1.mlp.down_proj.weight") name = "model.layers.1.mlp.down.weight";
    if (name == "model.layers.0.mlp.down_proj.weight") std::swap(shape[0], shape[1]);
  });
  try {
    (void)cases::check_init_from(s, copy);
    ADD_FAILURE() << "a checkpoint that does not fit the port was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Code::kInvalidSpec);
    EXPECT_THAT(e.what(), HasSubstr("(2 problem(s), nothing was run)"));
    EXPECT_THAT(e.what(), HasSubstr("the checkpoint has no 'model.layers.1.mlp.down_proj.weight' (needed for "
                                    "'layers.1.mlp.down_proj.weight')"));
    EXPECT_THAT(e.what(), HasSubstr("'model.layers.0.mlp.down_proj.weight' (for 'layers.0.mlp.down_proj.weight') has "
                                    "shape [128,64], the port loads [64,128] (likely transposed"));
    EXPECT_THAT(e.what(), HasSubstr("`mih inspect --spec llama --hf-dir "));
  }
}

// A rank that finds the checkpoint changed since the run checked it stops before training:
// the case is "not_run" (bad input or environment, exit 12), never FAILED on the model's
// account; run_case, given no digest, checks the checkpoint itself and the case runs from it.
TEST(HfInitFromCaseTest, ACheckpointChangedAfterTheCheckIsNotRunNeverTheModelsFailure) {
  const spec::ModelSpec s = spec::SpecRegistry::instance().get("llama");
  cases::HfExportOptions e;
  e.out = testing::temp_dir("init_changed");
  e.seed = 4;
  cases::export_hf(s, e);
  const cases::InitSource checked = cases::check_init_from(s, e.out);
  flip_first_weight_byte(e.out / "model.safetensors");
  const spec::Case c = spec::resolve_matrix_source(s, "cpu-smoke").at("Reference");
  CaseRequest q;
  q.spec = s.name;
  q.c = c;
  q.matrix = MatrixSource::parse("cpu-smoke");
  q.training_backend = "trainer";
  q.init_from = checked.dir.string();
  q.init_from_sha256 = checked.sha256;
  const cases::CaseRunOptions o{.evidence_root = testing::temp_dir("init_changed_root")};
  const cases::CaseRunResult r = cases::run_case(q, o);
  EXPECT_EQ(r.outcome, Outcome::kNotRun);
  EXPECT_EQ(r.code, Code::kFailedPrecondition);
  EXPECT_THAT(r.error, HasSubstr("the checkpoint's files changed after the run checked them"));
  EXPECT_NE(r.state, "FAILED") << "the model was never run: no verdict on it";
  EXPECT_EQ(read_json_file(r.evidence / "case_run.json")["outcome"], "not_run");

  q.init_from_sha256.clear();
  const cases::CaseRunResult again = cases::run_case(q, o);
  EXPECT_EQ(again.outcome, Outcome::kRan) << again.error;
  const nlohmann::json case_file = read_json_file(again.evidence / "run/case.json");
  EXPECT_EQ(case_file["init_from"], checked.dir.string());
  EXPECT_EQ(case_file["init_from_sha256"], cases::checkpoint_digest(hf::read_checkpoint(e.out)));
  const nlohmann::json spec_file = read_json_file(again.evidence / "spec.resolved.json");
  EXPECT_EQ(spec_file["checkpoint"]["init_from"], checked.dir.string());
  EXPECT_EQ(spec_file["checkpoint"]["source"], checked.dir.string()) << "the checkpoint is the source checked";
}

TEST(HfExportTest, AnExportReplacesOnlyAnEarlierExportAndOnlyWhenComplete) {
  const spec::ModelSpec s = spec::SpecRegistry::instance().get("llama");
  cases::HfExportOptions o;
  o.out = testing::temp_dir("export_replace");
  o.max_shard_bytes = 64 * 1024;
  cases::export_hf(s, o);
  const std::string first_shard = "model-00001-of-00008.safetensors";
  ASSERT_TRUE(fs::exists(o.out / first_shard));
  // A failing export (an unsupported dtype) leaves the earlier one as it was.
  cases::HfExportOptions bad = o;
  bad.dtype = "float16";
  EXPECT_THAT([&] { cases::export_hf(s, bad); }, ::testing::ThrowsMessage<Error>(HasSubstr("--dtype float16")));
  EXPECT_TRUE(fs::exists(o.out / first_shard));
  // One file now: no shard of the earlier export survives.
  o.max_shard_bytes = hf::kDefaultMaxShardBytes;
  cases::export_hf(s, o);
  EXPECT_FALSE(fs::exists(o.out / first_shard));
  EXPECT_FALSE(fs::exists(o.out / "model.safetensors.index.json"));
  EXPECT_EQ(inspect(s, o.out, "replaced").differences, 0u);
  // A file put beside an export is never deleted, an edited one never overwritten.
  write_file_atomic(o.out / "tokenizer.json", "{}");
  EXPECT_THAT([&] { cases::export_hf(s, o); },
              ::testing::ThrowsMessage<Error>(HasSubstr("holds 'tokenizer.json', which mih_export.json does not list")));
  std::string tokenizer;
  EXPECT_TRUE(read_file(o.out / "tokenizer.json", &tokenizer) && tokenizer == "{}");
  fs::remove(o.out / "tokenizer.json");
  std::string config;
  ASSERT_TRUE(read_file(o.out / "config.json", &config));
  write_file_atomic(o.out / "config.json", config + " ");
  EXPECT_THAT([&] { cases::export_hf(s, o); },
              ::testing::ThrowsMessage<Error>(HasSubstr("'config.json' in " + fs::absolute(o.out).lexically_normal().string() +
                                                        " was edited since mih wrote it")));
  std::string kept_config;
  EXPECT_TRUE(read_file(o.out / "config.json", &kept_config) && kept_config == config + " ");
  write_file_atomic(o.out / "config.json", config);
  cases::export_hf(s, o);
  // A directory mih did not write is never overwritten.
  const fs::path theirs = testing::temp_dir("export_theirs");
  { std::ofstream(theirs / "config.json") << "{}"; }
  o.out = theirs;
  EXPECT_THAT([&] { cases::export_hf(s, o); },
              ::testing::ThrowsMessage<Error>(HasSubstr("holds files and no mih_export.json")));
  std::string kept;
  EXPECT_TRUE(read_file(theirs / "config.json", &kept) && kept == "{}");
}

TEST(HfExportTest, ConfigIntegersCompareExactlyAndEachInspectStandsAlone) {
  const spec::ModelSpec s = spec::SpecRegistry::instance().get("llama");
  cases::HfExportOptions o;
  o.out = testing::temp_dir("export_ints");
  cases::export_hf(s, o);
  cases::HfInspectOptions io;
  io.checkpoint = o.out;
  io.out = testing::temp_dir("inspect_ints");
  EXPECT_EQ(cases::inspect_hf(s, io).differences, 0u);
  EXPECT_TRUE(fs::exists(io.out / "integration_state.json"));
  nlohmann::json c = read_json_file(o.out / "config.json");
  c["num_hidden_layers"] = 2.0;  // the same integer written as a float
  { std::ofstream(o.out / "config.json") << c.dump(); }
  EXPECT_EQ(cases::inspect_hf(s, io).differences, 0u);
  c["num_hidden_layers"] = 2.0000001;
  { std::ofstream(o.out / "config.json") << c.dump(); }
  const cases::HfInspectResult r = cases::inspect_hf(s, io);
  ASSERT_EQ(r.differences, 1u);
  EXPECT_EQ(r.diff["config_differences"][0]["field"], "num_hidden_layers");
  EXPECT_FALSE(fs::exists(io.out / "integration_state.json")) << "the earlier inspect's DISCOVERED must not stand";
}

TEST(HfExportTest, ASpecWithoutAHuggingFaceConfigIsNotExported) {
  spec::ModelSpec s = spec::SpecRegistry::instance().get("llama");
  s.checkpoint.hf = {};
  cases::HfExportOptions o;
  o.out = testing::temp_dir("hf_export_undeclared");
  EXPECT_THAT([&] { cases::export_hf(s, o); },
              ::testing::ThrowsMessage<Error>(HasSubstr("spec 'llama' declares no Hugging Face config")));
}

// Issue 52: the export wrote one key for a tensor registered under two names, silently.
// llama_tied's model registers the embedding's weight again as lm_head.weight: declared, the
// export writes it once and records the alias; undeclared, it refuses, naming both names.
TEST(HfExportTest, ATensorUnderTwoNamesIsRefusedUnlessDeclaredTiedAndRecordedWhenItIs) {
  spec::ModelSpec s = spec::SpecRegistry::instance().get("llama_tied");
  cases::HfExportOptions o;
  o.out = testing::temp_dir("hf_export_tied");
  const cases::HfExportResult declared = cases::export_hf(s, o);
  EXPECT_EQ(declared.aliases, (std::vector<std::pair<std::string, std::string>>{{"embed_tokens.weight", "lm_head.weight"}}));
  const nlohmann::json aliases = read_json_file(o.out / "mih_export.json").value("aliases", nlohmann::json());
  ASSERT_EQ(aliases.size(), 1u) << aliases.dump();
  EXPECT_EQ(aliases[0]["fqn"], "lm_head.weight");
  EXPECT_EQ(aliases[0]["of"], "embed_tokens.weight");
  EXPECT_EQ(aliases[0]["keys"], nlohmann::json::array({"lm_head.weight"}));
  EXPECT_EQ(aliases[0]["written_as"], nlohmann::json::array({"model.embed_tokens.weight"}));

  s.checkpoint.tied.clear();
  cases::HfExportOptions u;
  u.out = testing::temp_dir("hf_export_undeclared_alias") / "out";
  EXPECT_THAT([&] { cases::export_hf(s, u); },
              ::testing::ThrowsMessage<Error>(::testing::AllOf(
                  HasSubstr("export: spec 'llama_tied': 'embed_tokens.weight' and 'lm_head.weight' name the same tensor"),
                  HasSubstr("no key for 'lm_head.weight'"), HasSubstr("declare {\"embed_tokens.weight\", \"lm_head.weight\"}"))));
  EXPECT_FALSE(fs::exists(u.out)) << "a refused export writes nothing";
}

}  // namespace
}  // namespace mih
