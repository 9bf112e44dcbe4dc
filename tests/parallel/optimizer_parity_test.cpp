// The Trainer's optimizers beyond AdamW (SGD with momentum, Adam) and its learning-rate
// schedule on thread ranks in float64: every parallel config against world size 1 (loss,
// gradients, parameters after each step, the optimizer's state, the per-step learning rate,
// to 1e-10), and why a non-scale-invariant step matters: a gradient-scale fault (F33: each
// pipeline micro-batch's loss divided by its own valid tokens, about micro_batches times the
// gradient) moves AdamW's parameters by nearly the right step (within 1%) and SGD's by 4 times it.
#include <cmath>

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "harness/base/error.h"
#include "harness/base/fault.h"
#include "tests/parallel/tiny_block.h"
#include "tests/support/parity.h"

namespace mih {
namespace {

using testing::MatchesReference;
using testing::TrainingRun;
using ::testing::HasSubstr;

constexpr int64_t kSteps = 3;

// Warmup over 1 step, then cosine decay over 2: all three steps at another rate.
TrainerOptions options(OptimizerKind kind) {
  return TrainerOptions().optimizer(kind).lr(1e-2).max_grad_norm(0.05).warmup_steps(1).decay_steps(2).min_lr(1e-3);
}

ParallelConfig config(int dp_replicate, int dp_shard, int tp, bool sp = false, int pp = 1, int micro_batches = 1) {
  ParallelConfig c;
  c.dp_replicate = dp_replicate;
  c.dp_shard = dp_shard;
  c.tp = tp;
  c.sequence_parallel = sp;
  c.pp = pp;
  c.micro_batches = micro_batches;
  c.dtype = DType::kFloat64;
  c.seed = 11;
  return c;
}

testing::TinyBlockOptions model() {
  testing::TinyBlockOptions m;
  m.layers = 2;
  return m;
}

TrainingRun train(const ParallelConfig& c, const TrainerOptions& o, int64_t steps = kSteps) {
  return testing::train_on_threads(c, testing::tiny_block_factory(model()), testing::tiny_batches(8, 8, 37), o, steps);
}

struct Case {
  const char* name;
  OptimizerKind kind;
  ParallelConfig config;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name << " (" << c.config.name() << ")"; }

class OptimizerParityTest : public ::testing::TestWithParam<Case> {};

TEST_P(OptimizerParityTest, MatchesOneRank) {
  const TrainerOptions o = options(GetParam().kind);
  const TrainingRun ref = train(config(1, 1, 1), o);
  ASSERT_EQ(ref.metrics.size(), static_cast<size_t>(kSteps));
  for (int64_t s = 0; s < kSteps; ++s) EXPECT_EQ(ref.metrics[s].lr, scheduled_lr(o, s));
  EXPECT_FALSE(ref.exp_avg.empty()) << "the optimizer's state is compared too";
  ::testing::AssertionResult result = MatchesReference(train(GetParam().config, o), ref);
  EXPECT_TRUE(result) << GetParam().name;
}

INSTANTIATE_TEST_SUITE_P(
    Configs, OptimizerParityTest,
    ::testing::Values(Case{"SgdDpShard2", OptimizerKind::kSgd, config(1, 2, 1)},
                      Case{"SgdDpReplicate2DpShard2", OptimizerKind::kSgd, config(2, 2, 1)},
                      Case{"SgdTp2Sp", OptimizerKind::kSgd, config(1, 1, 2, true)},
                      Case{"SgdPp2Mb2", OptimizerKind::kSgd, config(1, 1, 1, false, 2, 2)},
                      Case{"AdamDpShard2", OptimizerKind::kAdam, config(1, 2, 1)},
                      Case{"AdamTp2Sp", OptimizerKind::kAdam, config(1, 1, 2, true)}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

TEST(ScheduleTest, WarmsUpLinearlyThenDecaysAlongACosine) {
  const TrainerOptions o = TrainerOptions().lr(1.0).warmup_steps(2).decay_steps(4).min_lr(0.2);
  EXPECT_EQ(scheduled_lr(o, 0), 0.5);
  EXPECT_EQ(scheduled_lr(o, 1), 1.0);
  EXPECT_NEAR(scheduled_lr(o, 2), 0.2 + 0.4 * (1 + std::cos(M_PI / 4)), 1e-15);  // a quarter of the decay
  EXPECT_NEAR(scheduled_lr(o, 3), 0.6, 1e-15);  // half way: (1 + 0.2) / 2
  EXPECT_NEAR(scheduled_lr(o, 5), 0.2, 1e-15);
  EXPECT_NEAR(scheduled_lr(o, 60), 0.2, 1e-15);
  EXPECT_EQ(scheduled_lr(TrainerOptions().lr(0.3), 7), 0.3) << "no schedule: constant";
  EXPECT_THAT([&] { scheduled_lr(o, -1); }, ::testing::ThrowsMessage<Error>(HasSubstr("learning-rate schedule")));
  EXPECT_THAT([] { parse_optimizer_kind("lamb"); },
              ::testing::ThrowsMessage<Error>(HasSubstr("unknown optimizer 'lamb'; valid: [adamw, adam, sgd]")));
}

// The relative L2 error of the first update (after step 0 minus before) of `run` against
// `ref`, over every parameter together (an element whose gradient is near eps moves by a
// different share under AdamW: one element's error is not the step's).
double update_error(const TrainingRun& run, const TrainingRun& ref, const TrainingRun& before) {
  double diff = 0, norm = 0;
  for (const auto& [fqn, after] : ref.params[0]) {
    const at::Tensor want = after - before.params[0].at(fqn);
    const at::Tensor got = run.params[0].at(fqn) - before.params[0].at(fqn);
    diff += (got - want).pow(2).sum().item<double>();
    norm += want.pow(2).sum().item<double>();
  }
  return std::sqrt(diff / norm);
}

// F33 scales each micro-batch's gradient by about micro_batches (4). Clipping off, no weight
// decay, so the step is the optimizer's alone. AdamW's update divides by the gradient's
// magnitude: it moves the parameters by the fault-free step but for eps's share on the elements
// of a gradient near eps (measured: relative L2 error 0.008 of the update for a gradient 4 times
// too large); SGD's is linear in the gradient: the update 4 times too large (error 3).
TEST(GradientScaleTest, SgdShowsAScaleFaultInTheParametersWhereAdamwHidesIt) {
  const ParallelConfig c = config(1, 1, 1, false, 2, 4);
  for (OptimizerKind kind : {OptimizerKind::kAdamW, OptimizerKind::kSgd}) {
    const TrainerOptions o = TrainerOptions().optimizer(kind).lr(1e-2).max_grad_norm(0).weight_decay(0);
    // Step 0 of a zero learning rate: the initial parameters.
    const TrainingRun before = train(c, TrainerOptions(o).lr(0), 1);
    const TrainingRun good = train(c, o, 1);
    TrainingRun faulty;
    {
      const fault::ScopedFault scale(fault::Fault::kF33);
      faulty = train(c, o, 1);
    }
    const double grad_ratio = faulty.metrics[0].grad_norm_pre_clip / good.metrics[0].grad_norm_pre_clip;
    EXPECT_GT(grad_ratio, 2) << "the fault scales the gradient";
    const double e = update_error(faulty, good, before);
    std::printf("%s: gradient norm x%.3f, parameter update relative error %.3g\n", optimizer_kind_name(kind).c_str(),
                grad_ratio, e);
    if (kind == OptimizerKind::kSgd) {
      EXPECT_GT(e, 1.0) << "SGD's parameters diverge";
    } else {
      EXPECT_LT(e, 0.05) << "AdamW's parameters hardly move off the fault-free step";
    }
  }
}

}  // namespace
}  // namespace mih
