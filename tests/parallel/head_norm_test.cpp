// A per-head norm (HeadRMSNorm: one weight [D] for every head, each tp rank holding its own
// heads) on tp=2 thread ranks with real Gloo groups: its gradient is partial over tp whenever
// tp > 1, with or without sequence parallelism, and the synchronized gradient is one device's;
// a plain RMSNorm in its place (partial only under sequence parallelism) is finding
// MIH-GRAD-002, whose fix names the heads, and trains with its own heads' share only.
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "harness/checks/checks.h"
#include "harness/findings/codes.h"
#include "harness/parallel/layers.h"
#include "tests/support/thread_ranks.h"

namespace mih {
namespace {

using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr int64_t kBatch = 2, kHeads = 4, kSeq = 3, kHeadDim = 6;

// Query heads [B, heads, S, D] as the attention sees them on one device; tp rank t holds heads
// [t heads/2, (t + 1) heads/2) (the column-parallel q projection's output, split into heads).
at::Tensor all_heads() {
  return at::sin(at::arange(kBatch * kHeads * kSeq * kHeadDim, at::kDouble).reshape({kBatch, kHeads, kSeq, kHeadDim}) * 0.43) +
         0.2;
}
// Weights of the loss, per head: each head's output counts differently.
at::Tensor head_loss_weights() {
  return at::cos(at::arange(kBatch * kHeads * kSeq * kHeadDim, at::kDouble).reshape(all_heads().sizes()) * 0.17);
}

// The norm weight's gradient on one device: sum(norm(q) * c) over every head.
at::Tensor one_device_grad() {
  at::Tensor w = at::ones({kHeadDim}, at::kDouble).requires_grad_(true);
  const at::Tensor q = all_heads();
  const at::Tensor y = q * at::rsqrt(q.pow(2).mean(-1, true) + 1e-6) * w;
  (y * head_loss_weights()).sum().backward();
  return w.grad();
}

::testing::AssertionResult Close(const at::Tensor& actual, const at::Tensor& expected, double tol = 1e-12) {
  const double err = (actual - expected).abs().max().item<double>();
  if (err <= tol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "max abs error " << err << " > " << tol;
}

std::vector<std::string> codes_of(const FindingReport& r) {
  std::vector<std::string> out;
  for (const auto& f : r.findings()) out.push_back(f.code + " " + f.owner);
  return out;
}

// What each rank saw of a norm on its heads: the tp-partial check's findings before the
// gradient synchronization, the weight's gradient after it, and its gradient domain.
struct NormRun {
  FindingReport before_sync;
  at::Tensor synced_grad;
  std::vector<std::string> grad_domain;
};
// Runs the norm `make` builds (its module and forward) at tp=2 on this tp rank's heads, then
// backward; fills one NormRun per rank.
template <class MakeNorm>
std::vector<std::string> on_tp2(bool sequence_parallel, MakeNorm make, std::vector<NormRun>* runs) {
  ParallelConfig dims;
  dims.tp = 2;
  runs->assign(2, {});
  return testing::run_mesh(dims, [&](DeviceMesh& mesh) {
    ParallelConfig config = mesh.config();
    config.dtype = DType::kFloat64;
    config.sequence_parallel = sequence_parallel;
    ParallelContext ctx(mesh, config);
    struct Attention : torch::nn::Module {
      std::shared_ptr<torch::nn::Module> q_norm;
    } attn;
    auto [module, forward] = make(ctx);
    attn.q_norm = attn.register_module("q_norm", module);
    ctx.finalize(attn);
    const int64_t t = ctx.tp_rank(), local = kHeads / ctx.tp_size();
    const at::Tensor q = all_heads().narrow(1, t * local, local);  // [B, heads/TP, S, D]
    (forward(q) * head_loss_weights().narrow(1, t * local, local)).sum().backward();
    NormRun& run = (*runs)[static_cast<size_t>(mesh.rank())];
    run.before_sync = checks::check_tp_partial_gradients(ctx, 0).findings;
    ctx.synchronize_gradients();
    const ShardedParameter& p = *ctx.parameters().at(0);
    run.synced_grad = p.local.grad().clone();
    run.grad_domain = p.grad_domain();
  });
}

// The per-head norm: partial over tp at tp=2 with and without sequence parallelism, declared
// so, all-reduced: every rank holds one device's gradient.
TEST(HeadRMSNormTest, GradientIsPartialOverTpWheneverTpIsAboveOne) {
  const at::Tensor expected = one_device_grad();
  for (bool sp : {false, true}) {
    SCOPED_TRACE(sp ? "sequence parallel" : "no sequence parallel");
    std::vector<NormRun> runs;
    ASSERT_THAT(on_tp2(sp,
                       [](ParallelContext& ctx) {
                         HeadRMSNorm norm(ctx, kHeadDim);
                         return std::make_pair(std::static_pointer_cast<torch::nn::Module>(norm.ptr()),
                                               std::function<at::Tensor(const at::Tensor&)>(
                                                   [norm](const at::Tensor& q) mutable { return norm->forward(q); }));
                       },
                       &runs),
                IsEmpty());
    for (const NormRun& run : runs) {
      EXPECT_THAT(codes_of(run.before_sync), IsEmpty()) << run.before_sync.summary();
      EXPECT_THAT(run.grad_domain, Contains("tp"));
      EXPECT_TRUE(Close(run.synced_grad, expected));
    }
  }
}

// A plain RMSNorm on the heads at tp=2 without sequence parallelism: its gradient is partial
// but undeclared, MIH-GRAD-002 says so and its fix names the heads, and after the
// synchronization each rank holds its own heads' share, not one device's gradient.
TEST(HeadRMSNormTest, APlainNormOnTheHeadsIsFindingGrad002) {
  const at::Tensor expected = one_device_grad();
  std::vector<NormRun> runs;
  ASSERT_THAT(on_tp2(false,
                     [](ParallelContext& ctx) {
                       RMSNorm norm(ctx, kHeadDim);
                       return std::make_pair(std::static_pointer_cast<torch::nn::Module>(norm.ptr()),
                                             std::function<at::Tensor(const at::Tensor&)>(
                                                 [norm](const at::Tensor& q) mutable { return norm->forward(q); }));
                     },
                     &runs),
              IsEmpty());
  for (const NormRun& run : runs) {
    EXPECT_THAT(codes_of(run.before_sync), Contains(std::string(codes::kGradTpPartialUndeclared) + " q_norm.weight"));
    ASSERT_FALSE(run.before_sync.findings().empty());
    EXPECT_THAT(run.before_sync.findings()[0].remediation, HasSubstr("only its heads"));
    EXPECT_THAT(run.before_sync.findings()[0].remediation, HasSubstr("HeadRMSNorm"));
    EXPECT_THAT(run.grad_domain, ::testing::Not(Contains("tp")));
    EXPECT_FALSE(Close(run.synced_grad, expected, 1e-6)) << "the plain norm's gradient should be one rank's share";
  }
  EXPECT_TRUE(Close(runs[0].synced_grad + runs[1].synced_grad, expected));
}

// A k_norm on KV heads replicated over tp (tp 4 > 2 KV heads, ColumnParallelLinearOptions::
// heads): tp rank t holds KV head t / 2 whole, but its loss is only its own query heads' share,
// so the norm's gradient is still partial over tp. A plain RMSNorm there (what layers.h once
// advised for replicated KV heads) is MIH-GRAD-002 at tp 4; HeadRMSNorm is declared partial and
// synchronizes to one device's gradient.
TEST(HeadRMSNormTest, AKNormOnReplicatedKvHeadsIsPartialOverTpToo) {
  constexpr int64_t kKvHeads = 2, kTp = 4;
  const at::Tensor kv = all_heads().narrow(1, 0, kKvHeads);  // [B, 2, S, D]
  auto share = [&](int64_t t) { return head_loss_weights().narrow(1, t / 2, 1) * static_cast<double>(1 + t); };
  at::Tensor expected;
  {
    at::Tensor w = at::ones({kHeadDim}, at::kDouble).requires_grad_(true);
    const at::Tensor y = kv * at::rsqrt(kv.pow(2).mean(-1, true) + 1e-6) * w;
    at::Tensor loss = at::zeros({}, at::kDouble);
    for (int64_t t = 0; t < kTp; ++t) loss = loss + (y.narrow(1, t / 2, 1) * share(t)).sum();
    loss.backward();
    expected = w.grad();
  }
  for (bool head_norm : {false, true}) {
    SCOPED_TRACE(head_norm ? "HeadRMSNorm" : "RMSNorm");
    std::vector<NormRun> runs(kTp);
    ParallelConfig dims;
    dims.tp = kTp;
    ASSERT_THAT(testing::run_mesh(dims, [&](DeviceMesh& mesh) {
                  ParallelConfig config = mesh.config();
                  config.dtype = DType::kFloat64;
                  ParallelContext ctx(mesh, config);
                  struct Attention : torch::nn::Module {
                    std::shared_ptr<torch::nn::Module> k_norm;
                  } attn;
                  std::function<at::Tensor(const at::Tensor&)> forward;
                  if (head_norm) {
                    HeadRMSNorm norm(ctx, kHeadDim);
                    attn.k_norm = attn.register_module("k_norm", norm.ptr());
                    forward = [norm](const at::Tensor& k) mutable { return norm->forward(k); };
                  } else {
                    RMSNorm norm(ctx, kHeadDim);
                    attn.k_norm = attn.register_module("k_norm", norm.ptr());
                    forward = [norm](const at::Tensor& k) mutable { return norm->forward(k); };
                  }
                  ctx.finalize(attn);
                  const int64_t t = ctx.tp_rank();
                  (forward(kv.narrow(1, t / 2, 1)) * share(t)).sum().backward();
                  NormRun& run = runs[static_cast<size_t>(t)];
                  run.before_sync = checks::check_tp_partial_gradients(ctx, 0).findings;
                  ctx.synchronize_gradients();
                  run.synced_grad = ctx.parameters().at(0)->local.grad().clone();
                }),
                IsEmpty());
    for (const NormRun& run : runs) {
      if (head_norm) {
        EXPECT_THAT(codes_of(run.before_sync), IsEmpty()) << run.before_sync.summary();
        EXPECT_TRUE(Close(run.synced_grad, expected));
      } else {
        EXPECT_THAT(codes_of(run.before_sync), Contains(std::string(codes::kGradTpPartialUndeclared) + " k_norm.weight"));
      }
    }
  }
}

}  // namespace
}  // namespace mih
