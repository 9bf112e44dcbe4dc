// What the reference specs (llama_spec.cpp, moe_spec.cpp, qwen3_spec.cpp, vlm_spec.cpp) share,
// installed for authors of Llama-, Qwen3-, Qwen-MoE- or LLaVA-style ports
// (<prefix>/include/specs/spec_support.h; the specs themselves under
// <prefix>/share/mih/examples/specs): the Hugging Face config fields of those architectures from
// the reference models' options, the parts of a spec every reference language model has, and
// the invariants and module parity case the llama spec lends the moe, qwen3 and vlm specs. A
// port of another architecture needs none of it: a spec includes harness/spec/model_spec.h and
// suites/conformance.h (`mih scaffold` writes one).
#pragma once

#include <algorithm>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "harness/base/error.h"
#include "harness/spec/model_spec.h"
#include "reference_models/llama.h"
#include "reference_models/registry.h"
#include "reference_models/vlm.h"

namespace mih::specs {

/// Hugging Face LlamaConfig's fields for options `o` (the names a LlamaForCausalLM loader
/// reads; max_position_embeddings and the token ids are not declared: the rotary table has no
/// length limit and the byte tokenizer is not a Hugging Face tokenizer). Every field that
/// changes the original's numbers is declared, defaults included (rope_scaling null,
/// pretraining_tp 1), so none defaults silently on the original's side (`mih inspect` warns
/// for one left out).
inline nlohmann::json hf_llama_fields(const models::LlamaOptions& o) {
  return {{"vocab_size", o.vocab_size()},
          {"hidden_size", o.hidden_size()},
          {"intermediate_size", o.intermediate_size()},
          {"num_hidden_layers", o.num_layers()},
          {"num_attention_heads", o.num_heads()},
          {"num_key_value_heads", o.num_kv_heads()},
          {"head_dim", o.resolved_head_dim()},
          {"hidden_act", "silu"},
          {"rms_norm_eps", o.rms_norm_eps()},
          {"rope_theta", o.rope_theta()},
          {"rope_scaling", nullptr},
          {"pretraining_tp", 1},
          {"tie_word_embeddings", o.tie_word_embeddings()},
          {"attention_bias", o.attention_bias()},
          {"attention_dropout", o.dropout()},
          {"mlp_bias", false},
          {"initializer_range", o.init_std()}};
}

/// LlamaForCausalLM.
inline spec::HfConfig hf_llama_config(const models::LlamaOptions& o) {
  return {"llama", {"LlamaForCausalLM"}, hf_llama_fields(o)};
}

/// MistralForCausalLM: Llama's decoder (no biases, no q/k norms) with a sliding window
/// (`sliding_window`, null when the options have none): LlamaConfig's fields less
/// attention_bias, mlp_bias and pretraining_tp. Throws: mih::Error{kInvalidSpec} for options
/// with attention biases or qk_norm, which Mistral has not.
inline spec::HfConfig hf_mistral_config(const models::LlamaOptions& o) {
  MIH_CHECK(!o.attention_bias() && !o.qk_norm(), "hf_mistral_config: Mistral has no attention biases and no q/k "
            "norms, the options have ", o.attention_bias() ? "attention_bias" : "qk_norm",
            "; declare the model as a LlamaForCausalLM or Qwen3ForCausalLM");
  nlohmann::json f = hf_llama_fields(o);
  for (const char* llama_only : {"attention_bias", "mlp_bias", "pretraining_tp"}) f.erase(llama_only);
  f["sliding_window"] = o.sliding_window() > 0 ? nlohmann::json(o.sliding_window()) : nlohmann::json(nullptr);
  return {"mistral", {"MistralForCausalLM"}, f};
}

/// Qwen3ForCausalLM for options with qk_norm (Qwen3's q_norm and k_norm; Qwen3Config has no
/// field for them, every Qwen3 has them): LlamaConfig's fields less pretraining_tp and
/// mlp_bias, head_dim always declared (Qwen3Config's default is 128, not hidden / heads), no
/// sliding window. Throws: mih::Error{kInvalidSpec} when `o` has no qk_norm.
inline spec::HfConfig hf_qwen3_config(const models::LlamaOptions& o) {
  MIH_CHECK(o.qk_norm(), "hf_qwen3_config: the options have no qk_norm, which every Qwen3 has; set qk_norm(true) or "
            "declare the model as a LlamaForCausalLM (hf_llama_config)");
  nlohmann::json f = hf_llama_fields(o);
  for (const char* llama_only : {"mlp_bias", "pretraining_tp"}) f.erase(llama_only);
  f["use_sliding_window"] = false;
  return {"qwen3", {"Qwen3ForCausalLM"}, f};
}

/// Qwen3MoeForCausalLM for the moe port (models::moe_options): Qwen3's attention (qk_norm),
/// the layers outside moe_layers dense (mlp_only_layers, as transformers defines it: their MLP
/// of intermediate_size), the sparse layers' experts of moe_intermediate_size, norm_topk_prob as
/// the port routes, no shared expert, output_router_logits true (the port trains with the
/// load-balancing loss, which transformers adds only then). Not Mixtral: it has every layer
/// sparse, and its loss over several sparse layers is over their router logits concatenated,
/// where the port sums a loss per layer; with one sparse layer the two agree. Throws:
/// mih::Error{kInvalidSpec} for options with a shared expert or without qk_norm.
inline spec::HfConfig hf_qwen3_moe_config(const models::LlamaOptions& o) {
  MIH_CHECK(o.shared_expert_intermediate_size() == 0, "hf_qwen3_moe_config: Qwen3-MoE has no shared expert, the options "
            "have one of ", o.shared_expert_intermediate_size(), "; declare it a Qwen2MoeForCausalLM (hf_qwen2_moe_config)");
  nlohmann::json f = hf_qwen3_config(o).fields;
  f["num_experts"] = o.num_experts();
  f["num_experts_per_tok"] = o.top_k();
  f["moe_intermediate_size"] = o.expert_intermediate_size();
  f["norm_topk_prob"] = o.norm_topk_prob();
  f["decoder_sparse_step"] = 1;
  std::vector<int64_t> dense;
  for (int64_t l = 0; l < o.num_layers(); ++l) {
    if (std::find(o.moe_layers().begin(), o.moe_layers().end(), l) == o.moe_layers().end()) dense.push_back(l);
  }
  f["mlp_only_layers"] = dense;
  f["router_aux_loss_coef"] = o.router_aux_loss_coef();
  f["output_router_logits"] = true;
  return {"qwen3_moe", {"Qwen3MoeForCausalLM"}, f};
}

/// Qwen2MoeForCausalLM for the moe port with Qwen2-MoE routing (moe_qwen_options): its dense
/// layers (mlp_only_layers) of intermediate_size, its sparse layers' experts of
/// moe_intermediate_size with a shared expert and its gate, norm_topk_prob as the port
/// routes, no q/k/v biases (qkv_bias false).
inline spec::HfConfig hf_qwen2_moe_config(const models::LlamaOptions& o) {
  nlohmann::json f = hf_llama_fields(o);
  for (const char* llama_only : {"attention_bias", "mlp_bias", "pretraining_tp"}) f.erase(llama_only);
  f["qkv_bias"] = o.attention_bias();
  f["use_sliding_window"] = false;
  f["num_experts"] = o.num_experts();
  f["num_experts_per_tok"] = o.top_k();
  f["moe_intermediate_size"] = o.expert_intermediate_size();
  f["shared_expert_intermediate_size"] = o.shared_expert_intermediate_size();
  f["norm_topk_prob"] = o.norm_topk_prob();
  f["decoder_sparse_step"] = 1;
  std::vector<int64_t> dense;
  for (int64_t l = 0; l < o.num_layers(); ++l) {
    if (std::find(o.moe_layers().begin(), o.moe_layers().end(), l) == o.moe_layers().end()) dense.push_back(l);
  }
  f["mlp_only_layers"] = dense;
  f["router_aux_loss_coef"] = o.router_aux_loss_coef();
  f["output_router_logits"] = true;
  return {"qwen2_moe", {"Qwen2MoeForCausalLM"}, f};
}

/// LlavaForConditionalGeneration: text_config a LlamaConfig, vision_config a CLIPVisionConfig
/// (quick_gelu, as CLIP), the features the last encoder layer's without the class token
/// (vision_feature_layer -1, strategy "default"), the projector with biases and GELU.
inline spec::HfConfig hf_llava_config(const models::VlmOptions& o) {
  nlohmann::json text = hf_llama_fields(o.text());
  text["model_type"] = "llama";
  const nlohmann::json vision = {{"model_type", "clip_vision_model"},
                                 {"hidden_size", o.vision_hidden_size()},
                                 {"intermediate_size", o.vision_intermediate_size()},
                                 {"num_hidden_layers", o.vision_layers()},
                                 {"num_attention_heads", o.vision_heads()},
                                 {"image_size", o.image_size()},
                                 {"patch_size", o.patch_size()},
                                 {"num_channels", o.channels()},
                                 {"hidden_act", "quick_gelu"},
                                 {"layer_norm_eps", 1e-5},
                                 {"attention_dropout", 0.0}};
  return {"llava",
          {"LlavaForConditionalGeneration"},
          {{"text_config", text},
           {"vision_config", vision},
           {"image_token_index", o.image_token_id()},
           {"projector_hidden_act", "gelu"},
           {"multimodal_projector_bias", true},
           {"vision_feature_layer", -1},
           {"vision_feature_select_strategy", "default"},
           {"image_seq_length", o.num_patches()},
           {"tie_word_embeddings", o.text().tie_word_embeddings()}}};
}

/// A reference model's spec with the parts every language model declares: its factory
/// (models::reference_model(name)), the text data contract (byte-level text of
/// /usr/share/common-licenses, 8 x 64 tokens, labels shifted in the pipeline, loss_mask and
/// attention_mask sharded on the sequence under cp, every field recomputed from the documents),
/// the checkpoint map with `o`'s Llama config, and the rotary table as shared state. Throws: mih::Error{kInvalidSpec} for a name
/// that is not a reference model.
inline spec::ModelSpec language_model_spec(const std::string& name, const models::LlamaOptions& o) {
  const models::ReferenceModel m = models::reference_model(name);
  spec::ModelSpec s;
  s.name = name;
  s.description = m.description;
  // Query heads split over tp; KV heads split, or replicated at tp above them.
  s.tp_divides = {o.num_heads(), o.intermediate_size()};
  s.num_key_value_heads = o.num_kv_heads();
  s.factory = m.factory;
  s.seq_len = 64;
  s.data.pipeline = "byte-level text over /usr/share/common-licenses, packed, labels shifted in the pipeline";
  s.data.make_batches = [batches = m.batches] {
    return batches(data::TextPipelineOptions().seq_len(64).global_batch(8));
  };
  s.data.labels_are_shifted = true;
  s.data.rows_from_documents = true;  // a TextPipeline: every field is recomputed from the documents
  s.data.fields = {{"loss_mask", /*forward=*/false, /*loss=*/true, spec::CpSharding::kSequence},
                   {"attention_mask", false, false, spec::CpSharding::kSequence}};
  s.checkpoint.key_map = m.key_map.rules();
  s.checkpoint.hf = hf_llama_config(o);
  // Older Hugging Face exports carry the rotary table; it is rebuilt here, never loaded.
  s.checkpoint.inference_only = {"*rotary_emb.inv_freq"};
  s.shared_state = {{"rotary.cos", "*rotary_emb", {"*layers.*"}}, {"rotary.sin", "*rotary_emb", {"*layers.*"}}};
  return s;
}

/// `s` (a language_model_spec) over packed documents that attention never crosses: its
/// documents cut to at most 23 bytes (25 tokens: several to a row of 64, of odd and even
/// lengths, straddling every cp chunk boundary; TextPipelineOptions::max_document_bytes), and
/// "document_ids" emitted (TextPipelineOptions::document_ids: which document of its row each
/// input is), a forward field handed whole to every cp rank (cp-replicated, so a
/// port's block-causal mask looks it up at global token ids, CpAttentionMask), and recomputed
/// from the documents with the other fields (PipelineOutputs). The port must mask by it
/// (LlamaOptions::document_mask).
inline spec::ModelSpec with_document_ids(spec::ModelSpec s) {
  const int64_t seq_len = s.seq_len;
  s.data.pipeline += ", documents of at most 23 bytes, document_ids (attention within each document)";
  s.data.make_batches = [seq_len] {
    return data::TextPipeline(
               data::TextPipelineOptions().seq_len(seq_len).global_batch(8).document_ids(true).max_document_bytes(23))
        .source();
  };
  s.data.fields.push_back({data::kDocumentIdsField, /*forward=*/true, /*loss=*/false, spec::CpSharding::kReplicated});
  return s;
}

/// `s` (a language_model_spec) over a dataset of `epoch_samples` samples served in epochs
/// (TextPipelineOptions::epoch_samples: a window of 65 tokens each, shuffled anew each epoch)
/// and drawn through a data::EpochLoader, whose epoch, position and seed every checkpoint saves
/// and a resume restores; each step's sample ids are its metrics' ledger (the DataLoaderState
/// suite). With 8 rows a step and 12 samples an epoch, steps straddle epoch boundaries.
inline spec::ModelSpec with_epochs(spec::ModelSpec s, int64_t epoch_samples) {
  const data::TextPipelineOptions options =
      data::TextPipelineOptions().seq_len(s.seq_len).global_batch(8).epoch_samples(epoch_samples);
  s.data.pipeline += ", epochs of " + std::to_string(epoch_samples) + " samples shuffled per epoch (a stateful loader)";
  s.data.make_batches = [options] { return data::TextPipeline(options).source(); };
  s.data.make_loader = [options] { return std::make_unique<data::EpochLoader>(data::TextPipeline(options)); };
  return s;
}

/// From llama_spec.cpp: the key listing of reference model `name` in Hugging Face layout
/// (<MIH_SPECS_DIR>/sources/<name>/, see its README; MIH_SPECS_DIR is the specs folder the
/// binary was built from), or "" when that folder is not there (a relocated install): then
/// the SourceCheckpoint suite is not instantiated.
std::string reference_source_checkpoint(const std::string& name);

/// From llama_spec.cpp: the golden of the original model the build made for reference spec
/// `name` (<MIH_GOLDENS_DIR>/<name>: golden.json and golden.safetensors, target mih_goldens;
/// docs/golden.md), or "" when that build made none (no Python with torch at configure time,
/// or a relocated install whose build tree is gone): then the MatchesOriginal suite is not
/// instantiated. A golden the build makes but that is missing from its tree is named all the
/// same, so that `mih test` refuses it (exit 12, naming `--no-golden`) instead of leaving
/// MatchesOriginal out unsaid.
std::string reference_golden(const std::string& name);

/// The golden layer map of a llama-style port with `layers` decoder layers (llama.h's
/// module names): embed_tokens -> hidden state 0, layers.i -> i + 1, norm -> layers + 1.
inline std::vector<std::pair<std::string, int64_t>> llama_golden_layers(int64_t layers) {
  std::vector<std::pair<std::string, int64_t>> map = {{"embed_tokens", 0}};
  for (int64_t i = 0; i < layers; ++i) map.emplace_back("layers." + std::to_string(i), i + 1);
  map.emplace_back("norm", layers + 1);
  return map;
}

/// From llama_spec.cpp: rotary inv_freq against its formula (a non-persistent buffer) after the
/// build and after a checkpoint load, and CP attention against an independent per-head loop
/// (output and the q, k, v gradients).
std::vector<spec::StateInvariant> llama_inv_freq_invariants(const std::string& fqn, double theta);
spec::ModuleParityCase llama_attention_case();
/// From llama_spec.cpp: the head `head` is one parameter with the embedding `embed` (an alias)
/// exactly when `tied` (the config's tie_word_embeddings).
spec::StateInvariant llama_tie_invariant(const std::string& embed, const std::string& head, bool tied);

}  // namespace mih::specs
