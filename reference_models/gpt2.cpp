// gpt2 (see gpt2.h).
#include "reference_models/gpt2.h"

#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "harness/base/error.h"
#include "harness/base/fault.h"
#include "harness/parallel/context_parallel.h"

namespace mih::models {
namespace {

// GPT-2's attention: fused [q; k; v] (each split over tp by heads), causal attention over the
// context-parallel sequence, the row-parallel output projection.
class AttentionImpl : public torch::nn::Module {
 public:
  AttentionImpl(ParallelContext& ctx, const Gpt2Options& o) : ctx_(&ctx), o_(o) {
    c_attn = register_module("c_attn", ColumnParallelLinear(ctx, ColumnParallelLinearOptions(o.n_embd(), 3 * o.n_embd())
                                                                      .partitions(3)
                                                                      .init_std(o.initializer_range())));
    c_proj = register_module("c_proj", RowParallelLinear(ctx, RowParallelLinearOptions(o.n_embd(), o.n_embd())
                                                                   .init_std(o.initializer_range())));
  }
  at::Tensor forward(const at::Tensor& x) {
    const int64_t heads = o_.n_head() / ctx_->tp_size(), d = o_.n_embd() / o_.n_head();
    const std::vector<at::Tensor> qkv = c_attn(x).chunk(3, -1);
    const int64_t b = qkv[0].size(0), s = qkv[0].size(1);
    auto split = [&](const at::Tensor& t) { return t.reshape({b, s, heads, d}).transpose(1, 2); };
    const at::Tensor y = cp_causal_attention(split(qkv[0]), split(qkv[1]), split(qkv[2]), ctx_->cp_shard());
    return c_proj(y.transpose(1, 2).reshape({b, s, heads * d}));
  }
  ColumnParallelLinear c_attn{nullptr};
  RowParallelLinear c_proj{nullptr};

 private:
  ParallelContext* ctx_;
  Gpt2Options o_;
};
TORCH_MODULE(Attention);

// c_proj(gelu(c_fc(x))) with GPT-2's gelu_new, the tanh approximation.
class MlpImpl : public torch::nn::Module {
 public:
  MlpImpl(ParallelContext& ctx, const Gpt2Options& o) {
    c_fc = register_module("c_fc", ColumnParallelLinear(ctx, ColumnParallelLinearOptions(o.n_embd(), o.n_inner())
                                                                  .init_std(o.initializer_range())));
    c_proj = register_module("c_proj", RowParallelLinear(ctx, RowParallelLinearOptions(o.n_inner(), o.n_embd())
                                                                   .init_std(o.initializer_range())));
  }
  at::Tensor forward(const at::Tensor& x) {
    // F32 (docs/fault-catalog.md): the exact (erf) GELU where GPT-2 has the tanh approximation, in every
    // configuration alike.
    return c_proj(at::gelu(c_fc(x), fault::active(fault::Fault::kF32) ? "none" : "tanh"));
  }
  ColumnParallelLinear c_fc{nullptr};
  RowParallelLinear c_proj{nullptr};
};
TORCH_MODULE(Mlp);

// x + attn(ln_1(x)), then + mlp(ln_2(.)); each module's output observed.
class BlockImpl : public torch::nn::Module {
 public:
  BlockImpl(ParallelContext& ctx, const Gpt2Options& o) : ctx_(&ctx) {
    ln_1 = register_module("ln_1", LayerNorm(ctx, o.n_embd(), o.layer_norm_epsilon()));
    attn = register_module("attn", Attention(ctx, o));
    ln_2 = register_module("ln_2", LayerNorm(ctx, o.n_embd(), o.layer_norm_epsilon()));
    mlp = register_module("mlp", Mlp(ctx, o));
  }
  at::Tensor forward(const at::Tensor& x) {
    const ActivationLayout residual = ActivationLayout::residual(*ctx_);
    const at::Tensor h = x + ctx_->observe(*attn, attn(ctx_->observe(*ln_1, ln_1(x), residual)), residual);
    const at::Tensor out = h + ctx_->observe(*mlp, mlp(ctx_->observe(*ln_2, ln_2(h), residual)), residual);
    return ctx_->observe(*this, out, residual);
  }
  LayerNorm ln_1{nullptr}, ln_2{nullptr};
  Attention attn{nullptr};
  Mlp mlp{nullptr};

