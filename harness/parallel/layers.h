// Tensor-parallel layers (Megatron-Core's names): each is plain single-device code at tp=1
// and shards its parameters over tp otherwise; parameters are made by the ParallelContext, so
// FSDP and the gradient synchronization know their layout. Activations are [B, S, H]; under
// sequence parallelism the tensors between regions are [B, S/TP, H]: this tp rank's
// contiguous chunk of its cp rank's tokens (ParallelContext::sequence_parallel_chunk lines a
// batch field up with them, local_token_ids gives their global positions).
//
// How to write a model with them: hold a ParallelContext&, build every parameterized piece
// from these layers (or make_parameter + ctx.use for your own), and call the layers from
// forward as you would torch::nn ones. `mih scaffold --name my_port --out DIR` writes a
// complete small port (model.h: a GPT-2-style decoder with a learned position embedding of
// its own) with its spec; reference_models/llama.cpp is a larger one.
#pragma once

#include <cstdint>
#include <utility>

#include <ATen/core/Tensor.h>
#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include "harness/parallel/parallel_context.h"

namespace mih {

/// Options of ColumnParallelLinear. Example: ColumnParallelLinearOptions(H, 3 * H).partitions(3)
struct ColumnParallelLinearOptions {
  ColumnParallelLinearOptions(int64_t in_features, int64_t out_features)
      : in_features_(in_features), out_features_(out_features) {}
  /// Input features H (not sharded).
  TORCH_ARG(int64_t, in_features);
  /// Output features (sharded over tp: each rank computes out/TP of them).
  TORCH_ARG(int64_t, out_features);
  /// Add a bias (sharded like the outputs). Default true.
  TORCH_ARG(bool, bias) = true;
  /// All-gather the output over tp, [.., out/TP] -> [.., out] (padding dropped: exactly
  /// out_features). Its backward keeps this rank's slice of the gradient. Default false.
  TORCH_ARG(bool, gather_output) = false;
  /// The outputs are this many equal partitions (fused [q; k; v] = 3, [gate; up] = 2), each
  /// sharded separately so every rank gets matching pieces of each. Default 1.
  TORCH_ARG(int64_t, partitions) = 1;
  /// Standard deviation of the normal init of the weight. Default 0.02.
  TORCH_ARG(double, init_std) = 0.02;
  /// Pad out_features up to a multiple of tp (padding outputs are zero; a vocabulary head
  /// sets it). Default false.
  TORCH_ARG(bool, pad_to_tp) = false;
  /// The outputs are this many attention heads of out_features / heads features each (the k
  /// or v projection of grouped-query attention: num_key_value_heads). When tp is a multiple
  /// of them and above them, the heads are replicated over tp as vLLM replicates KV heads
  /// (num_kv_head_replicas = tp / heads): the weight [out, in] and the bias are Replicate over
  /// tp, tp rank t computes head t / (tp / heads) only (the one its query heads attend with,
  /// output [B, S, out / heads]), and their gradient, each rank's share of its head's, is
  /// partial over tp (ParamSpec::tp_partial_grad: all-reduced over tp before the optimizer).
  /// tp <= heads: sharded as usual (tp must divide them). 0: not heads (tp must divide
  /// out_features). Default 0.
  TORCH_ARG(int64_t, heads) = 0;
};

/// y = x W^T + b with W's output features split over tp (W: [out, in], Shard(0)), or, for
/// heads replicated over tp (ColumnParallelLinearOptions::heads < tp), W Replicate and this
/// rank's head's rows of it.
/// Input: [B, S, in] replicated over tp (sequence parallel: [B, S/TP, in], all-gathered).
/// Output: [B, S, out/TP] (gather_output: [B, S, out]; replicated heads: [B, S, out/heads]).
/// Throws: mih::Error{kInvalidSpec} when tp divides neither heads nor is a multiple of them
///   (with the arithmetic), or when replicated heads are asked with partitions, gather_output,
///   pad_to_tp or a tied weight.
class ColumnParallelLinearImpl : public torch::nn::Module {
 public:
  ColumnParallelLinearImpl(ParallelContext& ctx, const ColumnParallelLinearOptions& options);
  /// Uses `tied_weight` (e.g. the embedding's [V, H] table, laid out identically) instead of
  /// a weight of its own.
  ColumnParallelLinearImpl(ParallelContext& ctx, const ColumnParallelLinearOptions& options,
                           const at::Tensor& tied_weight);
  at::Tensor forward(const at::Tensor& x);
  /// The tp ranks that compute each head: tp / heads when the heads are replicated over tp,
  /// else 1.
  int64_t head_replicas() const { return head_replicas_; }
  /// The head this tp rank computes when head_replicas() > 1: tp_rank / head_replicas().
  int64_t replicated_head() const;

