// The validation spec of the vlm reference port (reference_models/vlm.h).
#include "reference_models/vlm.h"
#include "specs/spec_support.h"
#include "suites/conformance.h"

namespace mih::specs {
namespace {

// The tower's patch embedding (unfold + linear) against a strided convolution with the same
// weights: the ViT paper's patch embedding written the other standard way. The adapter
// reshapes the [Hv, C*p*p] weight into the convolution's [Hv, C, p, p]; its gradient comes
// back through the reshape.
spec::ModuleParityCase patch_embedding_case() {
  const models::VlmOptions o = models::VlmOptions().image_size(16).vision_layers(0);
  const int64_t hv = o.vision_hidden_size(), ch = o.channels(), p = o.patch_size();
  spec::ModuleParityCase c;
  c.name = "patch_embedding_vs_conv2d";
  c.candidate = [o](ParallelContext& ctx) {
    models::VisionTower tower(ctx, o);
    return spec::ParityCandidate{tower.ptr(), [t = tower.ptr()](const std::vector<at::Tensor>& in) { return t->forward(in[0]); }};
  };
  c.weights = {{"patch_embedding", "conv_weight", [=](const at::Tensor& w) { return w.reshape({hv, ch, p, p}); }},
               {"position_embedding"},
               {"post_layernorm.weight"},
               {"post_layernorm.bias"}};
  c.reference = [=](const spec::ReferenceWeights& w, const std::vector<at::Tensor>& in) {
    const at::Tensor conv = at::conv2d(in[0], w.at("conv_weight"), {}, p).flatten(2).transpose(1, 2);  // [N, P, Hv]
    // With no blocks the tower is the embedding then the final LayerNorm.
    return at::layer_norm(conv + w.at("position_embedding"), {hv}, w.at("post_layernorm.weight"),
                          w.at("post_layernorm.bias"), 1e-5);
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
  s.modalities = {{"pixel_values", {"vision_tower.*", "multi_modal_projector.*"}}};
  // Published only when images reach the model: a text-only batch (mixed instruction data)
  // runs no vision tower.
  s.shared_state.push_back({"vision.features", "vision_tower", {"multi_modal_projector"}, "pixel_values"});
  s.invariants = llama_inv_freq_invariants("language_model.rotary_emb.inv_freq", o.text().rope_theta());
  s.parity_cases = {patch_embedding_case(), llama_attention_case()};
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
