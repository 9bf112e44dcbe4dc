// The optimizer state of SGD (momentum_buffer) and Adam (exp_avg, exp_avg_sq, step) in a
// resharding checkpoint, and the learning-rate schedule across a resume, on thread ranks in
// float64: saved under dp_shard=2 after 2 steps, loaded under tp=2 and dp_shard=4 (uneven
// shards), every global state tensor equals the saved one bit for bit, the resumed run's
// parameters and per-step learning rate equal the uninterrupted run's. F41 (a checkpoint that
// keeps the Adam moments only) loses SGD's momentum; F40 (the schedule restarted at the load)
// warms up again; a checkpoint of another optimizer is refused by name.
#include <filesystem>
#include <map>
#include <mutex>

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "harness/base/error.h"
#include "harness/base/fault.h"
#include "harness/compat/optim.h"
#include "harness/training/trainer.h"
#include "tests/parallel/tiny_block.h"
#include "tests/support/temp_dir.h"
#include "tests/support/thread_ranks.h"

namespace mih {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;
using Tensors = std::map<std::string, at::Tensor>;

constexpr int64_t kSaveAt = 2;  // steps before the save
constexpr int64_t kAfter = 2;   // steps after the load

ParallelConfig config(int dp_shard, int tp) {
  ParallelConfig c;
  c.dp_shard = dp_shard;
  c.tp = tp;
  c.dtype = DType::kFloat64;
  c.seed = 5;
  return c;
}

// Clipping off, so SGD's step is linear in the gradient; warmup 2 then cosine over 2 steps,
// so the save falls at the end of the warmup and the resumed steps are in the decay.
TrainerOptions options(OptimizerKind kind) {
  return TrainerOptions().optimizer(kind).lr(1e-2).max_grad_norm(0).warmup_steps(2).decay_steps(2).min_lr(1e-3);
}

testing::TinyBlockOptions model() {
  testing::TinyBlockOptions m;
  m.kv_heads = 2;
  return m;
}

struct Trained {
  Tensors state;                // every parameter and optimizer state after the save or the load
  std::vector<Tensors> params;  // after each later step
  std::vector<double> lr;       // of each later step
};

// Trains under `c` with `o`: loads `load_from` when given, else trains kSaveAt steps and saves
// to `save_to` (when given); then kAfter more steps. What rank 0 saw.
Trained run(const ParallelConfig& c, const TrainerOptions& o, const std::filesystem::path& save_to,
            const std::filesystem::path& load_from) {
  Trained out;
  std::mutex mutex;
  auto errors = testing::run_mesh(c, [&](DeviceMesh& mesh) {
    Trainer t(mesh, c, testing::tiny_block_factory(model()), testing::tiny_batches(8, 8, 37), o);
    if (!load_from.empty()) {
      t.load(load_from);
    } else {
      t.run(kSaveAt);
      if (!save_to.empty()) t.save(save_to);
    }
    Trained mine;
    for (const auto& p : t.context().parameters()) {
      mine.state[p->fqn] = t.gather_full(*p);
      for (const std::string& s : compat::state_names(t.optimizer())) {
        const at::Tensor full = t.gather_full(*p, s);
        if (full.defined()) mine.state[p->fqn + "/" + s] = full;
      }
    }
    for (int64_t i = 0; i < kAfter; ++i) {
      mine.lr.push_back(t.step().lr);
      mine.params.emplace_back();
      for (const auto& p : t.context().parameters()) mine.params.back()[p->fqn] = t.gather_full(*p);
    }
    std::lock_guard<std::mutex> lock(mutex);
    if (mesh.rank() == 0) out = mine;
  });
  EXPECT_THAT(errors, IsEmpty()) << c.name();
  return out;
}

// The keys of `saved` whose tensor differs in `loaded` (absent or not bit-equal).
std::vector<std::string> differing(const Tensors& saved, const Tensors& loaded) {
  std::vector<std::string> out;
  for (const auto& [key, value] : saved) {
    const auto it = loaded.find(key);
    if (it == loaded.end() || !at::equal(it->second, value)) out.push_back(key);
  }
  return out;
}

class OptimizerCheckpointTest : public ::testing::TestWithParam<OptimizerKind> {};

TEST_P(OptimizerCheckpointTest, StateReshardsBitExactAndTheRunContinues) {
  const std::filesystem::path dir = testing::temp_dir("optim_ckpt") / "ckpt";
  const Trained saved = run(config(2, 1), options(GetParam()), dir, {});
  const std::string first_state = GetParam() == OptimizerKind::kSgd ? "/momentum_buffer" : "/exp_avg_sq";
  ASSERT_TRUE(saved.state.count("head.weight" + first_state)) << "the optimizer holds its state after 2 steps";
  for (const ParallelConfig& c : {config(1, 2), config(4, 1)}) {
    const Trained loaded = run(c, options(GetParam()), {}, dir);
    EXPECT_THAT(differing(saved.state, loaded.state), IsEmpty()) << c.name();
    ASSERT_EQ(loaded.params.size(), saved.params.size());
    for (size_t s = 0; s < saved.params.size(); ++s) {
      EXPECT_EQ(loaded.lr[s], saved.lr[s]) << c.name() << ": the learning rate of step " << kSaveAt + s;
      for (const auto& [fqn, value] : saved.params[s]) {
        const double e = (loaded.params[s].at(fqn) - value).abs().max().item<double>() / value.abs().max().item<double>();
        EXPECT_LE(e, 1e-10) << c.name() << " step " << kSaveAt + s << " " << fqn;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Kinds, OptimizerCheckpointTest, ::testing::Values(OptimizerKind::kSgd, OptimizerKind::kAdam),
                         [](const auto& info) { return optimizer_kind_name(info.param); });

// F41: the momentum buffers are missing after the load (so the next step starts SGD's
// momentum again), the round trip names them; AdamW's state is still complete under it.
TEST(OptimizerCheckpointFaultTest, F41LosesTheMomentumBufferOnly) {
  const std::filesystem::path dir = testing::temp_dir("optim_f41") / "ckpt";
  const fault::ScopedFault fault(fault::Fault::kF41);
  const Trained sgd = run(config(2, 1), options(OptimizerKind::kSgd), dir, {});
  const std::vector<std::string> lost = differing(sgd.state, run(config(1, 2), options(OptimizerKind::kSgd), {}, dir).state);
  EXPECT_THAT(lost, ::testing::Contains("head.weight/momentum_buffer"));
  EXPECT_THAT(lost, ::testing::Each(::testing::EndsWith("/momentum_buffer")));
  const Trained adamw = run(config(2, 1), options(OptimizerKind::kAdamW), dir, {});
  EXPECT_THAT(differing(adamw.state, run(config(1, 2), options(OptimizerKind::kAdamW), {}, dir).state), IsEmpty());
}

// F40: after the load the schedule counts from 0: step 2 runs at the first warmup step's
// rate (lr / 2), not at the decay's.
TEST(ScheduleResumeTest, F40RestartsTheWarmupAtTheLoad) {
  const std::filesystem::path dir = testing::temp_dir("optim_f40") / "ckpt";
  const TrainerOptions o = options(OptimizerKind::kAdamW);
  const Trained saved = run(config(2, 1), o, dir, {});
  EXPECT_EQ(saved.lr[0], scheduled_lr(o, kSaveAt));
  EXPECT_EQ(run(config(1, 2), o, {}, dir).lr, saved.lr) << "the fault-free resume keeps the schedule";
  const fault::ScopedFault fault(fault::Fault::kF40);
  const Trained restarted = run(config(1, 2), o, {}, dir);
  EXPECT_EQ(restarted.lr[0], o.lr() / 2) << "the warmup's first step";
  EXPECT_NE(restarted.lr, saved.lr);
}

TEST(OptimizerCheckpointRefusalTest, RefusesAnotherOptimizersState) {
  const std::filesystem::path dir = testing::temp_dir("optim_kind") / "ckpt";
  run(config(1, 1), options(OptimizerKind::kAdamW), dir, {});
  auto errors = testing::run_mesh(config(1, 1), [&](DeviceMesh& mesh) {
    Trainer t(mesh, config(1, 1), testing::tiny_block_factory(model()), testing::tiny_batches(8, 8, 37),
              options(OptimizerKind::kSgd));
    EXPECT_THAT([&] { t.load(dir); },
                ::testing::ThrowsMessage<Error>(HasSubstr("holds the state of optimizer 'adamw', this trainer's is 'sgd'")));
  });
  EXPECT_THAT(errors, IsEmpty());
}

}  // namespace
}  // namespace mih
