// adamw_state / adamw_step over the version-specific key of Optimizer::state().
#include "harness/compat/optim.h"

#include <torch/optim/adamw.h>
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

torch::optim::AdamWParamState* find_state(torch::optim::Optimizer& optimizer, const at::Tensor& param) {
  auto key = state_key(param);
  auto& state = optimizer.state();
  auto it = state.find(key);
  if (it == state.end()) return nullptr;
  auto* adamw = dynamic_cast<torch::optim::AdamWParamState*>(it->second.get());
  MIH_INTERNAL_ASSERT(adamw != nullptr, "the optimizer state is not AdamW's");
  return adamw;
}

}  // namespace

at::Tensor adamw_state(torch::optim::Optimizer& optimizer, const at::Tensor& param, const std::string& name) {
  MIH_CHECK(name == "exp_avg" || name == "exp_avg_sq" || name == "max_exp_avg_sq", "unknown AdamW state '", name,
            "'; valid: [exp_avg, exp_avg_sq, max_exp_avg_sq]");
  auto* s = find_state(optimizer, param);
  if (!s) return at::Tensor();
  if (name == "exp_avg") return s->exp_avg();
  if (name == "exp_avg_sq") return s->exp_avg_sq();
  return s->max_exp_avg_sq();
}

int64_t adamw_step(torch::optim::Optimizer& optimizer, const at::Tensor& param) {
  auto* s = find_state(optimizer, param);
  return s ? static_cast<int64_t>(s->step()) : 0;
}

void set_adamw_state(torch::optim::Optimizer& optimizer, const at::Tensor& param, int64_t step, const at::Tensor& exp_avg,
                     const at::Tensor& exp_avg_sq) {
  MIH_CHECK(exp_avg.sizes() == param.sizes() && exp_avg_sq.sizes() == param.sizes(), "AdamW state of a parameter of shape ",
            param.sizes(), ": exp_avg ", exp_avg.sizes(), " and exp_avg_sq ", exp_avg_sq.sizes(), " must have its shape");
  auto s = std::make_unique<torch::optim::AdamWParamState>();
  s->step(step);
  s->exp_avg(exp_avg);
  s->exp_avg_sq(exp_avg_sq);
  optimizer.state()[state_key(param)] = std::move(s);
}

}  // namespace mih::compat
