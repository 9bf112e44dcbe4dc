// Optimizer-state access that differs between libtorch versions: the state map is keyed by a
// string of the TensorImpl address in 1.13 and by the address itself in 2.x
// (docs/spike-fsdp.md section 6), so no code outside harness/compat indexes optimizer.state().
// The optimizers mih reads and restores: torch::optim::AdamW, Adam and SGD.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace torch::optim {
class Optimizer;
class OptimizerOptions;
}  // namespace torch::optim

namespace mih::compat {

/// Whether this header reads and restores the state of `optimizer` (AdamW, Adam or SGD).
bool state_readable(const torch::optim::Optimizer& optimizer);

/// The optimizer's kind: "adamw", "adam" or "sgd".
/// Throws: mih::Error{kUnimplemented} for another torch::optim class, naming the supported ones.
std::string optimizer_kind(const torch::optim::Optimizer& optimizer);

/// The per-parameter state tensors of `optimizer`'s kind, in a fixed order, each shaped like
/// its parameter: AdamW and Adam {"exp_avg", "exp_avg_sq"}, plus "max_exp_avg_sq" when a group
/// has amsgrad; SGD {"momentum_buffer"} (a parameter has one once it took a step with
/// momentum != 0). Throws: as optimizer_kind.
std::vector<std::string> state_names(const torch::optim::Optimizer& optimizer);

/// The state tensor `name` (one of state_names) of `param`, or an undefined tensor when the
/// optimizer holds none for it (before its first step; SGD without momentum).
/// Throws: mih::Error{kInvalidSpec} for a name not in state_names, listing them.
at::Tensor optimizer_state(torch::optim::Optimizer& optimizer, const at::Tensor& param, const std::string& name);

/// Whether the optimizer holds state for `param` (it took a step for it).
bool has_state(torch::optim::Optimizer& optimizer, const at::Tensor& param);

/// The number of steps Adam or AdamW took for `param` (0 before the first); SGD counts none: 0.
int64_t optimizer_step(torch::optim::Optimizer& optimizer, const at::Tensor& param);

/// Sets the state of `param` (creating it when the optimizer has none yet, as after loading a
/// checkpoint into a fresh optimizer): the step count (ignored by SGD) and one tensor per
/// state_names entry, shaped like `param`, used as they are (not copied); a missing optional
/// one (max_exp_avg_sq) stays undefined.
/// Throws: mih::Error{kInvalidSpec} if a tensor's shape differs from the parameter's or a
///   required one is missing, naming it.
void set_optimizer_state(torch::optim::Optimizer& optimizer, const at::Tensor& param, int64_t step,
                         const std::map<std::string, at::Tensor>& tensors);

/// The weight decay of a param group's options (AdamW's decoupled, Adam's and SGD's L2).
/// Throws: as optimizer_kind for other options.
double weight_decay(const torch::optim::OptimizerOptions& options);

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
