// The reference-model catalog (see registry.h).
#include "reference_models/registry.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "harness/base/error.h"
#include "harness/base/fault.h"
#include "harness/base/files.h"
#include "harness/data/image_pipeline.h"
#include "harness/base/strings.h"
#include "reference_models/gpt2.h"
#include "reference_models/llama.h"
#include "reference_models/vlm.h"

namespace mih::models {
namespace {

// The language model's rules, with `prefix` before Hugging Face's "model." / "lm_head" keys
// and `internal` before our FQNs; the MoE layers' names Qwen2-MoE's and Qwen3-MoE's (mlp.gate,
// experts' gate/up/down_proj, Qwen2-MoE's shared expert and its gate).
std::vector<KeyRule> llama_rules(const std::string& internal, const std::string& prefix) {
  const std::string l = internal + R"(layers\.(\d+)\.)";
  const std::string hf = prefix + "model.layers.$1.";
  std::vector<KeyRule> rules = {
      {internal + R"(embed_tokens\.weight)", {prefix + "model.embed_tokens.weight"}},
      {l + R"(input_layernorm\.weight)", {hf + "input_layernorm.weight"}},
      {l + R"(post_attention_layernorm\.weight)", {hf + "post_attention_layernorm.weight"}},
      {l + R"(self_attn\.(q|k|v|o)_proj\.weight)", {hf + "self_attn.$2_proj.weight"}},
      {l + R"(self_attn\.(q|k)_norm\.weight)", {hf + "self_attn.$2_norm.weight"}},
      {l + R"(mlp\.gate_up_proj\.weight)", {hf + "mlp.gate_proj.weight", hf + "mlp.up_proj.weight"}},
      {l + R"(mlp\.down_proj\.weight)", {hf + "mlp.down_proj.weight"}},
      {l + R"(mlp\.router)", {hf + "mlp.gate.weight"}},
      {l + R"(mlp\.shared_expert\.gate_up_proj\.weight)",
       {hf + "mlp.shared_expert.gate_proj.weight", hf + "mlp.shared_expert.up_proj.weight"}},
      {l + R"(mlp\.shared_expert\.down_proj\.weight)", {hf + "mlp.shared_expert.down_proj.weight"}},
      {l + R"(mlp\.shared_expert_gate)", {hf + "mlp.shared_expert_gate.weight"}},
      {internal + R"(lm_head\.weight)", {prefix + "lm_head.weight"}},
  };
  rules.push_back({l + R"(self_attn\.(q|k|v|o)_proj\.bias)", {hf + "self_attn.$2_proj.bias"}});
  // The stacked experts (MoeExperts): gate_up_proj [E * 2F, H] splits on dim 0 into each
  // expert's gate_proj and up_proj, down_proj [E * H, F] into each expert's down_proj.
  std::vector<std::string> gate_up, down;
  for (int64_t e = 0; e < LlamaOptions().num_experts(); ++e) {
    const std::string expert = hf + "mlp.experts." + std::to_string(e) + ".";
    gate_up.insert(gate_up.end(), {expert + "gate_proj.weight", expert + "up_proj.weight"});
    down.push_back(expert + "down_proj.weight");
  }
  rules.push_back({l + R"(mlp\.experts\.gate_up_proj)", gate_up});
  rules.push_back({l + R"(mlp\.experts\.down_proj)", down});
  // F10 (docs/fault-catalog.md): the final norm left out of the key map.
  if (!fault::active(fault::Fault::kF10)) rules.push_back({internal + R"(norm\.weight)", {prefix + "model.norm.weight"}});
  return rules;
}

LlamaOptions llama_options() { return LlamaOptions(); }

// GPT-2's checkpoint: Conv1D weights [in, out] (the transpose of our Linear's [out, in]), the
// blocks under transformer.h.
std::vector<KeyRule> gpt2_rules() {
  return {{R"((h\.\d+\.(attn|mlp)\.c_(attn|proj|fc))\.weight)", {"transformer.$1.weight"}, 0, /*transpose=*/true},
          {R"(wpe)", {"transformer.wpe.weight"}},
          {R"(lm_head\.weight)", {"lm_head.weight"}},
          {R"((.+))", {"transformer.$1"}}};
}

VlmOptions vlm_options() { return VlmOptions().image_size(16); }

TrainerOptions field_sharding() {
  return TrainerOptions()
      .sequence_fields({"loss_mask", "attention_mask", "image_token_index"})
      .cp_replicated_fields({"pixel_values"});
}

}  // namespace

LlamaOptions moe_qwen_options() {
  return LlamaOptions().rope_theta(1e6).norm_topk_prob(false).shared_expert_intermediate_size(96);
}

LlamaOptions moe_options() { return LlamaOptions().qk_norm(true).moe_layers({1}); }

LlamaOptions qwen3_options() {
  return LlamaOptions().qk_norm(true).head_dim(32).rope_theta(1e6).tie_word_embeddings(true);
}

std::vector<std::string> reference_model_names() { return {"llama", "moe", "vlm", "moe_qwen", "gpt2", "qwen3"}; }

ReferenceModel reference_model(const std::string& name) {
  auto text_batches = [](const data::TextPipelineOptions& o) { return data::TextPipeline(o).source(); };
  if (name == "llama") {
    return {name, "decoder-only llama: GQA, rotary, SwiGLU (fused gate/up), RMSNorm", make_llama(llama_options()),
            text_batches, field_sharding(), KeyMap(llama_rules("", ""))};
  }
  if (name == "moe") {
    return {name,
            "Qwen3-MoE-style: per-head q/k RMSNorm before rotary, layer 0 dense, layer 1 a top-2 mixture of 4 SwiGLU "
            "experts (renormalized)",
            make_moe(moe_options()), text_batches, field_sharding(), KeyMap(llama_rules("", ""))};
  }
  if (name == "moe_qwen") {
    return {name,
            "llama with a Qwen2-MoE-style layer 1: top-2 of 4 experts without renormalization, a shared expert behind a "
            "sigmoid gate, rotary theta 1e6",
            make_moe(moe_qwen_options()), text_batches, field_sharding(), KeyMap(llama_rules("", ""))};
  }
  if (name == "qwen3") {
    return {name,
            "Qwen3-style decoder: per-head q/k RMSNorm before rotary, GQA (head_dim 32 apart from hidden / heads), "
            "rotary theta 1e6, SwiGLU, the head tied to the embedding",
            make_llama(qwen3_options()), text_batches, field_sharding(), KeyMap(llama_rules("", ""))};
  }
  if (name == "gpt2") {
    return {name, "GPT-2-style: learned positions, LayerNorm, fused q/k/v, GELU (tanh) MLP, Conv1D checkpoint layout",
            make_gpt2(), text_batches, field_sharding(), KeyMap(gpt2_rules())};
  }
  if (name == "vlm") {
    const VlmOptions o = vlm_options();
    std::vector<KeyRule> rules = llama_rules(R"(language_model\.)", "language_model.");
    rules.push_back({R"(vision_tower\.(.+))", {"vision_tower.vision_model.$1"}});
    rules.push_back({R"(multi_modal_projector\.(.+))", {"multi_modal_projector.$1"}});
    return {name,
            "LLaVA: a CLIP vision tower, a 2-layer GELU projector, llama with image placeholder tokens",
            make_vlm(o),
            [o](const data::TextPipelineOptions& t) {
              return vlm_batches(o, data::TextPipeline(t),
                                 data::ImagePipeline(data::ImagePipelineOptions()
                                                         .image_size(o.image_size())
                                                         .global_batch(t.global_batch())
                                                         .seed(t.seed())));
            },
            field_sharding(),
            KeyMap(rules)};
  }
  std::string names = join(reference_model_names(), ", ");
  MIH_THROW(Code::kInvalidSpec, "unknown reference model '", name, "'; known: ", names);
}

}  // namespace mih::models
