// The model port of my_port: a tiny GPT-2-style decoder (learned positions, LayerNorm with
// bias, fused q/k/v attention, a GELU MLP, an untied head) written against mih's harness
// layers (harness/parallel/layers.h), so it trains unchanged under data parallelism, FSDP,
// tensor and sequence parallelism, context parallelism and activation checkpointing. Written
// by `mih scaffold`: replace it with your model, keeping every parameter made by the
// ParallelContext (the layers do it; PositionEmbedding below shows how for a layer of your own).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <torch/nn/modules/container/modulelist.h>

#include "harness/base/error.h"
#include "harness/parallel/context_parallel.h"
#include "harness/parallel/layers.h"
#include "harness/training/trainer.h"

namespace my_port {

/// The port's sizes, by Hugging Face GPT2Config's names; tiny, so the conformance matrix
/// trains in seconds.
struct Options {
  int64_t vocab_size = 37;  // odd: the embedding and the head pad it to a multiple of tp
  int64_t n_positions = 32;  // rows of the learned position embedding (>= the sequence length)
  int64_t n_embd = 16;
  int64_t n_head = 2;   // tp must divide it: each tp rank holds whole heads
  int64_t n_inner = 64;  // the MLP's width; tp must divide it
  int64_t n_layer = 2;
  double layer_norm_epsilon = 1e-5;
  double initializer_range = 0.02;
};

/// GPT-2's learned position embedding, weight [n_positions, n_embd], replicated over tp: a
/// layer of the port's own, its parameter made by ctx.make_parameter and read through
/// ctx.use (FSDP gathers it there). Shape: positions [B, s] (int64) -> [B, s, n_embd].
class PositionEmbeddingImpl : public torch::nn::Module {
 public:
  PositionEmbeddingImpl(mih::ParallelContext& ctx, const Options& o) : ctx_(&ctx) {
    mih::ParamSpec spec;
    spec.shape = {o.n_positions, o.n_embd};
    spec.init = mih::init::normal(0.01);
    // Under sequence parallelism each tp rank looks up only its own tokens' positions, so its
    // gradient is a partial sum over tp, which the harness then sums over tp.
    spec.tp_partial_grad = ctx.sequence_parallel();
    weight = register_parameter("weight", ctx.make_parameter(spec));
  }
  at::Tensor forward(const at::Tensor& positions) { return at::embedding(ctx_->use(weight), positions); }

  at::Tensor weight;

 private:
  mih::ParallelContext* ctx_;
};
TORCH_MODULE(PositionEmbedding);

/// GPT-2's causal self-attention: a fused [q; k; v] column-parallel projection (each of q, k
/// and v split over tp by heads), attention over the whole sequence under context parallelism
/// (mih::cp_causal_attention: K and V all-gathered over cp, the causal mask in global token
/// ids), then the row-parallel output projection.
/// Shape: [B, S, n_embd] (sequence parallel: [B, S/TP, n_embd]) -> the same.
class AttentionImpl : public torch::nn::Module {
 public:
  AttentionImpl(mih::ParallelContext& ctx, const Options& o) : ctx_(&ctx), o_(o) {
    c_attn = register_module("c_attn", mih::ColumnParallelLinear(ctx, mih::ColumnParallelLinearOptions(o.n_embd, 3 * o.n_embd)
                                                                          .partitions(3)
                                                                          .init_std(o.initializer_range)));
    c_proj = register_module("c_proj", mih::RowParallelLinear(ctx, mih::RowParallelLinearOptions(o.n_embd, o.n_embd)
                                                                       .init_std(o.initializer_range)));
  }