 private:
  ParallelContext* ctx_;
};
TORCH_MODULE(Block);

}  // namespace

Gpt2ForCausalLM::Gpt2ForCausalLM(ParallelContext& ctx, const Gpt2Options& o) : ctx_(&ctx), o_(o) {
  MIH_CHECK(o.n_embd() % o.n_head() == 0, "gpt2: n_embd(", o.n_embd(), ") must divide by n_head(", o.n_head(), ")");
  MIH_CHECK(o.n_head() % ctx.tp_size() == 0 && o.n_inner() % ctx.tp_size() == 0, "gpt2: tp(", ctx.tp_size(),
            ") must divide n_head(", o.n_head(), ") and n_inner(", o.n_inner(), ")");
  wte = register_module("wte", VocabParallelEmbedding(ctx, o.vocab_size(), o.n_embd(), o.initializer_range()));
  ParamSpec positions;
  positions.shape = {o.n_positions(), o.n_embd()};
  positions.init = init::normal(0.01);
  // Under sequence parallelism each tp rank looks up only its own tokens' positions.
  positions.tp_partial_grad = ctx.sequence_parallel();
  wpe = register_parameter("wpe", ctx.make_parameter(positions));
  h = register_module("h", torch::nn::ModuleList());
  for (int64_t i = 0; i < o.n_layer(); ++i) h->push_back(Block(ctx, o));
  ln_f = register_module("ln_f", LayerNorm(ctx, o.n_embd(), o.layer_norm_epsilon()));
  lm_head = register_module("lm_head", ColumnParallelLinear(ctx, ColumnParallelLinearOptions(o.n_embd(), o.vocab_size())
                                                                      .bias(false)
                                                                      .pad_to_tp(true)
                                                                      .init_std(o.initializer_range())));
}

at::Tensor Gpt2ForCausalLM::logits(const Batch& batch) {
  const ActivationLayout residual = ActivationLayout::residual(*ctx_);
  // wte + wpe: under sequence parallelism this tp rank's chunk of its tokens, and the same
  // chunk of their positions.
  at::Tensor x = ctx_->observe(*wte, wte(batch.input_ids), residual) +
                 at::embedding(ctx_->use(wpe), ctx_->sequence_parallel_chunk(batch.position_ids, 1));
  for (size_t i = 0; i < h->size(); ++i) {
    const std::string name = "h." + std::to_string(i);
    auto block = h[i]->as<BlockImpl>();
    x = ctx_->fsdp_forward(name, [&] {
      return ctx_->checkpoint_region(
          name, [block](const std::vector<at::Tensor>& in) { return block->forward(in[0]); }, {x}, block->parameters());
    });
  }
  x = ctx_->observe(*ln_f, ln_f(x), residual);
  return ctx_->observe(*lm_head, lm_head(x), ActivationLayout::column_parallel(o_.vocab_size()));
}

at::Tensor Gpt2ForCausalLM::token_losses(const Batch& batch) {
  const at::Tensor l = logits(batch);
  return vocab_parallel_cross_entropy(l.reshape({-1, l.size(-1)}), batch.labels.reshape(-1), ctx_->tp_group(),
                                      o_.vocab_size())
      .view_as(batch.labels);
}

void Gpt2ForCausalLM::apply_fsdp(ParallelContext& ctx) {
  for (size_t i = 0; i < h->size(); ++i) ctx.fully_shard(*h[i], "h." + std::to_string(i));
  ctx.fully_shard(*this, "root");
}

ModelFactory make_gpt2(Gpt2Options o) {
  return [o](ParallelContext& ctx) { return std::make_shared<Gpt2ForCausalLM>(ctx, o); };
}

}  // namespace mih::models
