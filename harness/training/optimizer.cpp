// The Trainer's optimizer (AdamW, Adam or SGD with its weight-decay groups) and its
// learning-rate schedule (linear warmup, then cosine decay).
#include <cmath>
#include <numbers>

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include "harness/base/error.h"
#include "harness/training/trainer.h"

namespace mih {
namespace {

template <typename Options>
std::vector<torch::optim::OptimizerParamGroup> groups(const std::vector<at::Tensor>& decay,
                                                      const std::vector<at::Tensor>& no_decay, Options options,
                                                      double weight_decay) {
  std::vector<torch::optim::OptimizerParamGroup> out;
  if (!decay.empty()) out.emplace_back(decay, std::make_unique<Options>(Options(options).weight_decay(weight_decay)));
  if (!no_decay.empty()) out.emplace_back(no_decay, std::make_unique<Options>(Options(options).weight_decay(0.0)));
  return out;
}

}  // namespace

std::string optimizer_kind_name(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kAdamW: return "adamw";
    case OptimizerKind::kAdam: return "adam";
    case OptimizerKind::kSgd: return "sgd";
  }
  MIH_THROW(Code::kInternal, "unknown OptimizerKind");
}

OptimizerKind parse_optimizer_kind(const std::string& name) {
  for (OptimizerKind k : {OptimizerKind::kAdamW, OptimizerKind::kAdam, OptimizerKind::kSgd}) {
    if (optimizer_kind_name(k) == name) return k;
  }
  MIH_THROW(Code::kInvalidSpec, "unknown optimizer '", name, "'; valid: [adamw, adam, sgd]");
}

double scheduled_lr(const TrainerOptions& o, int64_t step) {
  MIH_CHECK(o.warmup_steps() >= 0 && o.decay_steps() >= 0 && step >= 0, "learning-rate schedule: expected ",
            "warmup_steps, decay_steps and the step >= 0, got ", o.warmup_steps(), ", ", o.decay_steps(), " and ", step);
  if (step < o.warmup_steps()) return o.lr() * static_cast<double>(step + 1) / static_cast<double>(o.warmup_steps());
  if (o.decay_steps() == 0) return o.lr();
  const double progress =
      std::min(1.0, static_cast<double>(step + 1 - o.warmup_steps()) / static_cast<double>(o.decay_steps()));
  return o.min_lr() + (o.lr() - o.min_lr()) * 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const TrainerOptions& o, const std::vector<at::Tensor>& decay,
                                                        const std::vector<at::Tensor>& no_decay) {
  MIH_CHECK(o.weight_decay() >= 0 && o.momentum() >= 0, "optimizer '", optimizer_kind_name(o.optimizer()),
            "': expected weight_decay and momentum >= 0, got ", o.weight_decay(), " and ", o.momentum());
  const auto betas = std::make_tuple(o.beta1(), o.beta2());
  switch (o.optimizer()) {
    case OptimizerKind::kAdamW: {
      const auto options = torch::optim::AdamWOptions(o.lr()).betas(betas).eps(o.eps());
      return std::make_unique<torch::optim::AdamW>(groups(decay, no_decay, options, o.weight_decay()), options);
    }
    case OptimizerKind::kAdam: {
      const auto options = torch::optim::AdamOptions(o.lr()).betas(betas).eps(o.eps());
      return std::make_unique<torch::optim::Adam>(groups(decay, no_decay, options, o.weight_decay()), options);
    }
    case OptimizerKind::kSgd: {
      MIH_CHECK(!o.nesterov() || o.momentum() > 0, "optimizer 'sgd': Nesterov momentum needs momentum > 0, got ",
                o.momentum());
      const auto options = torch::optim::SGDOptions(o.lr()).momentum(o.momentum()).nesterov(o.nesterov());
      return std::make_unique<torch::optim::SGD>(groups(decay, no_decay, options, o.weight_decay()), options);
    }
  }
  MIH_THROW(Code::kInternal, "unknown OptimizerKind");
}

}  // namespace mih
