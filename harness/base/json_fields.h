// Strict JSON objects for options and specs: an unknown field (a typo) is an error that lists
// the valid ones, never silently ignored; and the one reader of a whole JSON file.
#pragma once

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/base/error.h"
#include "harness/base/files.h"

namespace mih {

/// The JSON of `file`.
/// Throws: mih::Error{kFailedPrecondition} naming the file when it cannot be read;
///   kInvalidSpec naming it when it is not JSON.
inline nlohmann::json read_json_file(const std::filesystem::path& file) {
  std::string text;
  MIH_CHECK_CODE(read_file(file, &text), Code::kFailedPrecondition, "cannot read ", file.string());
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    MIH_THROW(Code::kInvalidSpec, file.string(), " is not JSON: ", e.what());
  }
}

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
