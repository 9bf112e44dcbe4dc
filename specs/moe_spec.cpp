// The validation spec of the moe reference port (llama with MoeMlp in layer 1).
#include <cmath>

#include "reference_models/llama.h"
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
            return {ok && !facts.empty(), {{"layers", facts}}};
          }};
}

// MoeMlp against a per-token loop: softmax router, the top_k experts by probability, their
// SwiGLU outputs weighted by the renormalized probabilities.
spec::ModuleParityCase moe_loop_case() {
  return {"moe_mlp_vs_per_token_loop", [] {
            return on_one_rank([](ParallelContext& ctx) {
              models::LlamaOptions o = models::LlamaOptions().hidden_size(8).num_experts(3).top_k(2).expert_intermediate_size(6);
              models::MoeMlp moe(ctx, o, "mlp");
              at::Tensor x = at::randn({1, 5, 8}, at::TensorOptions().dtype(at::kDouble));
              at::Tensor expected = at::zeros_like(x);
              for (int64_t t = 0; t < 5; ++t) {
                at::Tensor token = x[0][t];
                at::Tensor p = at::softmax(at::mv(moe->router.detach(), token), 0);
                std::vector<std::pair<double, int64_t>> ranked;
                for (int64_t e = 0; e < 3; ++e) ranked.emplace_back(p[e].item<double>(), e);
                std::sort(ranked.rbegin(), ranked.rend());
                const double norm = ranked[0].first + ranked[1].first;
                for (int i = 0; i < 2; ++i) {
                  auto* expert = moe->experts[ranked[i].second]->as<models::MoeExpert>();
                  at::Tensor gu = at::mv(expert->gate_up_proj.detach(), token);
                  at::Tensor h = at::silu(gu.narrow(0, 0, 6)) * gu.narrow(0, 6, 6);
                  expected[0][t] += ranked[i].first / norm * at::mv(expert->down_proj.detach(), h);
                }
              }
              return compare(moe->forward(x).detach(), expected, 1e-12);
            });
          }};
}

spec::ModelSpec moe_spec() {
  const models::LlamaOptions o;
  spec::ModelSpec s = language_model_spec("moe", o);
  s.shared_state.push_back({"layers.1.mlp.expert_counts", "layers.1.mlp", {"layers.1.mlp"}});
  s.invariants = llama_inv_freq_invariants("rotary_emb.inv_freq", o.rope_theta());
  s.invariants.push_back(expert_counts_invariant(8 * 64, o.top_k()));
  s.parity_cases = {moe_loop_case(), llama_attention_case()};
  s.checkpoint.source = reference_source_checkpoint("moe");
  // Measured on cpu-smoke DpShard2Mb2 (float64) against the single-batch reference: loss
  // 3.7e-5, grad norm 8.7e-4, the MoE layer's norm gradient 1.3e-1 relative error. No
  // tolerance would mean anything, so the cases are declared not comparable.
  s.tolerances.grad_accumulation_reason =
      "the load-balancing loss of the MoE layer is computed over each micro-batch's routing statistics, so "
      "accumulating two micro-batches optimizes a different objective than one batch of both (as in Megatron-LM "
      "and TorchTitan); the parity of micro-batching itself is proven by the dense llama spec at 1e-10";
  return s;
}

MIH_REGISTER_SPEC(moe_spec);

}  // namespace
}  // namespace mih::specs

// Every conformance suite for this spec over the CI preset (`--matrix` overrides it).
MIH_CONFORMANCE_SUITES(Moe, "moe", "cpu-smoke");
