// index_rows_by_step and its throwing forms (see step_rows.h).
#include "harness/contract/step_rows.h"

#include "harness/base/error.h"

namespace mih {
namespace {

using nlohmann::json;

std::string key_text(const StepKey& key, const std::string& second_key) {
  std::string text = "step " + std::to_string(key.first);
  if (!second_key.empty()) text += ", " + second_key + " " + key.second;
  return text;
}

// Why `row` (line `line` of `file`, from 1) has no key; "" when it has one.
std::string unkeyed(const json& row, size_t line, const std::string& file, const std::string& second_key) {
  const bool step = row.is_object() && row.contains("step") && row["step"].is_number_integer();
  const bool second = second_key.empty() || (row.is_object() && row.contains(second_key) && row[second_key].is_string());
  if (step && second) return "";
  const std::string missing = !step ? "integer \"step\"" : "string \"" + second_key + "\"";
  return "evidence file " + file + ": row " + std::to_string(line) + " has no " + missing +
         ": every row names the step it records; rerun the case";
}

}  // namespace

std::string index_rows_by_step(const std::vector<json>& rows, const std::string& file, const std::string& second_key,
                               std::map<StepKey, json>* out) {
  out->clear();
  for (size_t i = 0; i < rows.size(); ++i) {
    const json& row = rows[i];
    if (std::string why = unkeyed(row, i + 1, file, second_key); !why.empty()) return why;
    StepKey key{row["step"].get<int64_t>(), second_key.empty() ? "" : row[second_key].get<std::string>()};
    if (!out->emplace(key, row).second) {
      return "evidence file " + file + " has two rows for " + key_text(key, second_key) + ": one run writes one row per " +
             (second_key.empty() ? "step" : "step and " + second_key) + "; it is not one run's evidence; rerun the case";
    }
  }
  return "";
}

std::map<StepKey, json> rows_by_step_and(const std::vector<json>& rows, const std::string& file,
                                         const std::string& second_key) {
  std::map<StepKey, json> out;
  const std::string refusal = index_rows_by_step(rows, file, second_key, &out);
  MIH_CHECK_CODE(refusal.empty(), Code::kFailedPrecondition, refusal);
  return out;
}

std::map<int64_t, json> rows_by_step(const std::vector<json>& rows, const std::string& file) {
  std::map<int64_t, json> out;
  for (auto& [key, row] : rows_by_step_and(rows, file, "")) out.emplace(key.first, std::move(row));
  return out;
}

}  // namespace mih
