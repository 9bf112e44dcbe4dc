// Multi-head latent attention (see mla_attention.h).
#include "reference_models/mla_attention.h"

#include <utility>

#include <ATen/ATen.h>

#include "harness/base/error.h"
#include "harness/parallel/context_parallel.h"
#include "harness/parallel/regions.h"
#include "reference_models/llama.h"

namespace mih::models {
namespace {

constexpr int64_t kSeqDim = 1;
// DeepseekV3RMSNorm's default: q_a_layernorm and kv_a_layernorm are built without the config's
// rms_norm_eps.
constexpr double kLowRankNormEps = 1e-6;

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight) {
  return x * at::rsqrt(x.pow(2).mean(-1, /*keepdim=*/true) + kLowRankNormEps) * weight;
}

}  // namespace

void MlaOptions::validate() const {
  for (const auto& [name, value] : {std::pair{"q_lora_rank", q_lora_rank()}, std::pair{"kv_lora_rank", kv_lora_rank()},
                                    std::pair{"qk_nope_head_dim", qk_nope_head_dim()},
                                    std::pair{"qk_rope_head_dim", qk_rope_head_dim()},
                                    std::pair{"v_head_dim", v_head_dim()}}) {
    MIH_CHECK(value > 0, "mla: ", name, "(", value, ") must be positive");
  }
  MIH_CHECK(qk_rope_head_dim() % 2 == 0, "mla: qk_rope_head_dim(", qk_rope_head_dim(),
            ") must be even: rotary rotates its two halves");
}

MlaAttentionImpl::MlaAttentionImpl(ParallelContext& ctx, const LlamaOptions& o)
    : ctx_(&ctx), m_(o.mla()), hidden_(o.hidden_size()), heads_(o.num_heads()), dropout_(o.dropout()) {
  m_.validate();
  MIH_CHECK(!o.attention_bias(), "mla: attention_bias is not supported by the MLA attention; set it false");
  const int64_t h = hidden_, rq = m_.q_lora_rank(), rkv = m_.kv_lora_rank(), dr = m_.qk_rope_head_dim();
  // Creation order is Hugging Face's module order (the initial values follow it).
  q_a_weight = replicated("q_a_proj", {rq, h}, init::normal(o.init_std()));
  q_a_norm_weight = replicated("q_a_layernorm", {rq}, init::constant(1.0));
  auto column = [&](int64_t in, int64_t out) {
    return ColumnParallelLinearOptions(in, out).bias(false).init_std(o.init_std());
  };
  q_b_proj = register_module("q_b_proj", ColumnParallelLinear(ctx, column(rq, heads_ * m_.qk_head_dim())));
  kv_a_weight = replicated("kv_a_proj_with_mqa", {rkv + dr, h}, init::normal(o.init_std()));
  kv_a_norm_weight = replicated("kv_a_layernorm", {rkv}, init::constant(1.0));
  kv_b_proj = register_module(
      "kv_b_proj", ColumnParallelLinear(ctx, column(rkv, heads_ * (m_.qk_nope_head_dim() + m_.v_head_dim()))));
  o_proj = register_module("o_proj", RowParallelLinear(ctx, RowParallelLinearOptions(heads_ * m_.v_head_dim(), h)
                                                                 .bias(false)
                                                                 .init_std(o.init_std())));
}

at::Tensor MlaAttentionImpl::replicated(const std::string& module, std::vector<int64_t> shape, ParamInit init) {
  ParamSpec spec;
  spec.shape = std::move(shape);
  spec.init = std::move(init);
  // Every tp rank computes it on the whole input, and only its own heads use the result.
  spec.tp_partial_grad = ctx_->tp_size() > 1;
  auto holder = register_module(module, std::make_shared<torch::nn::Module>());
  return holder->register_parameter("weight", ctx_->make_parameter(spec));
}

at::Tensor MlaAttentionImpl::enter_tp_region(const at::Tensor& x) {
  Communicator& tp = ctx_->tp_group();
  if (tp.size() == 1) return x;
  // The contract (CommVolume), as ColumnParallelLinear declares its input's collectives.
  const std::string layer = ctx_->layer_of(q_a_weight);
  const int64_t bytes = x.numel() * static_cast<int64_t>(x.element_size());
  const bool backward = at::GradMode::is_enabled() && x.requires_grad();
  if (ctx_->sequence_parallel()) {
    tp.expect("region.all_gather", bytes, layer);
    if (backward) tp.expect("region.reduce_scatter", bytes * tp.size(), layer);
    return sequence_all_gather(x, tp, kSeqDim);
  }
  if (backward) tp.expect("region.copy_to.backward", bytes, layer);
  return copy_to_region(x, tp);
}

at::Tensor MlaAttentionImpl::forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                     const at::Tensor& document_ids) {
  const int64_t heads = heads_ / ctx_->tp_size(), dn = m_.qk_nope_head_dim(), dr = m_.qk_rope_head_dim(),
                dv = m_.v_head_dim(), rkv = m_.kv_lora_rank();
  const at::Tensor in = enter_tp_region(x);  // [B, S, H]
  const int64_t b = in.size(0), s = in.size(1);
  const at::Tensor c_q = rms_norm(at::linear(in, ctx_->use(q_a_weight)), ctx_->use(q_a_norm_weight));  // [B, S, Rq]
  const at::Tensor q = at::linear(c_q, ctx_->use(q_b_proj->weight))
                           .reshape({b, s, heads, m_.qk_head_dim()})
                           .transpose(1, 2);  // [B, heads/TP, S, Dn + Dr]
  const at::Tensor compressed = at::linear(in, ctx_->use(kv_a_weight));  // [B, S, Rkv + Dr]
  const at::Tensor c_kv = rms_norm(compressed.narrow(-1, 0, rkv), ctx_->use(kv_a_norm_weight));
  const at::Tensor kv = at::linear(c_kv, ctx_->use(kv_b_proj->weight))
                            .reshape({b, s, heads, dn + dv})
                            .transpose(1, 2);  // [B, heads/TP, S, Dn + Dv]
  const at::Tensor k_rot = apply_rotary(compressed.narrow(-1, rkv, dr).unsqueeze(1), cos, sin);  // [B, 1, S, Dr]
  const at::Tensor qh = at::cat({q.narrow(-1, 0, dn), apply_rotary(q.narrow(-1, dn, dr), cos, sin)}, -1);
  const at::Tensor kh = at::cat({kv.narrow(-1, 0, dn), k_rot.expand({b, heads, s, dr})}, -1);
  CpAttentionMask mask;
  mask.document_ids = document_ids;
  // [B, heads/TP, S, Dv]: scores scaled by 1 / sqrt(Dn + Dr), the queries' width.
  at::Tensor context = cp_causal_attention(qh, kh, kv.narrow(-1, dn, dv), ctx_->cp_shard(), mask);
  context = context.transpose(1, 2).reshape({b, s, heads * dv});
  return o_proj(ctx_->dropout(context, dropout_, is_training(), ActivationLayout::column_parallel()));
}

}  // namespace mih::models
