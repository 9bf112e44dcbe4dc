// The one validation behind every typed evidence reader (metrics_row.h, structure_table.h,
// findings_file.h, ...): a JSON value or JSONL line against the compiled contract's schema of
// its file, refused with the file, the line and step, the field and the fix. A reader validates
// once here and reads the fields typed after; no reader fills a missing field with a default.
#pragma once

#include <string>

#include <nlohmann/json_fwd.hpp>

namespace mih::contract {

/// Validates `value` against the contract's schema of `relative` (the path a case directory
/// names it by: layout::kMetrics, layout::before_save(layout::kFindings), ...). `file` is the
/// path the refusal names; `line` the JSONL line (from 1), 0 for a JSON file.
/// Throws: mih::Error{kFailedPrecondition} "evidence file <file>, line 2 (step 1): field lr:
///   <what is wrong>; it is not mih's evidence or was edited: rerun the case, or fix the writer
///   that produced it (mih validate names every problem)"; kInvalidSpec if no entry of the
///   contract with a schema names `relative`.
void require_schema(const std::string& relative, const nlohmann::json& value, const std::string& file, int line = 0);

}  // namespace mih::contract
