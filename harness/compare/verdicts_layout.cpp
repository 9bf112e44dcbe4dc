// The verdicts of the parameter table and the optimizer's layout from the evidence files
// (verdicts.h): Structure's local shapes and dtypes, OptimizerLayout's groups, decay and state
// shapes. They judge mih's cases and another writer's through the same rules.
#include <algorithm>
#include <map>
#include <cstdio>
#include <set>

#include "harness/base/error.h"
#include "harness/compare/verdicts_internal.h"
#include "harness/contract/structure_table.h"

namespace mih::verdicts {
using nlohmann::json;

namespace {

std::vector<contract::ParameterRow> parameter_rows(const CaseEvidence& ev) {
  return contract::structure_parameters(ev.json(layout::kStructure), rel_path(ev, layout::kStructure));
}

std::string shape_str(const std::vector<int64_t>& shape) { return json(shape).dump(); }

// A failure listing the first problems (at most five) and the files to open.
Verdict failed(const std::vector<std::string>& problems, const std::string& files) {
  std::string msg = problems[0];
  for (size_t i = 1; i < std::min<size_t>(problems.size(), 5); ++i) msg += "\n  " + problems[i];
  if (problems.size() > 5) msg += "\n  and " + std::to_string(problems.size() - 5) + " more";
  return Verdict::fail(msg + "\n  (open " + files + ")");
}

// The degree of every mesh axis a placement may name, from config.resolved.json (edp: the
// experts' FSDP axis, dp_shard * cp / ep).
std::map<std::string, int64_t> axis_degrees(const ParallelConfig& c) {
  return {{"pp", c.pp}, {"dp_replicate", c.dp_replicate}, {"dp_shard", c.dp_shard}, {"cp", c.cp},
          {"tp", c.tp}, {"ep", c.ep}, {"edp", c.dp_shard * c.cp / std::max(1, c.ep)}};
}

// A placement string: "Replicate()" -> {-1, 1}; "Shard(d)" -> {d, 1}; "Shard(d, partitions=p)"
// -> {d, p}; anything else -> {-2, 0}.
std::pair<int64_t, int64_t> parse_placement(const std::string& s) {
  if (s == "Replicate()") return {-1, 1};
  long long dim = -1, parts = 1;
  int end = 0;
  if (std::sscanf(s.c_str(), "Shard(%lld)%n", &dim, &end) == 1 && end == static_cast<int>(s.size()) && dim >= 0) {
    return {dim, 1};
  }
  end = 0;
  if (std::sscanf(s.c_str(), "Shard(%lld, partitions=%lld)%n", &dim, &parts, &end) == 2 &&
      end == static_cast<int>(s.size()) && dim >= 0 && parts >= 1) {
    return {dim, parts};
  }
  return {-2, 0};
}

// The FSDP axes come last: mih's order (and FSDP2 over TP's): the tp/ep piece, then its rows.
bool fsdp_axis(const std::string& axis) { return axis == "dp_shard" || axis == "edp"; }

}  // namespace

std::string expected_rank0_shape(const std::vector<int64_t>& global_shape,
                                 const std::map<std::string, std::string>& placements,
                                 const std::map<std::string, int64_t>& degrees, std::vector<int64_t>* shape) {
  *shape = global_shape;
  std::vector<std::string> order;
  for (const auto& [axis, p] : placements) {
    if (!fsdp_axis(axis)) order.push_back(axis);
  }
  for (const auto& [axis, p] : placements) {
    if (fsdp_axis(axis)) order.push_back(axis);
  }
  for (const std::string& axis : order) {
    const std::string& text = placements.at(axis);
    const auto [dim, parts] = parse_placement(text);
    if (dim == -1) continue;
    if (dim == -2) return "placement '" + text + "' on axis '" + axis + "' is none of Replicate(), Shard(<dim>), Shard(<dim>, partitions=<n>)";
    const auto degree = degrees.find(axis);
    if (degree == degrees.end()) return "axis '" + axis + "' is no mesh axis (pp, dp_replicate, dp_shard, cp, tp, ep, edp)";
    if (dim >= static_cast<int64_t>(shape->size())) {
      return "'" + text + "' on axis '" + axis + "' shards dim " + std::to_string(dim) + " of a " +
             std::to_string(shape->size()) + "-dim tensor";
    }
    int64_t& n = (*shape)[dim];
    if (n % parts != 0) return "dim " + std::to_string(dim) + " (" + std::to_string(n) + ") does not cut into " + text;
    // torch.chunk (and mih's shard_range, harness/parallel/placement.h): every chunk but the last
    // holds ceil(piece / degree) elements; rank 0 holds the first.
    const int64_t piece = n / parts;
    n = parts * ((piece + degree->second - 1) / std::max<int64_t>(1, degree->second));
  }
  return "";
}

std::string structure_examinable(const CaseEvidence& ev) {
  for (const auto& row : parameter_rows(ev)) {
    if (row.global_shape) return "";
  }
  return "no row of " + std::string(layout::kStructure) + " records its global_shape";
}

Verdict local_shapes_match_placements(const CaseEvidence& ev) {
  const std::map<std::string, int64_t> degrees = axis_degrees(ev.config());
  const std::vector<contract::ParameterRow> rows = parameter_rows(ev);
  std::vector<std::string> problems;
  int64_t sharded = 0;
  for (const auto& row : rows) {
    if (!row.global_shape) {
      problems.push_back("'" + row.fqn + "' records no global_shape: its local shape " + shape_str(row.local_shape) +
                         " cannot be judged against its placements");
      continue;
    }
    std::vector<int64_t> expected;
    const std::string why = expected_rank0_shape(*row.global_shape, row.placements, degrees, &expected);
    if (!why.empty()) {
      problems.push_back("'" + row.fqn + "': " + why);
    } else if (expected != row.local_shape) {
      problems.push_back("'" + row.fqn + "' holds local shape " + shape_str(row.local_shape) + " on rank 0, but " +
                         short_json(row.placements) + " cut " + shape_str(*row.global_shape) + " into " +
                         shape_str(expected) + " (the tp/ep piece first, then the FSDP rows; torch.chunk)");
    }
    sharded += expected != *row.global_shape ? 1 : 0;
  }
  if (!problems.empty()) {
    return failed(problems, rel_path(ev, layout::kStructure) + " and " + rel_path(ev, layout::kConfigResolved));
  }
  return Verdict::pass("examined the local shapes of " + std::to_string(rows.size()) + " parameters (" +
                       std::to_string(sharded) + " sharded) against their placements");
}

std::string master_dtype_name(const std::string& lane) {
  return lane == "bfloat16" || lane == "float16" ? "float32" : lane;
}

Verdict dtypes_as_configured(const CaseEvidence& ev) {
  const std::string lane = dtype_name(ev.config().dtype), master = master_dtype_name(lane);
  const std::vector<contract::ParameterRow> rows = parameter_rows(ev);
  std::vector<std::string> problems;
  std::set<std::string> devices;
  int64_t without_device = 0;
  for (const auto& row : rows) {
    if (row.dtype != master) {
      problems.push_back("'" + row.fqn + "' is " + row.dtype + ", the " + lane + " lane's parameters are " + master +
                         (master != lane ? " (master weights under autocast)" : ""));
    }
    if (row.device) devices.insert(*row.device);
    without_device += row.device ? 0 : 1;
  }
  if (devices.size() > 1) problems.push_back("the parameters are on " + short_json(devices) + ", one device expected");
  if (!problems.empty()) {
    return failed(problems, rel_path(ev, layout::kStructure) + " and " + rel_path(ev, layout::kConfigResolved));
  }
  return Verdict::pass("examined " + std::to_string(rows.size()) + " parameters: all " + master + " (the " + lane +
                       " lane)" + (devices.empty() ? std::string(", no row records its device")
                                                   : ", on " + *devices.begin() +
                                                         (without_device ? " (" + std::to_string(without_device) +
                                                                               " rows record no device)"
                                                                         : std::string())));
}

}  // namespace mih::verdicts
