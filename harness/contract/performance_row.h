// cases/runtime/performance_rank<r>.jsonl read typed (schemas/evidence/v1/cases.runtime.performance_rank.schema.json):
// what rank r did in each step, validated against the contract's schema once where the file is
// read, in the file's order (PipelineSchedule compares the ranks' files row by row).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace mih::contract {

struct PerformanceRow {
  int64_t step = 0;
  /// The pipeline actions the rank ran, in order; only when a pipeline schedule ran.
  std::optional<std::vector<std::string>> pipeline_order;
};

/// The lines of performance_rank<`rank`>.jsonl, in order. `file` names the file in a refusal.
/// Throws: mih::Error{kFailedPrecondition} naming the file, the line and step and the field for
///   a line the schema refuses.
std::vector<PerformanceRow> performance_rows(const std::vector<nlohmann::json>& lines, int rank, const std::string& file);

}  // namespace mih::contract