  at::Tensor forward(const at::Tensor& x) {
    const int64_t heads = o_.n_head / ctx_->tp_size(), head_dim = o_.n_embd / o_.n_head;
    // This rank's q, k and v heads, [B, S, heads * head_dim] each (under sequence parallelism
    // c_attn all-gathers the sequence first).
    const std::vector<at::Tensor> qkv = c_attn(x).chunk(3, -1);
    const int64_t b = qkv[0].size(0), s = qkv[0].size(1);
    auto split_heads = [&](const at::Tensor& t) { return t.reshape({b, s, heads, head_dim}).transpose(1, 2); };
    at::Tensor y = mih::cp_causal_attention(split_heads(qkv[0]), split_heads(qkv[1]), split_heads(qkv[2]),
                                            ctx_->cp_shard());
    y = y.transpose(1, 2).reshape({b, s, heads * head_dim});  // split over tp by heads
    return c_proj(y);                                        // summed over tp
  }

  mih::ColumnParallelLinear c_attn{nullptr};
  mih::RowParallelLinear c_proj{nullptr};

 private:
  mih::ParallelContext* ctx_;
  Options o_;
};
TORCH_MODULE(Attention);

/// GPT-2's MLP: column-parallel c_fc, GELU (tanh approximation: GPT-2's gelu_new), row-parallel
/// c_proj. Shape: [B, S, n_embd] (sequence parallel: [B, S/TP, n_embd]) -> the same.
class MlpImpl : public torch::nn::Module {
 public:
  MlpImpl(mih::ParallelContext& ctx, const Options& o) {
    c_fc = register_module("c_fc", mih::ColumnParallelLinear(ctx, mih::ColumnParallelLinearOptions(o.n_embd, o.n_inner)
                                                                      .init_std(o.initializer_range)));
    c_proj = register_module("c_proj", mih::RowParallelLinear(ctx, mih::RowParallelLinearOptions(o.n_inner, o.n_embd)
                                                                       .init_std(o.initializer_range)));
  }
  at::Tensor forward(const at::Tensor& x) { return c_proj(at::gelu(c_fc(x), "tanh")); }

  mih::ColumnParallelLinear c_fc{nullptr};
  mih::RowParallelLinear c_proj{nullptr};
};
TORCH_MODULE(Mlp);

/// One pre-norm decoder block: x + attn(ln_1(x)), then + mlp(ln_2(.)). Each module's output is
/// declared to the activation probes (ctx.observe, with its layout), so a parity failure names
/// the first module whose output diverges; keep the calls in your own modules (without them
/// mih can blame no module, only the loss, and says so).
class BlockImpl : public torch::nn::Module {
 public:
  BlockImpl(mih::ParallelContext& ctx, const Options& o) : ctx_(&ctx) {
    ln_1 = register_module("ln_1", mih::LayerNorm(ctx, o.n_embd, o.layer_norm_epsilon));
    attn = register_module("attn", Attention(ctx, o));
    ln_2 = register_module("ln_2", mih::LayerNorm(ctx, o.n_embd, o.layer_norm_epsilon));
    mlp = register_module("mlp", Mlp(ctx, o));
  }

  at::Tensor forward(const at::Tensor& x) {
    // The residual stream: replicated over tp, or this tp rank's tokens under sequence parallelism.
    const mih::ActivationLayout residual = mih::ActivationLayout::residual(*ctx_);
    const at::Tensor h = x + ctx_->observe(*attn, attn(ctx_->observe(*ln_1, ln_1(x), residual)), residual);
    const at::Tensor out = h + ctx_->observe(*mlp, mlp(ctx_->observe(*ln_2, ln_2(h), residual)), residual);
    return ctx_->observe(*this, out, residual);
  }

  mih::LayerNorm ln_1{nullptr}, ln_2{nullptr};
  Attention attn{nullptr};
  Mlp mlp{nullptr};

