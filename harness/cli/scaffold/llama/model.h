// The model port of my_port: a tiny Llama-style decoder (Hugging Face LlamaForCausalLM's
// layout and names: grouped-query attention with rotary positions over halves at the config's
// rope_theta, RMSNorm, a SwiGLU MLP, a head of its own or tied to the token embedding) written
// against mih's harness layers (harness/parallel/layers.h), so it trains unchanged under data
// parallelism, FSDP, tensor and sequence parallelism (the KV heads replicated where tp exceeds
// them), context parallelism, pipeline stages and activation checkpointing. Written by
// `mih scaffold --template llama`: replace it with your model, keeping every parameter made by
// the ParallelContext (the layers do it).
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "harness/base/error.h"
#include "harness/parallel/context_parallel.h"
#include "harness/parallel/layers.h"
#include "harness/training/trainer.h"

namespace my_port {

/// The port's sizes, by Hugging Face LlamaConfig's names; tiny, so the conformance matrix
/// trains in seconds.
struct Options {
  int64_t vocab_size = 37;  // odd: the embedding and the head pad it to a multiple of tp
  int64_t hidden_size = 32;
  int64_t intermediate_size = 48;  // SwiGLU's width; tp must divide it
  int64_t num_hidden_layers = 2;   // the pipeline stages split them (pp must divide them)
  int64_t num_attention_heads = 4;  // tp must divide it: each tp rank holds whole query heads
  // Grouped-query attention: each KV head serves num_attention_heads / num_key_value_heads
  // query heads. tp divides it, or is a multiple of it (each KV head replicated over tp ranks).
  int64_t num_key_value_heads = 2;
  double rope_theta = 500000.0;  // Llama 3's; the rotary table must use the config's, not 10000
  double rms_norm_eps = 1e-5;
  bool tie_word_embeddings = false;  // true: lm_head reuses embed_tokens' table
  double initializer_range = 0.02;

  int64_t head_dim() const { return hidden_size / num_attention_heads; }
};

/// Grouped-query self-attention: q over the query heads, k and v over the KV heads (each tp
/// rank's KV heads, or the one it attends with when tp exceeds them), rotary positions on q and
/// k, attention over the whole sequence under context parallelism (mih::cp_causal_attention:
/// K and V all-gathered over cp, the causal mask in global token ids), then the row-parallel
/// output projection. Shape: x [B, S, H] (sequence parallel: [B, S/TP, H]), cos/sin
/// [B, 1, S, D] -> like x.
class AttentionImpl : public torch::nn::Module {
 public:
  AttentionImpl(mih::ParallelContext& ctx, const Options& o) : ctx_(&ctx), o_(o) {
    const int64_t h = o.hidden_size, d = o.head_dim();
    auto column = [&](int64_t out) {
      return mih::ColumnParallelLinearOptions(h, out).bias(false).init_std(o.initializer_range);
    };
    q_proj = register_module("q_proj", mih::ColumnParallelLinear(ctx, column(o.num_attention_heads * d)));
    // .heads(): k and v are heads, replicated over tp when tp is above them (as vLLM does).
    k_proj = register_module("k_proj", mih::ColumnParallelLinear(ctx, column(o.num_key_value_heads * d)
                                                                          .heads(o.num_key_value_heads)));
    v_proj = register_module("v_proj", mih::ColumnParallelLinear(ctx, column(o.num_key_value_heads * d)
                                                                          .heads(o.num_key_value_heads)));
    o_proj = register_module("o_proj", mih::RowParallelLinear(ctx, mih::RowParallelLinearOptions(o.num_attention_heads * d, h)
                                                                       .bias(false)
                                                                       .init_std(o.initializer_range)));
  }

  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
    const int64_t d = o_.head_dim(), tp = ctx_->tp_size();
    const int64_t heads = o_.num_attention_heads / tp, kv_heads = std::max<int64_t>(o_.num_key_value_heads / tp, 1);
    const at::Tensor q = q_proj(x);  // [B, S, heads * D], the sequence gathered under sequence parallelism
    const int64_t b = q.size(0), s = q.size(1);
    auto split_heads = [&](const at::Tensor& t, int64_t n) { return t.reshape({b, s, n, d}).transpose(1, 2); };
    // Rotary over halves (rotate_half, Hugging Face's apply_rotary_pos_emb) on q and k only.
    const at::Tensor qh = mih::apply_rotary(split_heads(q, heads), cos, sin);
    const at::Tensor kh = mih::apply_rotary(split_heads(k_proj(x), kv_heads), cos, sin);
    at::Tensor y = mih::cp_causal_attention(qh, kh, split_heads(v_proj(x), kv_heads), ctx_->cp_shard());
    y = y.transpose(1, 2).reshape({b, s, heads * d});  // split over tp by heads
    return o_proj(y);                                  // summed over tp
  }

