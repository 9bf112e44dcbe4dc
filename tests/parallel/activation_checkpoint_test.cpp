// mih::checkpoint on one device, against the same region run plainly: bit-exact gradients
// with dropout over several steps (the RNG replayed in the recompute and restored after it),
// an input without grad, autocast re-entered, a parameter listed twice (a tie inside the region)
// given its gradient once, and each silent-loss trap turned into an error
// (docs/spike-ac-cp.md section 1.4).
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>

#include "harness/base/error.h"
#include "harness/compat/autocast.h"
#include "harness/parallel/activation_checkpoint.h"

namespace mih {
namespace {

using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

struct Block {
  at::Tensor w1, w2;
  // [N, D] -> [N, D]: two dropouts drawn from the default CPU generator.
  at::Tensor operator()(const at::Tensor& x) const {
    at::Tensor h = at::dropout(at::gelu(at::matmul(x, w1)), 0.1, /*train=*/true);
    return x + at::dropout(at::matmul(h, w2), 0.1, true);
  }
};

std::vector<Block> blocks(int n) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(7);
  std::vector<Block> out;
  for (int i = 0; i < n; ++i) {
    out.push_back({at::randn({8, 8}, gen, at::kDouble).mul_(0.3).requires_grad_(true),
                   at::randn({8, 8}, gen, at::kDouble).mul_(0.3).requires_grad_(true)});
  }
  return out;
}

// Three SGD steps of three blocks; returns every gradient of every step, and the loss.
std::vector<at::Tensor> train(bool checkpointed) {
  at::manual_seed(123);
  std::vector<Block> model = blocks(3);
  std::vector<at::Tensor> seen;
  for (int step = 0; step < 3; ++step) {
    at::Tensor x = at::randn({4, 8}, at::kDouble);  // no grad: the first region's input
    for (size_t i = 0; i < model.size(); ++i) {
      const Block b = model[i];
      x = checkpointed ? checkpoint("block" + std::to_string(i), [b](const std::vector<at::Tensor>& in) { return b(in[0]); },
                                    {x}, {b.w1, b.w2})
                       : b(x);
    }
    at::Tensor loss = x.pow(2).mean();
    loss.backward();
    seen.push_back(loss.detach());
    at::NoGradGuard no_grad;
    for (auto& b : model) {
      for (at::Tensor* w : {&b.w1, &b.w2}) {
        seen.push_back(w->grad().clone());
        w->sub_(w->grad() * 0.1);
        w->mutable_grad() = at::Tensor();
      }
    }
  }
  seen.push_back(at::rand({4}, at::kDouble));  // the stream after training
  return seen;
}

TEST(ActivationCheckpointTest, GradientsBitExactWithDropoutOverSteps) {
  std::vector<at::Tensor> plain = train(false), checkpointed = train(true);
  ASSERT_EQ(plain.size(), checkpointed.size());
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_TRUE(at::equal(plain[i], checkpointed[i])) << "value " << i;
}

TEST(ActivationCheckpointTest, RecomputeIsVisibleAndNamed) {
  std::vector<std::string> calls;
  at::Tensor w = at::ones({3}, at::kDouble).requires_grad_(true);
  at::Tensor y = checkpoint("layers.0", [&](const std::vector<at::Tensor>& in) {
    calls.push_back(in_recompute() ? "recompute " + recompute_region() : "forward");
    return in[0] * w;
  }, {at::ones({3}, at::kDouble)}, {w});
  EXPECT_FALSE(in_recompute());
  y.sum().backward();
  EXPECT_EQ(calls, (std::vector<std::string>{"forward", "recompute layers.0"}));
  EXPECT_TRUE(at::equal(w.grad(), at::ones({3}, at::kDouble)));
}

TEST(ActivationCheckpointTest, AutocastStateIsReenteredInTheRecompute) {
  auto grads = [](bool checkpointed) {
    at::Tensor w = at::eye(16, at::kFloat).add_(0.01).requires_grad_(true);
    at::Tensor x = at::linspace(-1, 1, 64, at::kFloat).reshape({4, 16});
    compat::AutocastState on;
    on.cpu_enabled = true;
    on.cpu_dtype = at::kBFloat16;
    auto f = [w](const std::vector<at::Tensor>& in) { return at::matmul(in[0], w); };  // bf16 under autocast
    at::Tensor y;
    {
      compat::AutocastScope autocast(on);
      y = checkpointed ? checkpoint("mm", f, {x}, {w}) : f({x});
    }  // backward outside autocast, the usual pattern
    EXPECT_EQ(y.scalar_type(), at::kBFloat16);
    y.to(at::kFloat).pow(2).sum().backward();
    return w.grad();
  };
  EXPECT_TRUE(at::equal(grads(false), grads(true)));
}

// A tie inside the region: one norm module registered under two names (a port whose q_norm
// and k_norm are the same module), so Module::parameters() lists its weight twice. Each entry
// used to get the region's whole gradient, and the leaf accumulated both: exactly 2x.
struct TiedNormBlockImpl : torch::nn::Module {
  at::Tensor w;
  torch::nn::Linear q{nullptr}, k{nullptr};
  explicit TiedNormBlockImpl(at::Generator gen) {
    q = register_module("q", torch::nn::Linear(torch::nn::LinearOptions(6, 6).bias(false)));
    k = register_module("k", torch::nn::Linear(torch::nn::LinearOptions(6, 6).bias(false)));
    at::NoGradGuard no_grad;
    for (auto& p : parameters()) p.set_data(at::randn(p.sizes(), gen, at::kDouble));
    w = at::randn({6}, gen, at::kDouble).requires_grad_(true);
    register_parameter("q_norm_weight", w);
    register_parameter("k_norm_weight", w);  // the same tensor under a second name
  }
  // [N, 6] -> [N, 6]
  at::Tensor forward(const at::Tensor& x) { return q(x) * w + (k(x) * w).tanh(); }
};
TORCH_MODULE(TiedNormBlock);

TEST(ActivationCheckpointTest, AParameterListedTwiceGetsItsGradientOnce) {
  auto grads = [](bool checkpointed) {
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(11);
    TiedNormBlock block(gen);
    EXPECT_EQ(block->parameters().size(), 4u) << "the tied weight is listed under both names";
    at::Tensor x = at::randn({3, 6}, gen, at::kDouble).requires_grad_(true);
    auto f = [impl = block.ptr()](const std::vector<at::Tensor>& in) { return impl->forward(in[0]); };
    at::Tensor y = checkpointed ? checkpoint("layers.0", f, {x}, block->parameters()) : f({x});
    y.pow(2).sum().backward();
    return std::vector<at::Tensor>{block->w.grad(), block->q->weight.grad(), x.grad()};
  };
  const std::vector<at::Tensor> plain = grads(false), checkpointed = grads(true);
  for (size_t i = 0; i < plain.size(); ++i) {
    const double diff = (checkpointed[i] - plain[i]).abs().max().item<double>();
    EXPECT_LE(diff, 1e-12) << "gradient " << i << " (0: the tied weight): checkpointed / plain = "
                           << (checkpointed[i] / plain[i]).mean().item<double>();
  }
}

TEST(ActivationCheckpointTest, UndeclaredLeafIsAnError) {
  at::Tensor w = at::ones({3}, at::kDouble).requires_grad_(true), tied = at::ones({3}, at::kDouble).requires_grad_(true);
  at::Tensor y = checkpoint("layers.1", [=](const std::vector<at::Tensor>& in) { return in[0] * w * tied; },
                            {at::ones({3}, at::kDouble)}, {w});
  EXPECT_THAT([&] { y.sum().backward(); },
              ThrowsMessage<Error>(HasSubstr("region 'layers.1' uses a tensor of shape [3] that requires grad but is "
                                             "neither one of its params nor one of its inputs")));
}

TEST(ActivationCheckpointTest, CapturedNonLeafIsAnError) {
  at::Tensor pos = at::ones({3}, at::kDouble).requires_grad_(true);
  at::Tensor table = pos.tanh();  // computed outside, requires grad
  at::Tensor w = at::ones({3}, at::kDouble).requires_grad_(true);
  at::Tensor y = checkpoint("layers.2", [=](const std::vector<at::Tensor>& in) { return in[0] * w + table; },
                            {at::ones({3}, at::kDouble)}, {w});
  EXPECT_THAT([&] { y.sum().backward(); }, ThrowsMessage<Error>(HasSubstr("reaches autograd node 'TanhBackward0' created outside")));
  // Declared as an input, its gradient flows back through the outer graph.
  at::Tensor ok = checkpoint("layers.2", [=](const std::vector<at::Tensor>& in) { return in[0] * w + in[1]; },
                             {at::ones({3}, at::kDouble), pos.tanh()}, {w});
  ok.sum().backward();
  EXPECT_TRUE(at::allclose(pos.grad(), 1 - at::ones({3}, at::kDouble).tanh().pow(2)));
}

TEST(ActivationCheckpointTest, InputModifiedInPlaceIsAnError) {
  at::Tensor w = at::ones({3}, at::kDouble).requires_grad_(true);
  at::Tensor mask = at::ones({3}, at::kDouble);
  at::Tensor y = checkpoint("layers.3", [=](const std::vector<at::Tensor>& in) { return in[0] * w * in[1]; },
                            {at::ones({3}, at::kDouble), mask}, {w});
  mask.mul_(2);
  EXPECT_THAT([&] { y.sum().backward(); }, ThrowsMessage<Error>(HasSubstr("an input was modified in place")));
}

}  // namespace
}  // namespace mih
