// Boxes, global indices and sharding-invariant statistics for TrainerSession
// (trainer_session_internal.h): the same quantities mih's probes record (harness/probes), for
// tensors described by a foreign trainer's placements instead of a ParallelContext.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "harness/base/error.h"
#include "harness/base/sha256.h"
#include "harness/parallel/activations.h"
#include "harness/session/trainer_session_internal.h"

namespace mih {

std::string AxisPlacement::str() const { return shard ? "Shard(" + std::to_string(dim) + ")" : "Replicate()"; }

namespace trainer_session_internal {

std::string Box::str() const {
  std::string s = "[";
  for (size_t d = 0; d < offset.size(); ++d) {
    s += (d ? ", " : "") + std::to_string(offset[d]) + ":" + std::to_string(offset[d] + length[d]);
  }
  return s + "]";
}

Box piece_box(const std::vector<int64_t>& global_shape, const std::vector<AxisPlacement>& placements,
              const std::map<std::string, AxisInfo>& axes, const std::string& what) {
  Box b;
  b.offset.assign(global_shape.size(), 0);
  b.length = global_shape;
  for (const AxisPlacement& p : placements) {
    if (!p.shard) continue;
    MIH_CHECK(p.dim >= 0 && p.dim < static_cast<int64_t>(global_shape.size()), what, ": Shard(", p.dim, ") over '",
              p.axis, "' names a dim of a tensor of ", global_shape.size(), " dims");
    const auto it = axes.find(p.axis);
    if (it == axes.end() || it->second.size == 1) continue;
    const int64_t n = b.length[static_cast<size_t>(p.dim)], k = it->second.size, r = it->second.rank;
    const int64_t chunk = (n + k - 1) / k;  // torch.chunk
    const int64_t start = std::min(r * chunk, n);
    b.offset[static_cast<size_t>(p.dim)] += start;
    b.length[static_cast<size_t>(p.dim)] = std::max<int64_t>(0, std::min(chunk, n - start));
  }
  return b;
}

bool counts_piece(const std::vector<AxisPlacement>& placements, const std::map<std::string, AxisInfo>& axes,
                  bool rows_distinct) {
  for (const auto& [name, axis] : axes) {
    if (axis.size == 1 || axis.rank == 0) continue;
    if (rows_distinct && axis.data) continue;
    const bool sharded = std::any_of(placements.begin(), placements.end(),
                                     [&](const AxisPlacement& p) { return p.axis == name && p.shard; });
    if (!sharded) return false;
  }
  return true;
}

at::Tensor global_index(const std::vector<int64_t>& global_shape, const Box& box) {
  const size_t dims = global_shape.size();
  at::Tensor index = at::zeros(box.length, at::kLong);
  int64_t stride = 1;
  for (size_t d = dims; d-- > 0;) {
    std::vector<int64_t> view(dims, 1);
    view[d] = box.length[d];
    index.add_(at::arange(box.offset[d], box.offset[d] + box.length[d], at::kLong).mul(stride).view(view));
    stride *= global_shape[d];
  }
  return index;
}

void Stats::add(const at::Tensor& piece, const at::Tensor& index) {
  const at::Tensor x = piece.detach().to(at::kCPU, at::kDouble).reshape(-1);
  const at::Tensor idx = index.reshape(-1);
  MIH_CHECK(x.numel() == idx.numel(), "statistics: a piece of ", x.numel(), " elements has ", idx.numel(), " indices");
  const at::Tensor finite = at::isfinite(x);
  const at::Tensor xf = at::where(finite, x, at::zeros_like(x));
  sum += xf.sum().item<double>();
  sum_sq += (xf * xf).sum().item<double>();
  nonfinite += static_cast<double>(x.numel() - finite.sum().item<int64_t>());
  numel += static_cast<double>(x.numel());
  for (int j = 0; j < kProjections; ++j) {
    sketch[static_cast<size_t>(j)] += (xf * projection_signs(idx, j)).sum().item<double>();
  }
  if (x.numel()) {
    max = std::max(max, x.max().item<double>());
    neg_min = std::max(neg_min, -x.min().item<double>());
  }
  if (total >= 0) {
    if (values.empty()) values.assign(static_cast<size_t>(total), 0.0);
    const double* v = x.data_ptr<double>();
    const int64_t* at = idx.contiguous().data_ptr<int64_t>();
    for (int64_t i = 0; i < x.numel(); ++i) {
      if (at[i] >= 0 && at[i] < total) values[static_cast<size_t>(at[i])] += v[i];
    }
  }
}

nlohmann::json finish_stats(WorldCollectives& world, std::vector<std::pair<std::string, Stats>>& stats, bool with_extrema) {
  constexpr int kLinear = 5 + kProjections;
  const int64_t n = static_cast<int64_t>(stats.size());
  at::Tensor linear = at::zeros({n, kLinear}, at::kDouble), extrema = at::zeros({n, 2}, at::kDouble);
  int64_t value_count = 0;
  for (auto& [name, s] : stats) value_count += s.total >= 0 ? s.total : 0;
  at::Tensor values = at::zeros({value_count}, at::kDouble);
  int64_t at_value = 0;
  for (int64_t i = 0; i < n; ++i) {
    Stats& s = stats[static_cast<size_t>(i)].second;
    double* row = linear[i].data_ptr<double>();
    row[0] = s.sum, row[1] = s.sum_sq, row[2] = s.nonfinite, row[3] = s.numel, row[4] = s.defined;
    for (int j = 0; j < kProjections; ++j) row[5 + j] = s.sketch[static_cast<size_t>(j)];
    extrema[i][0] = s.max;
    extrema[i][1] = s.neg_min;
    if (s.total >= 0) {
      s.values.resize(static_cast<size_t>(s.total), 0.0);
      std::copy(s.values.begin(), s.values.end(), values.data_ptr<double>() + at_value);
      at_value += s.total;
    }
  }
  linear = world.all_reduce(linear, ReduceOp::kSum, "mih.session.probes");
  if (with_extrema) extrema = world.all_reduce(extrema, ReduceOp::kMax, "mih.session.probes");
  if (value_count) values = world.all_reduce(values, ReduceOp::kSum, "mih.session.probes");
  nlohmann::json out = nlohmann::json::object();
  at_value = 0;
  for (int64_t i = 0; i < n; ++i) {
    const auto& [name, s] = stats[static_cast<size_t>(i)];
    const double* row = linear[i].data_ptr<double>();
    nlohmann::json t = {{"sum", row[0]}, {"sum_sq", row[1]}, {"nonfinite", static_cast<int64_t>(row[2])},
                        {"numel", static_cast<int64_t>(row[3])}};
    std::vector<double> sketch(row + 5, row + 5 + kProjections);
    t["sketch"] = sketch;
    if (with_extrema) {
      t["defined_ranks"] = static_cast<int64_t>(row[4]);
      if (row[3] > 0) {
        t["max"] = extrema[i][0].item<double>();
        t["min"] = -extrema[i][1].item<double>();
      }
    }
    if (s.total >= 0) {
      nlohmann::json v = nlohmann::json::array();
      const double* p = values.data_ptr<double>() + at_value;
      for (int64_t k = 0; k < s.total; ++k) v.push_back(std::isfinite(p[k]) ? nlohmann::json(p[k]) : nlohmann::json());
      if (row[2] == 0 && s.total > 0 && static_cast<int64_t>(row[3]) == s.total) t["values"] = std::move(v);
      at_value += s.total;
    }
    out[name] = std::move(t);
  }
  return out;
}

std::string tensor_sha256(const at::Tensor& t) {
  const at::Tensor c = t.detach().to(at::kCPU).contiguous();
  return sha256_hex(std::string_view(static_cast<const char*>(c.data_ptr()), c.numel() * c.element_size()));
}

}  // namespace trainer_session_internal
}  // namespace mih
