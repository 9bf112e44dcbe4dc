// The pipeline executor (harness/parallel/pipeline.h) against the unsplit objective: a
// 4-layer tanh MLP with a head and a token-level cross entropy, split into stages over 2 real
// Gloo ranks (threads) and run under GPipe, 1F1B and interleaved 1F1B, must give the loss and
// every parameter gradient of one full-batch pass computed without the executor: the sum of
// the valid tokens' losses over the step's valid-token count, on labels whose mask is uneven
// and where one micro-batch has no valid label. The planted bugs of the public record
// (the loss backpropagated un-normalized, pytorch/torchtitan#2972; normalized by one
// micro-batch's count) fail that comparison; an order that would deadlock is refused before
// anything is sent. A tied embedding and head across the first and last stage: the copies'
// gradients summed over pp and the global grad norm counting it once.
#include "harness/parallel/pipeline.h"

#include <cmath>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "harness/base/error.h"
#include "harness/base/pipeline_schedule.h"
#include "tests/support/thread_ranks.h"

namespace mih::pp {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kLayers = 4, kHidden = 6, kVocab = 5, kTokens = 3, kMicroBatches = 4;

struct Params {
  std::vector<at::Tensor> weight, bias;  // per layer: [hidden, hidden], [hidden]
  at::Tensor head;                       // [vocab, hidden]
};

// The step's data: x [micro_batches * tokens, hidden], labels, and a mask with 6 valid
// labels: 3 in micro-batch 0, 1 in 1, none in 2, 2 in 3.
struct Data {
  at::Tensor x, labels, mask;
};

Data data() {
  at::manual_seed(11);
  Data d;
  d.x = at::randn({kMicroBatches * kTokens, kHidden}, at::kDouble);
  d.labels = at::randint(0, kVocab, {kMicroBatches * kTokens}, at::kLong);
  d.mask = at::tensor(std::vector<double>{1, 1, 1, 0, 1, 0, 0, 0, 0, 1, 0, 1}, at::kDouble);
  return d;
}

Params initial() {
  at::manual_seed(7);
  Params p;
  for (int64_t l = 0; l < kLayers; ++l) {
    p.weight.push_back(at::randn({kHidden, kHidden}, at::kDouble) * 0.5);
    p.bias.push_back(at::randn({kHidden}, at::kDouble) * 0.1);
  }
  p.head = at::randn({kVocab, kHidden}, at::kDouble) * 0.5;
  return p;
}

Params trainable(const Params& p) {
  Params out;
  for (const auto& w : p.weight) out.weight.push_back(w.clone().requires_grad_(true));
  for (const auto& b : p.bias) out.bias.push_back(b.clone().requires_grad_(true));
  out.head = p.head.clone().requires_grad_(true);
  return out;
}

at::Tensor layer(const Params& p, int64_t l, const at::Tensor& h) { return at::tanh(at::linear(h, p.weight[l], p.bias[l])); }

// Cross entropy of every token, unreduced: [tokens].
at::Tensor cross_entropy(const at::Tensor& logits, const at::Tensor& labels) {
  return -at::log_softmax(logits, 1).gather(1, labels.unsqueeze(1)).squeeze(1);
}

at::Tensor token_losses(const Params& p, const at::Tensor& h, const at::Tensor& labels) {
  return cross_entropy(at::linear(h, p.head), labels);
}

// The unsplit objective, without the executor: one pass over the whole batch.
struct Reference {
  double loss = 0;
  Params grads;
};

Reference reference(const Data& d) {
  Params p = trainable(initial());
  at::Tensor h = d.x;
  for (int64_t l = 0; l < kLayers; ++l) h = layer(p, l, h);
  const at::Tensor loss = (token_losses(p, h, d.labels) * d.mask).sum() / d.mask.sum();
  loss.backward();
  Reference r;
  r.loss = loss.item<double>();
  for (int64_t l = 0; l < kLayers; ++l) {
    r.grads.weight.push_back(p.weight[l].grad());
    r.grads.bias.push_back(p.bias[l].grad());
  }
  r.grads.head = p.head.grad();
  return r;
}

// "" when `got` equals `want` to float64 rounding, else the first difference.
std::string mismatch(const std::string& what, const at::Tensor& got, const at::Tensor& want) {
  if (!got.defined()) return what + ": no gradient";
  const double err = (got - want).abs().max().item<double>();
  const double scale = want.abs().max().item<double>();
  if (err <= 1e-12 * (1 + scale)) return "";
  return what + ": max abs error " + std::to_string(err) + " (reference max " + std::to_string(scale) + ")";
}

struct StepRun {
  std::vector<std::vector<Action>> executed;  // per rank
  std::vector<std::string> mismatches;        // per rank: "" or the first difference
  std::vector<double> losses;                 // per rank: the batch loss (summed over pp)
  std::vector<int64_t> bytes;
  std::vector<std::string> errors;            // ranks that threw
};

// Runs one step over 2 thread ranks with `orders` (default: the schedule's), normalized by
// `valid_tokens` (default: the step's count), and compares with the reference.
StepRun run(ScheduleKind kind, PipelineShape shape, std::vector<std::vector<Action>> orders = {},
        int64_t valid_tokens = 6) {
  // Drawn here, once: the global generator is not for concurrent use by the rank threads.
  const Data d = data();
  const Reference ref = reference(d);
  const Params start = initial();
  if (orders.empty()) orders = schedule(kind, shape);
  StepRun out;
  out.executed.resize(2);
  out.mismatches.resize(2);
  out.losses.resize(2);
  out.bytes.resize(2);
  ParallelConfig dims;
  dims.dp_shard = 2;  // the 2-rank group the pipeline runs over
  out.errors = testing::run_mesh(dims, [&](DeviceMesh& mesh) {
    Communicator& comm = mesh.comm(MeshAxis::kDpShard);
    const int me = comm.rank();
    const Params mine = trainable(start);
    const auto layers = stage_layers(kLayers, shape);
    const int last = shape.stages() - 1;
    StageModel model;
    model.forward = [&](int stage, int mb, const at::Tensor& input) {
      at::Tensor h = stage == 0 ? d.x.slice(0, mb * kTokens, (mb + 1) * kTokens) : input;
      for (int64_t l = layers[stage].first; l < layers[stage].second; ++l) h = layer(mine, l, h);
      return stage == last ? token_losses(mine, h, d.labels.slice(0, mb * kTokens, (mb + 1) * kTokens)) : h;
    };
    model.loss_mask = [&](int mb) { return d.mask.slice(0, mb * kTokens, (mb + 1) * kTokens); };
    model.empty_activation = [](int, int) { return at::empty({kTokens, kHidden}, at::kDouble); };
    const PipelineStep step = run_pipeline_step(comm, kind, shape, orders, model, valid_tokens);
    out.executed[me] = step.executed;
    out.bytes[me] = step.bytes_sent;
    at::Tensor loss = at::tensor(std::vector<double>{step.loss}, at::kDouble);
    const_cast<Communicator&>(comm).all_reduce(loss);
    out.losses[me] = loss.item<double>();
    std::string& first = out.mismatches[me];
    for (const int stage : shape.stages_of(me)) {
      for (int64_t l = layers[stage].first; l < layers[stage].second && first.empty(); ++l) {
        first = mismatch("layers." + std::to_string(l) + ".weight", mine.weight[l].grad(), ref.grads.weight[l]);
        if (first.empty()) first = mismatch("layers." + std::to_string(l) + ".bias", mine.bias[l].grad(), ref.grads.bias[l]);
      }
      if (stage == last && first.empty()) first = mismatch("head.weight", mine.head.grad(), ref.grads.head);
    }
    if (first.empty() && std::abs(out.losses[me] - ref.loss) > 1e-12) {
      first = "loss " + std::to_string(out.losses[me]) + ", reference " + std::to_string(ref.loss);
    }
  });
  return out;
}

class PipelineScheduleRunTest : public ::testing::TestWithParam<std::pair<ScheduleKind, PipelineShape>> {};

TEST_P(PipelineScheduleRunTest, GivesTheUnsplitObjectivesLossAndGradients) {
  const auto [kind, shape] = GetParam();
  const StepRun r = run(kind, shape);
  ASSERT_TRUE(r.errors.empty()) << r.errors.front();
  EXPECT_EQ(r.mismatches[0], "");
  EXPECT_EQ(r.mismatches[1], "");
  EXPECT_EQ(r.losses[0], r.losses[1]);
  // The order the ranks ran is the schedule's, and a valid one judged from the order alone.
  EXPECT_EQ(r.executed, schedule(kind, shape));
  std::string problems;
  for (const auto& p : order_problems(kind, shape, r.executed)) problems += p + "\n";
  EXPECT_EQ(problems, "");
  // Bytes over the pp group: 2 directions x (stages - 1) boundaries x micro-batches x one
  // activation (tokens x hidden float64).
  EXPECT_EQ(r.bytes[0] + r.bytes[1], p2p_bytes_per_step(shape, kTokens * kHidden * 8));
}

INSTANTIATE_TEST_SUITE_P(Schedules, PipelineScheduleRunTest,
                         ::testing::Values(std::pair{ScheduleKind::kGPipe, PipelineShape{2, 1, kMicroBatches}},
                                           std::pair{ScheduleKind::k1F1B, PipelineShape{2, 1, kMicroBatches}},
                                           std::pair{ScheduleKind::kInterleaved1F1B, PipelineShape{2, 2, kMicroBatches}}),
                         [](const auto& info) { return schedule_name(info.param.first); });

// The bugs of the public record, planted: each fails the comparison with the unsplit objective.
TEST(PipelineBugTest, AnUnnormalizedOrMisnormalizedLossFailsTheComparison) {
  // Backpropagated as a sum (torchtitan#2972): every gradient 6x the reference's.
  StepRun sum = run(ScheduleKind::k1F1B, {2, 1, kMicroBatches}, {}, 1);
  ASSERT_TRUE(sum.errors.empty()) << sum.errors.front();
  EXPECT_THAT(sum.mismatches[0], HasSubstr("layers.0.weight: max abs error"));
  EXPECT_THAT(sum.mismatches[1], HasSubstr("layers.2.weight: max abs error"));
  // Normalized by the last micro-batch's 2 valid labels instead of the step's 6.
  StepRun one = run(ScheduleKind::kGPipe, {2, 1, kMicroBatches}, {}, 2);
  ASSERT_TRUE(one.errors.empty()) << one.errors.front();
  EXPECT_NE(one.mismatches[0], "");
  EXPECT_NE(one.mismatches[1], "");
}

TEST(PipelineBugTest, AnOrderThatCannotRunIsRefusedBeforeAnythingIsSent) {
  // Rank 0 waits for B1.0 before it sends F0.1; rank 1 waits for F0.1 before it runs B1.0.
  const std::vector<std::vector<Action>> deadlock = {
      {Action::parse("F0.0"), Action::parse("B0.0"), Action::parse("F0.1"), Action::parse("B0.1")},
      {Action::parse("F1.0"), Action::parse("F1.1"), Action::parse("B1.0"), Action::parse("B1.1")}};
  const StepRun r = run(ScheduleKind::kGPipe, {2, 1, 2}, deadlock);
  ASSERT_EQ(r.errors.size(), 2u) << "each rank refuses the order";
  EXPECT_THAT(r.errors[0], HasSubstr("is not a valid step (nothing was sent)"));
  EXPECT_THAT(r.errors[0], HasSubstr("deadlock): rank 0 waits at B0.0 for B1.0; rank 1 waits at F1.1 for F0.1"));
  // A dropped backward: the gradient of micro-batch 1 would never reach stage 0.
  std::vector<std::vector<Action>> dropped = schedule(ScheduleKind::kGPipe, {2, 1, 2});
  dropped[1].pop_back();
  const StepRun d = run(ScheduleKind::kGPipe, {2, 1, 2}, dropped);
  ASSERT_EQ(d.errors.size(), 2u);
  EXPECT_THAT(d.errors[1], HasSubstr("B1.1 never ran"));
  // A step without a valid label has nothing to normalize by.
  const StepRun none = run(ScheduleKind::kGPipe, {2, 1, 2}, {}, 0);
  ASSERT_EQ(none.errors.size(), 2u);
  EXPECT_THAT(none.errors[0], HasSubstr("valid-token count, which must be >= 1"));
}

// A tied embedding and head across the first and the last stage (llama_tied's layout): token
// ids embedded by E on stage 0, logits h E^T on the last. The copies' gradients summed over
// pp equal the one parameter's of the unsplit model, and the global grad norm counts E once;
// the bugs of the public record (the copies never synchronized, Megatron-LM#844; the norm of
// the local stage only, torchtitan#596; a tied copy counted twice, Megatron-LM#7227) differ.
TEST(PipelineTiedTest, TiedCopiesSumTheirGradientsAndTheNormCountsEachParameterOnce) {
  constexpr int64_t vocab = 7;
  at::manual_seed(5);
  const at::Tensor ids = at::randint(0, vocab, {kMicroBatches * kTokens}, at::kLong);
  const at::Tensor labels = at::randint(0, vocab, {kMicroBatches * kTokens}, at::kLong);
  const at::Tensor mask = data().mask;
  const at::Tensor embedding = at::randn({vocab, kHidden}, at::kDouble) * 0.5;
  const Params start = initial();
  // The unsplit model, one E for both uses.
  Params ref = trainable(start);
  const at::Tensor ref_e = embedding.clone().requires_grad_(true);
  at::Tensor h = at::embedding(ref_e, ids);
  for (int64_t l = 0; l < kLayers; ++l) h = layer(ref, l, h);
  const at::Tensor logits = at::linear(h, ref_e);
  (cross_entropy(logits, labels) * mask).sum().div(mask.sum()).backward();
  double ref_sq = ref_e.grad().pow(2).sum().item<double>();
  for (int64_t l = 0; l < kLayers; ++l) {
    ref_sq += ref.weight[l].grad().pow(2).sum().item<double>() + ref.bias[l].grad().pow(2).sum().item<double>();
  }
  const double ref_norm = std::sqrt(ref_sq);

  const PipelineShape shape{2, 1, kMicroBatches};
  std::vector<std::string> unsynced(2), synced(2);
  std::vector<double> norm(2), local_norm(2), twice_norm(2);
  ParallelConfig dims;
  dims.dp_shard = 2;
  const auto errors = testing::run_mesh(dims, [&](DeviceMesh& mesh) {
    Communicator& comm = mesh.comm(MeshAxis::kDpShard);
    const int me = comm.rank();
    const Params mine = trainable(start);
    const at::Tensor e = embedding.clone().requires_grad_(true);  // this stage's copy of E
    const auto layers = stage_layers(kLayers, shape);
    StageModel model;
    model.forward = [&](int stage, int mb, const at::Tensor& input) {
      at::Tensor x = stage == 0 ? at::embedding(e, ids.slice(0, mb * kTokens, (mb + 1) * kTokens)) : input;
      for (int64_t l = layers[stage].first; l < layers[stage].second; ++l) x = layer(mine, l, x);
      if (stage == 0) return x;
      const at::Tensor y = labels.slice(0, mb * kTokens, (mb + 1) * kTokens);
      return cross_entropy(at::linear(x, e), y);
    };
    model.loss_mask = [&](int mb) { return mask.slice(0, mb * kTokens, (mb + 1) * kTokens); };
    model.empty_activation = [](int, int) { return at::empty({kTokens, kHidden}, at::kDouble); };
    (void)run_pipeline_step(comm, ScheduleKind::k1F1B, shape, schedule(ScheduleKind::k1F1B, shape), model, 6);
    at::Tensor grad = e.grad().clone();
    unsynced[me] = mismatch("E (copy of stage " + std::to_string(me) + ")", grad, ref_e.grad());
    sum_tied_gradient(comm, grad);
    synced[me] = mismatch("E (copy of stage " + std::to_string(me) + ")", grad, ref_e.grad());
    std::vector<at::Tensor> counted;
    for (int64_t l = layers[me].first; l < layers[me].second; ++l) {
      counted.push_back(mine.weight[l].grad());
      counted.push_back(mine.bias[l].grad());
    }
    std::vector<at::Tensor> with_e = counted;
    with_e.push_back(grad);
    norm[me] = pipeline_grad_norm(comm, me == 0 ? with_e : counted);  // E counted on stage 0 only
    twice_norm[me] = pipeline_grad_norm(comm, with_e);                  // planted: on both stages
    double sq = 0;
    for (const at::Tensor& g : me == 0 ? with_e : counted) sq += g.pow(2).sum().item<double>();
    local_norm[me] = std::sqrt(sq);                                     // planted: no reduction over pp
  });
  ASSERT_TRUE(errors.empty()) << errors.front();
  EXPECT_THAT(unsynced[0], HasSubstr("E (copy of stage 0): max abs error")) << "a copy alone has only its stage's part";
  EXPECT_THAT(unsynced[1], HasSubstr("E (copy of stage 1): max abs error"));
  EXPECT_EQ(synced[0], "");
  EXPECT_EQ(synced[1], "");
  for (int r = 0; r < 2; ++r) {
    EXPECT_NEAR(norm[r], ref_norm, 1e-12 * ref_norm) << "rank " << r;
    EXPECT_GT(twice_norm[r], ref_norm * (1 + 1e-6)) << "rank " << r << ": E counted on both stages";
    EXPECT_GT(std::abs(local_norm[r] - ref_norm), 1e-6 * ref_norm) << "rank " << r << ": its stage's norm only";
  }
}

}  // namespace
}  // namespace mih::pp
