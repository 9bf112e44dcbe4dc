// Resharding checkpoints on thread ranks, in float64: save under dp_shard=2 after 2 steps,
// load under other configs (tp=2, cp=2, world size 1, uneven dp_shard=4, dp_shard=2 x tp=2):
// every global tensor (parameters and AdamW moments) equals the saved one bit for bit, and
// steps 3..5 equal the uninterrupted run. A corrupted or foreign file is an error that names
// it and loads nothing.
#include <map>
#include <mutex>

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "harness/base/error.h"
#include "harness/checkpoint/distributed_checkpoint.h"
#include "harness/checkpoint/safetensors.h"
#include "harness/compat/optim.h"
#include "tests/parallel/tiny_block.h"
#include "tests/support/temp_dir.h"
#include "tests/support/thread_ranks.h"

namespace mih {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

constexpr int64_t kSaveAt = 2;  // steps before the save
constexpr int64_t kAfter = 3;   // steps after the load
constexpr double kTolerance = 1e-10;

using Tensors = std::map<std::string, at::Tensor>;

testing::TinyBlockOptions model() {
  testing::TinyBlockOptions m;
  m.kv_heads = 2;  // GQA, and tp=2 divides it
  return m;
}

ParallelConfig config(int dp_shard, int cp, int tp) {
  ParallelConfig c;
  c.dp_shard = dp_shard;
  c.cp = cp;
  c.tp = tp;
  c.dtype = DType::kFloat64;
  c.seed = 5;
  return c;
}

TrainerOptions options() { return TrainerOptions().lr(1e-2).max_grad_norm(0.05); }

// Every parameter's full value and both AdamW moments, keyed "<fqn>" and "<fqn>/<moment>".
Tensors full_state(Trainer& t) {
  Tensors out;
  for (const auto& p : t.context().parameters()) {
    out[p->fqn] = t.gather_full(*p);
    for (const char* m : {"exp_avg", "exp_avg_sq"}) out[p->fqn + "/" + m] = t.gather_full(*p, m);
  }
  return out;
}

Tensors full_params(Trainer& t) {
  Tensors out;
  for (const auto& p : t.context().parameters()) out[p->fqn] = t.gather_full(*p);
  return out;
}

struct TrainedRun {
  std::vector<StepMetrics> metrics;
  Tensors state;                // after the save or the load
  std::vector<Tensors> params;  // after each later step
};

// Trains under `c`; with `load_from` loads that checkpoint first, else trains kSaveAt steps
// and, with `save_to`, saves. Then kAfter more steps. What rank 0 saw.
TrainedRun run(const ParallelConfig& c, const std::filesystem::path& save_to, const std::filesystem::path& load_from) {
  TrainedRun out;
  std::mutex mutex;
  auto errors = testing::run_mesh(c, [&](DeviceMesh& mesh) {
    Trainer t(mesh, c, testing::tiny_block_factory(model()), testing::tiny_batches(8, 8, 37), options());
    if (!load_from.empty()) {
      t.load(load_from);
    } else {
      t.run(kSaveAt);
      if (!save_to.empty()) t.save(save_to);
    }
    EXPECT_EQ(t.next_step(), kSaveAt);
    Tensors state = full_state(t);
    std::vector<StepMetrics> metrics;
    std::vector<Tensors> params;
    for (int64_t i = 0; i < kAfter; ++i) {
      metrics.push_back(t.step());
      params.push_back(full_params(t));
    }
    // Rank 0, and under pp the first rank of every other stage: their parameters merged.
    if (mesh.axis_rank(MeshAxis::kStage) != 0) return;
    std::lock_guard<std::mutex> lock(mutex);
    if (mesh.rank() == 0) out.metrics = metrics;
    out.state.insert(state.begin(), state.end());
    out.params.resize(params.size());
    for (size_t i = 0; i < params.size(); ++i) out.params[i].insert(params[i].begin(), params[i].end());
  });
  EXPECT_THAT(errors, IsEmpty()) << c.name();
  return out;
}

double relative_error(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>() / std::max(b.abs().max().item<double>(), 1e-30);
}

class ReshardTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::filesystem::path(testing::temp_dir("reshard") / "ckpt");
    saved_ = new TrainedRun(run(config(2, 1, 1), *dir_, {}));
  }
  static void TearDownTestSuite() {
    delete saved_;
    delete dir_;
  }
  static std::filesystem::path* dir_;
  static TrainedRun* saved_;  // the uninterrupted run: save after step 2, then 3 more steps
};
std::filesystem::path* ReshardTest::dir_ = nullptr;
TrainedRun* ReshardTest::saved_ = nullptr;

