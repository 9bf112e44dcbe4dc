// dtype_name / parse_dtype.
#include "harness/runtime/dtypes.h"

#include <array>
#include <utility>

#include "harness/base/error.h"
#include "harness/base/strings.h"

namespace mih {
namespace {

constexpr std::array<std::pair<std::string_view, c10::ScalarType>, 12> kDtypes = {{
    {"float32", c10::ScalarType::Float},
    {"float64", c10::ScalarType::Double},
    {"bfloat16", c10::ScalarType::BFloat16},
    {"float16", c10::ScalarType::Half},
    {"int64", c10::ScalarType::Long},
    {"int32", c10::ScalarType::Int},
    {"int16", c10::ScalarType::Short},
    {"int8", c10::ScalarType::Char},
    {"uint8", c10::ScalarType::Byte},
    {"bool", c10::ScalarType::Bool},
    {"complex64", c10::ScalarType::ComplexFloat},
    {"complex128", c10::ScalarType::ComplexDouble},
}};

}  // namespace

std::string dtype_name(c10::ScalarType dtype) {
  for (const auto& [name, type] : kDtypes) {
    if (type == dtype) return std::string(name);
  }
  return c10::toString(dtype);
}

c10::ScalarType parse_dtype(std::string_view name) {
  for (const auto& [n, type] : kDtypes) {
    if (n == name) return type;
  }
  MIH_THROW(Code::kInvalidSpec, "unknown dtype '", name, "'; valid: [",
            join(kDtypes, ", ", [](const auto& row) { return std::string(row.first); }), "]");
}

c10::ScalarType scalar_type(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return c10::ScalarType::Float;
    case DType::kFloat64: return c10::ScalarType::Double;
    case DType::kBFloat16: return c10::ScalarType::BFloat16;
    case DType::kFloat16: return c10::ScalarType::Half;
  }
  return c10::ScalarType::Float;
}

c10::ScalarType master_dtype(DType dtype) {
  return autocast_lane(dtype) ? c10::ScalarType::Float : scalar_type(dtype);
}

bool autocast_lane(DType dtype) { return dtype == DType::kBFloat16 || dtype == DType::kFloat16; }

DType case_dtype(c10::ScalarType type) { return parse_dtype_name(dtype_name(type)); }

}  // namespace mih
