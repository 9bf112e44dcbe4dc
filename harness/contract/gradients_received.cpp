// check/gradients_received.json read typed (see gradients_received.h).
#include "harness/contract/gradients_received.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "harness/base/error.h"
#include "harness/base/json_fields.h"

namespace mih::contract {
namespace {

using nlohmann::json;

bool list_of(const json& j, const char* field, bool (json::*is)() const noexcept) {
  if (!j.contains(field) || !j[field].is_array()) return false;
  return std::all_of(j[field].begin(), j[field].end(), [&](const json& v) { return (v.*is)(); });
}

}  // namespace

GradientsReceived read_gradients_received(const std::filesystem::path& file) {
  const json j = read_json_file(file);
  MIH_CHECK_CODE(j.is_object() && list_of(j, "never_received", &json::is_string) &&
                     list_of(j, "steps", &json::is_number_integer),
                 Code::kFailedPrecondition, "evidence file ", file.string(),
                 " has no list never_received of names or steps of integers: it was edited or written by another "
                 "version; rerun the case");
  return {j["never_received"].get<std::vector<std::string>>(), j["steps"].get<std::vector<int64_t>>()};
}

}  // namespace mih::contract
