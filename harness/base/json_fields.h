// Strict JSON objects for options and specs: an unknown field (a typo) is an error that lists
// the valid ones, never silently ignored.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/base/error.h"

namespace mih {

/// Throws: mih::Error{kInvalidSpec} "<what>: expected a JSON object, got ..." if `j` is not an
///   object, or "<what>: unknown field 'x'; valid: a, b, c" for a key not in `fields`.
inline void check_known_fields(const nlohmann::json& j, const std::string& what, const std::vector<std::string>& fields) {
  MIH_CHECK(j.is_object(), what, ": expected a JSON object, got ", j.dump());
  for (const auto& item : j.items()) {
    if (std::find(fields.begin(), fields.end(), item.key()) != fields.end()) continue;
    std::string valid;
    for (const auto& f : fields) valid += (valid.empty() ? "" : ", ") + f;
    MIH_THROW(Code::kInvalidSpec, what, ": unknown field '", item.key(), "'; valid: ", valid);
  }
}

}  // namespace mih
