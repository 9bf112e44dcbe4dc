// The reference-model catalog and `mih export` (see registry.h).
#include "reference_models/registry.h"

#include <cstdio>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "harness/base/error.h"
#include "harness/base/fault.h"
#include "harness/base/files.h"
#include "harness/checkpoint/distributed_checkpoint.h"
#include "harness/checkpoint/safetensors.h"
#include "harness/compat/store.h"
#include "harness/data/image_pipeline.h"
#include "harness/runtime/dtypes.h"
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

std::vector<std::pair<std::string, at::Tensor>> sorted(const std::map<std::string, at::Tensor>& m) {
  return {m.begin(), m.end()};
}

void write_tensors(const std::filesystem::path& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                   std::vector<at::Tensor>* keep) {
  std::vector<safetensors::TensorView> views;
  for (const auto& [name, t] : tensors) {
    at::Tensor c = t.detach().cpu().contiguous();
    keep->push_back(c);
    views.push_back({name, safetensors_dtype(c.scalar_type()), c.sizes().vec(), c.data_ptr(), c.nbytes()});
  }
  safetensors::write_file(path, views, {{"format", "pt"}});
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

double export_reference_model(const ExportOptions& options) {
  ReferenceModel model = reference_model(options.model);
  MIH_CHECK(!options.out.empty(), "export: --out DIR is required");
  ParallelConfig config;
  config.dtype = parse_dtype_name(options.dtype);
  config.seed = options.seed;
  compat::Store store = compat::make_hash_store(std::chrono::seconds(30));
  MeshOptions mesh_options;
  mesh_options.group.gloo_hostname = "127.0.0.1";
  DeviceMesh mesh(config, store, 0, 1, mesh_options);
  BatchSource batches = model.batches(options.text);
  Trainer trainer(mesh, config, model.factory, batches, model.trainer_options);
  ParallelModel& net = trainer.model();
  net.eval();  // no dropout in the reference numbers

  std::vector<at::Tensor> keep;
  std::map<std::string, at::Tensor> weights;
  for (const auto& p : trainer.context().parameters()) {
    for (auto& [key, tensor] : model.key_map.to_external(p->fqn, trainer.gather_full(*p))) {
      MIH_INTERNAL_ASSERT(!weights.count(key), "export: two parameters map to the external key '", key, "'");
      weights[key] = tensor;
    }
  }
  write_tensors(options.out / "model.safetensors", sorted(weights), &keep);

  Batch batch = batches(0);
  std::map<std::string, at::Tensor> batch_tensors = {
      {"input_ids", batch.input_ids}, {"labels", batch.labels}, {"position_ids", batch.position_ids}};
  for (const auto& [name, t] : batch.fields) batch_tensors[name] = t;
  write_tensors(options.out / "batch.safetensors", sorted(batch_tensors), &keep);

  at::Tensor losses, logits;
  {
    at::NoGradGuard no_grad;
    if (auto* lm = dynamic_cast<LlamaForCausalLM*>(&net)) {
      logits = lm->logits(batch);
      losses = lm->losses(logits, batch);
    } else {
      auto& vlm = dynamic_cast<VlmForConditionalGeneration&>(net);
      logits = vlm.logits(batch);
      losses = vlm.language_model->losses(logits, batch);
    }
  }
  const double valid = batch.labels.ne(-100).sum().item<double>();
  at::Tensor loss = losses.sum() / valid;
  write_tensors(options.out / "reference.safetensors", {{"logits", logits}, {"loss", loss}}, &keep);

  nlohmann::json tensors = nlohmann::json::object();
  for (const auto& [key, t] : weights) tensors[key] = t.sizes().vec();
  nlohmann::json config_json = {{"model", model.name},
                                {"description", model.description},
                                {"dtype", options.dtype},
                                {"seed", options.seed},
                                {"text_pipeline", options.text},
                                {"logits_shape", logits.sizes().vec()},
                                {"loss", loss.item<double>()},
                                {"key_map", model.key_map.to_json()},
                                {"weights", tensors}};
  write_file_atomic(options.out / "config.json", config_json.dump(2));
  return loss.item<double>();
}

int export_command(const std::string& model, const std::filesystem::path& out, const std::filesystem::path& corpus,
                   int64_t seq_len, int64_t batch, const std::string& dtype, uint64_t seed) {
  ExportOptions o;
  o.model = model;
  o.out = out;
  o.text = data::TextPipelineOptions().corpus(corpus).seq_len(seq_len).global_batch(batch).seed(seed);
  o.dtype = dtype;
  o.seed = seed;
  const double loss = export_reference_model(o);
  std::printf("mih export: %s (%s) -> %s: model.safetensors (Hugging Face keys), batch.safetensors, "
              "reference.safetensors (logits, loss %.6f), config.json\n",
              model.c_str(), dtype.c_str(), out.c_str(), loss);
  return 0;
}

}  // namespace mih::models
