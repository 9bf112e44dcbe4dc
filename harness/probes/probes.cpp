// Tensor probes (see probes.h).
#include "harness/probes/probes.h"

#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <regex>

#include <ATen/ATen.h>
#include <torch/optim/adamw.h>

#ifdef MIH_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include "harness/findings/codes.h"
#include "harness/base/error.h"
#include "harness/base/sha256.h"
#include "harness/checks/checks.h"
#include "harness/compat/optim.h"
#include "harness/runtime/communicator.h"

namespace mih::probes {
namespace {

using nlohmann::json;

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// Row-major global indices of the elements of `box` in a tensor of `shape`.
at::Tensor global_indices(const Box& box, const std::vector<int64_t>& shape) {
  at::Tensor idx = at::zeros({}, at::kLong);
  int64_t stride = 1;
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    std::vector<int64_t> view(shape.size(), 1);
    view[static_cast<size_t>(d)] = box.lengths[static_cast<size_t>(d)];
    const int64_t off = box.global_offset[static_cast<size_t>(d)];
    idx = idx + at::arange(off, off + box.lengths[static_cast<size_t>(d)], at::kLong).mul(stride).view(view);
    stride *= shape[static_cast<size_t>(d)];
  }
  return idx.expand(box.lengths).reshape({-1});
}

// The global indices of a box and the ±1 signs of its k projections as one sign pattern per
// element (bit j set when projection j's sign is +1; k <= 8), memoized per thread: a rank's
// boxes do not change during a run, and the hash is the costly part of a probe. Keyed by the
// shape, the box and k. A probe then needs one weighted bincount of the piece over the 2^k
// patterns, from which the sum and the k projections follow: 9 bytes read per element
// instead of 8 (k + 1) for k dense projections.
struct BoxIndex {
  at::Tensor index;    // [numel] int64
  at::Tensor pattern;  // [numel] uint8
};

const BoxIndex& box_index(const Box& box, const std::vector<int64_t>& shape, int64_t k);

at::Tensor narrow_box(at::Tensor t, const Box& box) {
  for (size_t d = 0; d < box.lengths.size(); ++d) {
    t = t.narrow(static_cast<int64_t>(d), box.local_offset[d], box.lengths[d]);
  }
  return t;
}

// "layers.3.mlp.weight" -> "layers.*.mlp.weight".
std::string group_of(const ShardedParameter& p) {
  static const std::regex kIndex("\\.[0-9]+\\.");
  std::string name = std::regex_replace(p.fqn, kIndex, ".*.");
  for (const auto& [axis, placement] : p.placements()) name += " " + axis + "=" + placement.str();
  return name;
}

}  // namespace

std::vector<WatchEntry> build_watchlist(const ParallelContext& ctx, const WatchlistOptions& options) {
  int64_t total = 0;
  for (const auto& p : ctx.parameters()) total += numel_of(p->global_shape);
  std::vector<WatchEntry> out;
  std::set<std::string> groups;
  for (const auto& p : ctx.parameters()) {
    std::string reason;
    const std::string group = group_of(*p);
    if (total <= options.watch_all_up_to) {
      reason = "whole model (" + std::to_string(total) + " elements)";
    } else if (numel_of(p->global_shape) <= options.small_numel) {
      reason = "small";
    } else if (!groups.count(group)) {
      reason = "representative of " + group;
    }
    for (const auto& pattern : options.patterns) {
      if (reason.empty() && checks::glob_match(pattern, p->fqn)) reason = "pattern " + pattern;
    }
    groups.insert(group);
    if (!reason.empty()) out.push_back({p.get(), reason});
  }
  return out;
}

json to_json(const std::vector<WatchEntry>& watchlist) {
  json out = json::array();
  for (const auto& w : watchlist) {
    out.push_back({{"fqn", w.param->fqn}, {"reason", w.reason}, {"global_shape", w.param->global_shape}});
  }
  return out;
}

std::string stage_name(Stage stage) {
  switch (stage) {
    case Stage::kModelBefore: return "model_before";
    case Stage::kGradBeforeClip: return "grad_before_clip";
    case Stage::kGradAfterClip: return "grad_after_clip";
    case Stage::kAfterOptimizer: return "after_optimizer";
    case Stage::kOptimizerState: return "optimizer_state";
  }
  return "?";
}


namespace {

const BoxIndex& box_index(const Box& box, const std::vector<int64_t>& shape, int64_t k) {
  thread_local std::map<std::vector<int64_t>, BoxIndex> cache;
  std::vector<int64_t> key = shape;
  key.push_back(-k - 1);
  key.insert(key.end(), box.global_offset.begin(), box.global_offset.end());
  key.insert(key.end(), box.lengths.begin(), box.lengths.end());
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  if (cache.size() > 100000) cache.clear();
  BoxIndex b;
  b.index = global_indices(box, shape);
  MIH_INTERNAL_ASSERT(k <= 8, "probes: at most 8 projections, got ", k);
  at::Tensor pattern = at::zeros({b.index.numel()}, at::kLong);
  for (int64_t j = 0; j < k; ++j) pattern = pattern + projection_signs(b.index, j).gt(0).to(at::kLong) * (int64_t{1} << j);
  b.pattern = pattern.to(at::kByte).contiguous();
  return cache[key] = b;
}

}  // namespace

