// Reading one field of a strict record (case_request.cpp, case_record.cpp): a missing or
// mistyped field is an error naming the record and the field, never a default.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "harness/base/error.h"
#include "harness/base/json_fields.h"

namespace mih::internal {

/// Field `name` of record `j` as a T.
/// Throws: mih::Error{kInvalidSpec} "<what>: field 'x' is missing" or "<what>: field 'x' is
///   <value>: <why it is no T>".
template <class T>
T field(const nlohmann::json& j, const char* name, const std::string& what) {
  MIH_CHECK(j.contains(name), what, ": field '", name, "' is missing");
  try {
    return j.at(name).get<T>();
  } catch (const nlohmann::json::exception& e) {
    MIH_THROW(Code::kInvalidSpec, what, ": field '", name, "' is ", json_summary(j.at(name)), ": ", json_error_text(e));
  } catch (const Error& e) {
    MIH_THROW(Code::kInvalidSpec, what, ": field '", name, "': ", e.message());
  }
}

/// Whether `s` is a case fingerprint as mih writes it: 16 lowercase hex digits.
inline bool is_fingerprint(const std::string& s) {
  return s.size() == 16 && s.find_first_not_of("0123456789abcdef") == std::string::npos;
}

}  // namespace mih::internal