  mih::ColumnParallelLinear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr};
  mih::RowParallelLinear o_proj{nullptr};

 private:
  mih::ParallelContext* ctx_;
  Options o_;
};
TORCH_MODULE(Attention);

/// The SwiGLU MLP (Shazeer 2020): down(silu(gate(x)) * up(x)), gate and up column-parallel
/// (each tp rank holds matching slices of both), down row-parallel.
/// Shape: [B, S, H] (sequence parallel: [B, S/TP, H]) -> the same.
class MlpImpl : public torch::nn::Module {
 public:
  MlpImpl(mih::ParallelContext& ctx, const Options& o) {
    auto column = mih::ColumnParallelLinearOptions(o.hidden_size, o.intermediate_size).bias(false).init_std(o.initializer_range);
    gate_proj = register_module("gate_proj", mih::ColumnParallelLinear(ctx, column));
    up_proj = register_module("up_proj", mih::ColumnParallelLinear(ctx, column));
    down_proj = register_module("down_proj", mih::RowParallelLinear(ctx, mih::RowParallelLinearOptions(o.intermediate_size, o.hidden_size)
                                                                             .bias(false)
                                                                             .init_std(o.initializer_range)));
  }
  at::Tensor forward(const at::Tensor& x) { return down_proj(at::silu(gate_proj(x)) * up_proj(x)); }

  mih::ColumnParallelLinear gate_proj{nullptr}, up_proj{nullptr};
  mih::RowParallelLinear down_proj{nullptr};
};
TORCH_MODULE(Mlp);

/// One pre-norm decoder layer: h = x + attn(norm(x)), then h + mlp(norm(h)). Each module's
/// output is declared to the activation probes (ctx.observe, with its layout), so a parity
/// failure names the first module whose output diverges; keep the calls in your own modules.
class DecoderLayerImpl : public torch::nn::Module {
 public:
  DecoderLayerImpl(mih::ParallelContext& ctx, const Options& o) : ctx_(&ctx) {
    input_layernorm = register_module("input_layernorm", mih::RMSNorm(ctx, o.hidden_size, o.rms_norm_eps));
    self_attn = register_module("self_attn", Attention(ctx, o));
    post_attention_layernorm = register_module("post_attention_layernorm", mih::RMSNorm(ctx, o.hidden_size, o.rms_norm_eps));
    mlp = register_module("mlp", Mlp(ctx, o));
  }

  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
    // The residual stream: replicated over tp, or this tp rank's tokens under sequence parallelism.
    const mih::ActivationLayout residual = mih::ActivationLayout::residual(*ctx_);
    const at::Tensor attn_in = ctx_->observe(*input_layernorm, input_layernorm(x), residual);
    const at::Tensor h = x + ctx_->observe(*self_attn, self_attn(attn_in, cos, sin), residual);
    const at::Tensor mlp_in = ctx_->observe(*post_attention_layernorm, post_attention_layernorm(h), residual);
    return ctx_->observe(*this, h + ctx_->observe(*mlp, mlp(mlp_in), residual), residual);
  }

  mih::RMSNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
  Attention self_attn{nullptr};
  Mlp mlp{nullptr};

 private:
  mih::ParallelContext* ctx_;
};
TORCH_MODULE(DecoderLayer);

