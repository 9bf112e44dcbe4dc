// errors/rank<r>.json read typed (see rank_error.h).
#include "harness/contract/rank_error.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "harness/base/error.h"
#include "harness/base/json_fields.h"

namespace mih::contract {
namespace {

using nlohmann::json;

constexpr char kNotMihs[] = ": it is not the error record a mih rank writes";

bool known_code(const std::string& name) {
  for (int c = 0; c <= static_cast<int>(Code::kInternal); ++c) {
    if (code_name(static_cast<Code>(c)) == name) return true;
  }
  return false;
}

std::string got(const json& value, const char* field) {
  return value.contains(field) ? json_summary(value[field]) : std::string("none");
}

}  // namespace

RankErrorRecord parse_rank_error(const json& value, const std::string& file) {
  MIH_CHECK_CODE(value.is_object(), Code::kFailedPrecondition, file, ": expected a JSON object, got ",
                 json_summary(value), kNotMihs);
  for (const char* field : {"code", "message"}) {
    MIH_CHECK_CODE(value.contains(field) && value[field].is_string(), Code::kFailedPrecondition, file, ": '", field,
                   "' must be a string, got ", got(value, field), kNotMihs);
  }
  const json& context = value.contains("context") ? value["context"] : json();
  MIH_CHECK_CODE(context.is_array() && std::all_of(context.begin(), context.end(), [](const json& c) { return c.is_string(); }),
                 Code::kFailedPrecondition, file, ": 'context' must be a list of strings, got ", got(value, "context"),
                 kNotMihs);
  RankErrorRecord out{value["code"].get<std::string>(), value["message"].get<std::string>(),
                      context.get<std::vector<std::string>>()};
  MIH_CHECK_CODE(known_code(out.code), Code::kFailedPrecondition, file, ": 'code' is '", out.code.substr(0, 40),
                 "', none of mih's error codes", kNotMihs);
  return out;
}

}  // namespace mih::contract
