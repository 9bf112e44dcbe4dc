// input_identity_rows (see input_identity_row.h).
#include "harness/contract/input_identity_row.h"

#include <nlohmann/json.hpp>

#include "harness/contract/evidence_layout.h"
#include "harness/contract/row_schema.h"
#include "harness/contract/step_rows.h"

namespace mih::contract {

std::map<int64_t, InputIdentityRow> input_identity_rows(const std::vector<nlohmann::json>& lines, const std::string& file) {
  for (size_t i = 0; i < lines.size(); ++i) {
    require_schema(layout::kInputIdentity, lines[i], file, static_cast<int>(i + 1));
  }
  std::map<int64_t, InputIdentityRow> out;
  for (const auto& [step, row] : rows_by_step(lines, file)) {
    out.emplace(step, InputIdentityRow{step, row["global"].get<std::string>(),
                                       row["fields"].get<std::map<std::string, std::string>>(),
                                       row["rows"].get<int64_t>()});
  }
  return out;
}

}  // namespace mih::contract
