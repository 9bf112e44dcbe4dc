// activation_checkpoint_record (see activation_checkpoint_record.h).
#include "harness/contract/activation_checkpoint_record.h"

#include <nlohmann/json.hpp>

#include "harness/contract/evidence_layout.h"
#include "harness/contract/row_schema.h"

namespace mih::contract {

ActivationCheckpointRecord activation_checkpoint_record(const nlohmann::json& value, const std::string& file) {
  require_schema(layout::kActivationCheckpoint, value, file);
  ActivationCheckpointRecord out{value["enabled"].get<bool>(), value["regions"].get<std::vector<std::string>>(), {}};
  for (const auto& s : value["steps"]) {
    CheckpointedStep step{s["step"].get<int64_t>(), {}};
    for (const auto& [region, c] : s["regions"].items()) {
      step.regions.emplace(region, RecomputeCounts{c["checkpointed"].get<int64_t>(), c["recomputed"].get<int64_t>()});
    }
    out.steps.push_back(std::move(step));
  }
  return out;
}

}  // namespace mih::contract
