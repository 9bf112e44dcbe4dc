// check/activation_checkpoint.json read typed (schemas/evidence/v1/
// check.activation_checkpoint.schema.json): whether the case ran with activation checkpointing,
// its declared regions, and per trained step and region the forwards that ran under
// checkpointing and the recomputes backward ran, validated against the contract's schema once.
// Every field is required: mih's session writes steps from the first step on.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace mih::contract {

/// One region's counts in one step (region executions).
struct RecomputeCounts {
  int64_t checkpointed = 0;  ///< forwards that ran under checkpointing
  int64_t recomputed = 0;    ///< recomputes in the step's backward
};

struct CheckpointedStep {
  int64_t step = 0;
  std::map<std::string, RecomputeCounts> regions;  ///< region FQN -> counts; empty: nothing ran under it
};

struct ActivationCheckpointRecord {
  bool enabled = false;              ///< the config turns activation checkpointing on
  std::vector<std::string> regions;  ///< the modules declared as checkpoint regions
  std::vector<CheckpointedStep> steps;
};

/// activation_checkpoint.json (`value`, the parsed file; `file` names it in a refusal).
/// Throws: mih::Error{kFailedPrecondition} naming the file and the field for a value the
///   schema refuses (no steps, a region's count missing or negative, enabled not a boolean).
ActivationCheckpointRecord activation_checkpoint_record(const nlohmann::json& value, const std::string& file);

}  // namespace mih::contract