 private:
  mih::ParallelContext* ctx_;
};
TORCH_MODULE(Block);

/// The language model: token and position embeddings, n_layer blocks, the final LayerNorm and
/// a vocab-parallel head with its cross entropy (the logits are never gathered over tp).
class Model : public mih::ParallelModel {
 public:
  Model(mih::ParallelContext& ctx, const Options& o) : ctx_(&ctx), o_(o) {
    MIH_CHECK(o.n_embd % o.n_head == 0, "my_port: n_embd(", o.n_embd, ") must divide by n_head(", o.n_head, ")");
    MIH_CHECK(o.n_head % ctx.tp_size() == 0 && o.n_inner % ctx.tp_size() == 0, "my_port: tp(", ctx.tp_size(),
              ") must divide n_head(", o.n_head, ") and n_inner(", o.n_inner, "): each tp rank holds whole heads");
    wte = register_module("wte", mih::VocabParallelEmbedding(ctx, o.vocab_size, o.n_embd, o.initializer_range));
    wpe = register_module("wpe", PositionEmbedding(ctx, o));
    h = register_module("h", torch::nn::ModuleList());
    for (int64_t i = 0; i < o.n_layer; ++i) h->push_back(Block(ctx, o));
    ln_f = register_module("ln_f", mih::LayerNorm(ctx, o.n_embd, o.layer_norm_epsilon));
    lm_head = register_module("lm_head", mih::ColumnParallelLinear(ctx, mih::ColumnParallelLinearOptions(o.n_embd, o.vocab_size)
                                                                            .bias(false)
                                                                            .pad_to_tp(true)
                                                                            .init_std(o.initializer_range)));
  }

  /// Shape: batch [B, S/CP] -> logits [B, S/CP, vocab/TP] (this tp rank's slice of the padded
  /// vocabulary).
  at::Tensor logits(const mih::Batch& batch) override {
    const mih::ActivationLayout residual = mih::ActivationLayout::residual(*ctx_);
    // Under sequence parallelism the embedding leaves this tp rank a contiguous chunk of its
    // tokens ([B, S/(CP*TP), n_embd]); the positions of the same tokens are the same chunk of
    // position_ids (the Trainer gives global positions, already split over cp).
    at::Tensor x = ctx_->observe(*wte, wte(batch.input_ids), residual);
    const at::Tensor positions = ctx_->sequence_parallel_chunk(batch.position_ids, 1);
    x = x + ctx_->observe(*wpe, wpe(positions), residual);
    for (size_t i = 0; i < h->size(); ++i) {
      // Each block is an FSDP unit (gathered for its forward, resharded after) and an
      // activation-checkpoint region (recomputed in backward when the case turns it on).
      const std::string name = "h." + std::to_string(i);
      auto block = h[i]->as<BlockImpl>();
      x = ctx_->fsdp_forward(name, [&] {
        return ctx_->checkpoint_region(
            name, [block](const std::vector<at::Tensor>& in) { return block->forward(in[0]); }, {x},
            block->parameters());
      });
    }
    x = ctx_->observe(*ln_f, ln_f(x), residual);
    return ctx_->observe(*lm_head, lm_head(x), mih::ActivationLayout::column_parallel(o_.vocab_size));
  }

  /// Shape: batch [B, S/CP] -> per-token losses [B, S/CP] (0 where labels are -100),
  /// replicated over tp.
  at::Tensor token_losses(const mih::Batch& batch) override {
    const at::Tensor l = logits(batch);
    return mih::vocab_parallel_cross_entropy(l.reshape({-1, l.size(-1)}), batch.labels.reshape(-1), ctx_->tp_group(),
                                             o_.vocab_size)
        .view_as(batch.labels);
  }

  /// FSDP units: each block, then the rest (the root), as TorchTitan shards a transformer.
  void apply_fsdp(mih::ParallelContext& ctx) override {
    for (size_t i = 0; i < h->size(); ++i) ctx.fully_shard(*h[i], "h." + std::to_string(i));
    ctx.fully_shard(*this, "root");
  }

  mih::VocabParallelEmbedding wte{nullptr};
  PositionEmbedding wpe{nullptr};
  torch::nn::ModuleList h{nullptr};
  mih::LayerNorm ln_f{nullptr};
  mih::ColumnParallelLinear lm_head{nullptr};

 private:
  mih::ParallelContext* ctx_;
  Options o_;
};

inline mih::ModelFactory make_model(Options o = {}) {
  return [o](mih::ParallelContext& ctx) { return std::make_shared<Model>(ctx, o); };
}

}  // namespace my_port
