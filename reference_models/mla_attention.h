// Multi-head latent attention (DeepSeek-V2, DeepSeek-AI 2024, section 2.1; transformers'
// DeepseekV3Attention): low-rank compressed query and key/value projections with their RMS
// norms and a decoupled rotary key shared by every head, on the harness's parallel layers
// under tp (with or without sequence parallelism) and cp. The llama port builds it in place of
// grouped-query attention under LlamaOptions::attention("mla").
#pragma once

#include <cstdint>
#include <string>

#include <ATen/core/Tensor.h>
#include <torch/arg.h>
#include <torch/nn/module.h>

#include "harness/parallel/layers.h"

namespace mih::models {

struct LlamaOptions;

/// The sizes of multi-head latent attention (DeepseekV3Config names). Defaults tiny, for the
/// `mla` spec: v_head_dim differs from the query/key head width on purpose.
struct MlaOptions {
  /// Rank Rq of the compressed query (q_a_proj [Rq, H], q_b_proj [heads * (Dn + Dr), Rq]).
  TORCH_ARG(int64_t, q_lora_rank) = 24;
  /// Rank Rkv of the compressed key/value (kv_a_proj_with_mqa [Rkv + Dr, H],
  /// kv_b_proj [heads * (Dn + Dv), Rkv]).
  TORCH_ARG(int64_t, kv_lora_rank) = 16;
  /// Dn: the per-head query/key features without rotary.
  TORCH_ARG(int64_t, qk_nope_head_dim) = 8;
  /// Dr: the rotary features of each query head and of the one shared rotary key (even); the
  /// rotary table is built for it (LlamaOptions::rotary_dim).
  TORCH_ARG(int64_t, qk_rope_head_dim) = 8;
  /// Dv: the per-head value features (o_proj [H, heads * Dv]).
  TORCH_ARG(int64_t, v_head_dim) = 12;

 public:
  /// Dn + Dr: the width of a query and a key head; scores scaled by its -1/2 power.
  int64_t qk_head_dim() const { return qk_nope_head_dim() + qk_rope_head_dim(); }
  /// Throws: mih::Error{kInvalidSpec} naming the option when a size is not positive or
  ///   qk_rope_head_dim is odd (rotary rotates halves).
  void validate() const;
};

/// Multi-head latent attention with the non-interleaved (rotate_half) rotary of Hugging Face's
/// Llama, DeepseekV3Config.rope_interleave false:
///   q = q_b_proj(q_a_layernorm(q_a_proj(x))), per head [q_nope Dn | q_rot Dr];
///   [c_kv Rkv | k_rot Dr] = kv_a_proj_with_mqa(x); per head [k_nope Dn | v Dv] =
///   kv_b_proj(kv_a_layernorm(c_kv)); k_rot one head shared by every head;
///   rotary on q_rot and k_rot; q = [q_nope | q_rot], k = [k_nope | k_rot];
///   causal softmax(q k^T / sqrt(Dn + Dr)) v over heads, o_proj over heads * Dv.
/// Under tp q_b_proj and kv_b_proj are column-parallel over heads and o_proj row-parallel;
/// q_a_proj, q_a_layernorm, kv_a_proj_with_mqa and kv_a_layernorm are replicated over tp, their
/// input entered into the tp region as ColumnParallelLinear enters it (the input's gradient
/// all-reduced over tp; under sequence parallelism all-gathered forward, reduce-scattered
/// backward), so each tp rank's heads contribute a partial sum of their gradients
/// (ParamSpec::tp_partial_grad). Under cp the keys (nope and rotary) and the values are
/// all-gathered over cp by cp_causal_attention. No biases, no dropout inside the scores.
/// Input [B, S, H] (sequence parallel: [B, S/TP, H]), cos/sin [B, 1, S, Dr], document_ids
/// [B, S * CP] (the whole row, LlamaOptions::document_mask; undefined: no document mask) -> like
/// the input.
class MlaAttentionImpl : public torch::nn::Module {
 public:
  /// Throws: mih::Error{kInvalidSpec} for invalid MlaOptions or attention_bias (not supported).
  MlaAttentionImpl(ParallelContext& ctx, const LlamaOptions& o);
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                     const at::Tensor& document_ids = {});

  /// Replicated over tp, gradients partial over tp: q_a_proj.weight [Rq, H],
  /// q_a_layernorm.weight [Rq], kv_a_proj_with_mqa.weight [Rkv + Dr, H],
  /// kv_a_layernorm.weight [Rkv].
  at::Tensor q_a_weight, q_a_norm_weight, kv_a_weight, kv_a_norm_weight;
  /// Column-parallel over heads (their forward is not called: their input is already in the
  /// tp region) and row-parallel over heads * Dv.
  ColumnParallelLinear q_b_proj{nullptr}, kv_b_proj{nullptr};
  RowParallelLinear o_proj{nullptr};

 private:
  /// x replicated over tp (sequence parallel: gathered), its gradient summed over tp.
  /// Shape: [B, S, H] or [B, S/TP, H] -> [B, S, H].
  at::Tensor enter_tp_region(const at::Tensor& x);
  /// A replicated parameter `module`.weight (Hugging Face's name), its gradient partial over tp at tp > 1.
  at::Tensor replicated(const std::string& module, std::vector<int64_t> shape, ParamInit init);

  ParallelContext* ctx_;
  MlaOptions m_;
  int64_t hidden_, heads_;
  double dropout_;
};
TORCH_MODULE(MlaAttention);

}  // namespace mih::models
