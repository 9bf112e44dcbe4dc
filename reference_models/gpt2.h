// `gpt2`: a GPT-2-style decoder (Radford et al. 2019; Hugging Face GPT2LMHeadModel names):
// learned token and position embeddings, pre-LayerNorm blocks with a fused [q; k; v]
// attention projection (Conv1D layout in the checkpoint) and a GELU MLP (the tanh
// approximation, GPT-2's gelu_new), a final LayerNorm and an untied head. The fault catalog's
// port with a GELU (F32) and the reference of the scaffold's template (harness/cli/scaffold).
// Shapes: B = local batch, S = local sequence (S_global / CP; [B, S/TP, H] between
// tensor-parallel regions under sequence parallelism), H = n_embd, V = vocab_size.
#pragma once

#include <cstdint>

#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>

#include "harness/parallel/layers.h"
#include "harness/training/trainer.h"

namespace mih::models {

/// GPT2Config's names.
struct Gpt2Options {
  /// The byte tokenizer's 256 bytes + BOS, EOS, PAD.
  TORCH_ARG(int64_t, vocab_size) = 259;
  /// Rows of the learned position embedding (>= the sequence length).
  TORCH_ARG(int64_t, n_positions) = 64;
  TORCH_ARG(int64_t, n_embd) = 64;
  /// Heads; tp must divide it.
  TORCH_ARG(int64_t, n_head) = 4;
  /// The MLP's width; tp must divide it.
  TORCH_ARG(int64_t, n_inner) = 128;
  TORCH_ARG(int64_t, n_layer) = 2;
  TORCH_ARG(double, layer_norm_epsilon) = 1e-5;
  TORCH_ARG(double, initializer_range) = 0.02;
};

/// The GPT-2 causal language model. FQNs are Hugging Face's without "transformer." (wte.weight,
/// h.0.attn.c_attn.weight [3H, H] in Linear layout, ..., lm_head.weight).
class Gpt2ForCausalLM : public ParallelModel {
 public:
  Gpt2ForCausalLM(ParallelContext& ctx, const Gpt2Options& o);
  /// Shape: batch [B, S] (position_ids: global positions) -> per-token losses [B, S].
  at::Tensor token_losses(const Batch& batch) override;
  /// Shape: [B, S] -> [B, S, V/TP] (this rank's slice of the padded vocabulary).
  at::Tensor logits(const Batch& batch) override;
  /// Each block an FSDP unit, the rest the root.
  void apply_fsdp(ParallelContext& ctx) override;

  VocabParallelEmbedding wte{nullptr};
  at::Tensor wpe;  // [n_positions, H], replicated
  torch::nn::ModuleList h{nullptr};
  LayerNorm ln_f{nullptr};
  ColumnParallelLinear lm_head{nullptr};

 private:
  ParallelContext* ctx_;
  Gpt2Options o_;
};

ModelFactory make_gpt2(Gpt2Options o = {});

}  // namespace mih::models
