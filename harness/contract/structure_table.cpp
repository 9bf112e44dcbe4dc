// structure_parameters (see structure_table.h).
#include "harness/contract/structure_table.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "harness/contract/evidence_layout.h"
#include "harness/contract/row_schema.h"

namespace mih::contract {
namespace {

using nlohmann::json;

template <typename T>
std::optional<T> optional_field(const json& row, const char* key) {
  if (!row.contains(key)) return std::nullopt;
  return row[key].get<T>();
}

// An entry the schema accepted, typed.
ParameterRow typed(const json& p) {
  ParameterRow r;
  r.fqn = p["fqn"].get<std::string>();
  r.requires_grad = p["requires_grad"].get<bool>();
  r.local_shape = p["local_shape"].get<std::vector<int64_t>>();
  r.dtype = p["dtype"].get<std::string>();
  r.placements = p["placements"].get<std::map<std::string, std::string>>();
  r.global_shape = optional_field<std::vector<int64_t>>(p, "global_shape");
  r.aliases = optional_field<std::vector<std::string>>(p, "aliases").value_or(std::vector<std::string>{});
  r.device = optional_field<std::string>(p, "device");
  r.tp_local_shape = optional_field<std::vector<int64_t>>(p, "tp_local_shape");
  r.grad_domain = optional_field<std::vector<std::string>>(p, "grad_domain");
  r.gradient_kind = optional_field<std::string>(p, "gradient_kind");
  r.fsdp_unit = optional_field<std::string>(p, "fsdp_unit");
  r.pp_ranks = optional_field<std::vector<int64_t>>(p, "pp_ranks");
  r.pp_counted = optional_field<bool>(p, "pp_counted");
  r.fsdp_axis = optional_field<std::string>(p, "fsdp_axis");
  if (p.contains("fsdp_rows")) {
    const json& rows = p["fsdp_rows"];
    r.fsdp_rows = FsdpRows{rows["offset"].get<int64_t>(), rows["size"].get<int64_t>(), rows["chunk"].get<int64_t>()};
  }
  return r;
}

}  // namespace

bool ParameterRow::on_rank0() const {
  if (!pp_ranks) return true;
  return std::find(pp_ranks->begin(), pp_ranks->end(), 0) != pp_ranks->end() && pp_counted.value_or(true);
}

std::vector<ParameterRow> structure_parameters(const json& structure, const std::string& file) {
  require_schema(layout::kStructure, structure, file);
  std::vector<ParameterRow> out;
  for (const json& p : structure["parameters"]) out.push_back(typed(p));
  return out;
}

}  // namespace mih::contract
