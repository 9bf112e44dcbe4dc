// The validation spec of the vlm reference port (reference_models/vlm.h).
#include "reference_models/vlm.h"
#include "specs/spec_support.h"
#include "suites/conformance.h"

namespace mih::specs {
namespace {

// The tower's embeddings (the patch convolution computed as unfold + matmul, the class token,
// the position embeddings) against CLIPVisionEmbeddings' own formulation: a strided conv2d of
// the [Hv, C, p, p] weight, flattened, the class embedding concatenated before it.
spec::ModuleParityCase patch_embedding_case() {
  const models::VlmOptions o = models::VlmOptions().image_size(16);
  const int64_t hv = o.vision_hidden_size(), ch = o.channels(), p = o.patch_size();
  spec::ModuleParityCase c;
  c.name = "patch_embedding_vs_conv2d";
  c.candidate = [o](ParallelContext& ctx) {
    models::VisionEmbeddings embeddings(ctx, o);
    return spec::ParityCandidate{embeddings.ptr(),
                                 [e = embeddings.ptr()](const std::vector<at::Tensor>& in) { return e->forward(in[0]); }};
  };
  c.weights = {{"patch_embedding.weight", "conv_weight"}, {"class_embedding"}, {"position_embedding.weight", "positions"}};
  c.reference = [=](const spec::ReferenceWeights& w, const std::vector<at::Tensor>& in) {
    const at::Tensor conv = at::conv2d(in[0], w.at("conv_weight"), {}, p).flatten(2).transpose(1, 2);  // [N, P, Hv]
    const at::Tensor cls = w.at("class_embedding").expand({in[0].size(0), 1, hv});
    return at::cat({cls, conv}, 1) + w.at("positions");
  };
  c.input_shapes = {{2, ch, o.image_size(), o.image_size()}};
  return c;
}

spec::ModelSpec vlm_spec() {
  const models::VlmOptions o = models::VlmOptions().image_size(16);
  spec::ModelSpec s = language_model_spec("vlm", o.text());
  s.checkpoint.hf = hf_llava_config(o);
  s.data.pipeline += "; one procedural image per row, its patches replacing the first placeholder tokens";
  s.data.fields.push_back({"image_token_index", true, false, spec::CpSharding::kSequence});
  s.data.fields.push_back({"pixel_values", true, false, spec::CpSharding::kReplicated});
  s.modalities = {{"pixel_values",
                   {"vision_tower.embeddings.*", "vision_tower.pre_layrnorm.*", "vision_tower.encoder.*",
                    "multi_modal_projector.*"}}};
  // CLIP's pooled-output norm: in the checkpoint, never in LLaVA's forward (the features are a
  // hidden state before it), so it trains in neither.
  s.unused_parameters = {"vision_tower.post_layernorm.*"};
  // CLIP's class token is a 1-D embedding, not a scale: kept out of the decay, as ViT recipes
  // (timm's no_weight_decay: cls_token, pos_embed) do; the biases and norms as every spec.
  s.trainer.no_weight_decay({"*bias", "*norm*", "*class_embedding"});
  // Published only when images reach the model: a text-only batch (mixed instruction data)
  // runs no vision tower.
  s.shared_state.push_back({"vision.features", "vision_tower", {"multi_modal_projector"}, "pixel_values"});
  s.invariants = llama_inv_freq_invariants("language_model.rotary_emb.inv_freq", o.text().rope_theta());
  s.parity_cases = {patch_embedding_case(), llama_attention_case()};
  // The original (transformers' LlavaForConditionalGeneration on this spec's export): the
  // language model's decoder layers and final norm (its hidden state 0 is the embeddings with
  // the image features merged in, which no module of the port outputs).
  s.golden.dir = reference_golden("vlm");
  for (auto [module, index] : llama_golden_layers(o.text().num_layers())) {
    if (index > 0) s.golden.layers.emplace_back("language_model." + module, index);
  }
  s.golden.logits = "language_model.lm_head";
  return s;
}

// The LLaVA recipe: the vision tower frozen, the projector and the language model trained.
// The frozen tower is its own FSDP unit at the input (no gradient reaches it), so it has no
// reduce-scatter and no gather for backward; the pixels must still train the projector.
spec::ModelSpec vlm_frozen_vision_spec() {
  spec::ModelSpec s = vlm_spec();
  s.name = "vlm_frozen_vision";
  s.description = "vlm with the vision tower frozen (ModelSpec::frozen)";
  s.frozen = {"vision_tower.*"};
  s.unused_parameters = {};
  s.golden = {};  // the build's golden is of vlm's export (its tower trains): the variant has none
  s.modalities = {{"pixel_values", {"multi_modal_projector.*"}}};
  return s;
}

// Mixed instruction data: every third global batch (steps 1, 4, ...) is text only, with no
// pixel_values and no image placeholders, as when a step draws only text samples. The vision
// tower and projector get no gradient then and the optimizer must leave them as they are;
// their FSDP unit is not gathered; the vision features are not published.
spec::ModelSpec vlm_mixed_spec() {
  spec::ModelSpec s = vlm_spec();
  s.name = "vlm_mixed";
  s.golden = {};  // the build's golden is of vlm's first batch; this variant's batches differ
  s.description = "vlm on mixed data: the global batch of steps 1, 4, 7, ... is text only";
  s.data.pipeline += "; the global batch of every step k with k % 3 == 1 is text only (no pixel_values, no placeholders)";
  s.data.make_batches = [] {
    const data::TextPipelineOptions text = data::TextPipelineOptions().seq_len(64).global_batch(8);
    const BatchSource with_images = models::reference_model("vlm").batches(text);
    const BatchSource text_only = data::TextPipeline(text).source();
    return BatchSource([with_images, text_only](int64_t step) { return step % 3 == 1 ? text_only(step) : with_images(step); });
  };
  return s;
}

MIH_REGISTER_SPEC(vlm_spec);
MIH_REGISTER_SPEC(vlm_frozen_vision_spec);
MIH_REGISTER_SPEC(vlm_mixed_spec);

}  // namespace
}  // namespace mih::specs

// Every conformance suite for this spec over the CI preset (`--matrix` overrides it).
MIH_CONFORMANCE_SUITES(Vlm, "vlm", "cpu-smoke");
// The frozen-tower variant on the variants lane (FSDP, TP, TP with SP).
MIH_CONFORMANCE_SUITES(VlmFrozenVision, "vlm_frozen_vision", "cpu-smoke-variants");
// Mixed data (a text-only step): on request only (`--prefixes VlmMixed`; tests/cli/correct_ports.py).
MIH_CONFORMANCE_SUITES_ON_REQUEST(VlmMixed, "vlm_mixed", "cpu-smoke");
