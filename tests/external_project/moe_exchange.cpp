// An outside port's mixture of experts through the installed token exchange
// (harness/parallel/expert_parallel.h, the calls docs/examples.md shows) and a per-head QK norm
// (HeadRMSNorm), built against the installed package and run at world size 1: the dispatcher's
// output and the router's gradient equal a per-token loop. Exit 0 when they do, 1 otherwise.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <vector>

#include <ATen/ATen.h>

#include "harness/compat/store.h"
#include "harness/parallel/expert_parallel.h"
#include "harness/parallel/layers.h"
#include "harness/runtime/device_mesh.h"

int main() {
  constexpr int64_t kTokens = 6, kHidden = 4, kExperts = 3, kTopK = 2;
  mih::compat::Store store = mih::compat::make_hash_store(std::chrono::seconds(30));
  mih::MeshOptions options;
  options.group.gloo_hostname = "127.0.0.1";
  mih::ParallelConfig config;
  config.dtype = mih::DType::kFloat64;
  mih::DeviceMesh mesh(config, store, 0, 1, options);
  mih::ParallelContext ctx(mesh, config);

  const at::Tensor tokens = at::sin(at::arange(kTokens * kHidden, at::kDouble).reshape({kTokens, kHidden}));
  const at::Tensor scale = at::arange(1, kExperts + 1, at::kDouble);  // expert e scales its rows by e + 1
  at::Tensor router = at::cos(at::arange(kExperts * kHidden, at::kDouble).reshape({kExperts, kHidden})).requires_grad_(true);

  // The port: router, routing, dispatch, this rank's experts, combine.
  const at::Tensor probs = at::softmax(at::matmul(tokens, router.t()), -1);  // [N, E]
  const mih::TopKRouting routing = mih::top_k_routing(probs, kTopK, /*normalize_top_k=*/false);
  const mih::TokenDispatcher dispatcher(ctx, mih::TokenDispatcherOptions(kExperts).layer("mlp"));
  const mih::DispatchedTokens d = dispatcher.dispatch(tokens, routing);  // [R, H]
  std::vector<at::Tensor> rows;
  int64_t start = 0;
  for (int64_t l = 0; l < dispatcher.local_experts(); ++l) {
    rows.push_back(d.expert_input.narrow(0, start, d.rows_per_expert[l]) * scale[dispatcher.first_local_expert() + l]);
    start += d.rows_per_expert[l];
  }
  const at::Tensor out = dispatcher.combine(at::cat(rows), d);  // [N, H]
  out.sum().backward();
  const at::Tensor router_grad = router.grad().clone();

  // The same token by token.
  router.mutable_grad() = at::Tensor();
  std::vector<at::Tensor> expected_rows;
  const at::Tensor p = at::softmax(at::matmul(tokens, router.t()), -1);
  for (int64_t t = 0; t < kTokens; ++t) {
    auto [top_p, top_i] = p[t].topk(kTopK);
    at::Tensor row = at::zeros({kHidden}, at::kDouble);
    for (int64_t j = 0; j < kTopK; ++j) row = row + top_p[j] * scale[top_i[j].item<int64_t>()] * tokens[t];
    expected_rows.push_back(row);
  }
  const at::Tensor expected = at::stack(expected_rows);
  expected.sum().backward();
  const double out_error = (out.detach() - expected.detach()).abs().max().item<double>();
  const double grad_error = (router_grad - router.grad()).abs().max().item<double>();

  // A per-head QK norm on [B, heads, S, D].
  mih::HeadRMSNorm q_norm(ctx, kHidden);
  const at::Tensor normed = q_norm(at::ones({1, 2, 3, kHidden}, at::kDouble));
  const double norm_error = (normed - 1 / std::sqrt(1 + 1e-6)).abs().max().item<double>();  // mean(x^2) = 1, eps 1e-6

  std::printf("moe exchange: output error %g, router gradient error %g; per-head norm error %g\n", out_error, grad_error,
              norm_error);
  return out_error < 1e-12 && grad_error < 1e-12 && norm_error < 1e-12 ? 0 : 1;
}
