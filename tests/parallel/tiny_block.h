// A small transformer language model written against harness/parallel layers: vocab-parallel
// embedding, rotary positions, pre-norm decoder layers (causal grouped-query attention over a
// context-parallel sequence, SwiGLU MLP with a fused gate/up projection, optional dropout),
// each an activation-checkpoint region and an FSDP unit, final norm, vocab-parallel head and
// cross entropy. Plain single-device code at degree 1; the parity tests train it under
// every parallel configuration. Also the smallest complete example of a ParallelModel.
#pragma once

#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <optional>
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
  int64_t kv_heads = 4;  // < heads: grouped-query attention
  int64_t ffn = 24;
  int64_t layers = 2;
  bool tie_embeddings = false;
  bool layer_norm = false;  // LayerNorm instead of RMSNorm
  double dropout = 0.0;     // on the attention context and on each residual branch
};

class TinyDecoderLayerImpl : public torch::nn::Module {
 public:
  TinyDecoderLayerImpl(ParallelContext& ctx, const TinyBlockOptions& o) : ctx_(&ctx), o_(o) {
    MIH_CHECK(o.kv_heads % ctx.tp_size() == 0, "kv_heads(", o.kv_heads, ") must divide by tp(", ctx.tp_size(), ")");
    MIH_CHECK(o.heads % o.kv_heads == 0, "heads(", o.heads, ") must be a multiple of kv_heads(", o.kv_heads, ")");
    const int64_t head_dim = o.hidden / o.heads;
    attn_norm = register_module("attn_norm", RMSNorm(ctx, o.hidden));
    q = register_module("q", ColumnParallelLinear(ctx, ColumnParallelLinearOptions(o.hidden, o.hidden)));
    kv = register_module("kv", ColumnParallelLinear(ctx, ColumnParallelLinearOptions(o.hidden, 2 * o.kv_heads * head_dim)
                                                             .partitions(2)));
    out = register_module("out", RowParallelLinear(ctx, RowParallelLinearOptions(o.hidden, o.hidden)));
    mlp_norm = register_module("mlp_norm", RMSNorm(ctx, o.hidden));
    gate_up = register_module("gate_up", ColumnParallelLinear(ctx, ColumnParallelLinearOptions(o.hidden, 2 * o.ffn)
                                                                       .partitions(2)
                                                                       .bias(false)));
    down = register_module("down", RowParallelLinear(ctx, RowParallelLinearOptions(o.ffn, o.hidden).bias(false)));
  }

  /// Shape: x [B, S/CP, H] (sequence parallel: [B, S/(CP*TP), H]), cos/sin [B, 1, S/CP, D]
  /// -> like x.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
    // Residual branches are [B, S/CP, H], replicated over tp unless sequence parallel.
    const ActivationLayout residual = ActivationLayout::residual(*ctx_);
    at::Tensor h = x + ctx_->dropout(attention(attn_norm(x), cos, sin), o_.dropout, is_training(), residual);
    at::Tensor gu = gate_up(mlp_norm(h));  // [B, S, 2F/TP] = [gate | up] of this rank
    auto parts = gu.chunk(2, -1);
    return h + ctx_->dropout(down(at::silu(parts[0]) * parts[1]), o_.dropout, is_training(), residual);
  }

  RMSNorm attn_norm{nullptr}, mlp_norm{nullptr};
  ColumnParallelLinear q{nullptr}, kv{nullptr}, gate_up{nullptr};
  RowParallelLinear out{nullptr}, down{nullptr};

 private:
  at::Tensor attention(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
    at::Tensor queries = q(x);  // [B, S/CP, Hq/TP * D]
    at::Tensor keys_values = kv(x);  // [B, S/CP, 2 * Hkv/TP * D] = [k | v] of this rank
    const int64_t b = queries.size(0), s = queries.size(1), head_dim = o_.hidden / o_.heads;
    const int64_t local_heads = o_.heads / ctx_->tp_size(), local_kv = o_.kv_heads / ctx_->tp_size();
    auto heads = [&](const at::Tensor& t, int64_t n) { return t.reshape({b, s, n, head_dim}).transpose(1, 2); };
    auto kv_parts = keys_values.chunk(2, -1);
    at::Tensor qh = apply_rotary(heads(queries, local_heads), cos, sin);
    at::Tensor kh = apply_rotary(heads(kv_parts[0], local_kv), cos, sin);
    at::Tensor context = cp_causal_attention(qh, kh, heads(kv_parts[1], local_kv), ctx_->cp_shard());
    context = context.transpose(1, 2).reshape({b, s, local_heads * head_dim});
    return out(ctx_->dropout(context, o_.dropout, is_training(), ActivationLayout::column_parallel()));
  }

  ParallelContext* ctx_;
  TinyBlockOptions o_;
};
TORCH_MODULE(TinyDecoderLayer);

