// The optimizer-layout records read typed (schemas/evidence/v1/check.optimizer_layout_initial,
// cases.runtime.optimizer_layout_step and checkpoint.optimizer_layout_after_load): the
// optimizer's parameter groups at one point of the run, and the local shapes of its per-element
// state, validated against the contract's schema once where the file is read.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace mih::contract {

/// One parameter group of the optimizer.
struct OptimizerGroup {
  int64_t index = 0;                    ///< the group's index in its optimizer, from 0
  double lr = 0;                        ///< its learning rate
  double weight_decay = 0;              ///< its decoupled weight-decay coefficient
  std::vector<std::string> parameters;  ///< FQNs, in the group's order (a stray tensor: "<not a live parameter ...>")
};

struct OptimizerLayoutRecord {
  std::vector<OptimizerGroup> groups;
  /// FQN -> state name ("exp_avg", "exp_avg_sq") -> the local shape of that state tensor on the
  /// writing rank, elements per dim; only per-element state (never a scalar step counter).
  /// Empty: none recorded (before the first step, or a writer that records no state).
  std::map<std::string, std::map<std::string, std::vector<int64_t>>> state;
};

/// Whether a group's entry names a tensor that is no live parameter (mih's session writes
/// "<not a live parameter [shape]>"; OptimizerLayout.HoldsTheLiveShards judges those).
bool stray_entry(const std::string& entry);

/// An optimizer-layout file (`relative`, its path in the case directory: check/
/// optimizer_layout_initial.json, cases/runtime/optimizer_layout_step<k>.json or
/// checkpoint/optimizer_layout_after_load.json; `record`, the parsed file; `file` names it in a
/// refusal).
/// Throws: mih::Error{kFailedPrecondition} naming the file and the field for a value the
///   schema refuses (a group without weight_decay, a shape that is no list of integers).
OptimizerLayoutRecord optimizer_layout_record(const std::string& relative, const nlohmann::json& record,
                                              const std::string& file);

}  // namespace mih::contract
