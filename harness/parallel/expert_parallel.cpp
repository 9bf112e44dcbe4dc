// The top-k routing and the expert-parallel dispatch and combine (see expert_parallel.h).
#include "harness/parallel/expert_parallel.h"

#include <tuple>
#include <utility>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "harness/base/error.h"
#include "harness/parallel/regions.h"

namespace mih {

TopKRouting top_k_routing(const at::Tensor& probs, int64_t k, bool normalize_top_k) {
  MIH_CHECK(probs.dim() == 2, "top_k_routing: router probabilities must be [N, E], got ", probs.sizes());
  MIH_CHECK(k >= 1 && k <= probs.size(1), "top_k_routing: k must be in [1, E = ", probs.size(1), "], got ", k);
  auto [top_p, top_i] = probs.topk(k, -1);  // [N, k]
  if (normalize_top_k) top_p = top_p / top_p.sum(-1, /*keepdim=*/true);
  return {top_i, top_p};
}

TokenDispatcher::TokenDispatcher(ParallelContext& ctx, TokenDispatcherOptions options)
    : ep_(&ctx.mesh().comm(MeshAxis::kEp)), options_(std::move(options)) {
  const int64_t e = options_.num_experts(), ep = ep_->size();
  MIH_CHECK(e >= 1, "TokenDispatcher: num_experts must be positive, got ", e);
  MIH_CHECK(e % ep == 0, "TokenDispatcher: num_experts(", e, ") must divide by ep(", ep,
            "): each ep rank holds E / ep whole experts; use ep in the divisors of ", e);
}

int64_t TokenDispatcher::local_experts() const { return options_.num_experts() / ep_->size(); }
int64_t TokenDispatcher::first_local_expert() const { return ep_->rank() * local_experts(); }

DispatchedTokens TokenDispatcher::dispatch(const at::Tensor& tokens, const TopKRouting& routing) const {
  Communicator& ep = *ep_;
  const int64_t n_experts = options_.num_experts(), ep_size = ep.size(), local = local_experts();
  MIH_CHECK(tokens.dim() == 2, "TokenDispatcher::dispatch: tokens must be [N, H], got ", tokens.sizes());
  const int64_t n = tokens.size(0), h = tokens.size(1);
  MIH_CHECK(routing.experts.dim() == 2 && routing.experts.size(0) == n && routing.gates.sizes() == routing.experts.sizes(),
            "TokenDispatcher::dispatch: routing must be experts and gates of [N = ", n, ", k], got ",
            routing.experts.sizes(), " and ", routing.gates.sizes());
  MIH_CHECK(routing.experts.scalar_type() == at::kLong, "TokenDispatcher::dispatch: routing.experts must be int64, got ",
            routing.experts.scalar_type());
  const int64_t k = routing.experts.size(1);
  DispatchedTokens d;
  d.tokens = n;
  d.hidden = h;
  d.token_options = tokens.options();
  const at::Tensor slot_expert = routing.experts.reshape(-1);  // [N k]
  if (slot_expert.numel() > 0) {
    const int64_t lowest = slot_expert.min().item<int64_t>(), highest = slot_expert.max().item<int64_t>();
    MIH_CHECK(lowest >= 0 && highest < n_experts, "TokenDispatcher::dispatch: expert ids must be in [0, ", n_experts,
              "), got ids from ", lowest, " to ", highest);
  }
  // Token slots per expert [E].
  d.slots_per_expert = at::bincount(slot_expert, /*weights=*/{}, n_experts).to(at::kLong);
  // The N k slots sorted by expert (stably: by token within an expert), so the slots of each
  // ep rank's experts are one block of rows.
  const at::Tensor order = std::get<1>(slot_expert.sort(/*stable=*/true, 0, false));  // [N k]
  d.slot_token = order.div(k, "floor");                                              // token of each sorted slot
  d.slot_gates = routing.gates.reshape(-1).index_select(0, order).unsqueeze(-1);      // [N k, 1]
  // counts_to[j][l]: slots this rank sends ep rank j for its local expert l; counts_from[j][l]:
  // slots ep rank j sends this rank for expert l of ours (one all-to-all of the counts).
  const at::Tensor counts_to = d.slots_per_expert.view({ep_size, local}).contiguous();
  at::Tensor counts_from = counts_to;
  if (ep_size > 1) {
    counts_from = at::empty_like(counts_to);
    ep.all_to_all_single(counts_from, counts_to, {}, {}, "moe.dispatch_counts");
  }
  const at::Tensor to_cpu = counts_to.cpu().contiguous(), from_cpu = counts_from.cpu().contiguous();
  const at::Tensor send_t = to_cpu.sum(1), recv_t = from_cpu.sum(1);  // [ep]: rows to and from each ep rank
  d.send_rows.assign(send_t.data_ptr<int64_t>(), send_t.data_ptr<int64_t>() + ep_size);
  d.recv_rows.assign(recv_t.data_ptr<int64_t>(), recv_t.data_ptr<int64_t>() + ep_size);
  const int64_t received_rows = recv_t.sum().item<int64_t>();
  if (ep_size > 1) {
    // What the ledger will record over ep for this call (each collective's input on this
    // rank): the counts [ep, E / ep] int64, the N k slot rows, H values each, and in backward
    // (when there is one: not in the no-grad first forward of an activation-checkpoint
    // region) the R received rows' gradients the other way. CommVolume compares, site by
    // site, the ledger's bytes with the sum of what every layer declared.
    const int64_t element = static_cast<int64_t>(tokens.element_size());
    ep.expect("moe.dispatch_counts", counts_to.numel() * 8, options_.layer());
    ep.expect("region.all_to_all", n * k * h * element, options_.layer());
    if (at::GradMode::is_enabled() && tokens.requires_grad()) {
      ep.expect("region.all_to_all.backward", received_rows * h * element, options_.layer());
    }
  }
  const at::Tensor received = all_to_all_rows(tokens.index_select(0, d.slot_token), ep, d.recv_rows, d.send_rows);  // [R, H]
  // The received rows come by source rank, each source's by local expert: a stable sort by
  // local expert regroups them (by source within an expert), its inverse puts them back.
  const at::Tensor row_expert = at::arange(local, at::kLong).repeat({ep_size}).repeat_interleave(from_cpu.reshape(-1));
  const at::Tensor regroup = std::get<1>(row_expert.sort(/*stable=*/true, 0, false)).to(tokens.device());  // [R]
  d.undo = std::get<1>(regroup.sort(/*stable=*/true, 0, false));                                           // inverse
  const at::Tensor per_expert = from_cpu.sum(0);  // [E / ep]: rows of each local expert
  d.rows_per_expert.assign(per_expert.data_ptr<int64_t>(), per_expert.data_ptr<int64_t>() + local);
  d.expert_input = received.index_select(0, regroup);
  return d;
}

at::Tensor TokenDispatcher::combine(const at::Tensor& expert_output, const DispatchedTokens& d) const {
  Communicator& ep = *ep_;
  MIH_CHECK(expert_output.dim() == 2 && expert_output.size(0) == d.undo.size(0) && expert_output.size(1) == d.hidden,
            "TokenDispatcher::combine: the experts' output must be [R = ", d.undo.size(0), ", H = ", d.hidden,
            "] like the dispatched rows, got ", expert_output.sizes());
  // In the residual stream's dtype, as dispatched (under autocast the experts compute in
  // bfloat16): the combine moves what the dispatch did.
  const at::Tensor back = expert_output.index_select(0, d.undo).to(d.token_options.dtype().toScalarType());  // [R, H], source order
  if (ep.size() > 1) {
    // The R rows back to their sources, and in backward the N k slots' gradients the other way
    // (see dispatch).
    const int64_t element = static_cast<int64_t>(back.element_size());
    const int64_t slots = d.slot_token.size(0);
    ep.expect("region.all_to_all", back.size(0) * d.hidden * element, options_.layer());
    if (at::GradMode::is_enabled() && back.requires_grad()) {
      ep.expect("region.all_to_all.backward", slots * d.hidden * element, options_.layer());
    }
  }
  const at::Tensor returned = all_to_all_rows(back, ep, d.send_rows, d.recv_rows);  // [N k, H], in sorted slot order
  // Summed in the residual stream's dtype: under autocast the gates are bfloat16 and
  // index_add is no autocast op.
  return at::zeros({d.tokens, d.hidden}, d.token_options)
      .index_add(0, d.slot_token, (returned * d.slot_gates).to(d.token_options.dtype().toScalarType()));
}

}  // namespace mih