  at::Tensor weight, bias;
  ColumnParallelLinearOptions options;

 private:
  ParallelContext* ctx_;
  int64_t head_replicas_ = 1;
};
TORCH_MODULE(ColumnParallelLinear);

/// Options of RowParallelLinear.
struct RowParallelLinearOptions {
  RowParallelLinearOptions(int64_t in_features, int64_t out_features)
      : in_features_(in_features), out_features_(out_features) {}
  /// Input features (sharded over tp: each rank holds in/TP columns of W).
  TORCH_ARG(int64_t, in_features);
  /// Output features H (not sharded).
  TORCH_ARG(int64_t, out_features);
  /// Add a bias, once, after the reduction over tp. Default true.
  TORCH_ARG(bool, bias) = true;
  /// Standard deviation of the normal init of the weight. Default 0.02.
  TORCH_ARG(double, init_std) = 0.02;
};

/// y = x W^T + b with W's input features split over tp (W: [out, in], Shard(1)); the partial
/// products are summed over tp (sequence parallel: reduce-scattered on the sequence dim),
/// then the bias is added once.
/// Input: [B, S, in/TP]. Output: [B, S, out] (sequence parallel: [B, S/TP, out]).
class RowParallelLinearImpl : public torch::nn::Module {
 public:
  RowParallelLinearImpl(ParallelContext& ctx, const RowParallelLinearOptions& options);
  at::Tensor forward(const at::Tensor& x);

  at::Tensor weight, bias;
  RowParallelLinearOptions options;

 private:
  ParallelContext* ctx_;
};
TORCH_MODULE(RowParallelLinear);

/// Token embedding with the vocabulary split over tp (table [V, H], Shard(0)); a vocabulary
/// that does not divide by tp is padded with zero rows that no token id reaches.
/// Input: ids [B, S] (int64, in [0, V)). Output: [B, S, H] (sequence parallel: [B, S/TP, H]).
class VocabParallelEmbeddingImpl : public torch::nn::Module {
 public:
  VocabParallelEmbeddingImpl(ParallelContext& ctx, int64_t vocab, int64_t hidden, double init_std = 0.02);
  at::Tensor forward(const at::Tensor& ids);

  at::Tensor weight;
  int64_t vocab, hidden;

 private:
  ParallelContext* ctx_;
};
TORCH_MODULE(VocabParallelEmbedding);

/// RMSNorm (Zhang & Sennrich 2019): x * rsqrt(mean(x^2) + eps) * weight, weight [H]
/// replicated over tp. Under sequence parallelism each tp rank sees only its tokens, so the
/// weight's gradient is partial over tp and is summed there after backward.
/// Shape: [.., H] -> [.., H].
class RMSNormImpl : public torch::nn::Module {
 public:
  /// `sequence_parallel_grad`: the weight's gradient is marked partial over tp under sequence
  /// parallelism (each tp rank normalizes only its S/TP tokens), so it is all-reduced over tp
  /// before the optimizer; false only to plant fault F01 (docs/fault-catalog.md).
  RMSNormImpl(ParallelContext& ctx, int64_t hidden, double eps = 1e-6, bool sequence_parallel_grad = true);
  at::Tensor forward(const at::Tensor& x);

  at::Tensor weight;
  double eps;

