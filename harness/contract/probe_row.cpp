// probe_rows (see probe_row.h).
#include "harness/contract/probe_row.h"

#include "harness/contract/evidence_layout.h"
#include "harness/contract/row_schema.h"

namespace mih::contract {

std::map<StepKey, ProbeRow> probe_rows(const std::vector<nlohmann::json>& lines, const std::string& file) {
  for (size_t i = 0; i < lines.size(); ++i) require_schema(layout::kProbes, lines[i], file, static_cast<int>(i + 1));
  std::map<StepKey, ProbeRow> out;
  for (auto& [key, row] : rows_by_step_and(lines, file, "stage")) {
    ProbeRow p{key.first, key.second, row["tensors"], {}, {}};
    if (row.contains("order")) p.order = row["order"].get<std::vector<std::string>>();
    if (row.contains("unplaced")) p.unplaced = row["unplaced"].get<std::vector<std::string>>();
    out.emplace(key, std::move(p));
  }
  return out;
}

}  // namespace mih::contract
