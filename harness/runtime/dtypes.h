// The names mih writes dtypes under in evidence and accepts on command lines: PyTorch's
// Python names ("float32", "bfloat16", "int64"), the same on every libtorch version.
#pragma once

#include <string>
#include <string_view>

#include <c10/core/ScalarType.h>

#include "harness/base/parallel_config.h"

namespace mih {

/// Returns "float32", "float64", "bfloat16", "float16", "int64", "int32", "int16", "int8",
/// "uint8", "bool", "complex64", "complex128"; c10's own name for any other type.
std::string dtype_name(c10::ScalarType dtype);

/// Parses a name of dtype_name.
/// Throws: mih::Error{kInvalidSpec} listing the valid names.
c10::ScalarType parse_dtype(std::string_view name);

/// The c10 type of a case dtype (ParallelConfig::dtype).
c10::ScalarType scalar_type(DType dtype);
/// The dtype of a case's master weights, gradients, reductions and optimizer states: float32
/// for the mixed-precision lanes (bfloat16, float16), else the case dtype itself.
c10::ScalarType master_dtype(DType dtype);
/// Whether the case computes its forward under autocast (bfloat16, float16: their
/// scalar_type is the autocast dtype).
bool autocast_lane(DType dtype);
/// The case dtype of `type`. Throws: mih::Error{kInvalidSpec} for a type that is not a
///   floating case dtype (float32, float64, bfloat16, float16).
DType case_dtype(c10::ScalarType type);

}  // namespace mih
