// resolved_spec (see resolved_spec.h).
#include "harness/contract/resolved_spec.h"

#include <nlohmann/json.hpp>

#include "harness/contract/evidence_layout.h"
#include "harness/contract/row_schema.h"

namespace mih::contract {

using Profile = std::map<std::string, double>;

const Profile* ResolvedTolerances::profile(const std::string& name) const {
  if (name == "same_topology") return &same_topology;
  if (name == "cross_topology") return &cross_topology;
  if (name == "grad_accumulation" && grad_accumulation) return &*grad_accumulation;
  return nullptr;
}

ResolvedSpec resolved_spec(const nlohmann::json& spec, const std::string& file) {
  require_schema(layout::kSpecResolved, spec, file);
  const nlohmann::json& t = spec["tolerances"];
  ResolvedSpec out;
  out.name = spec["name"].get<std::string>();
  out.tolerances.same_topology = t["same_topology"].get<Profile>();
  out.tolerances.cross_topology = t["cross_topology"].get<Profile>();
  if (t.contains("grad_accumulation")) out.tolerances.grad_accumulation = t["grad_accumulation"].get<Profile>();
  if (t.contains("grad_accumulation_reason")) {
    out.tolerances.grad_accumulation_reason = t["grad_accumulation_reason"].get<std::string>();
  }
  out.tolerances.noise_k = t["noise_k"].get<double>();
  out.tolerances.noise_k_update = t["noise_k_update"].get<double>();
  out.tolerances.noise_floor_eps = t["noise_floor_eps"].get<double>();
  out.tolerances.noise_oracle_factor = t["noise_oracle_factor"].get<double>();
  out.decayed_1d = spec["decayed_1d"].get<std::vector<std::string>>();
  for (const auto& m : spec["modalities"]) {
    out.modalities.push_back({m["field"].get<std::string>(), m["parameters"].get<std::vector<std::string>>()});
  }
  for (const auto& i : spec["invariants"]) {
    out.invariants.push_back({i["name"].get<std::string>(), i["phase"].get<std::string>()});
  }
  for (const auto& c : spec["module_parity_cases"]) {
    out.module_parity_cases.push_back(
        {c["name"].get<std::string>(), c["tolerance"].get<double>(), c["grad_tolerance"].get<double>()});
  }
  return out;
}

}  // namespace mih::contract