json probe_stage(ParallelContext& ctx, const std::vector<WatchEntry>& watchlist, Stage stage,
                 torch::optim::AdamW* optimizer, const WatchlistOptions& options) {
  struct Item {
    std::string name;
    const ShardedParameter* param;
    at::Tensor piece;  // laid out like param->local; undefined if this rank has none
  };
  std::vector<Item> items;
  for (const auto& w : watchlist) {
    const ShardedParameter& p = *w.param;
    switch (stage) {
      case Stage::kModelBefore:
      case Stage::kAfterOptimizer: items.push_back({p.fqn, &p, p.local.detach()}); break;
      case Stage::kGradBeforeClip:
      case Stage::kGradAfterClip: items.push_back({p.fqn, &p, p.local.grad()}); break;
      case Stage::kOptimizerState:
        MIH_INTERNAL_ASSERT(optimizer != nullptr, "probe_stage(optimizer_state) without an optimizer");
        for (const char* m : {"exp_avg", "exp_avg_sq"}) {
          items.push_back({p.fqn + "/" + m, &p, compat::adamw_state(*optimizer, p.local, m)});
        }
        break;
    }
  }
  // This rank's contribution: per item sum, sum_sq, nonfinite, defined, k projections (SUM),
  // then the values of small tensors (SUM; each element is written by one rank), and max,
  // -min (MAX). Per box a handful of reductions over a view of the piece, and the cached
  // projection signs: no temporary the size of the model (large fresh allocations cost more
  // in page faults here than the arithmetic).
  const int64_t k = options.projections, n_items = static_cast<int64_t>(items.size());
  std::vector<int64_t> value_base(items.size(), -1);
  int64_t values_len = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const int64_t n = numel_of(items[i].param->global_shape);
    if (n <= options.values_up_to) {
      value_base[i] = values_len;
      values_len += n;
    }
  }
  const int64_t width = 4 + k;
  std::vector<double> sums(static_cast<size_t>(n_items * width + values_len), 0.0);
  std::vector<double> extremes(2 * items.size(), -std::numeric_limits<double>::infinity());
  for (size_t i = 0; i < items.size(); ++i) {
    const Item& it = items[i];
    double* row = sums.data() + static_cast<int64_t>(i) * width;
    if (!it.piece.defined()) continue;
    row[3] = 1;
    if (!ctx.writes_piece(*it.param)) continue;
    for (const Box& box : ctx.local_boxes(*it.param)) {
      if (box.numel() == 0) continue;
      const BoxIndex& bi = box_index(box, it.param->global_shape, k);
      // Into a float64 scratch buffer this thread reuses: a fresh allocation the size of the
      // piece on every probe costs more in page faults than the statistics themselves.
      thread_local at::Tensor scratch;
      const int64_t n = box.numel();
      if (!scratch.defined() || scratch.numel() < n) scratch = at::empty({std::max<int64_t>(n, 1 << 16)}, at::kDouble);
      const at::Tensor raw = scratch.narrow(0, 0, n);
      raw.copy_(narrow_box(it.piece.detach(), box).reshape({-1}));
      at::Tensor x = raw;
      double sum = x.sum().item<double>();
      if (!std::isfinite(sum)) {  // rare: count and zero the non-finite elements
        const at::Tensor finite = at::isfinite(x);
        row[2] += static_cast<double>(x.numel() - finite.sum().item<int64_t>());
        x = at::where(finite, x, at::zeros_like(x));
        sum = x.sum().item<double>();
      }
      row[0] += sum;
      row[1] += at::dot(x, x).item<double>();
      if (k > 0) {
        // Per sign pattern g the sum of its elements: projection j = sum over g of ±S_g.
        const at::Tensor by_pattern = at::bincount(bi.pattern, x, int64_t{1} << k).contiguous();
        const double* sg = by_pattern.data_ptr<double>();
        for (int64_t j = 0; j < k; ++j) {
          double projected = 0;
          for (int64_t g = 0; g < (int64_t{1} << k); ++g) projected += (g >> j) & 1 ? sg[g] : -sg[g];
          row[4 + j] += projected;
        }
      }
      const auto [lo, hi] = at::aminmax(x);
      extremes[2 * i] = std::max(extremes[2 * i], hi.item<double>());
      extremes[2 * i + 1] = std::max(extremes[2 * i + 1], -lo.item<double>());
      if (value_base[i] >= 0) {  // the values as they are, non-finite ones included
        const auto xa = raw.accessor<double, 1>();
        const auto ia = bi.index.accessor<int64_t, 1>();
        double* values = sums.data() + n_items * width + value_base[i];
        for (int64_t e = 0; e < raw.numel(); ++e) values[ia[e]] = xa[e];
      }
    }
  }
  Communicator& world = ctx.mesh().comm(MeshAxis::kWorld);
  at::Tensor s = at::from_blob(sums.data(), {static_cast<int64_t>(sums.size())}, at::kDouble)
                     .to(ctx.device(), /*non_blocking=*/false, /*copy=*/true);
  at::Tensor m = at::from_blob(extremes.data(), {static_cast<int64_t>(extremes.size())}, at::kDouble)
                     .to(ctx.device(), /*non_blocking=*/false, /*copy=*/true);
  world.all_reduce(s, ReduceOp::kSum, "mih.session.probes");
  world.all_reduce(m, ReduceOp::kMax, "mih.session.probes");
  const at::Tensor st = s.cpu().narrow(0, 0, n_items * width).reshape({n_items, width}).contiguous();
  const at::Tensor vals = s.cpu().narrow(0, n_items * width, values_len).contiguous();
  const at::Tensor ex = m.cpu().reshape({n_items, 2}).contiguous();
  const auto sa = st.accessor<double, 2>();
  const auto ea = ex.accessor<double, 2>();
  json tensors = json::object();
  for (size_t i = 0; i < items.size(); ++i) {
    const auto r = static_cast<int64_t>(i);
    const int64_t n = numel_of(items[i].param->global_shape);
    json t = {{"sum", sa[r][0]},
              {"sum_sq", sa[r][1]},
              {"nonfinite", static_cast<int64_t>(sa[r][2])},
              {"defined_ranks", static_cast<int64_t>(sa[r][3])},
              {"max", ea[r][0]},
              {"min", -ea[r][1]},
              {"numel", n}};
    std::vector<double> sketch(static_cast<size_t>(k));
    for (int64_t j = 0; j < k; ++j) sketch[static_cast<size_t>(j)] = sa[r][4 + j];
    t["sketch"] = sketch;
    if (value_base[i] >= 0) {
      const double* v = vals.data_ptr<double>() + value_base[i];
      t["values"] = std::vector<double>(v, v + n);
    }
    tensors[items[i].name] = t;
  }
  return {{"stage", stage_name(stage)}, {"tensors", tensors}};
}

