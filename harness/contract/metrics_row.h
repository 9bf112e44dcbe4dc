// cases/runtime/metrics.jsonl read typed (schemas/evidence/v1/cases.runtime.metrics.schema.json):
// one MetricsRow per step, validated against the contract's schema once where the file is read,
// indexed by step with the one refusal of two rows for one step (step_rows.h). A field the
// schema requires is a plain member; an optional one (a writer that does not record it: the
// own-trainer session writes no comm_expected, fsdp_gather_forwards or pipeline) is a
// std::optional, and its reader says what its absence means.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace mih::contract {

/// Bytes per mesh axis (comm_bytes) or per axis and call site (comm_sites, comm_expected).
using AxisBytes = std::map<std::string, int64_t>;
using SiteBytes = std::map<std::string, std::map<std::string, int64_t>>;

/// metrics "pipeline": what rank 0's pipeline schedule ran and the shape of what it moved.
struct PipelineRecord {
  std::vector<std::string> order;      ///< pp::Action texts ("F0.1", "B1.0") in the order run
  std::vector<int64_t> message_shape;  ///< of the first message moved; empty when none moved
  std::string message_dtype;
};

/// One line of metrics.jsonl: the metrics of one step as rank 0 saw them.
struct MetricsRow {
  int64_t step = 0;
  /// Non-finite values are written as null (JSON has no NaN) and read as NaN.
  double loss = 0, grad_norm_pre_clip = 0, grad_norm_post_clip = 0;
  double lr = 0;
  std::string input_hash;  ///< SHA-256 of the step's global batch
  std::optional<AxisBytes> comm_bytes;
  std::optional<SiteBytes> comm_sites, comm_expected;
  /// Per FSDP parameter, the forwards of the step that gathered it.
  std::optional<AxisBytes> fsdp_gather_forwards;
  std::optional<PipelineRecord> pipeline;  ///< only when a pipeline schedule ran
  /// The metric named `name` ("loss", "grad_norm_pre_clip", "grad_norm_post_clip", "lr").
  /// Throws: mih::Error{kInternal} for another name.
  double metric(const std::string& name) const;
};

/// The lines of metrics.jsonl (as an evidence store read them) by step. `file` names the file
/// in a refusal (the case directory's path of it).
/// Throws: mih::Error{kFailedPrecondition} naming the file, the line and step and the field for
///   a line the schema refuses (a missing or mistyped field), and for two rows of one step.
std::map<int64_t, MetricsRow> metrics_rows(const std::vector<nlohmann::json>& lines, const std::string& file);

}  // namespace mih::contract
