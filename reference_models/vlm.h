// `vlm`: a LLaVA-style vision-language model (Liu et al. 2023; Hugging Face
// LlavaForConditionalGeneration names): a ViT-style vision tower (Dosovitskiy et al. 2021:
// non-overlapping patches, a linear patch embedding with learned position embeddings,
// pre-LayerNorm bidirectional transformer blocks), a two-layer GELU projector into the
// language model's hidden size, and a llama language model whose image placeholder tokens
// are replaced by the projected patch features.
//
// Data: one image per sequence. Fields: `pixel_values` [B, C, H, W] (whole on every cp rank)
// and `image_token_index` [B, S] int64 (sharded on the sequence like input_ids): for a
// placeholder token the index of the patch feature that replaces it, else -1 (the image-token
// mask is image_token_index >= 0). The vision tower and projector are replicated over tp;
// their gradients are partial over tp under sequence parallelism (each tp rank merges only
// its own tokens) and over cp (each cp rank only its own).
#pragma once

#include <cstdint>
#include <memory>

#include <ATen/core/Tensor.h>
#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>

#include "harness/data/image_pipeline.h"
#include "harness/data/text_pipeline.h"
#include "reference_models/llama.h"

namespace mih::models {

struct VlmOptions {
  /// The language model; its vocabulary holds the placeholder token.
  TORCH_ARG(LlamaOptions, text) = LlamaOptions().vocab_size(260);
  /// The image placeholder token id (default: the one past the byte tokenizer's 259).
  TORCH_ARG(int64_t, image_token_id) = 259;
  /// Square images of image_size pixels cut into patch_size patches: P = (image_size /
  /// patch_size)^2 patch features (and placeholder tokens) per image.
  TORCH_ARG(int64_t, image_size) = 32;
  TORCH_ARG(int64_t, patch_size) = 8;
  TORCH_ARG(int64_t, channels) = 3;
  TORCH_ARG(int64_t, vision_hidden_size) = 32;
  TORCH_ARG(int64_t, vision_layers) = 2;
  TORCH_ARG(int64_t, vision_heads) = 4;

 public:
  int64_t num_patches() const { return (image_size() / patch_size()) * (image_size() / patch_size()); }
  /// Throws: mih::Error{kInvalidSpec} naming the sizes that do not fit.
  void validate(const ParallelContext& ctx) const;
};

/// One pre-LayerNorm ViT block: x + attn(ln(x)), then h + mlp(ln(h)) (GELU, 4x).
/// Shape: [N, P, Hv] -> the same.
class VisionBlockImpl : public torch::nn::Module {
 public:
  VisionBlockImpl(ParallelContext& ctx, const VlmOptions& o);
  at::Tensor forward(const at::Tensor& x);

  LayerNorm layer_norm1{nullptr}, layer_norm2{nullptr};
  at::Tensor qkv, out, fc1, fc2;  // [3Hv, Hv], [Hv, Hv], [4Hv, Hv], [Hv, 4Hv]

 private:
  ParallelContext* ctx_;
  VlmOptions o_;
};
TORCH_MODULE(VisionBlock);

/// Patch embedding, position embeddings, blocks, final LayerNorm.
/// Shape: pixel_values [N, C, H, W] -> patch features [N, P, Hv].
class VisionTowerImpl : public torch::nn::Module {
 public:
  VisionTowerImpl(ParallelContext& ctx, const VlmOptions& o);
  at::Tensor forward(const at::Tensor& pixel_values);

  at::Tensor patch_embedding, position_embedding;  // [Hv, C*p*p], [P, Hv]
  torch::nn::ModuleList layers{nullptr};
  LayerNorm post_layernorm{nullptr};

 private:
  ParallelContext* ctx_;
  VlmOptions o_;
};
TORCH_MODULE(VisionTower);

class VlmForConditionalGeneration : public ParallelModel {
 public:
  VlmForConditionalGeneration(ParallelContext& ctx, const VlmOptions& o);
  /// Shape: batch [B, S] with pixel_values and image_token_index -> per-token losses [B, S].
  /// Without pixel_values the forward is text-only (as in Hugging Face's LLaVA): the
  /// placeholder tokens keep their token embeddings.
  /// Throws: mih::Error{kInvalidSpec} if image_token_index is missing next to pixel_values, or
  ///   a field's shape does not fit.
  at::Tensor token_losses(const Batch& batch) override;
  /// The language model's logits with the image features merged in: -> [B, S, V/TP].
  at::Tensor logits(const Batch& batch) override;
  /// The vision tower one FSDP unit, each language-model layer one, the rest the root.
  void apply_fsdp(ParallelContext& ctx) override;

  VisionTower vision_tower{nullptr};
  at::Tensor projector_1, projector_2;  // multi_modal_projector: [H, Hv], [H, H]
  std::shared_ptr<torch::nn::Module> projector_;
  std::shared_ptr<LlamaForCausalLM> language_model;

 private:
  ParallelContext* ctx_;
  VlmOptions o_;
};

ModelFactory make_vlm(VlmOptions o = {});

/// The vlm's global batches: text from `text` (byte tokens) with the first P positions of
/// every row made image placeholders (no loss on them), and one image per row from `images`.
/// position_ids count from the row's start through the placeholders and restart at every
/// document start after them; the text's provenance gains the placeholders
/// (BatchProvenance::prefix_tokens), so the PipelineOutputs suite recomputes the row.
/// Throws (when called): mih::Error{kInvalidSpec} if seq_len <= P or the image size differs.
BatchSource vlm_batches(const VlmOptions& o, data::TextPipeline text, data::ImagePipeline images);

}  // namespace mih::models
