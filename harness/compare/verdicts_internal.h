// What the verdicts' source files share (verdicts.cpp, verdicts_checks.cpp,
// verdicts_comm.cpp): how a message names a file, a JSON value and a number of the evidence.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "harness/compare/verdicts.h"

namespace mih::verdicts::internal {

using nlohmann::json;

inline std::string rel_path(const CaseEvidence& ev, const std::string& relative) { return (ev.dir() / relative).string(); }

inline std::string short_json(const json& j, size_t max = 300) {
  std::string s = j.dump();
  if (s.size() > max) s = s.substr(0, max) + "...";
  return s;
}

// A number of the evidence as %.3g; JSON has no NaN or infinity, so those were written as null.
inline std::string number(const json& v) {
  if (!v.is_number()) return "not finite";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", v.get<double>());
  return buf;
}

inline int64_t numel(const json& shape) {
  int64_t n = 1;
  for (const auto& d : shape) n *= d.get<int64_t>();
  return n;
}

inline int64_t element_size(const std::string& dtype) {
  if (dtype == "float64" || dtype == "int64") return 8;
  if (dtype == "bfloat16" || dtype == "float16") return 2;
  return 4;
}

}  // namespace mih::verdicts::internal

namespace mih::verdicts {
using internal::element_size;
using internal::number;
using internal::numel;
using internal::rel_path;
using internal::short_json;
}  // namespace mih::verdicts