TEST_F(ReshardTest, LoadsUnderEveryConfigBitExactAndContinues) {
  for (const ParallelConfig& c : {config(2, 1, 1), config(1, 1, 2), config(1, 2, 1), config(1, 1, 1), config(4, 1, 1),
                                  config(2, 1, 2)}) {
    TrainedRun loaded = run(c, {}, *dir_);
    ASSERT_EQ(loaded.state.size(), saved_->state.size()) << c.name();
    for (const auto& [key, value] : saved_->state) {
      EXPECT_TRUE(at::equal(loaded.state.at(key), value)) << c.name() << ": " << key << " differs after the load";
    }
    ASSERT_EQ(loaded.metrics.size(), saved_->metrics.size());
    for (size_t s = 0; s < saved_->metrics.size(); ++s) {
      EXPECT_EQ(loaded.metrics[s].step, kSaveAt + static_cast<int64_t>(s));
      EXPECT_LE(std::abs(loaded.metrics[s].loss - saved_->metrics[s].loss), kTolerance * saved_->metrics[s].loss)
          << c.name() << " step " << loaded.metrics[s].step;
      for (const auto& [fqn, value] : saved_->params[s]) {
        EXPECT_LE(relative_error(loaded.params[s].at(fqn), value), kTolerance) << c.name() << " step " << s << " " << fqn;
      }
    }
  }
}

ParallelConfig pipelined(ParallelConfig c, int pp) {
  c.pp = pp;
  c.micro_batches = 2;
  return c;
}

// Each pipeline stage saves its own parameters under their global FQNs (a stage's layers keep
// their global index) and a load reshards them: pp=1 -> pp=2, pp=2 -> pp=1 and pp=2 with
// dp_shard, bit-exact, AdamW moments included, and training continues as the saved run did.
TEST_F(ReshardTest, PipelineStagesSaveAndLoadUnderEveryConfig) {
  for (const ParallelConfig& c : {pipelined(config(1, 1, 1), 2), pipelined(config(2, 1, 1), 2)}) {
    TrainedRun loaded = run(c, {}, *dir_);
    ASSERT_EQ(loaded.state.size(), saved_->state.size()) << c.name();
    for (const auto& [key, value] : saved_->state) {
      EXPECT_TRUE(at::equal(loaded.state.at(key), value)) << c.name() << ": " << key << " differs after the load";
    }
  }
  const std::filesystem::path pp_dir = testing::temp_dir("reshard_pp") / "ckpt";
  const TrainedRun pp_saved = run(pipelined(config(1, 1, 1), 2), pp_dir, {});
  ASSERT_EQ(pp_saved.state.size(), saved_->state.size()) << "every stage's parameters";
  for (const ParallelConfig& c : {config(1, 1, 1), config(2, 1, 1), pipelined(config(2, 1, 1), 2)}) {
    TrainedRun loaded = run(c, {}, pp_dir);
    ASSERT_EQ(loaded.state.size(), pp_saved.state.size()) << c.name();
    for (const auto& [key, value] : pp_saved.state) {
      EXPECT_TRUE(at::equal(loaded.state.at(key), value)) << c.name() << ": " << key << " differs after the load";
    }
    ASSERT_EQ(loaded.metrics.size(), pp_saved.metrics.size());
    for (size_t s = 0; s < pp_saved.metrics.size(); ++s) {
      EXPECT_LE(std::abs(loaded.metrics[s].loss - pp_saved.metrics[s].loss), kTolerance * pp_saved.metrics[s].loss)
          << c.name() << " step " << loaded.metrics[s].step;
      for (const auto& [fqn, value] : pp_saved.params[s]) {
        EXPECT_LE(relative_error(loaded.params[s].at(fqn), value), kTolerance) << c.name() << " step " << s << " " << fqn;
      }
    }
  }
}

