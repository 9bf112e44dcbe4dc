// The `mla` spec: the llama port with multi-head latent attention (LlamaOptions::attention("mla"),
// reference_models/mla_attention.h) in every layer, declared as a dense DeepSeek-V3
// (DeepseekV3ForCausalLM with first_k_dense_replace = the layer count, rope_interleave false),
// its golden from the builtin original (golden/builtin_mla.py), its parity case MLA written per
// head from the split weights.
#include <cmath>
#include <limits>

#include "reference_models/llama.h"
#include "specs/spec_support.h"
#include "suites/conformance.h"

namespace mih::specs {
namespace {

// Every head its own key (num_key_value_heads = num_attention_heads, as DeepSeek-V3 declares).
models::LlamaOptions mla_options() { return models::LlamaOptions().attention("mla").num_kv_heads(4); }

// DeepseekV3Config's fields for `o`: every layer dense, the rotary on halves (rope_interleave
// false, the rotate_half rotary of MlaAttention), no rope scaling, no biases.
spec::HfConfig hf_deepseek_v3_config(const models::LlamaOptions& o) {
  nlohmann::json f = hf_llama_fields(o);
  for (const char* llama_only : {"mlp_bias", "head_dim"}) f.erase(llama_only);
  const models::MlaOptions& m = o.mla();
  f["q_lora_rank"] = m.q_lora_rank();
  f["kv_lora_rank"] = m.kv_lora_rank();
  f["qk_nope_head_dim"] = m.qk_nope_head_dim();
  f["qk_rope_head_dim"] = m.qk_rope_head_dim();
  f["v_head_dim"] = m.v_head_dim();
  f["rope_interleave"] = false;
  f["first_k_dense_replace"] = o.num_layers();
  return {"deepseek_v3", {"DeepseekV3ForCausalLM"}, f};
}

// cos, sin [1, 1, S, D] of positions 0..S-1 (theta 10000, halves), for the parity case.
std::pair<at::Tensor, at::Tensor> rotary_table(int64_t seq, int64_t d) {
  const at::Tensor inv_freq = at::pow(10000.0, -at::arange(0, d, 2, at::kDouble) / static_cast<double>(d));
  const at::Tensor angles = at::outer(at::arange(seq, at::kDouble), inv_freq);  // [S, D/2]
  const at::Tensor full = at::cat({angles, angles}, -1).view({1, 1, seq, d});
  return {full.cos(), full.sin()};
}

// x [..., D] rotated by the angles of `cos`/`sin` in pairs (i, i + D/2), written per pair.
at::Tensor rotate_pairs(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  const at::Tensor a = x.narrow(-1, 0, half), b = x.narrow(-1, half, half);
  const at::Tensor c = cos.narrow(-1, 0, half), s = sin.narrow(-1, 0, half);
  return at::cat({a * c - b * s, b * c + a * s}, -1);
}

at::Tensor rms(const at::Tensor& x, const at::Tensor& w) { return x / at::sqrt(x.pow(2).mean(-1, true) + 1e-6) * w; }

// MlaAttention at tp = cp = 1 against MLA written independently: each head's query, key and
// value weights split out of the fused projections, the shared rotary key and the causal mask
// per head, the output a sum over heads of each head's slice of o_proj.
spec::ModuleParityCase mla_attention_case() {
  constexpr int64_t kHeads = 2, kSeq = 5;
  models::LlamaOptions o = models::LlamaOptions().attention("mla").hidden_size(16).num_heads(kHeads).num_kv_heads(kHeads);
  o.mla(models::MlaOptions().q_lora_rank(6).kv_lora_rank(5).qk_nope_head_dim(4).qk_rope_head_dim(4).v_head_dim(3));
  const models::MlaOptions m = o.mla();
  const int64_t dn = m.qk_nope_head_dim(), dr = m.qk_rope_head_dim(), dv = m.v_head_dim(), rkv = m.kv_lora_rank();
  spec::ModuleParityCase c;
  c.name = "mla_attention_vs_per_head_mla";
  c.candidate = [o, dr](ParallelContext& ctx) {
    models::MlaAttention attn(ctx, o);
    return spec::ParityCandidate{attn.ptr(), [a = attn.ptr(), dr](const std::vector<at::Tensor>& in) {
                                   auto [cos, sin] = rotary_table(in[0].size(1), dr);
                                   return a->forward(in[0], cos, sin);
                                 }};
  };
  c.weights = {{"q_a_proj.weight", "q_down"}, {"q_a_layernorm.weight", "q_norm"},
               {"kv_a_proj_with_mqa.weight", "kv_down", [rkv](const at::Tensor& w) { return w.narrow(0, 0, rkv); }},
               {"kv_a_proj_with_mqa.weight", "k_rope", [rkv, dr](const at::Tensor& w) { return w.narrow(0, rkv, dr); }},
               {"kv_a_layernorm.weight", "kv_norm"}};
  for (int64_t h = 0; h < kHeads; ++h) {
    const std::string n = std::to_string(h);
    const int64_t q0 = h * (dn + dr), kv0 = h * (dn + dv);
    c.weights.push_back({"q_b_proj.weight", "q_nope" + n, [q0, dn](const at::Tensor& w) { return w.narrow(0, q0, dn); }});
    c.weights.push_back(
        {"q_b_proj.weight", "q_rope" + n, [q0, dn, dr](const at::Tensor& w) { return w.narrow(0, q0 + dn, dr); }});
    c.weights.push_back({"kv_b_proj.weight", "k_nope" + n, [kv0, dn](const at::Tensor& w) { return w.narrow(0, kv0, dn); }});
    c.weights.push_back(
        {"kv_b_proj.weight", "v" + n, [kv0, dn, dv](const at::Tensor& w) { return w.narrow(0, kv0 + dn, dv); }});
    c.weights.push_back({"o_proj.weight", "o" + n, [h, dv](const at::Tensor& w) { return w.narrow(1, h * dv, dv); }});
  }
  c.reference = [dn, dr](const spec::ReferenceWeights& w, const std::vector<at::Tensor>& in) {
    const at::Tensor& x = in[0];
    auto [cos, sin] = rotary_table(kSeq, dr);
    const at::Tensor c_q = rms(at::matmul(x, w.at("q_down").t()), w.at("q_norm"));
    const at::Tensor c_kv = rms(at::matmul(x, w.at("kv_down").t()), w.at("kv_norm"));
    const at::Tensor k_rope = rotate_pairs(at::matmul(x, w.at("k_rope").t()), cos[0][0], sin[0][0]);  // [B, S, Dr]
    const at::Tensor keep = at::ones({kSeq, kSeq}, at::kBool).tril();
    at::Tensor out;
    for (int64_t h = 0; h < kHeads; ++h) {
      const std::string n = std::to_string(h);
      const at::Tensor q = at::cat({at::matmul(c_q, w.at("q_nope" + n).t()),
                                    rotate_pairs(at::matmul(c_q, w.at("q_rope" + n).t()), cos[0][0], sin[0][0])}, -1);
      const at::Tensor k = at::cat({at::matmul(c_kv, w.at("k_nope" + n).t()), k_rope}, -1);
      at::Tensor s = at::matmul(q, k.transpose(-1, -2)) / std::sqrt(static_cast<double>(dn + dr));
      s = at::where(keep, s, at::full_like(s, -std::numeric_limits<double>::infinity()));
      const at::Tensor head = at::matmul(at::matmul(at::softmax(s, -1), at::matmul(c_kv, w.at("v" + n).t())),
                                         w.at("o" + n).t());
      out = out.defined() ? out + head : head;
    }
    return out;
  };
  c.input_shapes = {{2, kSeq, o.hidden_size()}};
  return c;
}

// The llama port with MLA built with options `o`, registered as spec `name`.
spec::ModelSpec mla_spec_with(const std::string& name, const models::LlamaOptions& o) {
  spec::ModelSpec s = language_model_spec("llama", o);
  s.name = name;
  s.description =
      "llama with multi-head latent attention (DeepSeek-V3 MLA: compressed q and kv with their norms, one shared "
      "rotary key, v_head_dim apart from the query/key width) in every layer";
  s.factory = models::make_llama(o);
  s.num_key_value_heads = o.num_kv_heads();
  s.pipeline_layers = o.num_layers();
  s.invariants = llama_inv_freq_invariants("rotary_emb.inv_freq", o.rope_theta());
  s.parity_cases = {mla_attention_case()};
  s.checkpoint.hf = hf_deepseek_v3_config(o);
  s.checkpoint.key_map.push_back({R"(layers\.(\d+)\.self_attn\.(q_a_proj|q_a_layernorm|q_b_proj|kv_a_proj_with_mqa|)"
                                  R"(kv_a_layernorm|kv_b_proj)\.weight)",
                                  {"model.layers.$1.self_attn.$2.weight"}});
  s.golden.dir = reference_golden(name);
  s.golden.layers = llama_golden_layers(o.num_layers());
  s.golden.logits = "lm_head";
  return s;
}

spec::ModelSpec mla_spec() { return mla_spec_with("mla", mla_options()); }

// MLA over packed documents that attention never crosses (see llama_docs): the decoupled
// rotary key takes each document's positions, the latent keys and values are masked to the
// query's document at global token ids under cp; its golden is transformers' DeepseekV3, which
// finds the documents from the restarting position ids.
spec::ModelSpec mla_docs_spec() {
  spec::ModelSpec s = with_document_ids(mla_spec_with("mla_docs", mla_options().document_mask(true)));
  s.description += ", over packed documents, attention masked to each document (document_mask)";
  return s;
}

MIH_REGISTER_SPEC(mla_spec);
MIH_REGISTER_SPEC(mla_docs_spec);

}  // namespace
}  // namespace mih::specs

// The tensor-parallel layouts MLA changes (tp with and without sequence parallelism: the
// replicated low-rank projections and norms, their gradients partial over tp) and cp zigzag
// (the keys and the values of another width all-gathered over cp).
MIH_CONFORMANCE_SUITES(Mla, "mla", MIH_SPECS_DIR "/matrices/mla.json");
// Document masking on the cases that split the sequence (cp contiguous and zigzag, sp).
MIH_CONFORMANCE_SUITES(MlaDocs, "mla_docs", "cpu-smoke-documents");
