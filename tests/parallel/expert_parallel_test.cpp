// The expert-parallel token dispatcher (harness/parallel/expert_parallel.h) on 2 thread ranks
// with real Gloo groups (dp_shard=2, with ep=2 and ep=1) against a per-token loop on one
// device: outputs and the gradients of the tokens, the router and every expert; the bytes the
// layer declares against what the comm ledger recorded; bad routing refused.
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "harness/base/error.h"
#include "harness/parallel/expert_parallel.h"
#include "harness/runtime/comm_ledger.h"
#include "tests/support/thread_ranks.h"

namespace mih {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::ThrowsMessage;

constexpr int64_t kExperts = 4, kTopK = 2, kHidden = 3;

::testing::AssertionResult Close(const at::Tensor& actual, const at::Tensor& expected, double tol = 1e-12) {
  if (actual.sizes() != expected.sizes()) {
    return ::testing::AssertionFailure() << "shape " << actual.sizes() << " != expected " << expected.sizes();
  }
  const double err = actual.numel() == 0 ? 0 : (actual - expected).abs().max().item<double>();
  if (err <= tol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "max abs error " << err << " > " << tol;
}

// Rank r's tokens: 5 on rank 0, 3 on rank 1 (uneven, so the splits differ), [N_r, H].
at::Tensor rank_tokens(int64_t r) {
  const int64_t n = r == 0 ? 5 : 3;
  return at::sin(at::arange(n * kHidden, at::kDouble).reshape({n, kHidden}) * 0.71 + static_cast<double>(r) * 1.3);
}
// The weights of the loss on rank r's outputs, [N_r, H].
at::Tensor loss_weights(int64_t r) { return at::cos(at::arange(rank_tokens(r).numel(), at::kDouble) * 0.29 + r).view_as(rank_tokens(r)); }
// The router [E, H] and the experts' weights [E, H, H], the same on every rank.
at::Tensor router_weight() { return at::cos(at::arange(kExperts * kHidden, at::kDouble).reshape({kExperts, kHidden}) * 1.7); }
at::Tensor expert_weights() {
  return at::sin(at::arange(kExperts * kHidden * kHidden, at::kDouble).reshape({kExperts, kHidden, kHidden}) * 0.37);
}
// Expert e on rows x [r, H].
at::Tensor expert(const at::Tensor& x, const at::Tensor& w) { return at::tanh(at::matmul(x, w.t())); }

// Every rank's loss as one device computes it, token by token: the router's top-k, the
// experts' outputs weighted by the gates. Returns the total loss of both ranks.
at::Tensor loop_loss(const std::vector<at::Tensor>& tokens, const at::Tensor& router, const at::Tensor& experts,
                     bool normalize_top_k) {
  at::Tensor loss = at::zeros({}, at::kDouble);
  for (size_t r = 0; r < tokens.size(); ++r) {
    std::vector<at::Tensor> rows;
    for (int64_t t = 0; t < tokens[r].size(0); ++t) {
      const at::Tensor x = tokens[r][t];
      const at::Tensor p = at::softmax(at::mv(router, x), 0);
      auto [top_p, top_i] = p.topk(kTopK);
      at::Tensor norm = normalize_top_k ? top_p.sum() : at::ones({}, at::kDouble);
      at::Tensor y = at::zeros_like(x);
      for (int64_t j = 0; j < kTopK; ++j) {
        const int64_t e = top_i[j].item<int64_t>();
        y = y + p[e] / norm * expert(x.unsqueeze(0), experts[e]).squeeze(0);
      }
      rows.push_back(y);
    }
    loss = loss + (at::stack(rows) * loss_weights(static_cast<int64_t>(r))).sum();
  }
  return loss;
}

// Runs `body(ctx, ledger)` on 2 thread ranks of dp_shard=2 with `ep`, float64 parameters, each
// rank recording into a comm ledger of its own.
std::vector<std::string> on_two_ranks(int ep, const std::function<void(ParallelContext&, CommLedger&)>& body) {
  ParallelConfig dims;
  dims.dp_shard = 2;
  dims.ep = ep;
  compat::Store store = compat::make_hash_store(std::chrono::seconds(20));
  return testing::run_ranks(2, [&](int rank) {
    MeshOptions options;
    options.group = testing::thread_group_options();
    options.ledger = std::make_shared<CommLedger>();
    DeviceMesh mesh(dims, store, rank, 2, options);
    ParallelConfig config = mesh.config();
    config.dtype = DType::kFloat64;
    ParallelContext ctx(mesh, config);
    body(ctx, *options.ledger);
  });
}

// One rank's MoE forward through the dispatcher: its tokens, the router, its E / ep experts
// (rows of the full weights), the loss on its outputs. Leaves are returned for their gradients.
struct RankForward {
  at::Tensor tokens, router, local_experts, loss;
};
RankForward rank_forward(ParallelContext& ctx, bool normalize_top_k) {
  const int64_t r = ctx.mesh().rank();
  const TokenDispatcher dispatcher(ctx, TokenDispatcherOptions(kExperts).layer("moe"));
  RankForward f;
  f.tokens = rank_tokens(r).requires_grad_(true);
  f.router = router_weight().requires_grad_(true);
  f.local_experts =
      expert_weights().narrow(0, dispatcher.first_local_expert(), dispatcher.local_experts()).clone().requires_grad_(true);
  const at::Tensor probs = at::softmax(at::matmul(f.tokens, f.router.t()), -1);
  const TopKRouting routing = top_k_routing(probs, kTopK, normalize_top_k);
  const DispatchedTokens d = dispatcher.dispatch(f.tokens, routing);
  EXPECT_EQ(static_cast<int64_t>(d.rows_per_expert.size()), dispatcher.local_experts());
  EXPECT_EQ(d.slots_per_expert.sum().item<int64_t>(), f.tokens.size(0) * kTopK);
  std::vector<at::Tensor> outs;
  int64_t start = 0;
  for (int64_t l = 0; l < dispatcher.local_experts(); ++l) {
    outs.push_back(expert(d.expert_input.narrow(0, start, d.rows_per_expert[l]), f.local_experts[l]));
    start += d.rows_per_expert[l];
  }
  EXPECT_EQ(start, d.expert_input.size(0));
  const at::Tensor out = dispatcher.combine(at::cat(outs), d);  // [N, H]
  f.loss = (out * loss_weights(r)).sum();
  return f;
}

// Dispatch, experts, combine on each rank give the per-token loop's loss, and the gradients of
// the tokens (through both all-to-alls), of each rank's experts (at ep=2 every token routed to
// them, from both ranks, arrives: no reduction) and of the router (through the gates; summed over the ranks, which route
// their own tokens), with and without the top-k renormalization.
TEST(TokenDispatcherTest, DispatchAndCombineEqualAPerTokenLoop) {
  for (int ep : {1, 2}) {
    for (bool normalize : {true, false}) {
      SCOPED_TRACE("ep=" + std::to_string(ep) + (normalize ? ", normalized top-k" : ", raw top-k"));
      // The loop on one device.
      std::vector<at::Tensor> tokens = {rank_tokens(0).requires_grad_(true), rank_tokens(1).requires_grad_(true)};
      at::Tensor router = router_weight().requires_grad_(true), experts = expert_weights().requires_grad_(true);
      at::Tensor expected = loop_loss(tokens, router, experts, normalize);
      expected.backward();
      EXPECT_THAT(on_two_ranks(ep,
                               [&](ParallelContext& ctx, CommLedger&) {
                                 const int64_t r = ctx.mesh().rank();
                                 RankForward f = rank_forward(ctx, normalize);
                                 at::Tensor total = f.loss.detach().clone();
                                 ctx.mesh().comm(MeshAxis::kWorld).all_reduce(total);
                                 EXPECT_TRUE(Close(total, expected.detach()));
                                 f.loss.backward();
                                 EXPECT_TRUE(Close(f.tokens.grad(), tokens[static_cast<size_t>(r)].grad()));
                                 // The ranks holding the same experts (edp: both at ep=1, each
                                 // alone at ep=2) sum what their tokens gave them.
                                 const int64_t local = kExperts / ep;
                                 at::Tensor expert_grad = f.local_experts.grad().clone();
                                 ctx.mesh().comm(MeshAxis::kEdp).all_reduce(expert_grad);
                                 EXPECT_TRUE(Close(expert_grad, experts.grad().narrow(0, r % ep * local, local)))
                                     << "the experts of rank " << r << " at ep=" << ep;
                                 at::Tensor router_grad = f.router.grad().clone();
                                 ctx.mesh().comm(MeshAxis::kWorld).all_reduce(router_grad);
                                 EXPECT_TRUE(Close(router_grad, router.grad()));
                               }),
                  IsEmpty());
    }
  }
}

// What the dispatcher declares with Communicator::expect is what its collectives moved over ep,
// call site by call site (the CommVolume suite's comparison), forward and backward.
TEST(TokenDispatcherTest, DeclaresTheBytesItMovesOverEp) {
  EXPECT_THAT(on_two_ranks(2,
                           [&](ParallelContext& ctx, CommLedger& ledger) {
                             RankForward f = rank_forward(ctx, true);
                             f.loss.backward();
                             std::map<std::string, int64_t> moved, declared;
                             for (const CommRecord& rec : ledger.completed()) {
                               if (rec.axis == "ep") moved[rec.site.substr(0, rec.site.find(" @"))] += rec.bytes;
                             }
                             for (const ExpectedComm& e : ledger.take_expected()) {
                               EXPECT_EQ(e.axis, "ep");
                               EXPECT_EQ(e.layer, "moe");
                               declared[e.site] += e.bytes;
                             }
                             EXPECT_EQ(moved, declared);
                             EXPECT_EQ(moved.count("moe.dispatch_counts"), 1u);
                             EXPECT_EQ(moved.count("region.all_to_all"), 1u);
                             EXPECT_EQ(moved.count("region.all_to_all.backward"), 1u);
                           }),
              IsEmpty());
}

TEST(TokenDispatcherTest, RefusesExpertsThatDoNotDivideByEpAndBadRouting) {
  EXPECT_THAT(on_two_ranks(2,
                           [&](ParallelContext& ctx, CommLedger&) {
                             EXPECT_THAT([&] { TokenDispatcher(ctx, TokenDispatcherOptions(3)); },
                                         ThrowsMessage<Error>(HasSubstr("num_experts(3) must divide by ep(2)")));
                             const TokenDispatcher dispatcher(ctx, TokenDispatcherOptions(kExperts));
                             const at::Tensor tokens = rank_tokens(0);
                             TopKRouting bad{at::full({5, kTopK}, kExperts, at::kLong), at::ones({5, kTopK}, at::kDouble)};
                             EXPECT_THAT([&] { dispatcher.dispatch(tokens, bad); },
                                         ThrowsMessage<Error>(HasSubstr("expert ids must be in [0, 4)")));
                             TopKRouting short_routing{at::zeros({4, kTopK}, at::kLong), at::ones({4, kTopK}, at::kDouble)};
                             EXPECT_THAT([&] { dispatcher.dispatch(tokens, short_routing); },
                                         ThrowsMessage<Error>(HasSubstr("[N = 5, k]")));
                             EXPECT_THAT([&] { top_k_routing(at::ones({5, kExperts}, at::kDouble), kExperts + 1); },
                                         ThrowsMessage<Error>(HasSubstr("k must be in [1, E = 4]")));
                           }),
              IsEmpty());
}

}  // namespace
}  // namespace mih
