// metrics_rows (see metrics_row.h).
#include "harness/contract/metrics_row.h"

#include <cmath>

#include <nlohmann/json.hpp>

#include "harness/base/error.h"
#include "harness/contract/evidence_layout.h"
#include "harness/contract/row_schema.h"
#include "harness/contract/step_rows.h"

namespace mih::contract {
namespace {

using nlohmann::json;

// A number the schema allows as null (not finite when written): NaN.
double number_or_nan(const json& v) { return v.is_number() ? v.get<double>() : NAN; }

template <typename T>
std::optional<T> optional_field(const json& row, const char* key) {
  if (!row.contains(key)) return std::nullopt;
  return row[key].get<T>();
}

// A line the schema accepted, typed.
MetricsRow typed(const json& row) {
  MetricsRow m;
  m.step = row["step"].get<int64_t>();
  m.loss = number_or_nan(row["loss"]);
  m.grad_norm_pre_clip = number_or_nan(row["grad_norm_pre_clip"]);
  m.grad_norm_post_clip = number_or_nan(row["grad_norm_post_clip"]);
  m.lr = row["lr"].get<double>();
  m.input_hash = row["input_hash"].get<std::string>();
  m.comm_bytes = optional_field<AxisBytes>(row, "comm_bytes");
  m.comm_sites = optional_field<SiteBytes>(row, "comm_sites");
  m.comm_expected = optional_field<SiteBytes>(row, "comm_expected");
  m.fsdp_gather_forwards = optional_field<AxisBytes>(row, "fsdp_gather_forwards");
  if (row.contains("pipeline")) {
    const json& p = row["pipeline"];
    m.pipeline = PipelineRecord{p["order"].get<std::vector<std::string>>(),
                                p["message_shape"].get<std::vector<int64_t>>(), p["message_dtype"].get<std::string>()};
  }
  return m;
}

}  // namespace

double MetricsRow::metric(const std::string& name) const {
  if (name == "loss") return loss;
  if (name == "grad_norm_pre_clip") return grad_norm_pre_clip;
  if (name == "grad_norm_post_clip") return grad_norm_post_clip;
  if (name == "lr") return lr;
  MIH_THROW(Code::kInternal, "MetricsRow has no metric '", name, "'; valid: loss, grad_norm_pre_clip, grad_norm_post_clip, lr");
}

std::map<int64_t, MetricsRow> metrics_rows(const std::vector<json>& lines, const std::string& file) {
  for (size_t i = 0; i < lines.size(); ++i) require_schema(layout::kMetrics, lines[i], file, static_cast<int>(i + 1));
  std::map<int64_t, MetricsRow> out;
  for (const auto& [step, row] : rows_by_step(lines, file)) out.emplace(step, typed(row));
  return out;
}

}  // namespace mih::contract