/// The causal language model: embed_tokens, rotary_emb (its inv_freq a non-persistent
/// buffer), the decoder layers, the final norm and a vocab-parallel head with its cross
/// entropy (the logits are never gathered over tp). FQNs are Hugging Face's without "model."
/// (embed_tokens.weight, layers.0.self_attn.q_proj.weight, ..., lm_head.weight). Under pipeline
/// parallelism a rank builds only its stages: embed_tokens on the first (and on the last as the
/// head's table when tied), norm and lm_head on the last, and its layers.
class Model : public mih::ParallelModel {
 public:
  Model(mih::ParallelContext& ctx, const Options& o) : ctx_(&ctx), o_(o) {
    check_sizes(ctx, o);
    // This rank's stages (one stage holding every layer without pp). The modules of other
    // stages are built under skip_parameters(), so every parameter keeps the initial value it
    // has in the unsplit model.
    stages_ = ctx.pipeline_stages(o.num_hidden_layers);
    const bool first = stages_.front().first, last = stages_.back().last;
    {
      std::optional<mih::ParallelContext::SkipParameters> skip;
      if (!first && !(last && o.tie_word_embeddings)) skip.emplace(ctx);
      auto built = mih::VocabParallelEmbedding(ctx, o.vocab_size, o.hidden_size, o.initializer_range);
      if (!skip) embed_tokens = register_module("embed_tokens", built);
    }
    rotary_emb = register_module("rotary_emb", mih::RotaryEmbedding(ctx, o.head_dim(), o.rope_theta));
    layers = register_module("layers", std::make_shared<torch::nn::Module>());
    for (int64_t i = 0; i < o.num_hidden_layers; ++i) {
      if (stage_of(i) == nullptr) {
        auto skip = ctx.skip_parameters();
        DecoderLayer(ctx, o);
        continue;
      }
      decoder_layers.emplace(i, DecoderLayer(ctx, o));
      layers->register_module(std::to_string(i), decoder_layers.at(i));
    }
    std::optional<mih::ParallelContext::SkipParameters> skip;
    if (!last) skip.emplace(ctx);
    auto built_norm = mih::RMSNorm(ctx, o.hidden_size, o.rms_norm_eps);
    auto head = mih::ColumnParallelLinearOptions(o.hidden_size, o.vocab_size).bias(false).pad_to_tp(true).init_std(o.initializer_range);
    mih::ColumnParallelLinear built_head{nullptr};
    if (!o.tie_word_embeddings) {
      built_head = mih::ColumnParallelLinear(ctx, head);
    } else if (embed_tokens) {
      built_head = mih::ColumnParallelLinear(ctx, head, embed_tokens->weight);  // one parameter, two names
    }
    if (skip) return;  // not the last stage
    norm = register_module("norm", built_norm);
    lm_head = register_module("lm_head", built_head);
  }

  /// Shape: batch [B, S/CP] -> logits [B, S/CP, vocab/TP] (this tp rank's slice of the padded
  /// vocabulary). Without pp only.
  at::Tensor logits(const mih::Batch& batch) override {
    MIH_CHECK(stages_.size() == 1 && stages_[0].first && stages_[0].last, "my_port: logits() on pipeline stage ",
              stages_[0].stage, ", which holds part of the model; a pipelined run calls stage_forward");
    return head_logits(run_layers(embed(batch), batch, 0, o_.num_hidden_layers));
  }

  /// Shape: batch [B, S/CP] -> per-token losses [B, S/CP] (0 where labels are -100),
  /// replicated over tp.
  at::Tensor token_losses(const mih::Batch& batch) override { return losses(logits(batch), batch); }

  /// Pipeline parallelism: stage `stage`'s layers over `input` (the first stage: over the
  /// embeddings of micro_batch); the last stage also runs the norm, the head and the loss.
  /// Shape: [b, s, H] -> [b, s, H], or per-token losses [b, s] on the last stage.
  at::Tensor stage_forward(int stage, const at::Tensor& input, const mih::Batch& micro_batch) override {
    auto s = std::find_if(stages_.begin(), stages_.end(), [&](const mih::PipelineStage& st) { return st.stage == stage; });
    MIH_CHECK(s != stages_.end(), "my_port: pipeline stage ", stage, " is not on this rank");
    const at::Tensor x = run_layers(s->first ? embed(micro_batch) : input, micro_batch, s->first_layer, s->last_layer);
    return s->last ? losses(head_logits(x), micro_batch) : x;
  }

  /// What a later stage receives: [b, s, H] ([b, s/TP, H] under sequence parallelism).
  at::Tensor stage_input(int /*stage*/, const mih::Batch& micro_batch) override {
    const int64_t seq = micro_batch.input_ids.size(1) / (ctx_->sequence_parallel() ? ctx_->tp_size() : 1);
    return at::empty({micro_batch.input_ids.size(0), seq, o_.hidden_size},
                     at::TensorOptions().dtype(ctx_->param_dtype()).device(ctx_->device()));
  }

  /// FSDP units: each decoder layer, then the rest (the root), as TorchTitan shards a transformer.
  void apply_fsdp(mih::ParallelContext& ctx) override {
    for (auto& [i, layer] : decoder_layers) ctx.fully_shard(*layer, "layers." + std::to_string(i));
    ctx.fully_shard(*this, "root");
  }

