// The validation spec of the llama reference port (reference_models/llama.h).
#include <cmath>
#include <filesystem>
#include <limits>

#include "harness/contract/evidence_layout.h"
#include "reference_models/llama.h"
#include "specs/spec_support.h"
#include "suites/conformance.h"

namespace mih::specs {
namespace {

// inv_freq[i] = 1 / theta^(2i / D), recomputed here independently: after the model is built,
// and again after a checkpoint load (a non-persistent buffer is not in the checkpoint, so the
// load must rebuild it).
spec::StateInvariant inv_freq_invariant(const std::string& fqn, double theta, spec::Phase phase) {
  const std::string name = phase == spec::Phase::kCheckpoint ? "inv_freq_rebuilt_after_load" : "inv_freq_matches_formula";
  return {name, phase, [fqn, theta](const TrainingState& t) -> spec::CheckResult {
            for (const auto& b : t.context->buffers()) {
              if (b.fqn != fqn) continue;
              const int64_t half = b.tensor.numel(), d = 2 * half;
              at::Tensor expected = at::empty({half}, at::kDouble);
              for (int64_t i = 0; i < half; ++i) expected[i] = 1.0 / std::pow(theta, 2.0 * static_cast<double>(i) / d);
              const double err = (b.tensor.to(at::kDouble).cpu() - expected).abs().max().item<double>();
              return {err <= 1e-6 * expected.abs().max().item<double>() && !b.persistent,
                      {{"buffer", fqn}, {"max_abs_error", err}, {"persistent", b.persistent}}};
            }
            return {false, {{"missing_buffer", fqn}}};
          }};
}

// The head is one parameter with the embedding exactly when the config ties them.
spec::StateInvariant tie_invariant(const std::string& embed, const std::string& head, bool tied) {
  return {"embedding_and_head_tied_as_configured", spec::Phase::kStructure,
          [embed, head, tied](const TrainingState& t) -> spec::CheckResult {
            bool aliased = false;
            for (const auto& p : t.context->parameters()) {
              if (p->fqn != embed) continue;
              aliased = std::find(p->aliases.begin(), p->aliases.end(), head) != p->aliases.end();
            }
            return {aliased == tied, {{"embedding", embed}, {"head", head}, {"tied", tied}, {"aliased", aliased}}};
          }};
}

// LlamaMlp (fused [gate; up], column-parallel) against SwiGLU written from the split weights.
// The adapter splits the fused weight in two; the gradients of the halves add up to the fused
// weight's gradient through the split.
spec::ModuleParityCase fused_swiglu_case() {
  const models::LlamaOptions o = models::LlamaOptions().hidden_size(16).intermediate_size(24);
  const int64_t f = o.intermediate_size();
  spec::ModuleParityCase c;
  c.name = "fused_swiglu_vs_unfused";
  c.candidate = [o](ParallelContext& ctx) {
    models::LlamaMlp mlp(ctx, o);
    return spec::ParityCandidate{mlp.ptr(), [m = mlp.ptr()](const std::vector<at::Tensor>& in) { return m->forward(in[0]); }};
  };
  c.weights = {{"gate_up_proj.weight", "gate", [f](const at::Tensor& w) { return w.narrow(0, 0, f); }},
               {"gate_up_proj.weight", "up", [f](const at::Tensor& w) { return w.narrow(0, f, f); }},
               {"down_proj.weight", "down"}};
  c.reference = [](const spec::ReferenceWeights& w, const std::vector<at::Tensor>& in) {
    const at::Tensor gate = at::linear(in[0], w.at("gate")), up = at::linear(in[0], w.at("up"));
    return at::linear(gate * at::sigmoid(gate) * up, w.at("down"));
  };
  c.input_shapes = {{2, 5, o.hidden_size()}};
  return c;
}

// cp_causal_attention with GQA at cp = 1 against attention written independently: an explicit
// per-head loop with the causal mask from a lower-triangular matrix. A function of q, k, v (no
// parameters): the output and the three input gradients are compared.
spec::ModuleParityCase attention_case() {
  constexpr int64_t kHeads = 4, kKvHeads = 2, kSeq = 6, kHeadDim = 8;
  spec::ModuleParityCase c;
  c.name = "cp_attention_vs_plain_attention";
  c.candidate = [](ParallelContext&) {
    return spec::ParityCandidate{nullptr, [](const std::vector<at::Tensor>& in) {
                                   return cp_causal_attention(in[0], in[1], in[2], CpShard{});
                                 }};
  };
  c.reference = [](const spec::ReferenceWeights&, const std::vector<at::Tensor>& in) {
    const at::Tensor keep = at::ones({kSeq, kSeq}, at::kBool).tril();
    std::vector<at::Tensor> heads;
    for (int64_t h = 0; h < kHeads; ++h) {
      const int64_t kv = h / (kHeads / kKvHeads);
      at::Tensor s = at::matmul(in[0].select(1, h), in[1].select(1, kv).transpose(-1, -2)) /
                     std::sqrt(static_cast<double>(kHeadDim));
      s = at::where(keep, s, at::full_like(s, -std::numeric_limits<double>::infinity()));
      heads.push_back(at::matmul(at::softmax(s, -1), in[2].select(1, kv)));
    }
    return at::stack(heads, 1);
  };
  c.input_shapes = {{2, kHeads, kSeq, kHeadDim}, {2, kKvHeads, kSeq, kHeadDim}, {2, kKvHeads, kSeq, kHeadDim}};
  return c;
}

std::vector<spec::StateInvariant> inv_freq_invariants(const std::string& fqn, double theta) {
  return {inv_freq_invariant(fqn, theta, spec::Phase::kStructure), inv_freq_invariant(fqn, theta, spec::Phase::kCheckpoint)};
}

// The llama port built with options `o`, registered as spec `name`.
spec::ModelSpec llama_spec_with(const std::string& name, const models::LlamaOptions& o) {
  spec::ModelSpec s = language_model_spec("llama", o);
  s.name = name;
  s.factory = models::make_llama(o);
  s.pipeline_layers = o.num_layers();  // the reference llama builds its pipeline stages
  s.invariants = inv_freq_invariants("rotary_emb.inv_freq", o.rope_theta());
  s.invariants.push_back(tie_invariant("embed_tokens.weight", "lm_head.weight", o.tie_word_embeddings()));
  s.parity_cases = {fused_swiglu_case(), attention_case()};
  s.checkpoint.source = reference_source_checkpoint("llama");
  return s;
}

spec::ModelSpec llama_spec() {
  const models::LlamaOptions o;
  spec::ModelSpec s = llama_spec_with("llama", o);
  // The original (the golden producer's builtin Llama on this spec's export): each decoder
  // layer's output, the final norm's and the logits, the gradients and the step.
  s.golden.dir = reference_golden("llama");
  s.golden.layers = llama_golden_layers(o.num_layers());
  s.golden.logits = "lm_head";
  return s;
}

// Variants of the port for the fault catalog (docs/fault-catalog.md; `mih faults`): the features some
// faults need, each a spec of its own so the reference matrix stays as it is. Their suites
// are instantiated on request only (MIH_CONFORMANCE_SUITES_ON_REQUEST below).
spec::ModelSpec llama_tied_spec() {
  spec::ModelSpec s = llama_spec_with("llama_tied", models::LlamaOptions().tie_word_embeddings(true));
  s.description = "llama with the output head tied to the token embedding (tie_word_embeddings)";
  s.checkpoint.tied = {{"embed_tokens.weight", "lm_head.weight"}};
  s.checkpoint.source = "";  // the listing is of the untied model (a tied export has no lm_head.weight)
  return s;
}

spec::ModelSpec llama_bias_spec() {
  spec::ModelSpec s = llama_spec_with("llama_bias", models::LlamaOptions().attention_bias(true).loss_parallel(false));
  s.description =
      "llama with biases on q, k, v and the row-parallel o projection (attention_bias), its logits all-gathered over "
      "tp and an ordinary cross entropy (loss_parallel off)";
  s.checkpoint.source = "";  // the listing has no biases
  return s;
}

spec::ModelSpec llama_unsharded_root_spec() {
  spec::ModelSpec s = llama_spec_with("llama_unsharded_root", models::LlamaOptions().fsdp_root(false));
  s.description =
      "llama whose root module (token embedding, final norm, head) stays out of FSDP: whole on every dp_shard rank, "
      "its gradients all-reduced over dp_shard (fsdp_root off)";
  return s;
}

spec::ModelSpec llama_dropout_spec() {
  spec::ModelSpec s = llama_spec_with("llama_dropout", models::LlamaOptions().dropout(0.1));
  s.description = "llama with dropout 0.1 on the attention context and the residual branches";
  // Its masks are not drawn stage-wise yet (LlamaOptions::validate refuses dropout under pp).
  s.pipeline_layers = 0;
  return s;
}

// Four decoder layers: stages enough for interleaved 1F1B (pp 2 x vpp 2) and pp 4.
spec::ModelSpec llama_deep_spec() {
  spec::ModelSpec s = llama_spec_with("llama_deep", models::LlamaOptions().num_layers(4));
  s.description = "llama with 4 decoder layers (the pipeline stages of pp 2 x vpp 2 and of pp 4)";
  s.checkpoint.source = "";  // the listing is of the 2-layer model
  return s;
}

// A port that never declares a module's output to the activation probes (no
// ParallelContext::observe call): what mih can say of its failures without them (the
// localization names the loss, and says why it can go no further).
spec::ModelSpec llama_unobserved_spec() {
  spec::ModelSpec s = llama_spec_with("llama_unobserved", models::LlamaOptions().observe_activations(false));
  s.description = "llama that never calls ParallelContext::observe (no activation probes)";
  return s;
}

// Packed documents that attention never crosses (document_ids, a block-causal mask in global
// token ids): the cases that split the sequence (cp contiguous and zigzag, sp), with its own
// golden; llama's own cases are the single-document control.
spec::ModelSpec llama_docs_spec() {
  const models::LlamaOptions o = models::LlamaOptions().document_mask(true);
  spec::ModelSpec s = with_document_ids(llama_spec_with("llama_docs", o));
  s.description = "llama over packed documents, attention masked to each document (document_mask)";
  s.golden.dir = reference_golden("llama_docs");
  s.golden.layers = llama_golden_layers(o.num_layers());
  s.golden.logits = "lm_head";
  return s;
}

// Sliding-window attention (a window of 8 in rows of 64, in global token ids) over the same
// packed documents: the window crosses every cp chunk boundary and composes with the documents;
// declared a MistralForCausalLM (Llama's decoder with sliding_window), its own golden.
spec::ModelSpec llama_swa_spec() {
  const models::LlamaOptions o = models::LlamaOptions().document_mask(true).sliding_window(8);
  spec::ModelSpec s = with_document_ids(llama_spec_with("llama_swa", o));
  s.description = "llama with sliding-window attention (8 tokens) over packed documents (a Mistral)";
  s.checkpoint.hf = hf_mistral_config(o);
  s.golden.dir = reference_golden("llama_swa");
  s.golden.layers = llama_golden_layers(o.num_layers());
  s.golden.logits = "lm_head";
  return s;
}

// The long-horizon lane: epochs of 12 samples (8 a step, so steps straddle the epoch
// boundaries) drawn through a loader whose state the checkpoint saves, a warmup-then-cosine
// schedule over 50 steps, and resumes held to bit-exactness in float64 (same_topology 0: a
// resume on the config it saved from recomputes the uninterrupted run's every bit).
spec::ModelSpec llama_epochs_spec() {
  spec::ModelSpec s = with_epochs(llama_spec_with("llama_epochs", models::LlamaOptions()), 12);
  s.description = "llama over epochs of 12 samples from a stateful loader, warmup then cosine over 50 steps";
  s.trainer.warmup_steps(2).decay_steps(48).min_lr(1e-4);
  s.tolerances.same_topology["float64"] = 0;
  // Its golden takes the original's step at the schedule's learning rate of step 0 (half the
  // peak, in the warmup): MatchesOriginal fails on a golden stepped at the peak.
  s.golden.dir = reference_golden(s.name);
  s.golden.layers = llama_golden_layers(models::LlamaOptions().num_layers());
  s.golden.logits = "lm_head";
  return s;
}

MIH_REGISTER_SPEC(llama_spec);
MIH_REGISTER_SPEC(llama_epochs_spec);
// The same, for the 50-step matrix on request (a spec of its own: its evidence apart).
spec::ModelSpec llama_epochs_long_spec() {
  spec::ModelSpec s = llama_epochs_spec();
  s.name = "llama_epochs_long";
  s.description += " (the 50-step lane)";
  s.golden.dir = "";  // llama_epochs' Reference holds the original's step 0
  return s;
}
MIH_REGISTER_SPEC(llama_epochs_long_spec);
MIH_REGISTER_SPEC(llama_docs_spec);
MIH_REGISTER_SPEC(llama_swa_spec);
MIH_REGISTER_SPEC(llama_tied_spec);
MIH_REGISTER_SPEC(llama_bias_spec);
MIH_REGISTER_SPEC(llama_unsharded_root_spec);
MIH_REGISTER_SPEC(llama_dropout_spec);
MIH_REGISTER_SPEC(llama_deep_spec);
MIH_REGISTER_SPEC(llama_unobserved_spec);

}  // namespace

// Shared with the moe, qwen3 and vlm specs.
std::string reference_source_checkpoint(const std::string& name) {
  const std::filesystem::path dir = std::filesystem::path(MIH_SPECS_DIR) / "sources" / name;
  return std::filesystem::is_directory(dir) ? dir.string() : "";
}

std::string reference_golden(const std::string& name) {
  const std::filesystem::path dir = std::filesystem::path(MIH_GOLDENS_DIR) / name;
  if (std::filesystem::is_regular_file(dir / layout::kGoldenManifest)) return dir.string();
#ifdef MIH_GOLDENS_MADE
  // The build makes this golden and its tree is still there: a golden missing from it was
  // removed or never built, never a reason to leave MatchesOriginal out unsaid. Named, the run
  // refuses it (exit 12, naming `--no-golden` and the target that makes it).
  if (std::filesystem::is_directory(std::filesystem::path(MIH_GOLDENS_DIR).parent_path() / "CMakeFiles")) {
    return dir.string();
  }
#endif
  return "";
}

std::vector<spec::StateInvariant> llama_inv_freq_invariants(const std::string& fqn, double theta) {
  return inv_freq_invariants(fqn, theta);
}
spec::ModuleParityCase llama_attention_case() { return attention_case(); }
spec::StateInvariant llama_tie_invariant(const std::string& embed, const std::string& head, bool tied) {
  return tie_invariant(embed, head, tied);
}

}  // namespace mih::specs

