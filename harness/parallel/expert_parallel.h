// Expert parallelism's token exchange, what a mixture-of-experts layer calls between its router
// and its experts: the top-k routing, the dispatch of each token's slots to the ep rank that
// holds their expert, and the combine that brings the experts' outputs back (TorchTitan's
// token dispatch and combine, Megatron-Core's MoEAlltoAllTokenDispatcher). Plain single-device
// code at ep = 1; autograd-correct under any ep (both all-to-alls are differentiable).
//
// How a port uses it (reference_models/llama.cpp, MoeMlpImpl::forward, is the complete one):
//
//   at::Tensor tokens = x.reshape({-1, H});                                  // [N, H]
//   at::Tensor probs = at::softmax(at::matmul(tokens, ctx.use(router).t()), -1);  // [N, E]
//   TopKRouting routing = top_k_routing(probs, top_k);                       // [N, k] twice
//   TokenDispatcher dispatcher(ctx, TokenDispatcherOptions(E).layer("layers.1.mlp"));
//   DispatchedTokens d = dispatcher.dispatch(tokens, routing);               // [R, H]
//   at::Tensor y = my_experts(d.expert_input, d.rows_per_expert);            // [R, H]
//   at::Tensor out = dispatcher.combine(y, d);                               // [N, H]
//
// Shapes: N = this rank's tokens, H = hidden size, E = experts, k = top_k, ep = the ep axis's
// size, E / ep = the experts this ep rank holds (experts [ep_rank E/ep, (ep_rank + 1) E/ep),
// ParamSpec::experts), R = the token slots this rank's experts receive from the whole ep group.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>
#include <c10/core/TensorOptions.h>
#include <torch/arg.h>

#include "harness/parallel/parallel_context.h"

namespace mih {

/// Which experts each token goes to, and with what weight.
struct TopKRouting {
  /// [N, k] int64: each token's k experts, in [0, E), by decreasing router probability.
  at::Tensor experts;
  /// [N, k]: the weight of each (token, expert) slot in the combine, differentiable (the
  /// router learns through it).
  at::Tensor gates;
};

/// The top `k` experts of each token from router probabilities `probs` [N, E] (a softmax over
/// the experts): experts = their indices, gates = their probabilities, divided by the k
/// probabilities' sum when `normalize_top_k` (Mixtral; Hugging Face's `norm_topk_prob = true`),
/// the raw probabilities otherwise (Qwen2-MoE's and DeepSeek-V2's default
/// `norm_topk_prob = false`). Shape: [N, E] -> [N, k], [N, k].
/// Throws: mih::Error{kInvalidSpec} if probs is not 2-D or k is not in [1, E].
TopKRouting top_k_routing(const at::Tensor& probs, int64_t k, bool normalize_top_k = true);

/// Options of TokenDispatcher.
struct TokenDispatcherOptions {
  explicit TokenDispatcherOptions(int64_t num_experts) : num_experts_(num_experts) {}
  /// Experts E of the layer (all ep ranks together); ep must divide it.
  TORCH_ARG(int64_t, num_experts);
  /// The MoE layer's FQN ("layers.1.mlp"): names the layer in the communication it declares
  /// (cases/runtime/comm_expected_step<N>.json, and the CommVolume message when the bytes
  /// moved differ). Default "": "(unnamed layer)".
  TORCH_ARG(std::string, layer) = "";
};

/// What TokenDispatcher::dispatch hands the experts, and what combine needs to undo it.
struct DispatchedTokens {
  /// [R, H]: the rows this rank's experts process, grouped by local expert: local expert l's
  /// rows are [sum(rows_per_expert[:l]), sum(rows_per_expert[:l + 1])); within an expert, by
  /// source ep rank, then by token. Differentiable w.r.t. the tokens.
  at::Tensor expert_input;
  /// [E / ep]: the rows of each local expert (sums to R). An expert may get none.
  std::vector<int64_t> rows_per_expert;
  /// [E] int64, on the tokens' device: this rank's token slots per expert, before the
  /// exchange (sums to N k): the routing statistics a load-balancing loss reduces over the
  /// ranks that hold other tokens.
  at::Tensor slots_per_expert;

  // The plan of the exchange (read by combine; a port need not look at it).
  /// [N k] int64: the token of each slot, the slots sorted (stably) by expert.
  at::Tensor slot_token;
  /// [N k, 1]: each sorted slot's gate.
  at::Tensor slot_gates;
  /// [R] int64: where each row of the expert order came from in the received (source-rank)
  /// order; combine applies its inverse.
  at::Tensor undo;
  /// [ep]: the rows this rank sent to each ep rank, and received from each.
  std::vector<int64_t> send_rows, recv_rows;
  /// The tokens' count N, hidden size H and options (the combine's output is like them).
  int64_t tokens = 0, hidden = 0;
  c10::TensorOptions token_options;
};

/// The dispatch and combine of one MoE layer over the ep axis of a ParallelContext (the
/// TorchTitan/Megatron-Core all-to-all dispatcher; ep = 1: the same code with the
/// collectives skipped). Cheap to build: make one per forward or keep one in the module.
///
/// Communication: dispatch all-to-alls the per-expert counts ("moe.dispatch_counts",
/// [ep, E/ep] int64) and the N k slot rows ("region.all_to_all", [N k, H]); combine sends the
/// R rows back ("region.all_to_all", [R, H]); in backward each rows all-to-all runs once the
/// other way ("region.all_to_all.backward"). Each call declares what it moves with
/// Communicator::expect beside the collectives it issues: the CommVolume suite holds every
/// call site's bytes in the comm ledger against what the layers declared for it, so a
/// collective that is missing, repeated or of the wrong size is named with its layer. A port
/// that calls all_to_all_rows itself must declare its own (see regions.h), or CommVolume fails
/// on axis ep naming the undeclared site.
class TokenDispatcher {
 public:
  /// Throws: mih::Error{kInvalidSpec} if num_experts < 1 or does not divide by ep (naming both
  ///   and the fix).
  TokenDispatcher(ParallelContext& ctx, TokenDispatcherOptions options);

  /// Sorts the N k slots of `routing` by expert (stably: by token within an expert), exchanges
  /// the per-expert counts over ep, sends each slot's token row to the ep rank that holds its
  /// expert (one differentiable variable-split all-to-all) and regroups the rows received by
  /// local expert. Collective over ep: every ep rank calls it, in the same order.
  /// Shape: tokens [N, H], routing [N, k] -> expert_input [R, H].
  /// Throws: mih::Error{kInvalidSpec} if tokens is not 2-D, the routing's shapes differ from
  ///   [N, k], or an expert id is outside [0, E).
  DispatchedTokens dispatch(const at::Tensor& tokens, const TopKRouting& routing) const;

  /// The experts' outputs `expert_output` (in expert_input's order) sent back to the ranks
  /// their slots came from (differentiable), cast to the tokens' dtype (under autocast the
  /// experts compute in bfloat16: the combine moves what the dispatch did), weighted by their
  /// gates and summed per token. Collective over ep. Shape: [R, H] -> [N, H].
  /// Throws: mih::Error{kInvalidSpec} if expert_output is not [R, H].
  at::Tensor combine(const at::Tensor& expert_output, const DispatchedTokens& dispatched) const;

  /// E / ep, and this ep rank's first expert (its experts are [first, first + E / ep)).
  int64_t local_experts() const;
  int64_t first_local_expert() const;
  Communicator& ep_group() const { return *ep_; }
  const TokenDispatcherOptions& options() const { return options_; }

 private:
  Communicator* ep_;
  TokenDispatcherOptions options_;
};

}  // namespace mih
