// The tensor-parallel layers and the vocab-parallel cross entropy.
#include "harness/parallel/layers.h"

#include <limits>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/custom_function.h>

#include "harness/base/error.h"
#include "harness/base/fault.h"
#include "harness/parallel/regions.h"

namespace mih {
namespace {

// Whether autograd will run the backward of an op on `t` (so its backward collective happens).
bool backward_runs(const at::Tensor& t) { return at::GradMode::is_enabled() && t.requires_grad(); }

// The contract of a layer whose local output is a partial sum over tp (row-parallel linear,
// vocab-parallel embedding): reduce-scattered over tp under sequence parallelism (its
// gradient all-gathered back), else all-reduced.
void expect_partial_sum(ParallelContext& ctx, const at::Tensor& weight, const at::Tensor& partial) {
  Communicator& tp = ctx.tp_group();
  if (tp.size() == 1) return;
  const std::string layer = ctx.layer_of(weight);
  const int64_t bytes = partial.numel() * static_cast<int64_t>(partial.element_size());
  if (ctx.sequence_parallel()) {
    tp.expect("region.reduce_scatter", bytes, layer);
    if (backward_runs(partial)) tp.expect("region.all_gather", bytes / tp.size(), layer);
  } else {
    tp.expect("region.reduce_from", bytes, layer);
  }
}

// x W^T (+ b), x: [..., in], w: [out, in], b: [out] or undefined. In the noise twin
// (ParallelConfig::noise_twin) a layer of degree 1 sums each of its three contractions in two
// halves, as the parallel configurations do: the forward's over the input features (a
// row-parallel layer's tp ranks), the input gradient's over the output features (a column-
// parallel layer's), and the weight and bias gradients' over the tokens (two data-parallel or
// context-parallel ranks). The same values in exact arithmetic, rounded differently, so the twin
// measures the lane's rounding noise in the forward and in both gradients; a twin that split
// the forward alone sampled none of the gradients' own rounding, and a case that reordered the
// tokens' sum differed from the lane's reference by up to 80 of its noises (docs/precision.md).
at::Tensor linear(const ParallelContext& ctx, const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  const int64_t k = w.size(-1);
  if (!ctx.config().noise_twin || ctx.tp_size() > 1 || k < 2) return at::linear(x, w, b);
  const int64_t out = w.size(0);
  const int64_t half = k / 2;
  // [tokens, in] -> [tokens, out]: the output features in two halves (each use of x adds its
  // part of the input gradient), each a sum of two halves of the input features.
  auto rows = [&](const at::Tensor& xr) {
    std::vector<at::Tensor> parts;
    const int64_t split = out >= 2 ? out / 2 : out;
    for (const auto& [first, count] : {std::pair{int64_t{0}, split}, std::pair{split, out - split}}) {
      if (count == 0) continue;
      const at::Tensor wo = w.narrow(0, first, count);
      parts.push_back(at::linear(xr.narrow(-1, 0, half), wo.narrow(-1, 0, half)) +
                      at::linear(xr.narrow(-1, half, k - half), wo.narrow(-1, half, k - half)));
    }
    at::Tensor y = parts.size() == 1 ? parts[0] : at::cat(parts, -1);
    return b.defined() ? y + b : y;
  };
  // The tokens in two halves: each half's use of w and b adds its part of their gradients.
  const at::Tensor flat = x.reshape({-1, k});
  const int64_t tokens = flat.size(0);
  at::Tensor y = tokens >= 2 ? at::cat({rows(flat.narrow(0, 0, tokens / 2)),
                                        rows(flat.narrow(0, tokens / 2, tokens - tokens / 2))}, 0)
                             : rows(flat);
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = out;
  return y.reshape(shape);
}

}  // namespace
namespace {

// The sequence dim of [B, S, H] (and of [S, H]): the one before the features.
constexpr int64_t kSeqDim = -2;

ParamSpec weight_spec(int64_t out, int64_t in, Placement tp, double std, int64_t pad) {
  ParamSpec s;
  s.shape = {out, in};
  s.tp = tp;
  s.init = init::normal(std);
  s.pad_dim0_to_multiple = pad;
  return s;
}

ParamSpec vector_spec(int64_t n, Placement tp, double value, bool tp_partial_grad, int64_t pad = 1) {
  ParamSpec s;
  s.shape = {n};
  s.tp = tp;
  s.init = init::constant(value);
  s.tp_partial_grad = tp_partial_grad;
  s.pad_dim0_to_multiple = pad;
  return s;
}

}  // namespace

ColumnParallelLinearImpl::ColumnParallelLinearImpl(ParallelContext& ctx, const ColumnParallelLinearOptions& o)
    : ColumnParallelLinearImpl(ctx, o, at::Tensor()) {}

ColumnParallelLinearImpl::ColumnParallelLinearImpl(ParallelContext& ctx, const ColumnParallelLinearOptions& o,
                                                   const at::Tensor& tied_weight)
    : options(o), ctx_(&ctx) {
  MIH_CHECK(o.in_features() > 0 && o.out_features() > 0 && o.partitions() >= 1,
            "ColumnParallelLinear: in_features, out_features and partitions must be positive, got ", o.in_features(),
            ", ", o.out_features(), ", ", o.partitions());
  MIH_CHECK_CODE(o.partitions() == 1 || !o.gather_output(), Code::kUnimplemented,
                 "ColumnParallelLinear: gather_output with partitions > 1 is not supported");
  const int64_t pad = o.pad_to_tp() ? ctx.tp_size() : 1;
  Placement tp = Placement::shard(0, o.partitions());
  MIH_CHECK(o.heads() >= 0, "ColumnParallelLinear: heads must be the number of attention heads of the output, or 0 "
            "for a plain column-parallel layer; got ", o.heads());
  if (o.heads() > 0) {
    const int64_t heads = o.heads(), tp_size = ctx.tp_size();
    MIH_CHECK(o.out_features() % heads == 0, "ColumnParallelLinear: out_features(", o.out_features(),
              ") must divide into heads(", heads, "): ", o.out_features(), " % ", heads, " = ", o.out_features() % heads);
    MIH_CHECK(heads % tp_size == 0 || tp_size % heads == 0, "ColumnParallelLinear: tp(", tp_size, ") must divide heads(",
              heads, ") or be a multiple of them (the heads then replicated over tp): ", heads, " % ", tp_size, " = ",
              heads % tp_size, " and ", tp_size, " % ", heads, " = ", tp_size % heads,
              "; use tp in the divisors or multiples of ", heads);
    if (tp_size > heads) {
      MIH_CHECK(o.partitions() == 1 && !o.gather_output() && !o.pad_to_tp() && !tied_weight.defined(),
                "ColumnParallelLinear: heads(", heads, ") replicated over tp(", tp_size,
                ") take no partitions, gather_output, pad_to_tp or tied weight; got partitions(", o.partitions(),
                "), gather_output(", o.gather_output(), "), pad_to_tp(", o.pad_to_tp(), "), tied weight(",
                tied_weight.defined(), "): give the replicated projection a weight of its own, one partition, "
                "its output sharded by heads");
      head_replicas_ = tp_size / heads;
      tp = Placement::replicate();
    }
  }
  if (tied_weight.defined()) {
    const ShardedParameter& tied = ctx.parameter(tied_weight);
    MIH_CHECK(tied.global_shape == std::vector<int64_t>({o.out_features(), o.in_features()}) && tied.tp == tp,
              "ColumnParallelLinear: the tied weight must be a [", o.out_features(), ", ", o.in_features(),
              "] parameter laid out as ", tp.str(), " over tp");
    weight = register_parameter("weight", tied_weight);
  } else {
    // Replicated heads: every tp rank holds the whole weight and backpropagates only its own
    // query heads' share into its head's rows, so the gradient is partial over tp.
    ParamSpec spec = weight_spec(o.out_features(), o.in_features(), tp, o.init_std(), pad);
    spec.tp_partial_grad = head_replicas_ > 1;
    weight = register_parameter("weight", ctx.make_parameter(spec));
  }
  if (o.bias()) {
    bias = register_parameter("bias",
                              ctx.make_parameter(vector_spec(o.out_features(), tp, 0.0, head_replicas_ > 1, pad)));
  }
}

int64_t ColumnParallelLinearImpl::replicated_head() const {
  if (head_replicas_ == 1) return 0;
  // F36 (docs/fault-catalog.md): the KV head picked by tp_rank % heads, as when the head index wraps around
  // the heads instead of counting tp / heads consecutive ranks per head: ranks whose query
  // heads belong to one KV head attend with another.
  if (fault::active(fault::Fault::kF36)) return ctx_->tp_rank() % options.heads();
  return ctx_->tp_rank() / head_replicas_;
}

at::Tensor ColumnParallelLinearImpl::forward(const at::Tensor& x) {
  Communicator& tp = ctx_->tp_group();
  // The contract (CommVolume): the input all-gathered over tp under sequence parallelism
  // (its gradient reduce-scattered back), else the input's gradient all-reduced.
  std::string layer;
  if (tp.size() > 1) {
    layer = ctx_->layer_of(weight);
    const int64_t bytes = x.numel() * static_cast<int64_t>(x.element_size());
    if (ctx_->sequence_parallel()) {
      tp.expect("region.all_gather", bytes, layer);
      if (backward_runs(x)) tp.expect("region.reduce_scatter", bytes * tp.size(), layer);
    } else if (backward_runs(x)) {
      tp.expect("region.copy_to.backward", bytes, layer);
    }
  }
  at::Tensor input = ctx_->sequence_parallel() ? sequence_all_gather(x, tp, kSeqDim) : copy_to_region(x, tp);
  at::Tensor w = ctx_->use(weight), b = bias.defined() ? ctx_->use(bias) : at::Tensor();
  if (head_replicas_ > 1) {
    // Replicated heads: this rank's head's rows (the gradient of the others stays zero here).
    const int64_t size = options.out_features() / options.heads(), first = replicated_head() * size;
    w = w.narrow(0, first, size);
    if (b.defined()) b = b.narrow(0, first, size);
  }
  at::Tensor y = linear(*ctx_, input, w, b);
  if (!options.gather_output()) return y;
  if (tp.size() > 1) tp.expect("region.all_gather", y.numel() * static_cast<int64_t>(y.element_size()), layer);
  // Padded outputs (pad_to_tp) are the last ones of the last rank: drop them after the gather.
  at::Tensor full = gather_from_region(y, tp, -1);
  return full.size(-1) == options.out_features() ? full : full.narrow(-1, 0, options.out_features());
}

RowParallelLinearImpl::RowParallelLinearImpl(ParallelContext& ctx, const RowParallelLinearOptions& o)
    : options(o), ctx_(&ctx) {
  MIH_CHECK(o.in_features() > 0 && o.out_features() > 0, "RowParallelLinear: in_features and out_features must be "
                                                          "positive, got ", o.in_features(), ", ", o.out_features());
  weight = register_parameter(
      "weight", ctx.make_parameter(weight_spec(o.out_features(), o.in_features(), Placement::shard(1), o.init_std(), 1)));
  if (o.bias()) {
    // Added after the reduction, so replicated; with sequence parallelism each rank adds it to
    // its own tokens only, and its gradient is partial over tp.
    bias = register_parameter("bias", ctx.make_parameter(vector_spec(o.out_features(), Placement::replicate(), 0.0,
                                                                     ctx.sequence_parallel())));
  }
}

at::Tensor RowParallelLinearImpl::forward(const at::Tensor& x) {
  Communicator& tp = ctx_->tp_group();
  // F08 (docs/fault-catalog.md): the bias folded into the local matmul, so each of the tp partial sums
  // carries it and the reduction adds it tp times.
  const bool bias_before_reduce = bias.defined() && fault::active(fault::Fault::kF08);
  at::Tensor partial = linear(*ctx_, x, ctx_->use(weight), bias_before_reduce ? ctx_->use(bias) : at::Tensor());
  expect_partial_sum(*ctx_, weight, partial);
  at::Tensor y = ctx_->sequence_parallel() ? sequence_reduce_scatter(partial, tp, kSeqDim) : reduce_from_region(partial, tp);
  return bias.defined() && !bias_before_reduce ? y + ctx_->use(bias) : y;
}

VocabParallelEmbeddingImpl::VocabParallelEmbeddingImpl(ParallelContext& ctx, int64_t vocab, int64_t hidden,
                                                       double init_std)
    : vocab(vocab), hidden(hidden), ctx_(&ctx) {
  MIH_CHECK(vocab > 0 && hidden > 0, "VocabParallelEmbedding: vocab and hidden must be positive, got ", vocab, ", ",
            hidden);
  weight = register_parameter(
      "weight", ctx.make_parameter(weight_spec(vocab, hidden, Placement::shard(0), init_std, ctx.tp_size())));
}

at::Tensor VocabParallelEmbeddingImpl::forward(const at::Tensor& ids) {
  Communicator& tp = ctx_->tp_group();
  at::Tensor table = ctx_->use(weight);  // [V/TP (padded), H]
  at::Tensor out;
  if (tp.size() == 1) {
    out = at::embedding(table, ids);
  } else {
    // Ids outside this rank's vocab slice look up row 0 and are zeroed; the sum over tp
    // then holds exactly one real row per token.
    const int64_t start = tp.rank() * table.size(0);
    at::Tensor outside = ids.lt(start).logical_or(ids.ge(start + table.size(0)));
    out = at::embedding(table, (ids - start).masked_fill(outside, 0)).masked_fill(outside.unsqueeze(-1), 0);
  }
  expect_partial_sum(*ctx_, weight, out);
  return ctx_->sequence_parallel() ? sequence_reduce_scatter(out, tp, kSeqDim) : reduce_from_region(out, tp);
}

RMSNormImpl::RMSNormImpl(ParallelContext& ctx, int64_t hidden, double eps, bool sequence_parallel_grad)
    : eps(eps), ctx_(&ctx) {
  MIH_CHECK(hidden > 0, "RMSNorm: hidden must be positive, got ", hidden);
  weight = register_parameter("weight", ctx.make_parameter(vector_spec(hidden, Placement::replicate(), 1.0,
                                                                       ctx.sequence_parallel() && sequence_parallel_grad)));
}

at::Tensor RMSNormImpl::forward(const at::Tensor& x) {
  // F30 (docs/fault-catalog.md): Gemma's (1 + w) * x / rms where the architecture has w * x / rms, in every
  // configuration alike.
  if (fault::active(fault::Fault::kF30)) return x * at::rsqrt(x.pow(2).mean(-1, /*keepdim=*/true) + eps) * (1 + ctx_->use(weight));
  return x * at::rsqrt(x.pow(2).mean(-1, /*keepdim=*/true) + eps) * ctx_->use(weight);
}

HeadRMSNormImpl::HeadRMSNormImpl(ParallelContext& ctx, int64_t head_dim, double eps)
    : head_dim(head_dim), eps(eps), ctx_(&ctx) {
  MIH_CHECK(head_dim > 0, "HeadRMSNorm: head_dim must be positive, got ", head_dim);
  // Each tp rank normalizes only its own heads: the gradient is partial over tp at any tp > 1.
  weight = register_parameter("weight",
                              ctx.make_parameter(vector_spec(head_dim, Placement::replicate(), 1.0, ctx.tp_size() > 1)));
}

at::Tensor HeadRMSNormImpl::forward(const at::Tensor& x) {
  MIH_CHECK(x.dim() >= 1 && x.size(-1) == head_dim, "HeadRMSNorm: the input's last dim must be head_dim(", head_dim,
            "), got shape ", x.sizes());
  return x * at::rsqrt(x.pow(2).mean(-1, /*keepdim=*/true) + eps) * ctx_->use(weight);
}

LayerNormImpl::LayerNormImpl(ParallelContext& ctx, int64_t hidden, double eps) : eps(eps), ctx_(&ctx) {
  MIH_CHECK(hidden > 0, "LayerNorm: hidden must be positive, got ", hidden);
  weight = register_parameter(
      "weight", ctx.make_parameter(vector_spec(hidden, Placement::replicate(), 1.0, ctx.sequence_parallel())));
  bias = register_parameter(
      "bias", ctx.make_parameter(vector_spec(hidden, Placement::replicate(), 0.0, ctx.sequence_parallel())));
}

at::Tensor LayerNormImpl::forward(const at::Tensor& x) {
  return at::layer_norm(x, {x.size(-1)}, ctx_->use(weight), ctx_->use(bias), eps);
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct VocabParallelCrossEntropy : public torch::autograd::Function<VocabParallelCrossEntropy> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& logits, const at::Tensor& targets, int64_t comm_id,
                            int64_t vocab, int64_t ignore_index) {
    Communicator& tp = *reinterpret_cast<Communicator*>(static_cast<intptr_t>(comm_id));
    const int64_t local_vocab = logits.size(1), start = tp.rank() * local_vocab;
    const int64_t real_cols = std::clamp<int64_t>(vocab - start, 0, local_vocab);
    at::Tensor shifted = logits.detach().clone();
    if (real_cols < local_vocab) {
      shifted.narrow(1, real_cols, local_vocab - real_cols).fill_(-std::numeric_limits<double>::infinity());
    }
    at::Tensor max = std::get<0>(shifted.max(1));
    tp.all_reduce(max, ReduceOp::kMax, "cross_entropy.max");
    shifted.sub_(max.unsqueeze(1));
    at::Tensor exp = shifted.exp();
    at::Tensor sum = exp.sum(1);
    tp.all_reduce(sum, ReduceOp::kSum, "cross_entropy.sum_exp");
    at::Tensor ignored = targets.eq(ignore_index);
    at::Tensor local_target = targets - start;
    at::Tensor here = local_target.ge(0).logical_and(local_target.lt(real_cols)).logical_and(ignored.logical_not());
    at::Tensor index = local_target.masked_fill(here.logical_not(), 0);
    at::Tensor target_logit = shifted.gather(1, index.unsqueeze(1)).squeeze(1).masked_fill(here.logical_not(), 0);
    tp.all_reduce(target_logit, ReduceOp::kSum, "cross_entropy.target_logit");
    at::Tensor loss = (sum.log() - target_logit).masked_fill(ignored, 0);
    ctx->save_for_backward({exp.div_(sum.unsqueeze(1)), index, here, ignored});
    return loss;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor& softmax = saved[0];
    const at::Tensor& index = saved[1];
    const at::Tensor& here = saved[2];
    const at::Tensor& ignored = saved[3];
    // d loss / d logits = softmax - onehot(target), on this rank's vocab slice.
    at::Tensor g = softmax.clone();
    g.scatter_add_(1, index.unsqueeze(1), here.to(g.scalar_type()).neg().unsqueeze(1));
    g.mul_(grads[0].unsqueeze(1)).masked_fill_(ignored.unsqueeze(1), 0);
    return {g, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor vocab_parallel_cross_entropy(const at::Tensor& logits, const at::Tensor& targets, Communicator& tp,
                                        int64_t vocab, int64_t ignore_index) {
  MIH_CHECK(logits.dim() == 2 && targets.dim() == 1 && logits.size(0) == targets.size(0),
            "vocab_parallel_cross_entropy: expected logits [N, V/TP] and targets [N], got ", logits.sizes(), " and ",
            targets.sizes());
  MIH_CHECK(logits.size(1) * tp.size() >= vocab, "vocab_parallel_cross_entropy: ", tp.size(), " ranks x ",
            logits.size(1), " columns cannot hold a vocabulary of ", vocab);
  // The contract (CommVolume): three reductions of one value per token over tp.
  const int64_t bytes = logits.size(0) * static_cast<int64_t>(logits.element_size());
  for (const char* site : {"cross_entropy.max", "cross_entropy.sum_exp", "cross_entropy.target_logit"}) {
    tp.expect(site, bytes, "cross_entropy");
  }
  return VocabParallelCrossEntropy::apply(logits, targets, static_cast<int64_t>(reinterpret_cast<intptr_t>(&tp)),
                                          vocab, ignore_index);
}

RotaryEmbeddingImpl::RotaryEmbeddingImpl(ParallelContext& ctx, int64_t head_dim_, double theta_)
    : head_dim(head_dim_), theta(theta_) {
  MIH_CHECK(head_dim > 0 && head_dim % 2 == 0, "RotaryEmbedding: head_dim must be even and positive, got ", head_dim);
  inv_freq = register_buffer("inv_freq", at::empty({head_dim / 2}, at::TensorOptions()
                                                                     .dtype(ctx.param_dtype())
                                                                     .device(ctx.device())));
  ctx.mark_non_persistent(inv_freq, [t = inv_freq, d = head_dim, base = theta] { fill_inv_freq(t, d, base); });
  reset_buffers();
}

void RotaryEmbeddingImpl::fill_inv_freq(const at::Tensor& inv_freq, int64_t head_dim, double theta) {
  at::NoGradGuard no_grad;
  at::Tensor exponent = at::arange(0, head_dim, 2, at::kDouble) / static_cast<double>(head_dim);
  inv_freq.copy_(at::pow(theta, exponent).reciprocal());
}

void RotaryEmbeddingImpl::reset_buffers() { fill_inv_freq(inv_freq, head_dim, theta); }

std::pair<at::Tensor, at::Tensor> RotaryEmbeddingImpl::forward(const at::Tensor& positions) {
  MIH_CHECK(positions.dim() == 2, "RotaryEmbedding: expected positions [B, S], got ", positions.sizes());
  at::Tensor angles = positions.to(at::kDouble).unsqueeze(-1) * inv_freq.to(at::kDouble);  // [B, S, D/2]
  at::Tensor full = at::cat({angles, angles}, -1).unsqueeze(1);                            // [B, 1, S, D]
  return {full.cos().to(inv_freq.scalar_type()), full.sin().to(inv_freq.scalar_type())};
}

at::Tensor apply_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  auto halves = x.chunk(2, -1);
  at::Tensor rotated = at::cat({-halves[1], halves[0]}, -1);
  return x * cos + rotated * sin;
}

}  // namespace mih
