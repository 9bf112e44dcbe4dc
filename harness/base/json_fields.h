// Strict JSON objects for options and specs: an unknown field (a typo) is an error that lists
// the valid ones, never silently ignored; and the one reader of a whole JSON file.
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/base/error.h"
#include "harness/base/files.h"

namespace mih {

namespace json_detail {
// Rejects a repeated key in any object: nlohmann keeps the last one silently.
class DuplicateKeyCheck {
 public:
  explicit DuplicateKeyCheck(const std::string* where) : where_(where) {}
  bool operator()(int /*depth*/, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    using Event = nlohmann::json::parse_event_t;
    if (event == Event::object_start) {
      keys_->emplace_back();
    } else if (event == Event::object_end) {
      if (!keys_->empty()) keys_->pop_back();
    } else if (event == Event::key && !keys_->empty()) {
      const auto& key = parsed.get_ref<const std::string&>();
      MIH_CHECK(keys_->back().insert(key).second, *where_, ": the key '", key,
                "' appears twice in one object; give each field once");
    }
    return true;
  }

 private:
  const std::string* where_;
  std::shared_ptr<std::vector<std::set<std::string>>> keys_ = std::make_shared<std::vector<std::set<std::string>>>();
};
}  // namespace json_detail

/// Parses `text` strictly: not JSON, or an object repeating a key, is an error naming `where`
/// (the file).
/// Throws: mih::Error{kInvalidSpec} "<where> is not JSON: ..." or "<where>: the key 'x'
///   appears twice in one object".
inline nlohmann::json parse_json_strict(const std::string& text, const std::string& where) {
  try {
    return nlohmann::json::parse(text, json_detail::DuplicateKeyCheck(&where));
  } catch (const nlohmann::json::exception& e) {
    MIH_THROW(Code::kInvalidSpec, where, " is not JSON: ", e.what());
  }
}

/// The JSON of `file`, parsed strictly (parse_json_strict).
/// Throws: mih::Error{kFailedPrecondition} naming the file when it does not exist or cannot
///   be read; kInvalidSpec naming it when it is not JSON or repeats a key.
inline nlohmann::json read_json_file(const std::filesystem::path& file) {
  std::string text;
  std::error_code ec;
  MIH_CHECK_CODE(!std::filesystem::is_directory(file, ec), Code::kFailedPrecondition, file.string(),
                 " is a directory, not a JSON file");
  MIH_CHECK_CODE(read_file(file, &text), Code::kFailedPrecondition, "cannot read ", file.string(),
                 std::filesystem::exists(file, ec) ? "" : ": no such file");
  return parse_json_strict(text, file.string());
}

/// Field `field` of object `j` as an integer in [min, max] (`fallback` when absent): a float
/// (2.5), a boolean, a string or a value out of range is an error, never a conversion.
/// Throws: mih::Error{kInvalidSpec} "<where>: 'steps' must be an integer in [1, ...], got ...".
inline int64_t json_int(const nlohmann::json& j, const std::string& field, int64_t fallback, const std::string& where,
                        int64_t min = std::numeric_limits<int64_t>::min(),
                        int64_t max = std::numeric_limits<int64_t>::max()) {
  if (!j.contains(field)) return fallback;
  const nlohmann::json& v = j.at(field);
  const bool integer = v.is_number_integer() && (v.is_number_unsigned() ? v.get<uint64_t>() <= static_cast<uint64_t>(max)
                                                                         : true);
  const int64_t x = integer ? (v.is_number_unsigned() ? static_cast<int64_t>(v.get<uint64_t>()) : v.get<int64_t>()) : 0;
  MIH_CHECK(integer && x >= min && x <= max, where, ": '", field, "' must be an integer in [", min, ", ", max, "], got ",
            v.dump());
  return x;
}

/// Field `field` of object `j` as a string (`fallback` when absent).
/// Throws: mih::Error{kInvalidSpec} "<where>: 'name' must be a string, got 3".
inline std::string json_string(const nlohmann::json& j, const std::string& field, const std::string& fallback,
                               const std::string& where) {
  if (!j.contains(field)) return fallback;
  MIH_CHECK(j.at(field).is_string(), where, ": '", field, "' must be a string, got ", j.at(field).dump());
  return j.at(field).get<std::string>();
}

/// Field `field` of object `j` as a boolean (`fallback` when absent): 0, 1 or "true" are errors.
/// Throws: mih::Error{kInvalidSpec} "<where>: 'reference' must be true or false, got 1".
inline bool json_bool(const nlohmann::json& j, const std::string& field, bool fallback, const std::string& where) {
  if (!j.contains(field)) return fallback;
  MIH_CHECK(j.at(field).is_boolean(), where, ": '", field, "' must be true or false, got ", j.at(field).dump());
  return j.at(field).get<bool>();
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
