// require_schema (see row_schema.h).
#include "harness/contract/row_schema.h"

#include <nlohmann/json.hpp>

#include "harness/base/error.h"
#include "harness/contract/contract.h"

namespace mih::contract {

void require_schema(const std::string& relative, const nlohmann::json& value, const std::string& file, int line) {
  const std::vector<Problem> problems = validate_value(relative, value, line);
  if (problems.empty()) return;
  std::string where = "evidence file " + file;
  if (line > 0) where += ", line " + std::to_string(line);
  if (value.is_object() && value.contains("step") && value["step"].is_number_integer()) {
    where += (line > 0 ? " (step " : " (step ") + std::to_string(value["step"].get<int64_t>()) + ")";
  }
  std::string what;
  for (size_t i = 0; i < problems.size() && i < 3; ++i) {
    const Problem& p = problems[i];
    std::string field = p.field;
    // validate_value prefixes the line ("line 2: lr"); the refusal names it once, above.
    const std::string prefix = "line " + std::to_string(line);
    if (line > 0 && field.rfind(prefix, 0) == 0) field = field.substr(field.find(':') == std::string::npos ? field.size() : field.find(':') + 1);
    while (!field.empty() && field.front() == ' ') field.erase(0, 1);
    what += (i ? "; " : "") + (field.empty() ? std::string() : "field " + field + ": ") + p.message;
  }
  if (problems.size() > 3) what += "; and " + std::to_string(problems.size() - 3) + " more";
  MIH_THROW(Code::kFailedPrecondition, where, ": ", what,
            "; it is not mih's evidence or was edited: rerun the case, or fix the writer that produced it "
            "(mih validate names every problem)");
}

}  // namespace mih::contract
