// The catalog of reference models by name (llama, moe, vlm, moe_qwen, gpt2, qwen3): how to build each, its data,
// the Trainer options its fields need, and its checkpoint key map to the Hugging Face names of
// the same architecture. What the specs in specs/ start from.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "harness/checkpoint/key_map.h"
#include "harness/data/text_pipeline.h"
#include "harness/training/trainer.h"
#include "reference_models/llama.h"

namespace mih::models {

struct ReferenceModel {
  std::string name;
  std::string description;
  ModelFactory factory;
  /// The global batches for a text pipeline configuration (the vlm adds its images).
  std::function<BatchSource(const data::TextPipelineOptions&)> batches;
  /// Field sharding under context parallelism (loss_mask, attention_mask, image_token_index on
  /// the sequence; pixel_values whole on every cp rank).
  TrainerOptions trainer_options;
  /// Internal FQN -> Hugging Face key(s): LlamaForCausalLM, Qwen3ForCausalLM,
  /// Qwen3MoeForCausalLM, Qwen2MoeForCausalLM and LlavaForConditionalGeneration names; the fused
  /// gate/up projection splits into gate_proj and up_proj (each expert's too).
  KeyMap key_map;
};

/// The options of moe (Qwen3MoeForCausalLM): qk_norm, layer 1 a top-2 mixture of 4 experts
/// with the top-k probabilities renormalized (norm_topk_prob), layer 0 dense.
LlamaOptions moe_options();

/// The options of moe_qwen: Qwen2-MoE's routing (a shared expert behind a sigmoid gate, the
/// top-k probabilities not renormalized: norm_topk_prob false) and rotary theta 1e6.
LlamaOptions moe_qwen_options();

/// The options of qwen3 (Qwen3ForCausalLM): qk_norm, head_dim 32 apart from hidden_size /
/// num_heads (64 / 4), 2 KV heads (replicated at tp 4), rotary theta 1e6, a tied head.
LlamaOptions qwen3_options();

/// "llama", "moe", "vlm", "moe_qwen" (Qwen2-MoE-style routing), "gpt2", "qwen3".
std::vector<std::string> reference_model_names();

/// Throws: mih::Error{kInvalidSpec} for an unknown name, listing the known ones.
ReferenceModel reference_model(const std::string& name);

}  // namespace mih::models