 private:
  ParallelContext* ctx_;
};
TORCH_MODULE(RMSNorm);

/// RMSNorm over the head dim of every attention head, one weight [D] shared by all heads
/// (Qwen3's q_norm and k_norm, OLMo-style per-head QK norm; Megatron-Core's qk_layernorm).
/// The weight is replicated over tp but sees only this rank's heads (heads/TP of them, after
/// the column-parallel q or k projection), so its gradient is partial over tp whenever
/// tp > 1, with or without sequence parallelism (inside attention the sequence is whole): it
/// is declared so (ParamSpec::tp_partial_grad) and all-reduced over tp before the optimizer,
/// as Megatron-Core's finalize_model_grads all-reduces qk_layernorm weights over tp. A plain
/// RMSNorm here declares its gradient partial only under sequence parallelism: at tp > 1 each
/// rank would update its copy with its own heads' share (finding MIH-GRAD-002). Replicated KV
/// heads (tp > num_key_value_heads, ColumnParallelLinearOptions::heads) need it too: each tp
/// rank holds its KV head whole but backpropagates only its own query heads' share through it,
/// so a k_norm's gradient is still partial over tp (a plain RMSNorm there fails at tp 4 with
/// MIH-GRAD-002 as well).
/// Shape: [.., D] -> [.., D], e.g. [B, Hq/TP, S, D].
class HeadRMSNormImpl : public torch::nn::Module {
 public:
  HeadRMSNormImpl(ParallelContext& ctx, int64_t head_dim, double eps = 1e-6);
  /// Throws: mih::Error{kInvalidSpec} if x's last dim is not head_dim.
  at::Tensor forward(const at::Tensor& x);

  at::Tensor weight;  // [D]
  int64_t head_dim;
  double eps;

 private:
  ParallelContext* ctx_;
};
TORCH_MODULE(HeadRMSNorm);

/// LayerNorm with weight and bias [H], replicated over tp, gradients partial over tp under
/// sequence parallelism (as RMSNorm). Shape: [.., H] -> [.., H].
class LayerNormImpl : public torch::nn::Module {
 public:
  LayerNormImpl(ParallelContext& ctx, int64_t hidden, double eps = 1e-5);
  at::Tensor forward(const at::Tensor& x);

  at::Tensor weight, bias;
  double eps;

 private:
  ParallelContext* ctx_;
};
TORCH_MODULE(LayerNorm);

/// Rotary position embedding (RoFormer, Su et al. 2021), the rotate-half convention of Llama
/// (HF transformers' LlamaRotaryEmbedding): inv_freq[i] = 1 / theta^(2i / D), angle = position *
/// inv_freq. `inv_freq` [D/2] is a non-persistent buffer: rebuilt from the options, never
/// saved or loaded (reset_buffers() recomputes it). Positions are global token positions (under
/// context parallelism, the ids of this rank's tokens; never a local arange).
class RotaryEmbeddingImpl : public torch::nn::Module {
 public:
  RotaryEmbeddingImpl(ParallelContext& ctx, int64_t head_dim, double theta = 10000.0);
  /// The cos and sin tables for `positions`, computed in float64 and cast to the parameters'
  /// dtype. Shape: positions [B, S] int64 -> cos, sin [B, 1, S, D] (broadcast over heads).
  std::pair<at::Tensor, at::Tensor> forward(const at::Tensor& positions);
  /// Recomputes inv_freq from head_dim and theta.
  void reset_buffers();
  /// inv_freq[i] = 1 / theta^(2i / head_dim), computed in float64, written into `inv_freq`.
  static void fill_inv_freq(const at::Tensor& inv_freq, int64_t head_dim, double theta);

  at::Tensor inv_freq;
  int64_t head_dim;
  double theta;
};
TORCH_MODULE(RotaryEmbedding);

/// Applies the rotation: x * cos + rotate_half(x) * sin, rotate_half(x) = [-x2, x1] for
/// x = [x1, x2] halves of the head dim. Shape: x [B, H, S, D], cos/sin [B, 1, S, D] -> [B, H, S, D].
at::Tensor apply_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

/// Per-token cross entropy over logits whose vocabulary is split over tp, without gathering
/// them (Megatron-LM's vocab_parallel_cross_entropy): max, sum of exponentials and the target
/// logit are all-reduced over tp; the backward is softmax minus one-hot on the local vocab.
/// Columns at or past `vocab` (padding) are ignored. Targets equal to `ignore_index` get loss 0.
/// Shape: logits [N, V/TP] (this rank's vocab slice, padded vocab), targets [N] -> [N].
/// Throws: mih::Error{kInvalidSpec} if the shapes disagree.
at::Tensor vocab_parallel_cross_entropy(const at::Tensor& logits, const at::Tensor& targets, Communicator& tp,
                                        int64_t vocab, int64_t ignore_index = -100);

}  // namespace mih
