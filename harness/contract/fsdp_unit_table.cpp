// fsdp_unit_table (see fsdp_unit_table.h).
#include "harness/contract/fsdp_unit_table.h"

#include <nlohmann/json.hpp>

#include "harness/contract/evidence_layout.h"
#include "harness/contract/row_schema.h"

namespace mih::contract {

std::map<std::string, FsdpUnit> fsdp_unit_table(const nlohmann::json& units, const std::string& file) {
  require_schema(layout::kFsdpUnits, units, file);
  std::map<std::string, FsdpUnit> out;
  for (const auto& [name, u] : units.items()) {
    out.emplace(name, FsdpUnit{u["parameters"].get<std::vector<std::string>>(), u["dtypes"].get<std::vector<std::string>>()});
  }
  return out;
}

}  // namespace mih::contract
