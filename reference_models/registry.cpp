// The reference-model catalog (see registry.h).
#include "reference_models/registry.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "harness/base/error.h"
#include "harness/base/fault.h"
#include "harness/base/files.h"
#include "harness/data/image_pipeline.h"
#include "reference_models/llama.h"
#include "reference_models/vlm.h"

namespace mih::models {
namespace {

// The language model's rules, with `prefix` before Hugging Face's "model." / "lm_head" keys
// and `internal` before our FQNs.
std::vector<KeyRule> llama_rules(const std::string& internal, const std::string& prefix) {
  const std::string l = internal + R"(layers\.(\d+)\.)";
  const std::string hf = prefix + "model.layers.$1.";
  std::vector<KeyRule> rules = {
      {internal + R"(embed_tokens\.weight)", {prefix + "model.embed_tokens.weight"}},
      {l + R"(input_layernorm\.weight)", {hf + "input_layernorm.weight"}},
      {l + R"(post_attention_layernorm\.weight)", {hf + "post_attention_layernorm.weight"}},
      {l + R"(self_attn\.(q|k|v|o)_proj\.weight)", {hf + "self_attn.$2_proj.weight"}},
      {l + R"(mlp\.gate_up_proj\.weight)", {hf + "mlp.gate_proj.weight", hf + "mlp.up_proj.weight"}},
      {l + R"(mlp\.down_proj\.weight)", {hf + "mlp.down_proj.weight"}},
      {l + R"(mlp\.router)", {hf + "block_sparse_moe.gate.weight"}},
      {internal + R"(lm_head\.weight)", {prefix + "lm_head.weight"}},
  };
  rules.push_back({l + R"(self_attn\.(q|k|v|o)_proj\.bias)", {hf + "self_attn.$2_proj.bias"}});
  // The stacked experts (MoeExperts): gate_up_proj [E * 2F, H] splits on dim 0 into each
  // expert's w1 (gate) and w3 (up), down_proj [E * H, F] into each expert's w2.
  std::vector<std::string> gate_up, down;
  for (int64_t e = 0; e < LlamaOptions().num_experts(); ++e) {
    const std::string expert = hf + "block_sparse_moe.experts." + std::to_string(e) + ".";
    gate_up.insert(gate_up.end(), {expert + "w1.weight", expert + "w3.weight"});
    down.push_back(expert + "w2.weight");
  }
  rules.push_back({l + R"(mlp\.experts\.gate_up_proj)", gate_up});
  rules.push_back({l + R"(mlp\.experts\.down_proj)", down});
  // F10 (FAULTS.md): the final norm left out of the key map.
  if (!fault::active(fault::Fault::kF10)) rules.push_back({internal + R"(norm\.weight)", {prefix + "model.norm.weight"}});
  return rules;
}

LlamaOptions llama_options() { return LlamaOptions(); }

VlmOptions vlm_options() { return VlmOptions().image_size(16); }

TrainerOptions field_sharding() {
  return TrainerOptions()
      .sequence_fields({"loss_mask", "attention_mask", "image_token_index"})
      .cp_replicated_fields({"pixel_values"});
}

}  // namespace

std::vector<std::string> reference_model_names() { return {"llama", "moe", "vlm"}; }

ReferenceModel reference_model(const std::string& name) {
  auto text_batches = [](const data::TextPipelineOptions& o) { return data::TextPipeline(o).source(); };
  if (name == "llama") {
    return {name, "decoder-only llama: GQA, rotary, SwiGLU (fused gate/up), RMSNorm", make_llama(llama_options()),
            text_batches, field_sharding(), KeyMap(llama_rules("", ""))};
  }
  if (name == "moe") {
    return {name, "llama with a top-2 mixture of 4 SwiGLU experts in layer 1", make_moe(llama_options()), text_batches,
            field_sharding(), KeyMap(llama_rules("", ""))};
  }
  if (name == "vlm") {
    const VlmOptions o = vlm_options();
    std::vector<KeyRule> rules = llama_rules(R"(language_model\.)", "language_model.");
    rules.push_back({R"(vision_tower\.(.+))", {"vision_tower.vision_model.$1"}});
    rules.push_back({R"(multi_modal_projector\.(linear_\d))", {"multi_modal_projector.$1.weight"}});
    return {name,
            "LLaVA-style: ViT tower, 2-layer projector, llama with image placeholder tokens",
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
  std::string names;
  for (const auto& n : reference_model_names()) names += (names.empty() ? "" : ", ") + n;
  MIH_THROW(Code::kInvalidSpec, "unknown reference model '", name, "'; known: ", names);
}

}  // namespace mih::models