FindingReport check_replica_consistency(ParallelContext& ctx, int64_t step, json* evidence) {
  json mine = json::object();
  for (const auto& p : ctx.parameters()) {
    json boxes = json::array();
    for (const Box& b : ctx.local_boxes(*p)) boxes.push_back({b.global_offset, b.lengths});
    // A piece no other rank holds has nothing to be compared with: not hashed.
    std::string digest = "unreplicated";
    if (p->replicas() > 1) {
      const at::Tensor bytes = p->local.detach().to(at::kCPU).contiguous();
      digest = Sha256().update(bytes.data_ptr(), static_cast<size_t>(bytes.numel()) * bytes.element_size()).hex_digest();
    }
    mine[p->fqn] = {sha256_hex(boxes.dump()), digest};
  }
  const std::vector<json> all =
      all_gather_json(ctx.mesh().comm(MeshAxis::kWorld), mine, ctx.device(), "mih.session.replicas");
  FindingReport report;
  json checked = json::object();
  int64_t replicated_pieces = 0;
  for (const auto& p : ctx.parameters()) {
    // piece id -> digest -> ranks
    std::map<std::string, std::map<std::string, std::vector<int>>> pieces;
    for (size_t r = 0; r < all.size(); ++r) {
      const json& e = all[r].at(p->fqn);
      pieces[e[0].get<std::string>()][e[1].get<std::string>()].push_back(static_cast<int>(r));
    }
    int replicas_compared = 0;
    for (const auto& [piece, by_digest] : pieces) {
      replicas_compared += static_cast<int>(by_digest.size() > 0);
      size_t holders = 0;
      for (const auto& [digest, ranks] : by_digest) holders += ranks.size();
      replicated_pieces += holders > 1;
      if (by_digest.size() < 2) continue;
      json groups = json::array();
      for (const auto& [digest, ranks] : by_digest) groups.push_back({{"ranks", ranks}, {"sha256", digest}});
      report.add({codes::kProbeReplicas, "runtime", p->fqn, Severity::kError,
                  "replicas of '" + p->fqn + "' differ after the optimizer at step " + std::to_string(step) + ": " +
                      std::to_string(by_digest.size()) + " different values among ranks holding the same piece",
                  {{"step", step}, {"groups", groups}},
                  "ranks that must hold one value train apart: a gradient that is partial over some axis was never "
                  "reduced",
                  "all-reduce the gradient over every axis the parameter is replicated on (e.g. tp for a norm weight "
                  "under sequence parallelism)"});
    }
    checked[p->fqn] = {{"pieces", pieces.size()}, {"replicas", p->replicas()}};
  }
  report.ran(codes::kCheckReplicas, replicated_pieces, "parameter pieces held by more than one rank");
  if (evidence) *evidence = {{"step", step}, {"parameters", checked}};
  return report;
}

int64_t peak_memory_bytes(c10::Device device) {
#ifdef MIH_WITH_CUDA
  if (device.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    return stats.allocated_bytes[0].peak;  // StatType::AGGREGATE
  }
#else
  (void)device;
#endif
  struct rusage usage {};
  ::getrusage(RUSAGE_SELF, &usage);
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;  // Linux reports kilobytes
}

}  // namespace mih::probes
