// A small transformer language model written against harness/parallel layers: vocab-parallel
// embedding, pre-norm decoder layers (causal multi-head attention with a fused qkv
// projection, SwiGLU MLP with a fused gate/up projection), final norm, vocab-parallel head
// and cross entropy. Plain single-device code at degree 1; the parity tests train it under
// every parallel configuration. Also the smallest complete example of a ParallelModel.
#pragma once

#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/modules/container/modulelist.h>

#include "harness/parallel/layers.h"
#include "harness/training/trainer.h"

namespace mih::testing {

struct TinyBlockOptions {
  int64_t vocab = 37;  // not divisible by 2: exercises vocab padding under tp=2
  int64_t hidden = 16;
  int64_t heads = 4;
  int64_t ffn = 24;
  int64_t layers = 2;
  bool tie_embeddings = false;
  bool layer_norm = false;  // LayerNorm instead of RMSNorm
};

class TinyDecoderLayerImpl : public torch::nn::Module {
 public:
  TinyDecoderLayerImpl(ParallelContext& ctx, const TinyBlockOptions& o) : ctx_(&ctx), o_(o) {
    MIH_CHECK(o.heads % ctx.tp_size() == 0, "heads(", o.heads, ") must divide by tp(", ctx.tp_size(), ")");
    attn_norm = register_module("attn_norm", RMSNorm(ctx, o.hidden));
    qkv = register_module("qkv", ColumnParallelLinear(ctx, ColumnParallelLinearOptions(o.hidden, 3 * o.hidden).partitions(3)));
    out = register_module("out", RowParallelLinear(ctx, RowParallelLinearOptions(o.hidden, o.hidden)));
    mlp_norm = register_module("mlp_norm", RMSNorm(ctx, o.hidden));
    gate_up = register_module("gate_up", ColumnParallelLinear(ctx, ColumnParallelLinearOptions(o.hidden, 2 * o.ffn)
                                                                       .partitions(2)
                                                                       .bias(false)));
    down = register_module("down", RowParallelLinear(ctx, RowParallelLinearOptions(o.ffn, o.hidden).bias(false)));
  }

  /// Shape: [B, S, H] (sequence parallel: [B, S/TP, H]) -> the same.
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor h = x + attention(attn_norm(x));
    at::Tensor gu = gate_up(mlp_norm(h));  // [B, S, 2F/TP] = [gate | up] of this rank
    auto parts = gu.chunk(2, -1);
    return h + down(at::silu(parts[0]) * parts[1]);
  }

  RMSNorm attn_norm{nullptr}, mlp_norm{nullptr};
  ColumnParallelLinear qkv{nullptr}, gate_up{nullptr};
  RowParallelLinear out{nullptr}, down{nullptr};

 private:
  at::Tensor attention(const at::Tensor& x) {
    at::Tensor fused = qkv(x);  // [B, S, 3H/TP]
    const int64_t b = fused.size(0), s = fused.size(1);
    const int64_t local_heads = o_.heads / ctx_->tp_size(), head_dim = o_.hidden / o_.heads;
    auto qkv_parts = fused.chunk(3, -1);
    auto heads = [&](const at::Tensor& t) { return t.reshape({b, s, local_heads, head_dim}).transpose(1, 2); };
    at::Tensor q = heads(qkv_parts[0]), k = heads(qkv_parts[1]), v = heads(qkv_parts[2]);
    at::Tensor scores = at::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(head_dim));
    at::Tensor future = at::ones({s, s}, at::TensorOptions().dtype(at::kBool).device(x.device())).triu(1);
    scores = scores.masked_fill(future, -std::numeric_limits<double>::infinity());
    at::Tensor context = at::matmul(at::softmax(scores, -1), v).transpose(1, 2).reshape({b, s, local_heads * head_dim});
    return out(context);
  }

  ParallelContext* ctx_;
  TinyBlockOptions o_;
};
TORCH_MODULE(TinyDecoderLayer);

class TinyBlockLM : public ParallelModel {
 public:
  TinyBlockLM(ParallelContext& ctx, const TinyBlockOptions& o) : ctx_(&ctx), o_(o) {
    embed = register_module("embed", VocabParallelEmbedding(ctx, o.vocab, o.hidden));
    layers = register_module("layers", torch::nn::ModuleList());
    for (int64_t i = 0; i < o.layers; ++i) layers->push_back(TinyDecoderLayer(ctx, o));
    final_norm = register_module("final_norm", RMSNorm(ctx, o.hidden));
    auto head_options = ColumnParallelLinearOptions(o.hidden, o.vocab).bias(false).pad_to_tp(true);
    head = o.tie_embeddings ? ColumnParallelLinear(ctx, head_options, embed->weight) : ColumnParallelLinear(ctx, head_options);
    register_module("head", head);
  }

  at::Tensor token_losses(const Batch& batch) override {
    at::Tensor x = embed(batch.input_ids);
    for (size_t i = 0; i < layers->size(); ++i) {
      // Each layer is an FSDP unit: its parameters are freed after its forward and gathered
      // again for its backward.
      auto* layer = layers[i]->as<TinyDecoderLayer>();
      x = ctx_->fsdp_forward("layers." + std::to_string(i), [&] { return layer->forward(x); });
    }
    at::Tensor logits = head(final_norm(x));  // [B, S, V/TP], the sequence gathered
    at::Tensor losses = vocab_parallel_cross_entropy(logits.reshape({-1, logits.size(-1)}), batch.labels.reshape(-1),
                                                     ctx_->tp(), o_.vocab);
    return losses.view_as(batch.labels);
  }

  /// Each decoder layer is an FSDP unit, and the root (embedding, final norm, head) another.
  void apply_fsdp(ParallelContext& ctx) override {
    for (size_t i = 0; i < layers->size(); ++i) ctx.fully_shard(*layers[i], "layers." + std::to_string(i));
    ctx.fully_shard(*this, "root");
  }

  VocabParallelEmbedding embed{nullptr};
  torch::nn::ModuleList layers{nullptr};
  RMSNorm final_norm{nullptr};
  ColumnParallelLinear head{nullptr};

 private:
  ParallelContext* ctx_;
  TinyBlockOptions o_;
};

inline ModelFactory tiny_block_factory(TinyBlockOptions o = {}) {
  return [o](ParallelContext& ctx) { return std::make_shared<TinyBlockLM>(ctx, o); };
}

/// Global batches of `batch` x `seq` tokens from a fixed generator: labels are the next
/// token, the last position and a row-dependent number of leading positions ignored (-100),
/// so data-parallel ranks hold different numbers of valid targets.
inline BatchSource tiny_batches(int64_t batch, int64_t seq, int64_t vocab, uint64_t seed = 1234) {
  return [=](int64_t step) {
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed + static_cast<uint64_t>(step));
    at::Tensor tokens = at::randint(vocab, {batch, seq + 1}, gen, at::kLong);
    Batch b;
    b.input_ids = tokens.narrow(1, 0, seq).contiguous();
    b.labels = tokens.narrow(1, 1, seq).contiguous();
    for (int64_t r = 0; r < batch; ++r) {
      const int64_t masked = (r * 3 + step) % (seq / 2);
      if (masked > 0) b.labels[r].narrow(0, 0, masked).fill_(-100);
    }
    return b;
  };
}

}  // namespace mih::testing
