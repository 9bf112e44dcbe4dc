// Strict JSON objects for options and specs: an unknown field (a typo) is an error that lists
// the valid ones, never silently ignored; the one reader of a whole JSON file; and the bounds
// every reader of JSON from outside (checkpoints, matrices, evidence) applies: nesting depth
// on parsing, length when a value is printed in a message.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <memory>
#include <limits>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/base/error.h"
#include "harness/base/files.h"
#include "harness/base/strings.h"

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

/// Deepest nesting of arrays and objects mih reads from outside: serde_json's recursion limit
/// (the parser of the safetensors library). nlohmann's parser is iterative, but copying,
/// comparing and dumping a value recurse once per level, so a value 100000 levels deep would
/// overflow the stack; no file mih reads nests more than about 10 levels.
inline constexpr int kMaxJsonDepth = 128;

/// True when the arrays and objects of `text` nest at most `max_depth` levels (brackets
/// inside strings do not count). One linear pass with no recursion; stops at the first level
/// too deep. Text that is not JSON may pass (the parser then says what is wrong).
bool json_depth_within(std::string_view text, int max_depth = kMaxJsonDepth);

/// The message of a nlohmann exception without the excerpt of the input it quotes ("; last
/// read: '...'"): the bytes of a file that failed to parse are never echoed.
std::string json_error_text(const std::exception& e);

/// Parses `text` as one JSON value, nested at most kMaxJsonDepth levels (json_depth_within).
/// Returns false, *out untouched, and sets *problem (nlohmann's message without the input
/// excerpt, or "arrays and objects nested deeper than 128 levels") when it is not JSON or
/// nests deeper. Every reader of JSON that mih did not just write in the same process parses
/// through here, parse_json_strict or parse_json_lenient.
bool parse_json_bounded(std::string_view text, nlohmann::json* out, std::string* problem);

/// parse_json_bounded for readers that treat a bad file as absent: the value, or a discarded
/// one (is_discarded()) when `text` is not JSON or nests deeper than kMaxJsonDepth.
nlohmann::json parse_json_lenient(std::string_view text);

/// A bounded rendering of `value` for a message: compact JSON as dump() writes it, strings
/// longer than 64 bytes cut, arrays and objects 4 levels down shown as [...] / {...}, and the
/// whole cut after about `max_chars` characters (then "..."). Linear in what it prints, however
/// large or deep the value.
std::string json_summary(const nlohmann::json& value, size_t max_chars = 160);

/// Parses `text` strictly: not JSON, an object repeating a key, or arrays and objects nested
/// deeper than kMaxJsonDepth is an error naming `where` (the file) and quoting none of it.
/// Throws: mih::Error{kInvalidSpec} "<where> is not JSON: ...", "<where> is not JSON mih
///   reads: arrays and objects nested deeper than 128 levels" or "<where>: the key 'x'
///   appears twice in one object".
inline nlohmann::json parse_json_strict(const std::string& text, const std::string& where) {
  MIH_CHECK(json_depth_within(text), where, " is not JSON mih reads: arrays and objects nested deeper than ",
            kMaxJsonDepth, " levels (no file mih reads nests that deep: is it the right file?)");
  try {
    return nlohmann::json::parse(text, json_detail::DuplicateKeyCheck(&where));
  } catch (const nlohmann::json::exception& e) {
    MIH_THROW(Code::kInvalidSpec, where, " is not JSON: ", json_error_text(e));
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
            json_summary(v));
  return x;
}

/// Field `field` of object `j` as a string (`fallback` when absent).
/// Throws: mih::Error{kInvalidSpec} "<where>: 'name' must be a string, got 3".
inline std::string json_string(const nlohmann::json& j, const std::string& field, const std::string& fallback,
                               const std::string& where) {
  if (!j.contains(field)) return fallback;
  MIH_CHECK(j.at(field).is_string(), where, ": '", field, "' must be a string, got ", json_summary(j.at(field)));
  return j.at(field).get<std::string>();
}

/// Field `field` of object `j` as a boolean (`fallback` when absent): 0, 1 or "true" are errors.
/// Throws: mih::Error{kInvalidSpec} "<where>: 'reference' must be true or false, got 1".
inline bool json_bool(const nlohmann::json& j, const std::string& field, bool fallback, const std::string& where) {
  if (!j.contains(field)) return fallback;
  MIH_CHECK(j.at(field).is_boolean(), where, ": '", field, "' must be true or false, got ", json_summary(j.at(field)));
  return j.at(field).get<bool>();
}

/// Throws: mih::Error{kInvalidSpec} "<what>: expected a JSON object, got ..." if `j` is not an
///   object, or "<what>: unknown field 'x'; valid: a, b, c" for a key not in `fields`.
inline void check_known_fields(const nlohmann::json& j, const std::string& what, const std::vector<std::string>& fields) {
  MIH_CHECK(j.is_object(), what, ": expected a JSON object, got ", json_summary(j));
  for (const auto& item : j.items()) {
    if (std::find(fields.begin(), fields.end(), item.key()) != fields.end()) continue;
    std::string valid = join(fields, ", ");
    MIH_THROW(Code::kInvalidSpec, what, ": unknown field '", item.key(), "'; valid: ", valid);
  }
}

}  // namespace mih