// Every conformance suite for this spec over the CI preset (`--matrix` overrides it).
MIH_CONFORMANCE_SUITES(Llama, "llama", "cpu-smoke");
// The variants whose features change the parallel layout (a tie across the vocab-parallel
// embedding and head, row-parallel biases, parameters FSDP leaves whole) run in the main job
// on their own lane.
MIH_CONFORMANCE_SUITES(LlamaTied, "llama_tied", "cpu-smoke-variants");
MIH_CONFORMANCE_SUITES(LlamaBias, "llama_bias", "cpu-smoke-variants");
MIH_CONFORMANCE_SUITES(LlamaUnshardedRoot, "llama_unsharded_root", "cpu-smoke-variants");
// Four layers: the lane's interleaved (pp 2 x vpp 2) and pp 4 cases, which the two-layer
// specs cannot take.
MIH_CONFORMANCE_SUITES(LlamaDeep, "llama_deep", "cpu-smoke-variants");
// Dropout 0.1 on every case: its masks depend only on each element's global position
// (ParallelContext::dropout), so every split of the batch matches the one-rank reference.
MIH_CONFORMANCE_SUITES(LlamaDropout, "llama_dropout", "cpu-smoke");
// Document masking on the cases that split the sequence (cp contiguous, cp zigzag, sp).
MIH_CONFORMANCE_SUITES(LlamaDocs, "llama_docs", "cpu-smoke-documents");
// The long horizon: resumes mid-epoch, across an epoch boundary and onto another dp degree
// (4 steps); its 50-step version on request (specs/matrices/llama_epochs_long.json).
MIH_CONFORMANCE_SUITES(LlamaEpochs, "llama_epochs", MIH_SPECS_DIR "/matrices/llama_epochs.json");
MIH_CONFORMANCE_SUITES_ON_REQUEST(LlamaEpochsLong, "llama_epochs_long", MIH_SPECS_DIR "/matrices/llama_epochs_long.json");
// Sliding-window attention (with the documents) on the same cases.
MIH_CONFORMANCE_SUITES(LlamaSwa, "llama_swa", "cpu-smoke-documents");
// No activation probes: on request only (`--prefixes LlamaUnobserved`; tests/cli/honest_blame.py).
MIH_CONFORMANCE_SUITES_ON_REQUEST(LlamaUnobserved, "llama_unobserved", "cpu-smoke");
