// `vlm`: a LLaVA model (Liu et al. 2023) exactly as Hugging Face transformers'
// LlavaForConditionalGeneration builds it from the export (vision_config a CLIPVisionConfig,
// text_config a LlamaConfig): a CLIP vision encoder (Radford et al. 2021: a patch embedding as a
// bias-free strided convolution, a learned class embedding, position embeddings for the class
// token and the patches, pre_layrnorm, pre-LayerNorm bidirectional blocks with biased q/k/v/out
// projections and a quick_gelu MLP), a two-layer GELU projector with biases into the language
// model's hidden size, and a llama language model whose image placeholder tokens are replaced
// by the projected patch features. Feature selection as transformers' vision_feature_layer -1
// and vision_feature_select_strategy "default": the last encoder layer's output without its class
// token. CLIP's post_layernorm (the pooled output's norm) is registered, loaded and saved as in
// the original, and never used, so it gets no gradient (the spec declares it in
// ModelSpec::unused_parameters).
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
  /// The vision MLP's inner size (CLIPVisionConfig.intermediate_size).
  TORCH_ARG(int64_t, vision_intermediate_size) = 128;

 public:
  int64_t num_patches() const { return (image_size() / patch_size()) * (image_size() / patch_size()); }
  /// Throws: mih::Error{kInvalidSpec} naming the sizes that do not fit.
  void validate(const ParallelContext& ctx) const;
};

/// y = x W^T + b with W [out, in] and b [out] replicated over tp (the vision side is not
/// sharded; its gradients are partial over tp under sequence parallelism). Shape: [.., in] ->
/// [.., out].
class TowerLinearImpl : public torch::nn::Module {
 public:
  TowerLinearImpl(ParallelContext& ctx, int64_t in, int64_t out, double init_std);
  at::Tensor forward(const at::Tensor& x);

  at::Tensor weight, bias;

 private:
  ParallelContext* ctx_;
};
TORCH_MODULE(TowerLinear);

/// CLIP's vision embeddings: the patches through a bias-free convolution of stride p (weight
/// [Hv, C, p, p], computed as unfold + matmul), the class embedding [Hv] before them, position
/// embeddings [P + 1, Hv] added. Shape: pixel_values [N, C, H, W] -> [N, P + 1, Hv].
class VisionEmbeddingsImpl : public torch::nn::Module {
 public:
  VisionEmbeddingsImpl(ParallelContext& ctx, const VlmOptions& o);
  at::Tensor forward(const at::Tensor& pixel_values);

  at::Tensor class_embedding, patch_weight, position_weight;

 private:
  ParallelContext* ctx_;
  VlmOptions o_;
};
TORCH_MODULE(VisionEmbeddings);

/// One CLIP encoder layer: x + out_proj(attn(layer_norm1(x))), then h + fc2(quick_gelu(fc1(
/// layer_norm2(h)))); bidirectional attention, scores scaled by head_dim^-0.5.
/// Shape: [N, T, Hv] -> the same.
class VisionBlockImpl : public torch::nn::Module {
 public:
  VisionBlockImpl(ParallelContext& ctx, const VlmOptions& o);
  at::Tensor forward(const at::Tensor& x);

  LayerNorm layer_norm1{nullptr}, layer_norm2{nullptr};
  TowerLinear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, out_proj{nullptr}, fc1{nullptr}, fc2{nullptr};

 private:
  at::Tensor attention(const at::Tensor& x);
  VlmOptions o_;
};
TORCH_MODULE(VisionBlock);

/// CLIP's vision transformer (LLaVA's vision_tower.vision_model): embeddings, pre_layrnorm,
/// encoder.layers; the features are the last layer's output without the class token.
/// Shape: pixel_values [N, C, H, W] -> patch features [N, P, Hv].
class VisionTowerImpl : public torch::nn::Module {
 public:
  VisionTowerImpl(ParallelContext& ctx, const VlmOptions& o);
  at::Tensor forward(const at::Tensor& pixel_values);

  VisionEmbeddings embeddings{nullptr};
  LayerNorm pre_layrnorm{nullptr};  // sic: CLIP's name
  torch::nn::ModuleList layers{nullptr};
  /// CLIP's pooled-output norm: part of the checkpoint, unused by LLaVA (no gradient).
  LayerNorm post_layernorm{nullptr};

 private:
  ParallelContext* ctx_;
};
TORCH_MODULE(VisionTower);

/// LLaVA's multi_modal_projector: linear_2(gelu(linear_1(x))), both with biases.
/// Shape: [N, P, Hv] -> [N, P, H].
class ProjectorImpl : public torch::nn::Module {
 public:
  ProjectorImpl(ParallelContext& ctx, const VlmOptions& o);
  at::Tensor forward(const at::Tensor& features);

  TowerLinear linear_1{nullptr}, linear_2{nullptr};
};
TORCH_MODULE(Projector);

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
  Projector multi_modal_projector{nullptr};
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
