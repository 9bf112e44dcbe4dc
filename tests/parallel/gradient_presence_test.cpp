// A parameter without a gradient after backward, under data parallelism on thread ranks:
// PyTorch's semantics (torch.optim skips a grad of None; DDP joins the ranks without one with
// zeros and leaves a globally unused parameter's grad None). One used on some ranks only gets
// the sum of theirs on every rank; one no rank used keeps no gradient, counts for nothing in
// the grad norm and is not moved by AdamW, weight decay included.
#include <cmath>
#include <vector>

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/nn/module.h>
#include <torch/optim/adamw.h>

#include "harness/parallel/parallel_context.h"
#include "tests/support/thread_ranks.h"

namespace mih {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

TEST(GradientPresenceTest, AParameterNoRankUsedKeepsNoGradientAndTheOptimizerSkipsIt) {
  ParallelConfig dims;
  dims.dp_replicate = 2;
  EXPECT_THAT(testing::run_mesh(dims, [&](DeviceMesh& mesh) {
                ParallelConfig c = mesh.config();
                c.dtype = DType::kFloat64;
                ParallelContext ctx(mesh, c);
                ParamSpec s;
                s.shape = {3};
                s.init = init::normal(1.0);
                torch::nn::Module m;
                // `both` is used on every rank, `rank0` on rank 0 only (a branch one data-parallel
                // rank's batch takes), `unused` on none (a vision tower on a text-only batch).
                const at::Tensor both = m.register_parameter("both", ctx.make_parameter(s));
                const at::Tensor rank0 = m.register_parameter("rank0", ctx.make_parameter(s));
                const at::Tensor unused = m.register_parameter("unused", ctx.make_parameter(s));
                ctx.finalize(m);
                const at::Tensor x = at::arange(3, at::kDouble) + 1 + mesh.rank();
                at::Tensor loss = (both * x).sum();
                if (mesh.rank() == 0) loss = loss + (rank0 * rank0).sum();
                loss.backward();
                ctx.synchronize_gradients();
                // The sum over the ranks: both ranks' x for `both`, rank 0's 2 * rank0 for `rank0`
                // (rank 1 joined with zeros).
                EXPECT_TRUE(at::allclose(both.grad(), at::arange(3, at::kDouble) * 2 + 3));
                EXPECT_TRUE(at::allclose(rank0.grad(), 2 * rank0.detach()));
                EXPECT_FALSE(unused.grad().defined());
                EXPECT_THAT(ctx.parameters_without_gradient(), ElementsAre("unused"));
                // Still recorded as zero-filled on this rank for the reduction check.
                EXPECT_TRUE(ctx.gradient_reductions().at("unused").count(ParallelContext::kNoGradient));
                // The norm counts the gradients there are, each once.
                const double expected = std::sqrt(both.grad().pow(2).sum().item<double>() + rank0.grad().pow(2).sum().item<double>());
                EXPECT_NEAR(ctx.grad_norm(), expected, 1e-12);
                const at::Tensor before_unused = unused.detach().clone(), before_rank0 = rank0.detach().clone();
                torch::optim::AdamW adamw({both, rank0, unused}, torch::optim::AdamWOptions(0.1).weight_decay(0.5));
                adamw.step();
                EXPECT_TRUE(at::equal(unused.detach(), before_unused)) << "AdamW moved a parameter without a gradient";
                EXPECT_FALSE(at::equal(rank0.detach(), before_rank0));
                // A second step in which `rank0` gets no gradient anywhere: its momentum does not move it.
                for (const at::Tensor& p : {both, rank0, unused}) p.mutable_grad() = at::Tensor();
                (both * x).sum().backward();
                ctx.synchronize_gradients();
                EXPECT_THAT(ctx.parameters_without_gradient(), ElementsAre("rank0", "unused"));
                const at::Tensor after_first = rank0.detach().clone();
                adamw.step();
                EXPECT_TRUE(at::equal(rank0.detach(), after_first)) << "stale momentum moved a parameter without a gradient";
              }),
              IsEmpty());
}

}  // namespace
}  // namespace mih
