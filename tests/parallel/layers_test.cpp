// Tensor-parallel layers on tp=2 thread ranks against plain single-device ops on the gathered
// full weights: forward outputs and gradients, sequence parallel, vocab 37 padded to 38, the
// fused gate/up layout, and the vocab-parallel cross entropy.
#include <tuple>
#include <vector>

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "harness/base/error.h"
#include "harness/base/fault.h"
#include "harness/parallel/layers.h"
#include "tests/support/thread_ranks.h"

namespace mih {
namespace {

using ::testing::IsEmpty;

::testing::AssertionResult Close(const at::Tensor& actual, const at::Tensor& expected, double tol = 1e-12) {
  if (actual.sizes() != expected.sizes()) {
    return ::testing::AssertionFailure() << "shape " << actual.sizes() << " != expected " << expected.sizes();
  }
  double err = (actual - expected).abs().max().item<double>();
  if (err <= tol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "max abs error " << err << " > " << tol;
}

// A float64 config on `mesh`'s degrees (seed 5).
ParallelConfig f64(const DeviceMesh& mesh, bool sequence_parallel = false) {
  ParallelConfig o = mesh.config();
  o.dtype = DType::kFloat64;
  o.sequence_parallel = sequence_parallel && mesh.config().tp > 1;
  o.seed = 5;
  return o;
}

at::Tensor input(int64_t b, int64_t s, int64_t h) {
  return at::sin(at::arange(b * s * h, at::kDouble).reshape({b, s, h}) * 0.37);
}

// Runs `body(ctx)` on tp=2 thread ranks with float64 parameters.
std::vector<std::string> on_tp2(bool sequence_parallel, const std::function<void(ParallelContext&)>& body) {
  ParallelConfig dims;
  dims.tp = 2;
  return testing::run_mesh(dims, [&](DeviceMesh& mesh) {
    ParallelContext ctx(mesh, f64(mesh, sequence_parallel));
    body(ctx);
  });
}

// The parameters a layer made, named, after finalize.
const ShardedParameter& named(ParallelContext& ctx, torch::nn::Module& m, const std::string& fqn) {
  ctx.finalize(m);
  for (const auto& p : ctx.parameters()) {
    if (p->fqn == fqn) return *p;
  }
  throw std::runtime_error("no parameter " + fqn);
}

TEST(TensorParallelLayerTest, ColumnThenRowEqualsTheDenseMlp) {
  for (bool sp : {false, true}) {
    SCOPED_TRACE(sp ? "sequence parallel" : "no sequence parallel");
    EXPECT_THAT(on_tp2(sp, [&](ParallelContext& ctx) {
                  struct Mlp : torch::nn::Module {
                    ColumnParallelLinear up{nullptr};
                    RowParallelLinear down{nullptr};
                  } mlp;
                  mlp.up = mlp.register_module("up", ColumnParallelLinear(ctx, ColumnParallelLinearOptions(6, 8)));
                  mlp.down = mlp.register_module("down", RowParallelLinear(ctx, RowParallelLinearOptions(8, 6)));
                  at::Tensor full_x = input(2, 4, 6);
                  at::Tensor x = (sp ? full_x.chunk(2, 1)[ctx.tp_rank()] : full_x).clone().requires_grad_(true);
                  at::Tensor y = mlp.down(at::tanh(mlp.up(x)));
                  const ShardedParameter& w1 = named(ctx, mlp, "up.weight");
                  const ShardedParameter& b1 = named(ctx, mlp, "up.bias");
                  const ShardedParameter& w2 = named(ctx, mlp, "down.weight");
                  const ShardedParameter& b2 = named(ctx, mlp, "down.bias");
                  at::Tensor W1 = ctx.gather_full(w1, w1.local), B1 = ctx.gather_full(b1, b1.local);
                  at::Tensor W2 = ctx.gather_full(w2, w2.local), B2 = ctx.gather_full(b2, b2.local);
                  // The same computation on one device.
                  at::Tensor rx = full_x.clone().requires_grad_(true);
                  at::Tensor rW1 = W1.clone().requires_grad_(true), rW2 = W2.clone().requires_grad_(true);
                  at::Tensor rB1 = B1.clone().requires_grad_(true), rB2 = B2.clone().requires_grad_(true);
                  at::Tensor ry = at::linear(at::tanh(at::linear(rx, rW1, rB1)), rW2, rB2);
                  EXPECT_TRUE(Close(y, sp ? ry.detach().chunk(2, 1)[ctx.tp_rank()] : ry.detach()));
                  // Each rank's loss covers the tokens it holds (all of them without SP, its own
                  // under SP): the gradients equal one device's, with no factor.
                  y.pow(2).sum().backward();
                  ry.pow(2).sum().backward();
                  ctx.synchronize_gradients();
                  EXPECT_TRUE(Close(ctx.gather_full(w1, w1.local.grad()), rW1.grad()));
                  EXPECT_TRUE(Close(ctx.gather_full(w2, w2.local.grad()), rW2.grad()));
                  EXPECT_TRUE(Close(ctx.gather_full(b1, b1.local.grad()), rB1.grad()));
                  // The row bias is replicated; under SP its gradient is partial per rank and the
                  // synchronization summed it.
                  EXPECT_TRUE(Close(ctx.gather_full(b2, b2.local.grad()), rB2.grad()));
                  EXPECT_TRUE(Close(x.grad(), sp ? rx.grad().chunk(2, 1)[ctx.tp_rank()] : rx.grad()));
                }),
                IsEmpty());
  }
}

// KV heads replicated over tp (ColumnParallelLinearOptions::heads below tp, vLLM's layout): at
// tp=4 with 2 heads every rank holds the whole weight and computes head t / 2, and the weight's
// and bias's gradients (each rank's query heads' share of its head's) are declared partial over
// tp, so after the synchronization they are one device's, with and without sequence
// parallelism; the input's gradient too. tp neither dividing the heads nor a multiple of them
// is refused with the arithmetic.
TEST(TensorParallelLayerTest, HeadsReplicatedOverTpComputeEachRanksHead) {
  constexpr int64_t kKvHeads = 2, kHeadDim = 3, kHidden = 5, kSeq = 4, kTp = 4;
  for (bool sp : {false, true}) {
    SCOPED_TRACE(sp ? "sequence parallel" : "no sequence parallel");
    ParallelConfig dims;
    dims.tp = kTp;
    EXPECT_THAT(testing::run_mesh(dims, [&](DeviceMesh& mesh) {
                  ParallelContext ctx(mesh, f64(mesh, sp));
                  struct Attention : torch::nn::Module {
                    ColumnParallelLinear k_proj{nullptr};
                  } attn;
                  attn.k_proj = attn.register_module(
                      "k_proj", ColumnParallelLinear(ctx, ColumnParallelLinearOptions(kHidden, kKvHeads * kHeadDim).heads(kKvHeads)));
                  const ShardedParameter& w = named(ctx, attn, "k_proj.weight");
                  const ShardedParameter& b = named(ctx, attn, "k_proj.bias");
                  EXPECT_TRUE(w.tp.is_replicate() && b.tp.is_replicate());
                  EXPECT_TRUE(w.tp_partial_grad && b.tp_partial_grad);
                  {
                    // Every tp rank holds the same whole weight (the reference below is built
                    // from this rank's copy, so a copy of its own would go unseen there).
                    at::Tensor sum = w.local.detach().clone();
                    ctx.tp_group().all_reduce(sum);
                    EXPECT_TRUE(Close(sum, w.local.detach() * static_cast<double>(kTp)));
                  }
                  const int64_t t = ctx.tp_rank(), head = t / 2;
                  EXPECT_EQ(attn.k_proj->head_replicas(), 2);
                  EXPECT_EQ(attn.k_proj->replicated_head(), head);
                  {
                    at::NoGradGuard no_grad;  // a bias of 0.1, not its initial 0
                    b.local.fill_(0.1);
                  }
                  const at::Tensor full_x = input(2, kSeq, kHidden);
                  at::Tensor x = (sp ? full_x.chunk(kTp, 1)[t] : full_x).clone().requires_grad_(true);
                  at::Tensor y = attn.k_proj(x);  // [B, S, D]: this rank's head, the whole sequence
                  // Each rank's query heads weigh its keys their own way.
                  auto weights = [&](int64_t r) {
                    return at::cos(at::arange(2 * kSeq * kHeadDim, at::kDouble).reshape({2, kSeq, kHeadDim}) * (0.3 + 0.1 * r));
                  };
                  (y * weights(t)).sum().backward();
                  // One device: every rank's head, weighted by that rank's weights.
                  at::Tensor rw = w.local.detach().clone().requires_grad_(true);
                  at::Tensor rb = b.local.detach().clone().requires_grad_(true);
                  at::Tensor rx = full_x.clone().requires_grad_(true);
                  at::Tensor all = at::linear(rx, rw, rb);  // [B, S, KV * D]
                  at::Tensor loss = at::zeros({}, at::kDouble);
                  for (int64_t r = 0; r < kTp; ++r) loss = loss + (all.narrow(-1, (r / 2) * kHeadDim, kHeadDim) * weights(r)).sum();
                  loss.backward();
                  EXPECT_TRUE(Close(y, all.detach().narrow(-1, head * kHeadDim, kHeadDim)));
                  ctx.synchronize_gradients();
                  EXPECT_TRUE(Close(w.local.grad(), rw.grad()));
                  EXPECT_TRUE(Close(b.local.grad(), rb.grad()));
                  EXPECT_TRUE(Close(x.grad(), sp ? rx.grad().chunk(kTp, 1)[t] : rx.grad()));
                  EXPECT_THAT([&] { ColumnParallelLinear(ctx, ColumnParallelLinearOptions(kHidden, 3 * kHeadDim).heads(3)); },
                              ::testing::ThrowsMessage<Error>(::testing::HasSubstr(
                                  "tp(4) must divide heads(3) or be a multiple of them (the heads then replicated over tp): "
                                  "3 % 4 = 3 and 4 % 3 = 1")));
                }),
                IsEmpty());
  }
}

// F36 (docs/fault-catalog.md): the head of tp rank t taken as t % heads, so ranks 1 and 2 compute the other
// group's KV head; a fault point reached only where the heads are replicated.
TEST(TensorParallelLayerTest, FaultF36GivesTwoRanksTheOtherKvHead) {
  fault::ScopedFault wrong_head(fault::Fault::kF36);
  std::vector<int64_t> heads(4, -1);
  ParallelConfig dims;
  dims.tp = 4;
  EXPECT_THAT(testing::run_mesh(dims, [&](DeviceMesh& mesh) {
                ParallelContext ctx(mesh, f64(mesh));
                ColumnParallelLinear k_proj(ctx, ColumnParallelLinearOptions(5, 6).heads(2));
                heads[static_cast<size_t>(ctx.tp_rank())] = k_proj->replicated_head();
              }),
              IsEmpty());
  EXPECT_EQ(heads, (std::vector<int64_t>{0, 1, 0, 1}));
  EXPECT_TRUE(fault::reached());
}

// Each rank must hold matching halves of gate and of up ([gate_r; up_r]), not one of them
// whole: the gathered weight equals the degree-1 weight, partition by partition.
TEST(TensorParallelLayerTest, FusedGateUpGivesEachRankMatchingHalves) {
  at::Tensor reference;
  {
    ParallelConfig one;
    auto errors = testing::run_mesh(one, [&](DeviceMesh& mesh) {
      ParallelContext ctx(mesh, f64(mesh));
      ColumnParallelLinear gate_up(ctx, ColumnParallelLinearOptions(4, 2 * 6).partitions(2).bias(false));
      reference = gate_up->weight.detach().clone();
    });
    ASSERT_THAT(errors, IsEmpty());
  }
  EXPECT_THAT(on_tp2(false, [&](ParallelContext& ctx) {
                ColumnParallelLinear gate_up(ctx, ColumnParallelLinearOptions(4, 2 * 6).partitions(2).bias(false));
                at::Tensor local = gate_up->weight.detach();
                ASSERT_EQ(local.size(0), 6);
                EXPECT_TRUE(Close(local.narrow(0, 0, 3), reference.narrow(0, 3 * ctx.tp_rank(), 3)));      // gate half
                EXPECT_TRUE(Close(local.narrow(0, 3, 3), reference.narrow(0, 6 + 3 * ctx.tp_rank(), 3)));  // up half
                const ShardedParameter& w = named(ctx, *gate_up, "weight");
                EXPECT_TRUE(Close(ctx.gather_full(w, w.local), reference));
              }),
              IsEmpty());
}

TEST(TensorParallelLayerTest, VocabParallelEmbeddingPadsAndMasksAVocabOf37) {
  for (bool sp : {false, true}) {
    EXPECT_THAT(on_tp2(sp, [&](ParallelContext& ctx) {
                  VocabParallelEmbedding embed(ctx, 37, 5);
                  EXPECT_EQ(embed->weight.size(0), 19);  // 38 / 2
                  const ShardedParameter& p = named(ctx, *embed, "weight");
                  EXPECT_EQ(p.padded_shape, (std::vector<int64_t>{38, 5}));
                  at::Tensor table = ctx.gather_full(p, p.local);
                  ASSERT_EQ(table.sizes(), (std::vector<int64_t>{37, 5}));
                  at::Tensor ids = at::tensor({0, 18, 19, 36, 5, 36, 19, 0}, at::kLong).reshape({2, 4});
                  at::Tensor out = embed(ids);
                  at::Tensor expected = at::embedding(table, ids);
                  EXPECT_TRUE(Close(out, sp ? expected.chunk(2, 1)[ctx.tp_rank()] : expected));
                  out.sum().backward();
                  ctx.synchronize_gradients();
                  at::Tensor grad = ctx.gather_full(p, p.local.grad());
                  at::Tensor counts = at::bincount(ids.reshape(-1), {}, 37).to(at::kDouble);
                  EXPECT_TRUE(Close(grad, counts.unsqueeze(1).expand({37, 5})));
                  at::Tensor padding_grad = p.local.grad().narrow(0, p.local.size(0) - 1, 1);
                  if (ctx.tp_rank() == 1) {
                    EXPECT_EQ(padding_grad.abs().sum().item<double>(), 0.0);
                  }
                }),
                IsEmpty());
  }
}

// The documented chunk of a sequence-parallel rank (ParallelContext::sequence_parallel_chunk,
// local_token_ids) is the one the layers' reduce-scatter leaves it: each rank's embedding
// output is the table's rows of exactly those tokens.
TEST(TensorParallelLayerTest, SequenceParallelChunkIsTheTokensTheEmbeddingLeavesEachRank) {
  EXPECT_THAT(on_tp2(true, [&](ParallelContext& ctx) {
                VocabParallelEmbedding embed(ctx, 37, 5);
                const ShardedParameter& p = named(ctx, *embed, "weight");
                const at::Tensor table = ctx.gather_full(p, p.local);
                const at::Tensor ids = at::remainder(at::arange(16, at::kLong) * 7 + 3, 37).reshape({2, 8});
                const at::Tensor out = embed(ids);  // [2, 4, 5]: this rank's tokens
                const at::Tensor positions = ctx.local_token_ids(out.size(1), /*sequence_sharded_over_tp=*/true);
                EXPECT_TRUE(at::equal(positions, at::arange(4 * ctx.tp_rank(), 4 * ctx.tp_rank() + 4, at::kLong)));
                EXPECT_TRUE(Close(out, at::embedding(table, ctx.sequence_parallel_chunk(ids, 1))));
                EXPECT_TRUE(Close(out, at::embedding(table, ids.index_select(1, positions))));
                EXPECT_TRUE(at::equal(ctx.local_token_ids(8, /*sequence_sharded_over_tp=*/false), at::arange(8, at::kLong)));
              }),
              IsEmpty());
}

TEST(TensorParallelLayerTest, VocabParallelCrossEntropyEqualsCrossEntropy) {
  EXPECT_THAT(on_tp2(false, [&](ParallelContext& ctx) {
                const int64_t vocab = 37, padded = 38;
                at::Tensor full = at::cos(at::arange(6 * padded, at::kDouble).reshape({6, padded}) * 0.3) * 3;
                at::Tensor targets = at::tensor({0, 18, 19, 36, -100, 7}, at::kLong);
                at::Tensor logits = full.chunk(2, 1)[ctx.tp_rank()].clone().requires_grad_(true);
                at::Tensor losses = vocab_parallel_cross_entropy(logits, targets, ctx.tp_group(), vocab);
                at::Tensor ref_logits = full.narrow(1, 0, vocab).clone().requires_grad_(true);
                at::Tensor ref = at::cross_entropy_loss(ref_logits, targets, {}, at::Reduction::None, -100);
                EXPECT_TRUE(Close(losses, ref.detach()));
                losses.sum().backward();
                ref.sum().backward();
                at::Tensor grad = ctx.tp_group().all_gather(logits.grad(), 1);
                EXPECT_TRUE(Close(grad.narrow(1, 0, vocab), ref_logits.grad()));
                EXPECT_EQ(grad.narrow(1, vocab, 1).abs().sum().item<double>(), 0.0) << "the padding column";
              }),
              IsEmpty());
}

TEST(TensorParallelLayerTest, NormsUnderSequenceParallelSumTheirPartialGradients) {
  EXPECT_THAT(on_tp2(true, [&](ParallelContext& ctx) {
                struct Norms : torch::nn::Module {
                  RMSNorm rms{nullptr};
                  LayerNorm ln{nullptr};
                } m;
                m.rms = m.register_module("rms", RMSNorm(ctx, 6));
                m.ln = m.register_module("ln", LayerNorm(ctx, 6));
                at::Tensor full_x = input(2, 4, 6);
                at::Tensor x = full_x.chunk(2, 1)[ctx.tp_rank()].clone();
                (m.ln(m.rms(x)) * x).sum().backward();
                ctx.finalize(m);
                for (const auto& p : ctx.parameters()) EXPECT_EQ(p->grad_domain(), std::vector<std::string>{"tp"}) << p->fqn;
                ctx.synchronize_gradients();
                // One device: the same norms on the whole sequence.
                at::Tensor w = at::ones({6}, at::kDouble).requires_grad_(true);
                at::Tensor lw = at::ones({6}, at::kDouble).requires_grad_(true), lb = at::zeros({6}, at::kDouble).requires_grad_(true);
                at::Tensor r = full_x * at::rsqrt(full_x.pow(2).mean(-1, true) + 1e-6) * w;
                (at::layer_norm(r, {6}, lw, lb, 1e-5) * full_x).sum().backward();
                EXPECT_TRUE(Close(m.rms->weight.grad(), w.grad()));
                EXPECT_TRUE(Close(m.ln->weight.grad(), lw.grad()));
                EXPECT_TRUE(Close(m.ln->bias.grad(), lb.grad()));
              }),
              IsEmpty());
}

// The noise twin (ParallelConfig::noise_twin) sums each of a degree-1 linear layer's three
// contractions in two halves: in float64 it is the plain layer (values and every gradient), in
// float32 it rounds each of them differently: the forward (over the input features), the input
// gradient (over the output features) and the weight and bias gradients (over the tokens). A
// twin that split the forward alone left the weight and bias gradients bitwise equal to the
// plain layer's, so it sampled none of their rounding (docs/precision.md).
TEST(TensorParallelLayerTest, NoiseTwinRoundsEachContractionOfALinearDifferently) {
  for (DType dtype : {DType::kFloat64, DType::kFloat32}) {
    SCOPED_TRACE(dtype == DType::kFloat64 ? "float64" : "float32");
    ParallelConfig one;
    EXPECT_THAT(testing::run_mesh(one, [&](DeviceMesh& mesh) {
                  ParallelConfig config = f64(mesh);
                  config.dtype = dtype;
                  config.noise_twin = true;
                  ParallelContext ctx(mesh, config);
                  ColumnParallelLinear twin(ctx, ColumnParallelLinearOptions(37, 29));
                  const auto options = twin->weight.options();
                  // [batch 3, seq 7, in 37]: 21 tokens, halves of 10 and 11.
                  at::Tensor x0 = at::sin(at::arange(3 * 7 * 37, options).reshape({3, 7, 37}) * 0.37);
                  at::Tensor gy = at::cos(at::arange(3 * 7 * 29, options).reshape({3, 7, 29}) * 0.91);
                  at::Tensor x = x0.clone().requires_grad_(true);
                  at::Tensor y = twin(x);
                  y.backward(gy);
                  at::Tensor rx = x0.clone().requires_grad_(true);
                  at::Tensor rw = twin->weight.detach().clone().requires_grad_(true);
                  at::Tensor rb = twin->bias.detach().clone().requires_grad_(true);
                  at::Tensor ry = at::linear(rx, rw, rb);
                  ry.backward(gy);
                  const std::vector<std::tuple<const char*, at::Tensor, at::Tensor>> pairs = {
                      {"forward", y.detach(), ry.detach()},
                      {"input gradient", x.grad(), rx.grad()},
                      {"weight gradient", twin->weight.grad(), rw.grad()},
                      {"bias gradient", twin->bias.grad(), rb.grad()}};
                  for (const auto& [what, a, b] : pairs) {
                    SCOPED_TRACE(what);
                    if (dtype == DType::kFloat64) {
                      EXPECT_TRUE(Close(a, b, 1e-12));
                    } else {
                      // Equal up to float32 rounding, and rounded differently.
                      EXPECT_TRUE(Close(a.to(at::kDouble), b.to(at::kDouble), 1e-4));
                      EXPECT_FALSE(at::equal(a, b)) << "the twin summed this contraction in the plain order";
                    }
                  }
                }),
                IsEmpty());
  }
}

TEST(TensorParallelLayerTest, IndivisibleShardIsAClearError) {
  EXPECT_THAT(on_tp2(false, [&](ParallelContext& ctx) {
                EXPECT_THAT([&] { ColumnParallelLinear(ctx, ColumnParallelLinearOptions(4, 5)); },
                            ::testing::ThrowsMessage<Error>(::testing::HasSubstr(
                                "dim 0 (size 5) does not split into partitions(1) x tp(2) equal pieces")));
              }),
              IsEmpty());
}

}  // namespace
}  // namespace mih
