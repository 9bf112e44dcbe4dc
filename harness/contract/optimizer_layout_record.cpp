// optimizer_layout_record (see optimizer_layout_record.h).
#include "harness/contract/optimizer_layout_record.h"

#include <nlohmann/json.hpp>

#include "harness/contract/row_schema.h"

namespace mih::contract {

bool stray_entry(const std::string& entry) { return entry.rfind("<not a live parameter", 0) == 0; }

OptimizerLayoutRecord optimizer_layout_record(const std::string& relative, const nlohmann::json& record,
                                              const std::string& file) {
  require_schema(relative, record, file);
  OptimizerLayoutRecord out;
  for (const nlohmann::json& g : record["groups"]) {
    out.groups.push_back({g["index"].get<int64_t>(), g["lr"].get<double>(), g["weight_decay"].get<double>(),
                          g["parameters"].get<std::vector<std::string>>()});
  }
  if (record.contains("state")) {
    for (const auto& [fqn, tensors] : record["state"].items()) {
      for (const auto& [name, shape] : tensors.items()) out.state[fqn][name] = shape.get<std::vector<int64_t>>();
    }
  }
  return out;
}

}  // namespace mih::contract
