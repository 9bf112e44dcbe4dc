// The validation spec of the qwen3 reference port: the llama port with Qwen3's attention
// (LlamaOptions::qk_norm, head_dim apart from hidden / heads), declared as Qwen3ForCausalLM.
#include "reference_models/llama.h"
#include "reference_models/registry.h"
#include "specs/spec_support.h"
#include "suites/conformance.h"

namespace mih::specs {
namespace {

// Qwen3 (models::qwen3_options): q_norm and k_norm per head before rotary, 4 query heads of
// D 32 over hidden 64 (q_proj [128, 64], o_proj [64, 128]), 2 KV heads, rotary theta 1e6,
// SwiGLU, the head tied to the embedding. At tp 4 (cpu-smoke's Tp4) each KV head is
// replicated over 2 tp ranks: k_proj's rows and k_norm's weight are whole on both, each
// backpropagating only its own query heads' share, so their gradients are partial over tp
// (the gradient domain ColumnParallelLinearOptions::heads and HeadRMSNorm declare).
spec::ModelSpec qwen3_spec_with(const std::string& name, const models::LlamaOptions& o) {
  spec::ModelSpec s = language_model_spec("qwen3", o);
  s.name = name;
  s.factory = models::make_llama(o);
  s.pipeline_layers = o.num_layers();  // the reference llama builds its pipeline stages
  s.checkpoint.hf = hf_qwen3_config(o);
  s.checkpoint.tied = {{"embed_tokens.weight", "lm_head.weight"}};
  s.checkpoint.source = reference_source_checkpoint("qwen3");
  s.invariants = llama_inv_freq_invariants("rotary_emb.inv_freq", o.rope_theta());
  s.invariants.push_back(llama_tie_invariant("embed_tokens.weight", "lm_head.weight", o.tie_word_embeddings()));
  s.parity_cases = {llama_attention_case()};
  // The original (Qwen3's equations, the builtin or transformers' Qwen3ForCausalLM on this
  // spec's export): each decoder layer's output, the final norm's and the logits.
  s.golden.dir = reference_golden(name);
  s.golden.layers = llama_golden_layers(o.num_layers());
  s.golden.logits = "lm_head";
  return s;
}

spec::ModelSpec qwen3_spec() { return qwen3_spec_with("qwen3", models::qwen3_options()); }

// Packed documents that attention never crosses (see llama_docs in llama_spec.cpp).
spec::ModelSpec qwen3_docs_spec() {
  spec::ModelSpec s = with_document_ids(qwen3_spec_with("qwen3_docs", models::qwen3_options().document_mask(true)));
  s.description += "; packed documents, attention masked to each document (document_mask)";
  return s;
}

MIH_REGISTER_SPEC(qwen3_spec);
MIH_REGISTER_SPEC(qwen3_docs_spec);

}  // namespace
}  // namespace mih::specs

// Every conformance suite for this spec over the CI preset (`--matrix` overrides it).
MIH_CONFORMANCE_SUITES(Qwen3, "qwen3", "cpu-smoke");
// Document masking on the cases that split the sequence (cp contiguous, cp zigzag, sp).
MIH_CONFORMANCE_SUITES(Qwen3Docs, "qwen3_docs", "cpu-smoke-documents");
