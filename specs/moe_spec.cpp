// The validation spec of the moe reference port (llama with Qwen3's attention and MoeMlp in
// layer 1), declared as a stock Qwen3MoeForCausalLM (layer 0 in mlp_only_layers).
#include <algorithm>
#include <cmath>
#include <string>

#include "reference_models/llama.h"
#include "reference_models/registry.h"
#include "specs/spec_support.h"
#include "suites/conformance.h"

namespace mih::specs {
namespace {

// After a step, each MoE layer routed every token of the global batch to top_k experts.
spec::StateInvariant expert_counts_invariant(int64_t global_tokens, int64_t top_k) {
  return {"expert_counts_sum_to_tokens_times_top_k", spec::Phase::kRuntime,
          [global_tokens, top_k](const TrainingState& t) -> spec::CheckResult {
            nlohmann::json facts = nlohmann::json::array();
            bool ok = true;
            // The counts are of the last forward: one micro-batch's share of the global batch.
            const int64_t forward_tokens = global_tokens / (t.config ? t.config->micro_batches : 1);
            for (auto* moe : dynamic_cast<models::LlamaForCausalLM&>(*t.model).moe_mlps()) {
              const int64_t sum = moe->last_expert_counts.defined() ? moe->last_expert_counts.sum().item<int64_t>() : -1;
              ok = ok && sum == forward_tokens * top_k;
              facts.push_back({{"counted", sum}, {"expected", forward_tokens * top_k}});
            }
            // A pipeline stage without MoE layers has none to count (the stages that hold them
            // do; the session requires the invariant to hold on every stage).
            if (facts.empty() && t.config && t.config->pipelined()) {
              return {true, {{"layers", facts}, {"note", "no MoE layer on this pipeline stage"}}};
            }
            return {ok && !facts.empty(), {{"layers", facts}}};
          }};
}

// MoeMlp against a per-token loop: softmax router, the top_k experts by probability, their
// SwiGLU outputs weighted by the renormalized probabilities, and the load-balancing loss
// (alpha * E * sum_e f_e * P_e over the tokens, Switch Transformer eq. 4, f_e the fraction of
// tokens with e among their top_k as Mixtral counts it) as the aux loss, which reaches the
// router's gradient besides the output.
spec::ModuleParityCase moe_loop_case() {
  const models::LlamaOptions o = models::LlamaOptions().hidden_size(8).num_experts(3).top_k(2).expert_intermediate_size(6);
  const int64_t tokens = 5, experts = o.num_experts(), top_k = o.top_k(), f = o.expert_intermediate_size();
  spec::ModuleParityCase c;
  c.name = "moe_mlp_vs_per_token_loop";
  c.candidate = [o](ParallelContext& ctx) {
    models::MoeMlp moe(ctx, o, "mlp");
    // The candidate attaches its aux loss to the output's graph itself: its value is returned
    // detached, to be compared, not added again.
    return spec::ParityCandidate{moe.ptr(), [m = moe.ptr()](const std::vector<at::Tensor>& in) -> spec::ParityOutput {
                                   at::Tensor y = m->forward(in[0]);
                                   return {y, at::scalar_tensor(m->last_aux_loss, at::TensorOptions().dtype(at::kDouble))};
                                 }};
  };
  c.weights = {{"router"}, {"experts.gate_up_proj"}, {"experts.down_proj"}};
  c.reference = [=](const spec::ReferenceWeights& w, const std::vector<at::Tensor>& in) -> spec::ParityOutput {
    std::vector<at::Tensor> rows;
    std::vector<double> routed(static_cast<size_t>(experts), 0.0);  // token slots per expert
    at::Tensor prob_sum = at::zeros({experts}, in[0].options());
    for (int64_t t = 0; t < tokens; ++t) {
      const at::Tensor token = in[0][0][t];
      const at::Tensor p = at::softmax(at::mv(w.at("router"), token), 0);
      prob_sum = prob_sum + p;
      std::vector<std::pair<double, int64_t>> ranked;
      for (int64_t e = 0; e < experts; ++e) ranked.emplace_back(p[e].item<double>(), e);
      std::sort(ranked.rbegin(), ranked.rend());
      at::Tensor norm = at::zeros({}, in[0].options()), y = at::zeros_like(token);
      for (int64_t i = 0; i < top_k; ++i) norm = norm + p[ranked[i].second];
      for (int64_t i = 0; i < top_k; ++i) {
        const int64_t e = ranked[i].second;
        // Expert e's rows of the stacked weights.
        const int64_t hidden = o.hidden_size();
        const at::Tensor gu = at::mv(w.at("experts.gate_up_proj").narrow(0, e * 2 * f, 2 * f), token);
        const at::Tensor h = at::silu(gu.narrow(0, 0, f)) * gu.narrow(0, f, f);
        y = y + p[e] / norm * at::mv(w.at("experts.down_proj").narrow(0, e * hidden, hidden), h);
        routed[static_cast<size_t>(e)] += 1;
      }
      rows.push_back(y);
    }
    at::Tensor aux = at::zeros({}, in[0].options());
    for (int64_t e = 0; e < experts; ++e) {
      const double fraction = routed[static_cast<size_t>(e)] / static_cast<double>(tokens);  // f_e
      aux = aux + fraction * prob_sum[e] / static_cast<double>(tokens);                    // f_e * P_e
    }
    return {at::stack(rows).unsqueeze(0), o.router_aux_loss_coef() * static_cast<double>(experts) * aux};
  };
  c.input_shapes = {{1, tokens, o.hidden_size()}};
  return c;
}

spec::ModelSpec moe_spec() {
  const models::LlamaOptions o = models::moe_options();
  spec::ModelSpec s = language_model_spec("moe", o);
  s.num_experts = o.num_experts();
  s.pipeline_layers = o.num_layers();  // the reference moe builds its pipeline stages
  s.checkpoint.hf = hf_qwen3_moe_config(o);
  s.shared_state.push_back({"layers.1.mlp.expert_counts", "layers.1.mlp", {"layers.1.mlp"}});
  s.invariants = llama_inv_freq_invariants("rotary_emb.inv_freq", o.rope_theta());
  s.invariants.push_back(expert_counts_invariant(8 * 64, o.top_k()));
  s.parity_cases = {moe_loop_case(), llama_attention_case()};
  s.checkpoint.source = reference_source_checkpoint("moe");
  // The original: Qwen3-MoE (the builtin's equations or transformers' Qwen3MoeForCausalLM) on
  // this spec's export, layer 0 dense as the config's mlp_only_layers say.
  s.golden.dir = reference_golden("moe");
  s.golden.layers = llama_golden_layers(o.num_layers());
  s.golden.logits = "lm_head";
  // Measured on cpu-smoke DpShard2Mb2 (float64) against the single-batch reference: loss
  // 3.7e-5, grad norm 8.7e-4, the MoE layer's norm gradient 1.3e-1 relative error. No
  // tolerance would mean anything, so the cases are declared not comparable.
  s.tolerances.grad_accumulation_reason =
      "the load-balancing loss of the MoE layer is computed over each micro-batch's routing statistics, so "
      "accumulating two micro-batches optimizes a different objective than one batch of both (as in Megatron-LM "
      "and TorchTitan); the parity of micro-batching itself is proven by the dense llama spec at 1e-10";
  return s;
}

// The moe port with Qwen2-MoE's routing (a shared expert behind a sigmoid gate, the top-k
// probabilities not renormalized, rotary theta 1e6), declared as Qwen2MoeForCausalLM: the fault
// catalog's port for the config-invariant bugs of such a model (F28, F31), which only the
// golden of the original catches. It declares no rotary inv_freq invariant: its rotary table is
// checked against the original by MatchesOriginal.
spec::ModelSpec moe_qwen_spec() {
  models::LlamaOptions o = models::moe_qwen_options();
  o.moe_layers({1});  // as make_moe's default: every second layer from layer 1
  spec::ModelSpec s = language_model_spec("moe_qwen", o);
  s.num_experts = o.num_experts();
  s.pipeline_layers = o.num_layers();  // the reference moe builds its pipeline stages
  s.tp_divides.push_back(o.shared_expert_intermediate_size());
  s.checkpoint.hf = hf_qwen2_moe_config(o);
  s.shared_state.push_back({"layers.1.mlp.expert_counts", "layers.1.mlp", {"layers.1.mlp"}});
  s.invariants = {expert_counts_invariant(8 * 64, o.top_k())};
  s.golden.dir = reference_golden("moe_qwen");
  s.golden.layers = llama_golden_layers(o.num_layers());
  s.golden.logits = "lm_head";
  s.tolerances.grad_accumulation_reason = moe_spec().tolerances.grad_accumulation_reason;
  return s;
}

// Four layers, MoE at 1 and 3: under pp 2 each stage holds a MoE layer, so the balancing loss of
// a stage that is not the last reaches its router only through the pipeline's backward (the
// fault catalog's F42). Its suites run on request (`mih faults`); the moe's own Pp2 holds the
// last stage's MoE layer to the reference.
spec::ModelSpec moe_deep_spec() {
  models::LlamaOptions o = models::moe_options().num_layers(4);
  o.moe_layers({1, 3});
  spec::ModelSpec s = language_model_spec("moe", o);
  s.name = "moe_deep";
  s.description = "moe with 4 decoder layers, MoE at layers 1 and 3 (a MoE layer on each stage of pp 2)";
  s.factory = models::make_moe(o);
  s.num_experts = o.num_experts();
  s.pipeline_layers = o.num_layers();
  s.checkpoint.hf = hf_qwen3_moe_config(o);
  for (const char* layer : {"layers.1.mlp", "layers.3.mlp"}) {
    s.shared_state.push_back({std::string(layer) + ".expert_counts", layer, {layer}});
  }
  s.invariants = llama_inv_freq_invariants("rotary_emb.inv_freq", o.rope_theta());
  s.invariants.push_back(expert_counts_invariant(8 * 64, o.top_k()));
  s.tolerances.grad_accumulation_reason = moe_spec().tolerances.grad_accumulation_reason;
  return s;
}

MIH_REGISTER_SPEC(moe_spec);
MIH_REGISTER_SPEC(moe_qwen_spec);
MIH_REGISTER_SPEC(moe_deep_spec);

}  // namespace
}  // namespace mih::specs

// Every conformance suite for this spec over the CI preset (`--matrix` overrides it).
MIH_CONFORMANCE_SUITES(Moe, "moe", "cpu-smoke");
// Its Qwen2-MoE variant on the variants' lane (dp_shard, tp, tp with sequence parallelism).
MIH_CONFORMANCE_SUITES(MoeQwen, "moe_qwen", "cpu-smoke-variants");
// The four-layer variant, for the fault catalog (F42 on Pp2).
MIH_CONFORMANCE_SUITES_ON_REQUEST(MoeDeep, "moe_deep", "cpu-smoke");