class TinyBlockLM : public ParallelModel {
 public:
  /// Builds only this rank's pipeline stages (all of it when the config is not pipelined):
  /// the modules of other stages are built under skip_parameters(), so every stage takes the
  /// creation indices, and the initial values, of the unsplit model. Under a tied embedding
  /// the last stage holds a copy of the embedding (as Megatron-LM's last stage does).
  TinyBlockLM(ParallelContext& ctx, const TinyBlockOptions& o) : ctx_(&ctx), o_(o) {
    MIH_CHECK(o.dropout == 0 || !ctx.config().pipelined(), "tiny block: dropout ", o.dropout,
              " under pipeline parallelism is not supported yet (the masks follow one forward through the whole "
              "model); set it to 0");
    stages_ = ctx.pipeline_stages(o.layers);
    const bool first = stages_.front().first, last = stages_.back().last;
    {
      std::optional<ParallelContext::SkipParameters> skip;
      if (!first && !(last && o.tie_embeddings)) skip.emplace(ctx);
      auto built = VocabParallelEmbedding(ctx, o.vocab, o.hidden);
      if (!skip) embed = register_module("embed", built);
    }
    rotary = register_module("rotary", RotaryEmbedding(ctx, o.hidden / o.heads));
    layers = register_module("layers", std::make_shared<torch::nn::Module>());
    for (int64_t i = 0; i < o.layers; ++i) {
      if (stage_of_layer(i) == nullptr) {
        auto skip = ctx.skip_parameters();
        TinyDecoderLayer(ctx, o);
        continue;
      }
      auto layer = by_layer_.emplace(i, TinyDecoderLayer(ctx, o)).first->second;
      layers->register_module(std::to_string(i), layer);
    }
    std::optional<ParallelContext::SkipParameters> skip;
    if (!last) skip.emplace(ctx);
    auto built_norm = RMSNorm(ctx, o.hidden);
    auto head_options = ColumnParallelLinearOptions(o.hidden, o.vocab).bias(false).pad_to_tp(true);
    auto built_head = o.tie_embeddings && embed ? ColumnParallelLinear(ctx, head_options, embed->weight)
                      : o.tie_embeddings        ? ColumnParallelLinear(nullptr)
                                                : ColumnParallelLinear(ctx, head_options);
    if (!skip) {
      final_norm = register_module("final_norm", built_norm);
      head = register_module("head", built_head);
    }
  }

  at::Tensor token_losses(const Batch& batch) override {
    MIH_CHECK(stages_.size() == 1 && stages_[0].first && stages_[0].last, "token_losses of a pipeline stage");
    return stage_forward(0, at::Tensor(), batch);
  }

  at::Tensor stage_forward(int stage, const at::Tensor& input, const Batch& batch) override {
    const PipelineStage& s = stage_at(stage);
    at::Tensor x = s.first ? embed(batch.input_ids) : input;
    auto [cos, sin] = rotary(batch.position_ids);  // global positions of this rank's tokens
    for (int64_t i = s.first_layer; i < s.last_layer; ++i) {
      // Each layer is an FSDP unit (its parameters are freed after its forward and gathered
      // again for its backward) and an activation-checkpoint region.
      const std::string name = "layers." + std::to_string(i);
      auto layer = by_layer_.at(i).ptr();
      x = ctx_->fsdp_forward(name, [&] {
        return ctx_->checkpoint_region(
            name, [layer](const std::vector<at::Tensor>& in) { return layer->forward(in[0], in[1], in[2]); },
            {x, cos, sin}, layer->parameters());
      });
    }
    if (!s.last) return x;
    at::Tensor logits = head(final_norm(x));  // [B, S, V/TP], the sequence gathered
    at::Tensor losses = vocab_parallel_cross_entropy(logits.reshape({-1, logits.size(-1)}), batch.labels.reshape(-1),
                                                     ctx_->tp_group(), o_.vocab);
    return losses.view_as(batch.labels);
  }

  /// [b, s, H], [b, s/TP, H] under sequence parallelism.
  at::Tensor stage_input(int /*stage*/, const Batch& batch) override {
    const int64_t seq = batch.input_ids.size(1) / (ctx_->sequence_parallel() ? ctx_->tp_size() : 1);
    return at::empty({batch.input_ids.size(0), seq, o_.hidden},
                     at::TensorOptions().dtype(ctx_->param_dtype()).device(ctx_->device()));
  }

  /// Each decoder layer is an FSDP unit, and the root (embedding, final norm, head) another.
  void apply_fsdp(ParallelContext& ctx) override {
    for (auto& [i, layer] : by_layer_) ctx.fully_shard(*layer, "layers." + std::to_string(i));
    ctx.fully_shard(*this, "root");
  }

  VocabParallelEmbedding embed{nullptr};
  RotaryEmbedding rotary{nullptr};
  std::shared_ptr<torch::nn::Module> layers;  // children named by global layer index
  RMSNorm final_norm{nullptr};
  ColumnParallelLinear head{nullptr};

 private:
  const PipelineStage* stage_of_layer(int64_t layer) const {
    for (const auto& s : stages_) {
      if (layer >= s.first_layer && layer < s.last_layer) return &s;
    }
    return nullptr;
  }
  const PipelineStage& stage_at(int stage) const {
    for (const auto& s : stages_) {
      if (s.stage == stage) return s;
    }
    MIH_THROW(Code::kInternal, "stage ", stage, " is not on this rank");
  }

  ParallelContext* ctx_;
  TinyBlockOptions o_;
  std::vector<PipelineStage> stages_;
  std::map<int64_t, TinyDecoderLayer> by_layer_;
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
