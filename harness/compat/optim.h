// Optimizer-state access that differs between libtorch versions: the AdamW state map is keyed
// by a string of the TensorImpl address in 1.13 and by the address itself in 2.x
// (docs/spike-fsdp.md section 6), so no code outside harness/compat indexes optimizer.state().
#pragma once

#include <cstdint>
#include <string>

#include <ATen/core/Tensor.h>

namespace torch::optim {
class Optimizer;
}

namespace mih::compat {

/// The AdamW state tensor `name` ("exp_avg", "exp_avg_sq", "max_exp_avg_sq") of `param`, or
/// an undefined tensor when the optimizer has no state for it yet (before its first step).
/// Throws: mih::Error{kInvalidSpec} for another name; kInternal if the state is not AdamW's.
at::Tensor adamw_state(torch::optim::Optimizer& optimizer, const at::Tensor& param, const std::string& name);

/// The number of AdamW steps taken for `param` (0 before the first).
int64_t adamw_step(torch::optim::Optimizer& optimizer, const at::Tensor& param);

/// Sets the AdamW state of `param` (creating it when the optimizer has none yet, as after
/// loading a checkpoint into a fresh optimizer): the step count and the moment estimates, which
/// must have `param`'s shape. The tensors are used as they are (not copied).
/// Throws: mih::Error{kInvalidSpec} if a moment's shape differs from the parameter's.
void set_adamw_state(torch::optim::Optimizer& optimizer, const at::Tensor& param, int64_t step, const at::Tensor& exp_avg,
                     const at::Tensor& exp_avg_sq);

}  // namespace mih::compat
