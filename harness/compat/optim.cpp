// Optimizer state of AdamW, Adam and SGD over the version-specific key of Optimizer::state().
#include "harness/compat/optim.h"

#include <algorithm>

#include <c10/util/StringUtil.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <torch/version.h>

#include "harness/base/error.h"

namespace mih::compat {
namespace {

auto state_key(const at::Tensor& param) {
#if TORCH_VERSION_MAJOR >= 2
  return static_cast<void*>(param.unsafeGetTensorImpl());
#else
  return c10::guts::to_string(param.unsafeGetTensorImpl());
#endif
}

torch::optim::OptimizerParamState* find_any(torch::optim::Optimizer& optimizer, const at::Tensor& param) {
  auto& state = optimizer.state();
  auto it = state.find(state_key(param));
  return it == state.end() ? nullptr : it->second.get();
}

template <typename State>
State* find_state(torch::optim::Optimizer& optimizer, const at::Tensor& param, const char* kind) {
  torch::optim::OptimizerParamState* any = find_any(optimizer, param);
  if (!any) return nullptr;
  auto* s = dynamic_cast<State*>(any);
  MIH_INTERNAL_ASSERT(s != nullptr, "the optimizer state is not ", kind, "'s");
  return s;
}

template <typename Options>
bool any_amsgrad(const torch::optim::Optimizer& optimizer) {
  for (const auto& g : optimizer.param_groups()) {
    if (static_cast<const Options&>(g.options()).amsgrad()) return true;
  }
  return false;
}

// The Adam-family state `name` of `s` (AdamParamState and AdamWParamState share the fields).
template <typename State>
at::Tensor adam_tensor(State* s, const std::string& name) {
  if (!s) return at::Tensor();
  if (name == "exp_avg") return s->exp_avg();
  if (name == "exp_avg_sq") return s->exp_avg_sq();
  return s->max_exp_avg_sq();
}

template <typename State>
void set_adam(torch::optim::Optimizer& optimizer, const at::Tensor& param, int64_t step,
              const std::map<std::string, at::Tensor>& tensors) {
  auto s = std::make_unique<State>();
  s->step(step);
  s->exp_avg(tensors.at("exp_avg"));
  s->exp_avg_sq(tensors.at("exp_avg_sq"));
  if (tensors.count("max_exp_avg_sq")) s->max_exp_avg_sq(tensors.at("max_exp_avg_sq"));
  optimizer.state()[state_key(param)] = std::move(s);
}

}  // namespace

bool state_readable(const torch::optim::Optimizer& optimizer) {
  return dynamic_cast<const torch::optim::AdamW*>(&optimizer) || dynamic_cast<const torch::optim::Adam*>(&optimizer) ||
         dynamic_cast<const torch::optim::SGD*>(&optimizer);
}

std::string optimizer_kind(const torch::optim::Optimizer& optimizer) {
  if (dynamic_cast<const torch::optim::AdamW*>(&optimizer)) return "adamw";
  if (dynamic_cast<const torch::optim::Adam*>(&optimizer)) return "adam";
  if (dynamic_cast<const torch::optim::SGD*>(&optimizer)) return "sgd";
  MIH_THROW(Code::kUnimplemented, "optimizer state of a torch::optim class other than AdamW, Adam and SGD is not ",
            "supported yet; build the Trainer with TrainerOptions::optimizer one of [adamw, adam, sgd]");
}

std::vector<std::string> state_names(const torch::optim::Optimizer& optimizer) {
  const std::string kind = optimizer_kind(optimizer);
  if (kind == "sgd") return {"momentum_buffer"};
  std::vector<std::string> names = {"exp_avg", "exp_avg_sq"};
  const bool amsgrad = kind == "adamw" ? any_amsgrad<torch::optim::AdamWOptions>(optimizer)
                                       : any_amsgrad<torch::optim::AdamOptions>(optimizer);
  if (amsgrad) names.push_back("max_exp_avg_sq");
  return names;
}

at::Tensor optimizer_state(torch::optim::Optimizer& optimizer, const at::Tensor& param, const std::string& name) {
  const std::vector<std::string> names = state_names(optimizer);
  MIH_CHECK(std::find(names.begin(), names.end(), name) != names.end(), "unknown ", optimizer_kind(optimizer),
            " state '", name, "'; valid: ", c10::Join(", ", names));
  const std::string kind = optimizer_kind(optimizer);
  if (kind == "sgd") {
    auto* s = find_state<torch::optim::SGDParamState>(optimizer, param, "SGD");
    return s ? s->momentum_buffer() : at::Tensor();
  }
  if (kind == "adamw") return adam_tensor(find_state<torch::optim::AdamWParamState>(optimizer, param, "AdamW"), name);
  return adam_tensor(find_state<torch::optim::AdamParamState>(optimizer, param, "Adam"), name);
}

bool has_state(torch::optim::Optimizer& optimizer, const at::Tensor& param) {
  return find_any(optimizer, param) != nullptr;
}

int64_t optimizer_step(torch::optim::Optimizer& optimizer, const at::Tensor& param) {
  const std::string kind = optimizer_kind(optimizer);
  if (kind == "adamw") return adamw_step(optimizer, param);
  if (kind == "adam") {
    auto* s = find_state<torch::optim::AdamParamState>(optimizer, param, "Adam");
    return s ? s->step() : 0;
  }
  return 0;
}

void set_optimizer_state(torch::optim::Optimizer& optimizer, const at::Tensor& param, int64_t step,
                         const std::map<std::string, at::Tensor>& tensors) {
  const std::vector<std::string> names = state_names(optimizer);
  for (const std::string& name : names) {
    const auto it = tensors.find(name);
    MIH_CHECK(it != tensors.end() || name == "max_exp_avg_sq", "the ", optimizer_kind(optimizer),
              " state of a parameter of shape ", param.sizes(), " needs '", name, "'");
    if (it == tensors.end()) continue;
    MIH_CHECK(it->second.sizes() == param.sizes(), optimizer_kind(optimizer), " state '", name, "' of a parameter of ",
              "shape ", param.sizes(), ": expected its shape, got ", it->second.sizes());
  }
  const std::string kind = optimizer_kind(optimizer);
  if (kind == "adamw") return set_adam<torch::optim::AdamWParamState>(optimizer, param, step, tensors);
  if (kind == "adam") return set_adam<torch::optim::AdamParamState>(optimizer, param, step, tensors);
  auto s = std::make_unique<torch::optim::SGDParamState>();
  s->momentum_buffer(tensors.at("momentum_buffer"));
  optimizer.state()[state_key(param)] = std::move(s);
}

double weight_decay(const torch::optim::OptimizerOptions& options) {
  if (auto* o = dynamic_cast<const torch::optim::AdamWOptions*>(&options)) return o->weight_decay();
  if (auto* o = dynamic_cast<const torch::optim::AdamOptions*>(&options)) return o->weight_decay();
  if (auto* o = dynamic_cast<const torch::optim::SGDOptions*>(&options)) return o->weight_decay();
  MIH_THROW(Code::kUnimplemented, "the weight decay of a torch::optim param group other than AdamW's, Adam's and ",
            "SGD's is not supported yet");
}

at::Tensor adamw_state(torch::optim::Optimizer& optimizer, const at::Tensor& param, const std::string& name) {
  MIH_CHECK(name == "exp_avg" || name == "exp_avg_sq" || name == "max_exp_avg_sq", "unknown AdamW state '", name,
            "'; valid: [exp_avg, exp_avg_sq, max_exp_avg_sq]");
  return adam_tensor(find_state<torch::optim::AdamWParamState>(optimizer, param, "AdamW"), name);
}

int64_t adamw_step(torch::optim::Optimizer& optimizer, const at::Tensor& param) {
  auto* s = find_state<torch::optim::AdamWParamState>(optimizer, param, "AdamW");
  return s ? static_cast<int64_t>(s->step()) : 0;
}

void set_adamw_state(torch::optim::Optimizer& optimizer, const at::Tensor& param, int64_t step, const at::Tensor& exp_avg,
                     const at::Tensor& exp_avg_sq) {
  MIH_CHECK(exp_avg.sizes() == param.sizes() && exp_avg_sq.sizes() == param.sizes(), "AdamW state of a parameter of shape ",
            param.sizes(), ": exp_avg ", exp_avg.sizes(), " and exp_avg_sq ", exp_avg_sq.sizes(), " must have its shape");
  set_adam<torch::optim::AdamWParamState>(optimizer, param, step, {{"exp_avg", exp_avg}, {"exp_avg_sq", exp_avg_sq}});
}

}  // namespace mih::compat