TEST_F(ReshardTest, IndexListsEveryTensorOnceAndNoNonPersistentBuffer) {
  nlohmann::json index = read_checkpoint_index(*dir_);
  EXPECT_EQ(index["trainer_state"]["next_step"], kSaveAt);
  EXPECT_EQ(index["trainer_state"]["parallel_config"]["dp_shard"], 2);
  const auto& tensors = index["tensors"];
  EXPECT_FALSE(tensors.contains("buffer/rotary.inv_freq")) << "non-persistent: rebuilt, not saved";
  ASSERT_TRUE(tensors.contains("model/embed.weight"));
  ASSERT_TRUE(tensors.contains("optim/embed.weight/exp_avg_sq"));
  // 37 rows over dp_shard=2: chunks of 19 and 18 rows, in two files.
  const auto& chunks = tensors["model/embed.weight"]["chunks"];
  ASSERT_EQ(chunks.size(), 2u);
  EXPECT_EQ(chunks[0]["lengths"], nlohmann::json({19, 16}));
  EXPECT_EQ(chunks[1]["offsets"], nlohmann::json({19, 0}));
  // Each chunk is a plain safetensors tensor of its lengths.
  safetensors::Reader reader(*dir_ / chunks[1]["file"].get<std::string>());
  EXPECT_EQ(reader.info(chunks[1]["name"].get<std::string>()).shape, (std::vector<int64_t>{18, 16}));
  EXPECT_EQ(reader.info(chunks[1]["name"].get<std::string>()).dtype, "F64");
}

// Loads `dir` into fresh dp_shard=2 trainers and expects every rank to throw matching
// `message`, with the parameters unchanged.
void ExpectLoadFails(const std::filesystem::path& dir, const ::testing::Matcher<std::string>& message) {
  auto errors = testing::run_mesh(config(2, 1, 1), [&](DeviceMesh& mesh) {
    Trainer t(mesh, config(2, 1, 1), testing::tiny_block_factory(model()), testing::tiny_batches(8, 8, 37), options());
    Tensors before = full_params(t);
    try {
      t.load(dir);
      ADD_FAILURE() << "the load succeeded";
    } catch (const Error& e) {
      if (mesh.rank() == 1) {
        EXPECT_THAT(std::string(e.what()), message);
      }
    }
    for (const auto& [fqn, value] : full_params(t)) EXPECT_TRUE(at::equal(value, before.at(fqn))) << fqn << " changed";
    EXPECT_EQ(t.next_step(), 0);
  });
  EXPECT_THAT(errors, IsEmpty());
}

TEST_F(ReshardTest, TruncatedFileIsNamedAndNothingLoads) {
  auto copy = testing::temp_dir("truncated") / "ckpt";
  std::filesystem::copy(*dir_, copy);
  const auto file = copy / "rank00001.safetensors";
  std::filesystem::resize_file(file, std::filesystem::file_size(file) - 100);
  ExpectLoadFails(copy, AllOf(HasSubstr("rank00001.safetensors"), HasSubstr("truncated")));
}

TEST_F(ReshardTest, FileOfAnotherSaveIsNamed) {
  auto other = testing::temp_dir("other") / "ckpt";
  run(config(2, 1, 1), other, {});
  auto mixed = testing::temp_dir("mixed") / "ckpt";
  std::filesystem::copy(*dir_, mixed);
  std::filesystem::copy_file(other / "rank00001.safetensors", mixed / "rank00001.safetensors",
                             std::filesystem::copy_options::overwrite_existing);
  ExpectLoadFails(mixed, AllOf(HasSubstr("file rank00001.safetensors belongs to another checkpoint")));
}

TEST_F(ReshardTest, MissingIndexAndOtherModelAreNamed) {
  ExpectLoadFails(testing::temp_dir("empty"), HasSubstr("no index.json (not a checkpoint directory"));
  // A model with another hidden size: the shapes disagree.
  auto errors = testing::run_mesh(config(1, 1, 1), [&](DeviceMesh& mesh) {
    testing::TinyBlockOptions wide = model();
    wide.hidden = 24;
    wide.heads = 4;
    Trainer t(mesh, config(1, 1, 1), testing::tiny_block_factory(wide), testing::tiny_batches(8, 8, 37), options());
    EXPECT_THAT([&] { t.load(*dir_); },
                ::testing::ThrowsMessage<Error>(HasSubstr("'model/embed.weight' has shape [37, 16], the model's is [37, 24]")));
  });
  EXPECT_THAT(errors, IsEmpty());
}

TEST(CheckpointSaveTest, UnwritableDirectoryFailsOnEveryRank) {
  auto blocker = testing::temp_dir("blocked") / "file";
  { std::FILE* f = std::fopen(blocker.c_str(), "w"); std::fclose(f); }
  auto errors = testing::run_mesh(config(2, 1, 1), [&](DeviceMesh& mesh) {
    Trainer t(mesh, config(2, 1, 1), testing::tiny_block_factory(model()), testing::tiny_batches(8, 8, 37), options());
    EXPECT_THAT([&] { t.save(blocker / "ckpt"); }, ::testing::ThrowsMessage<Error>(HasSubstr("cannot create directory")));
  });
  EXPECT_THAT(errors, IsEmpty());
}

}  // namespace
}  // namespace mih
