// comm_expected_by_layer (see comm_expected_step.h).
#include "harness/contract/comm_expected_step.h"

#include <nlohmann/json.hpp>

#include "harness/contract/evidence_layout.h"
#include "harness/contract/row_schema.h"

namespace mih::contract {

LayerBytes comm_expected_by_layer(const nlohmann::json& value, int64_t step, const std::string& file) {
  require_schema(layout::comm_expected_step(step), value, file);
  return value.get<LayerBytes>();
}

}  // namespace mih::contract
