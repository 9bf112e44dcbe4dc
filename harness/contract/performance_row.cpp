// performance_rows (see performance_row.h).
#include "harness/contract/performance_row.h"

#include <nlohmann/json.hpp>

#include "harness/contract/evidence_layout.h"
#include "harness/contract/row_schema.h"

namespace mih::contract {

std::vector<PerformanceRow> performance_rows(const std::vector<nlohmann::json>& lines, int rank, const std::string& file) {
  std::vector<PerformanceRow> out;
  for (size_t i = 0; i < lines.size(); ++i) {
    const nlohmann::json& row = lines[i];
    require_schema(layout::performance_rank(rank), row, file, static_cast<int>(i + 1));
    PerformanceRow p{row["step"].get<int64_t>(), std::nullopt};
    if (row.contains("pipeline_order")) p.pipeline_order = row["pipeline_order"].get<std::vector<std::string>>();
    out.push_back(std::move(p));
  }
  return out;
}

}  // namespace mih::contract
