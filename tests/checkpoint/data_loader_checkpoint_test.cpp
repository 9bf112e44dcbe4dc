// The data loader's state in a resharding checkpoint, on thread ranks in float64: a loader of
// epochs (12 samples an epoch, 8 a step, so steps straddle the epoch boundaries) saved mid-epoch,
// loaded, saved again at an epoch boundary and loaded again (twice in a row) serves the
// uninterrupted run's samples at every step and the run's parameters equal it bit for bit; the
// same checkpoint loaded under another dp degree (dp 1, dp_replicate 2) serves the same samples.
// A loader refuses another seed's, another dataset's or another loader's state and is unchanged
// after a refusal; F43 (the epoch not restored) and F44 (the loader left out of the load) serve
// samples twice.
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <ostream>
#include <set>

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "harness/base/error.h"
#include "harness/base/fault.h"
#include "harness/data/data_loader.h"
#include "harness/training/trainer.h"
#include "tests/parallel/tiny_block.h"
#include "tests/support/temp_dir.h"
#include "tests/support/thread_ranks.h"

namespace mih {

// gtest prints a ledger as [epoch, index] pairs.
void PrintTo(const SampleId& id, std::ostream* os) { *os << "[" << id.epoch << ", " << id.index << "]"; }

namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;
using Tensors = std::map<std::string, at::Tensor>;

constexpr int64_t kEpochSamples = 12;
constexpr int64_t kSteps = 6;  // 48 samples: four epochs

data::TextPipelineOptions pipeline_options(uint64_t seed = 3) {
  return data::TextPipelineOptions().seq_len(8).global_batch(8).epoch_samples(kEpochSamples).seed(seed);
}

data::TextPipeline pipeline(uint64_t seed = 3) { return data::TextPipeline(pipeline_options(seed)); }

ParallelConfig config(int dp_replicate, int dp_shard) {
  ParallelConfig c;
  c.dp_replicate = dp_replicate;
  c.dp_shard = dp_shard;
  c.dtype = DType::kFloat64;
  c.seed = 7;
  return c;
}

testing::TinyBlockOptions model() {
  testing::TinyBlockOptions m;
  m.vocab = data::ByteTokenizer::kVocab;
  return m;
}

// Warmup then cosine across the whole run, SGD with momentum and no clipping: the step and the
// momentum depend on every sample served.
TrainerOptions options() {
  return TrainerOptions().optimizer(OptimizerKind::kSgd).lr(1e-2).max_grad_norm(0).warmup_steps(2).decay_steps(4);
}

struct Segment {
  std::vector<std::vector<SampleId>> samples;  // per step
  std::vector<Tensors> params;                 // after each step
  nlohmann::json state_after;                  // the loader's, after the last step
};

// Under `c`: loads `load_from` when given, runs `steps` steps, saves to `save_to` when given.
// What rank 0 saw.
Segment train(const ParallelConfig& c, int64_t steps, const std::filesystem::path& load_from,
              const std::filesystem::path& save_to) {
  Segment out;
  std::mutex mutex;
  auto errors = testing::run_mesh(c, [&](DeviceMesh& mesh) {
    const data::TextPipeline p = pipeline();
    Trainer t(mesh, c, testing::tiny_block_factory(model()), p.source(), options(), nullptr,
              std::make_unique<data::EpochLoader>(p));
    if (!load_from.empty()) t.load(load_from);
    Segment mine;
    for (int64_t i = 0; i < steps; ++i) {
      const StepMetrics m = t.step();
      mine.samples.push_back(m.samples);
      mine.state_after = m.data_state;
      mine.params.emplace_back();
      for (const auto& param : t.context().parameters()) mine.params.back()[param->fqn] = t.gather_full(*param);
    }
    if (!save_to.empty()) t.save(save_to);
    std::lock_guard<std::mutex> lock(mutex);
    if (mesh.rank() == 0) out = std::move(mine);
  });
  EXPECT_THAT(errors, IsEmpty()) << c.name();
  return out;
}

Segment join(const std::vector<Segment>& parts) {
  Segment all;
  for (const Segment& s : parts) {
    all.samples.insert(all.samples.end(), s.samples.begin(), s.samples.end());
    all.params.insert(all.params.end(), s.params.begin(), s.params.end());
    all.state_after = s.state_after;
  }
  return all;
}

// The largest relative difference of any parameter after any step (0: bit-equal everywhere).
double worst_difference(const Segment& a, const Segment& b) {
  EXPECT_EQ(a.params.size(), b.params.size());
  double worst = 0;
  for (size_t s = 0; s < std::min(a.params.size(), b.params.size()); ++s) {
    for (const auto& [fqn, value] : b.params[s]) {
      const at::Tensor other = a.params[s].at(fqn);
      if (at::equal(other, value)) continue;
      worst = std::max(worst, (other - value).abs().max().item<double>() / value.abs().max().item<double>());
    }
  }
  return worst;
}

// Every (epoch, index) at most once, and every epoch before the last one whole.
bool once_per_epoch(const std::vector<std::vector<SampleId>>& steps) {
  std::map<int64_t, std::set<int64_t>> seen;
  for (const auto& step : steps) {
    for (const SampleId& s : step) {
      if (!seen[s.epoch].insert(s.index).second) return false;
    }
  }
  for (const auto& [epoch, indices] : seen) {
    if (epoch != seen.rbegin()->first && static_cast<int64_t>(indices.size()) != kEpochSamples) return false;
  }
  return true;
}

TEST(EpochLoaderTest, ServesEveryEpochWholeInItsOwnShuffledOrder) {
  data::EpochLoader loader(pipeline());
  std::vector<std::vector<SampleId>> steps;
  for (int64_t k = 0; k < kSteps; ++k) {
    const Batch b = loader.next();
    ASSERT_EQ(b.samples.size(), 8u);
    EXPECT_TRUE(at::equal(b.input_ids, pipeline().batch(k).input_ids)) << "the loader serves batch(" << k << ")";
    steps.push_back(b.samples);
  }
  EXPECT_TRUE(once_per_epoch(steps));
  EXPECT_EQ(steps[1][3].epoch, 0);  // step 1 ends epoch 0 (positions 8..11) and starts epoch 1
  EXPECT_EQ(steps[1][4].epoch, 1);
  std::vector<int64_t> first, second;
  for (int64_t i = 0; i < kEpochSamples; ++i) {
    first.push_back(pipeline().sample_at(i).index);
    second.push_back(pipeline().sample_at(kEpochSamples + i).index);
  }
  EXPECT_NE(first, second) << "each epoch has its own order";
  EXPECT_EQ(loader.state_dict().at("epoch"), 4);
  EXPECT_EQ(loader.state_dict().at("position"), 0);
  EXPECT_EQ(loader.state_dict().at("samples_served"), kSteps * 8);
}

TEST(EpochLoaderTest, EpochsNeedPackedWindowsThatFitOnePass) {
  const data::TextPipeline p = pipeline();
  EXPECT_GT(p.num_windows(), kEpochSamples);
  EXPECT_THAT([&] { data::TextPipeline(pipeline_options().epoch_samples(p.num_windows() + 1)); },
              ::testing::ThrowsMessage<Error>(HasSubstr("ask for at most " + std::to_string(p.num_windows()))));
  EXPECT_THAT([&] { data::TextPipeline(pipeline_options().packing(false)); },
              ::testing::ThrowsMessage<Error>(HasSubstr("set packing or drop epoch_samples")));
  EXPECT_THAT([&] { data::EpochLoader(data::TextPipeline(pipeline_options().epoch_samples(0))); },
              ::testing::ThrowsMessage<Error>(HasSubstr("has no epochs")));
  EXPECT_THAT([&] { p.sample_at(-1); }, ::testing::ThrowsMessage<Error>(HasSubstr("must be >= 0")));
}

TEST(EpochLoaderTest, ContinuesFromItsStateAndRefusesAnotherDatasetsUnchanged) {
  data::EpochLoader saved(pipeline());
  saved.next();
  const nlohmann::json state = saved.state_dict();  // epoch 0, position 8
  data::EpochLoader resumed(pipeline());
  resumed.load_state_dict(state);
  EXPECT_EQ(resumed.next().samples, saved.next().samples);

  data::EpochLoader other_seed(pipeline(4));
  const nlohmann::json before = other_seed.state_dict();
  EXPECT_THAT([&] { other_seed.load_state_dict(state); },
              ::testing::ThrowsMessage<Error>(HasSubstr("shuffled with seed 3, this run's with 4")));
  EXPECT_EQ(other_seed.state_dict(), before) << "a refused state changes nothing";
  nlohmann::json bad = state;
  bad["epoch_samples"] = 13;
  EXPECT_THAT([&] { resumed.load_state_dict(bad); }, ::testing::ThrowsMessage<Error>(HasSubstr("epochs have 13 samples")));
  bad = state;
  bad["seed"] = -1;
  EXPECT_THAT([&] { resumed.load_state_dict(bad); },
              ::testing::ThrowsMessage<Error>(HasSubstr("'seed' must be an integer >= 0, got -1")));
  bad = state;
  bad["shuffle"] = false;
  EXPECT_THAT([&] { resumed.load_state_dict(bad); },
              ::testing::ThrowsMessage<Error>(
                  HasSubstr("epochs were not shuffled and this run's are shuffled; resume with shuffle false")));
  bad = state;
  bad["samples_served"] = 3;
  EXPECT_THAT([&] { resumed.load_state_dict(bad); }, ::testing::ThrowsMessage<Error>(HasSubstr("edited or corrupted")));
  bad = state;
  bad["position"] = kEpochSamples;
  EXPECT_THAT([&] { resumed.load_state_dict(bad); }, ::testing::ThrowsMessage<Error>(HasSubstr("'position'")));
  EXPECT_THAT([&] { resumed.load_state_dict({{"kind", "steps"}, {"next_step", 1}}); },
              ::testing::ThrowsMessage<Error>(HasSubstr("of kind 'steps'")));
  EXPECT_THAT([&] { data::StepLoader(pipeline().source()).load_state_dict(state); },
              ::testing::ThrowsMessage<Error>(HasSubstr("of kind 'epochs'")));
}

TEST(EpochLoaderTest, F43TheEpochNotRestoredServesEpochZerosOrderAgain) {
  data::EpochLoader saved(pipeline());
  std::vector<std::vector<SampleId>> run;
  for (int i = 0; i < 2; ++i) run.push_back(saved.next().samples);  // epoch 1, position 4
  data::EpochLoader resumed(pipeline());
  {
    const fault::ScopedFault f(fault::Fault::kF43);
    resumed.load_state_dict(saved.state_dict());
  }
  run.push_back(resumed.next().samples);
  EXPECT_FALSE(once_per_epoch(run)) << "epoch 0's positions 4..11 served again";
  EXPECT_EQ(run.back().front().epoch, 0);
}

// Saved mid-epoch (after step 0: epoch 0, position 8), loaded and saved again at an epoch
// boundary (after step 2: epoch 2, position 0), loaded again: every step serves the
// uninterrupted run's samples and its parameters are bit-equal to it.
TEST(DataLoaderResumeTest, TwiceInARowAcrossAnEpochBoundaryIsBitExact) {
  const std::filesystem::path dir = testing::temp_dir("loader_ckpt");
  const ParallelConfig dp2 = config(1, 2);
  const Segment whole = train(dp2, kSteps, {}, {});
  ASSERT_EQ(whole.samples.size(), static_cast<size_t>(kSteps));
  EXPECT_TRUE(once_per_epoch(whole.samples));
  const Segment a = train(dp2, 1, {}, dir / "a");
  const Segment b = train(dp2, 2, dir / "a", dir / "b");
  const Segment c = train(dp2, kSteps - 3, dir / "b", {});
  const Segment resumed = join({a, b, c});
  EXPECT_EQ(resumed.samples, whole.samples);
  EXPECT_EQ(resumed.state_after, whole.state_after);
  EXPECT_EQ(b.state_after.at("epoch"), 2);
  EXPECT_EQ(b.state_after.at("position"), 0);
  EXPECT_EQ(worst_difference(resumed, whole), 0.0) << "float64, the same config: bit for bit";

  // The same checkpoint under another dp degree: the same samples, the numbers to 1e-10.
  for (const ParallelConfig& other : {config(1, 1), config(2, 1)}) {
    const Segment moved = join({a, b, train(other, kSteps - 3, dir / "b", {})});
    EXPECT_EQ(moved.samples, whole.samples) << other.name();
    EXPECT_LE(worst_difference(moved, whole), 1e-10) << other.name();
  }
}

TEST(DataLoaderResumeTest, F44TheLoaderLeftOutOfTheLoadServesTheFirstBatchAgain) {
  const std::filesystem::path dir = testing::temp_dir("loader_ckpt_f44");
  const Segment a = train(config(1, 2), 2, {}, dir / "a");
  Segment b;
  {
    const fault::ScopedFault f(fault::Fault::kF44);
    b = train(config(1, 2), 1, dir / "a", {});
  }
  EXPECT_EQ(b.samples.front(), a.samples.front()) << "step 2 serves step 0's samples";
  EXPECT_FALSE(once_per_epoch(join({a, b}).samples));
}

TEST(DataLoaderResumeTest, AStepLoaderRefusesALoaderOfEpochsStateAndLoadsNothing) {
  const std::filesystem::path dir = testing::temp_dir("loader_ckpt_kind");
  train(config(1, 1), 1, {}, dir / "a");
  auto errors = testing::run_mesh(config(1, 1), [&](DeviceMesh& mesh) {
    Trainer t(mesh, config(1, 1), testing::tiny_block_factory(model()), pipeline().source(), options());
    EXPECT_THAT([&] { t.load(dir / "a"); }, ::testing::ThrowsMessage<Error>(HasSubstr("of kind 'epochs'")));
    EXPECT_EQ(t.next_step(), 0);
  });
  EXPECT_THAT(errors, IsEmpty());
}

// A checkpoint of a harness before loaders kept state (no "data_loader"; batches by step): a
// loader of epochs cannot continue it and says so; a step loader continues at its next_step.
TEST(DataLoaderResumeTest, ACheckpointWithoutLoaderStateContinuesByStepOrIsRefusedByName) {
  const std::filesystem::path dir = testing::temp_dir("loader_ckpt_old");
  train(config(1, 1), 1, {}, dir / "a");
  const std::filesystem::path index = dir / "a" / "index.json";
  nlohmann::json j = nlohmann::json::parse(std::ifstream(index));
  ASSERT_TRUE(j.at("trainer_state").contains("data_loader"));
  j["trainer_state"].erase("data_loader");
  std::ofstream(index) << j.dump();
  auto errors = testing::run_mesh(config(1, 1), [&](DeviceMesh& mesh) {
    const data::TextPipeline p = pipeline();
    Trainer epochs(mesh, config(1, 1), testing::tiny_block_factory(model()), p.source(), options(), nullptr,
                   std::make_unique<data::EpochLoader>(p));
    EXPECT_THAT([&] { epochs.load(dir / "a"); },
                ::testing::ThrowsMessage<Error>(HasSubstr("holds no data loader state")));
    EXPECT_EQ(epochs.next_step(), 0);
    Trainer steps(mesh, config(1, 1), testing::tiny_block_factory(model()), p.source(), options());
    steps.load(dir / "a");
    EXPECT_EQ(steps.next_step(), 1);
    EXPECT_EQ(steps.step().data_state.at("next_step"), 2);
  });
  EXPECT_THAT(errors, IsEmpty());
}

}  // namespace
}  // namespace mih
