// A comm ledger line and its JSON (see comm_ledger_row.h).
#include "harness/contract/comm_ledger_row.h"

#include <nlohmann/json.hpp>

#include "harness/base/error.h"
#include "harness/base/json_fields.h"

namespace mih {
namespace {

using nlohmann::json;

// Field `name` of ledger line `j` as a T, or the refusal naming it; `type` says what T is.
template <typename T>
T ledger_field(const json& j, const char* name, bool (json::*is)() const noexcept, const char* type) {
  const bool ok = j.contains(name) && (j[name].*is)();
  MIH_CHECK_CODE(ok, Code::kFailedPrecondition, "ledger line (seq ", j.contains("seq") ? j["seq"].dump() : "?", "): '",
                 name, "' must be ", type, ", got ", j.contains(name) ? json_summary(j[name]) : std::string("none"),
                 ": it is not a line of mih's comm ledger");
  return j[name].get<T>();
}

}  // namespace

void to_json(json& j, const CommRecord& r) {
  j = json{{"seq", r.seq},         {"event", r.event}, {"axis", r.axis},         {"ranks", r.ranks},
           {"op", r.op},           {"dtype", r.dtype}, {"numel", r.numel},       {"bytes", r.bytes},
           {"start_us", r.start_us}, {"site", r.site}};
  if (r.event != "begin") j["duration_us"] = r.duration_us;
  if (!r.error.empty()) j["error"] = r.error;
}

void from_json(const json& j, CommRecord& r) {
  MIH_CHECK_CODE(j.is_object(), Code::kFailedPrecondition, "ledger line ", json_summary(j),
                 " is no object: it is not a line of mih's comm ledger");
  r.seq = ledger_field<int64_t>(j, "seq", &json::is_number_integer, "an integer");
  r.event = ledger_field<std::string>(j, "event", &json::is_string, "a string");
  r.axis = ledger_field<std::string>(j, "axis", &json::is_string, "a string");
  r.ranks = ledger_field<std::vector<int>>(j, "ranks", &json::is_array, "a list of ranks");
  r.op = ledger_field<std::string>(j, "op", &json::is_string, "a string");
  r.dtype = ledger_field<std::string>(j, "dtype", &json::is_string, "a string");
  r.numel = ledger_field<int64_t>(j, "numel", &json::is_number_integer, "an integer");
  r.bytes = ledger_field<int64_t>(j, "bytes", &json::is_number_integer, "an integer");
  r.start_us = ledger_field<int64_t>(j, "start_us", &json::is_number_integer, "an integer");
  r.site = ledger_field<std::string>(j, "site", &json::is_string, "a string");
  r.duration_us = j.contains("duration_us") ? ledger_field<int64_t>(j, "duration_us", &json::is_number_integer, "an integer") : 0;
  r.error = j.contains("error") ? ledger_field<std::string>(j, "error", &json::is_string, "a string") : std::string();
}

}  // namespace mih