  mih::VocabParallelEmbedding embed_tokens{nullptr};
  mih::RotaryEmbedding rotary_emb{nullptr};
  std::shared_ptr<torch::nn::Module> layers;  // this rank's layers, under their global index
  std::map<int64_t, DecoderLayer> decoder_layers;
  mih::RMSNorm norm{nullptr};
  mih::ColumnParallelLinear lm_head{nullptr};

 private:
  static void check_sizes(const mih::ParallelContext& ctx, const Options& o) {
    const int64_t tp = ctx.tp_size();
    MIH_CHECK(o.hidden_size % o.num_attention_heads == 0 && o.head_dim() % 2 == 0, "my_port: hidden_size(",
              o.hidden_size, ") / num_attention_heads(", o.num_attention_heads, ") must be an even head_dim (rotary)");
    MIH_CHECK(o.num_attention_heads % o.num_key_value_heads == 0, "my_port: num_attention_heads(", o.num_attention_heads,
              ") must be a multiple of num_key_value_heads(", o.num_key_value_heads, ")");
    MIH_CHECK(o.num_attention_heads % tp == 0 && o.intermediate_size % tp == 0, "my_port: tp(", tp,
              ") must divide num_attention_heads(", o.num_attention_heads, ") and intermediate_size(",
              o.intermediate_size, "): each tp rank holds whole query heads");
    MIH_CHECK(o.num_key_value_heads % tp == 0 || tp % o.num_key_value_heads == 0, "my_port: tp(", tp,
              ") must divide num_key_value_heads(", o.num_key_value_heads, ") or be a multiple of it");
  }

  // The stage of this rank that holds layer i, or nullptr.
  const mih::PipelineStage* stage_of(int64_t i) const {
    auto s = std::find_if(stages_.begin(), stages_.end(),
                          [&](const mih::PipelineStage& st) { return i >= st.first_layer && i < st.last_layer; });
    return s == stages_.end() ? nullptr : &*s;
  }

  at::Tensor embed(const mih::Batch& batch) {
    return ctx_->observe(*embed_tokens, embed_tokens(batch.input_ids), mih::ActivationLayout::residual(*ctx_));
  }

  // Layers [first, last) over x. The rotary table is computed once per forward for the global
  // positions of this rank's tokens (the Trainer's position_ids, already split over cp) and
  // published as shared state every layer consumes; each layer gets it as an input of its
  // checkpoint region, so a recompute sees this forward's table.
  at::Tensor run_layers(at::Tensor x, const mih::Batch& batch, int64_t first, int64_t last) {
    mih::SharedState& shared = ctx_->shared_state();
    {
      auto [cos, sin] = rotary_emb(batch.position_ids);
      shared.publish("rotary.cos", cos, "rotary_emb");
      shared.publish("rotary.sin", sin, "rotary_emb");
    }
    for (int64_t i = first; i < last; ++i) {
      // Each layer is an FSDP unit (gathered for its forward, resharded after) and an
      // activation-checkpoint region (recomputed in backward when the case turns it on).
      const std::string name = "layers." + std::to_string(i);
      const at::Tensor cos = shared.consume("rotary.cos", name), sin = shared.consume("rotary.sin", name);
      auto layer = decoder_layers.at(i).ptr();
      x = ctx_->fsdp_forward(name, [&] {
        return ctx_->checkpoint_region(
            name, [layer](const std::vector<at::Tensor>& in) { return layer->forward(in[0], in[1], in[2]); },
            {x, cos, sin}, layer->parameters());
      });
    }
    return x;
  }

  at::Tensor head_logits(const at::Tensor& x) {
    const at::Tensor normed = ctx_->observe(*norm, norm(x), mih::ActivationLayout::residual(*ctx_));
    return ctx_->observe(*lm_head, lm_head(normed), mih::ActivationLayout::column_parallel(o_.vocab_size));
  }

  at::Tensor losses(const at::Tensor& l, const mih::Batch& batch) {
    return mih::vocab_parallel_cross_entropy(l.reshape({-1, l.size(-1)}), batch.labels.reshape(-1), ctx_->tp_group(),
                                             o_.vocab_size)
        .view_as(batch.labels);
  }

  mih::ParallelContext* ctx_;
  Options o_;
  std::vector<mih::PipelineStage> stages_;
};

inline mih::ModelFactory make_model(Options o = {}) {
  return [o](mih::ParallelContext& ctx) { return std::make_shared<Model>(ctx, o); };
}

}  // namespace my_port
