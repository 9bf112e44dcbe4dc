// Tensor probes (see probes.h).
#include "harness/probes/probes.h"

#include <sys/resource.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <regex>

#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>

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
    // A parameter tied across pipeline stages is watched on its first stage; its other copies
    // are held to that one by the replica check.
    if (!p->pp_counted) continue;
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

// The statistics of one box in one pass over its n elements: sum, sum of squares, the
// count of non-finite elements (which count as 0 in everything else: a NaN must not hide the
// rest), min, max, and per sign pattern (k projections, k <= 8) the sum of its elements. In
// blocks of 4096 with four partial sums each, added in a fixed order: the same numbers on every
// machine, and no more rounding than a pairwise sum at these sizes.
struct PieceSums {
  double sum = 0, sum_sq = 0, lo = std::numeric_limits<double>::infinity(), hi = -std::numeric_limits<double>::infinity();
  int64_t nonfinite = 0;
  std::array<double, 256> by_pattern{};
};

// One block [b0, b1) into `out` (block_patterns zeroed on entry), with four independent
// lanes per statistic so no add or min waits on the one before. `checked` tests every element
// for being finite (non-finite ones count as 0); unchecked is the fast path, valid when the
// block turns out finite.
template <bool checked, typename T>
void block_sums(const T* x, const uint8_t* pattern, int64_t b0, int64_t b1, bool with_patterns, double* s, double* q,
                double* lo, double* hi, int64_t* nonfinite, double* block_patterns) {
  for (int u = 0; u < 4; ++u) {
    s[u] = q[u] = 0;
    lo[u] = std::numeric_limits<double>::infinity();
    hi[u] = -std::numeric_limits<double>::infinity();
  }
  auto one = [&](int u, int64_t e) {
    double v = static_cast<double>(x[e]);
    if constexpr (checked) {
      if (!std::isfinite(v)) {
        ++*nonfinite;
        v = 0;
      }
    }
    s[u] += v;
    q[u] += v * v;
    lo[u] = std::min(lo[u], v);
    hi[u] = std::max(hi[u], v);
    if (with_patterns) block_patterns[pattern[e]] += v;
  };
  int64_t e = b0;
  for (; e + 4 <= b1; e += 4) {
    one(0, e);
    one(1, e + 1);
    one(2, e + 2);
    one(3, e + 3);
  }
  for (; e < b1; ++e) one(0, e);
}

template <typename T>
PieceSums piece_sums(const T* x, const uint8_t* pattern, int64_t n, int64_t k) {
  PieceSums out;
  std::array<double, 256> block_patterns{};
  const size_t patterns = size_t{1} << k;
  constexpr int64_t kBlock = 4096;
  for (int64_t b0 = 0; b0 < n; b0 += kBlock) {
    const int64_t b1 = std::min(n, b0 + kBlock);
    double s[4], q[4], lo[4], hi[4];
    int64_t nonfinite = 0;
    block_sums<false>(x, pattern, b0, b1, k > 0, s, q, lo, hi, &nonfinite, block_patterns.data());
    double sum = (s[0] + s[1]) + (s[2] + s[3]), sum_sq = (q[0] + q[1]) + (q[2] + q[3]);
    if (!std::isfinite(sum) || !std::isfinite(sum_sq)) [[unlikely]] {
      // A NaN or an infinity (or squares past 1e308): again, element by element.
      std::fill(block_patterns.begin(), block_patterns.begin() + static_cast<int64_t>(patterns), 0.0);
      block_sums<true>(x, pattern, b0, b1, k > 0, s, q, lo, hi, &nonfinite, block_patterns.data());
      sum = (s[0] + s[1]) + (s[2] + s[3]);
      sum_sq = (q[0] + q[1]) + (q[2] + q[3]);
    }
    out.sum += sum;
    out.sum_sq += sum_sq;
    out.nonfinite += nonfinite;
    for (int u = 0; u < 4; ++u) {
      out.lo = std::min(out.lo, lo[u]);
      out.hi = std::max(out.hi, hi[u]);
    }
    for (size_t g = 0; g < patterns; ++g) {
      out.by_pattern[g] += block_patterns[g];
      block_patterns[g] = 0;
    }
  }
  return out;
}

// One probed tensor: a parameter, its gradient or an optimizer state, laid out like param->local
// (undefined if this rank has none).
struct ProbeItem {
  std::string name;
  const ShardedParameter* param;
  at::Tensor piece;
};

std::vector<ProbeItem> stage_items(const std::vector<WatchEntry>& watchlist, Stage stage,
                                   torch::optim::Optimizer* optimizer) {
  std::vector<ProbeItem> items;
  for (const auto& w : watchlist) {
    const ShardedParameter& p = *w.param;
    switch (stage) {
      case Stage::kModelBefore:
      case Stage::kAfterOptimizer: items.push_back({p.fqn, &p, p.local.detach()}); break;
      case Stage::kGradBeforeClip:
      case Stage::kGradAfterClip: items.push_back({p.fqn, &p, p.local.grad()}); break;
      case Stage::kOptimizerState:
        MIH_INTERNAL_ASSERT(optimizer != nullptr, "probe_stage(optimizer_state) without an optimizer");
        for (const std::string& m : compat::state_names(*optimizer)) {
          items.push_back({p.fqn + "/" + m, &p, compat::optimizer_state(*optimizer, p.local, m)});
        }
        break;
    }
  }
  return items;
}

// This rank's contribution: per item sum, sum_sq, nonfinite, defined, k projections (SUM),
// then the values of small tensors (SUM; each element is written by one rank), and max, -min
// (MAX).
struct ProbeSums {
  int64_t k = 0, width = 0, n_items = 0, values_len = 0;
  std::vector<int64_t> value_base;  // per item: where its values start, -1 for none
  std::vector<double> sums, extremes;

  ProbeSums(const std::vector<ProbeItem>& items, const WatchlistOptions& options)
      : k(options.projections), width(4 + options.projections), n_items(static_cast<int64_t>(items.size())),
        value_base(items.size(), -1) {
    for (size_t i = 0; i < items.size(); ++i) {
      const int64_t n = numel_of(items[i].param->global_shape);
      if (n <= options.values_up_to) {
        value_base[i] = values_len;
        values_len += n;
      }
    }
    sums.assign(static_cast<size_t>(n_items * width + values_len), 0.0);
    extremes.assign(2 * items.size(), -std::numeric_limits<double>::infinity());
  }
};

// Item i's statistics over one box of its piece: a handful of reductions over a view of the
// piece and the cached projection signs, no temporary the size of the model (large fresh
// allocations cost more in page faults here than the arithmetic).
void add_box(const ProbeItem& it, const Box& box, size_t i, ProbeSums& b) {
  double* row = b.sums.data() + static_cast<int64_t>(i) * b.width;
  const int64_t k = b.k;
  const BoxIndex& bi = box_index(box, it.param->global_shape, k);
  const int64_t n = box.numel();
  const at::Tensor view = narrow_box(it.piece.detach(), box);
  // The piece's own memory when it is a contiguous float32/float64 CPU view (the usual case:
  // one pass, no copy); else a copy into a float64 scratch buffer this thread reuses (a fresh
  // allocation the size of the piece on every probe costs more in page faults than the
  // statistics).
  const bool direct = view.device().is_cpu() && view.is_contiguous() &&
                      (view.scalar_type() == at::kFloat || view.scalar_type() == at::kDouble);
  at::Tensor raw;
  if (!direct || b.value_base[i] >= 0) {
    thread_local at::Tensor scratch;
    if (!scratch.defined() || scratch.numel() < n) scratch = at::empty({std::max<int64_t>(n, 1 << 16)}, at::kDouble);
    raw = scratch.narrow(0, 0, n);
    raw.copy_(view.reshape({-1}));
  }
  const at::Tensor& x = direct ? view : raw;
  const PieceSums ps = x.scalar_type() == at::kFloat
                           ? piece_sums(x.data_ptr<float>(), bi.pattern.data_ptr<uint8_t>(), n, k)
                           : piece_sums(x.data_ptr<double>(), bi.pattern.data_ptr<uint8_t>(), n, k);
  row[0] += ps.sum;
  row[1] += ps.sum_sq;
  row[2] += static_cast<double>(ps.nonfinite);
  for (int64_t j = 0; j < k; ++j) {
    // Projection j = the sum over sign patterns g of ±(the sum of the elements of pattern g).
    double projected = 0;
    for (int64_t g = 0; g < (int64_t{1} << k); ++g) {
      projected += (g >> j) & 1 ? ps.by_pattern[static_cast<size_t>(g)] : -ps.by_pattern[static_cast<size_t>(g)];
    }
    row[4 + j] += projected;
  }
  b.extremes[2 * i] = std::max(b.extremes[2 * i], ps.hi);
  b.extremes[2 * i + 1] = std::max(b.extremes[2 * i + 1], -ps.lo);
  if (b.value_base[i] >= 0) {  // the values as they are, non-finite ones included
    const auto xa = raw.accessor<double, 1>();
    const auto ia = bi.index.accessor<int64_t, 1>();
    double* values = b.sums.data() + b.n_items * b.width + b.value_base[i];
    for (int64_t e = 0; e < raw.numel(); ++e) values[ia[e]] = xa[e];
  }
}

// The ranks' contributions summed over the ranks holding these parameters: per item its
// statistics record.
json reduced_records(ParallelContext& ctx, const std::vector<ProbeItem>& items, ProbeSums& b) {
  Communicator& holders = ctx.mesh().comm(MeshAxis::kStage);
  at::Tensor s = at::from_blob(b.sums.data(), {static_cast<int64_t>(b.sums.size())}, at::kDouble)
                     .to(ctx.device(), /*non_blocking=*/false, /*copy=*/true);
  at::Tensor m = at::from_blob(b.extremes.data(), {static_cast<int64_t>(b.extremes.size())}, at::kDouble)
                     .to(ctx.device(), /*non_blocking=*/false, /*copy=*/true);
  holders.all_reduce(s, ReduceOp::kSum, "mih.session.probes");
  holders.all_reduce(m, ReduceOp::kMax, "mih.session.probes");
  const at::Tensor st = s.cpu().narrow(0, 0, b.n_items * b.width).reshape({b.n_items, b.width}).contiguous();
  const at::Tensor vals = s.cpu().narrow(0, b.n_items * b.width, b.values_len).contiguous();
  const at::Tensor ex = m.cpu().reshape({b.n_items, 2}).contiguous();
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
    std::vector<double> sketch(static_cast<size_t>(b.k));
    for (int64_t j = 0; j < b.k; ++j) sketch[static_cast<size_t>(j)] = sa[r][4 + j];
    t["sketch"] = sketch;
    if (b.value_base[i] >= 0) {
      const double* v = vals.data_ptr<double>() + b.value_base[i];
      t["values"] = std::vector<double>(v, v + n);
    }
    tensors[items[i].name] = t;
  }
  return tensors;
}

}  // namespace

json probe_stage(ParallelContext& ctx, const std::vector<WatchEntry>& watchlist, Stage stage,
                 torch::optim::Optimizer* optimizer, const WatchlistOptions& options) {
  const std::vector<ProbeItem> items = stage_items(watchlist, stage, optimizer);
  ProbeSums b(items, options);
  for (size_t i = 0; i < items.size(); ++i) {
    const ProbeItem& it = items[i];
    if (!it.piece.defined()) continue;
    b.sums[i * static_cast<size_t>(b.width) + 3] = 1;  // defined on this rank
    if (!ctx.writes_piece(*it.param)) continue;
    for (const Box& box : ctx.local_boxes(*it.param)) {
      if (box.numel() > 0) add_box(it, box, i, b);
    }
  }
  return {{"stage", stage_name(stage)}, {"tensors", reduced_records(ctx, items, b)}};
}

FindingReport check_replica_consistency(ParallelContext& ctx, int64_t step, json* evidence) {
  // Only pieces some other rank also holds can be compared: replicas() > 1 within a stage, or
  // a parameter tied across pipeline stages (its copies, one per stage, must stay one value).
  // A tied copy is keyed by the first of its names over the stages (fqn and aliases), which
  // every stage's copy shares.
  auto key_of = [](const ShardedParameter& p) {
    std::string key = p.fqn;
    for (const auto& a : p.aliases) key = std::min(key, a);
    return key;
  };
  std::vector<const ShardedParameter*> replicated;
  for (const auto& p : ctx.parameters()) {
    if (p->replicas() > 1 || p->pp_ranks.size() > 1) replicated.push_back(p.get());
  }
  json mine = json::object();
  for (const ShardedParameter* p : replicated) {
    json boxes = json::array();
    for (const Box& b : ctx.local_boxes(*p)) boxes.push_back({b.global_offset, b.lengths});
    const at::Tensor bytes = p->local.detach().to(at::kCPU).contiguous();
    const std::string digest =
        Sha256().update(bytes.data_ptr(), static_cast<size_t>(bytes.numel()) * bytes.element_size()).hex_digest();
    mine[key_of(*p)] = {boxes.dump(), digest};
  }
  // Without pp every rank holds the same parameters, so all or none gather; under pp a stage
  // may hold none replicated while another does: every rank gathers.
  const bool gather = !replicated.empty() || ctx.mesh().config().pp > 1;
  const std::vector<json> all = gather ? all_gather_json(ctx.mesh().comm(MeshAxis::kWorld), mine, ctx.device(),
                                                         "mih.session.replicas")
                                       : std::vector<json>{};
  FindingReport report;
  json checked = json::object();
  int64_t replicated_pieces = 0;
  for (const auto& p : ctx.parameters()) {
    if (p->replicas() == 1 && p->pp_ranks.size() <= 1) checked[p->fqn] = {{"replicas", 1}, {"compared", false}};
  }
  for (const ShardedParameter* p : replicated) {
    // piece (its boxes) -> digest -> ranks
    std::map<std::string, std::map<std::string, std::vector<int>>> pieces;
    const std::string key = key_of(*p);
    for (size_t r = 0; r < all.size(); ++r) {
      if (!all[r].contains(key)) continue;  // another pipeline stage's rank
      const json& e = all[r].at(key);
      pieces[e[0].get<std::string>()][e[1].get<std::string>()].push_back(static_cast<int>(r));
    }
    bool compared = true;
    // Every piece is held by its replicas within a stage, on each stage holding a copy.
    const size_t expected_holders = static_cast<size_t>(p->replicas()) * std::max<size_t>(p->pp_ranks.size(), 1);
    for (const auto& [piece, by_digest] : pieces) {
      size_t holders = 0;
      for (const auto& [digest, ranks] : by_digest) holders += ranks.size();
      replicated_pieces += holders > 1;
      compared = compared && holders > 1;
      if (holders < expected_holders) {
        report.add({codes::kProbeReplicas, "runtime", p->fqn, Severity::kError,
                    "piece " + piece + " of '" + p->fqn + "' is held by " + std::to_string(holders) + " rank(s) at step " +
                        std::to_string(step) + ", where " + std::to_string(expected_holders) +
                        " hold it (replicas x pipeline stages with a copy): a copy was not found to compare",
                    {{"step", step}, {"holders", holders}, {"expected_holders", expected_holders}},
                    "a replica that is not compared can train apart unseen (a tie's copy under another name or split)",
                    "give every copy of a tied parameter the same names (ParallelContext's tie across stages) and layout"});
      }
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
    checked[p->fqn] = {{"pieces", pieces.size()}, {"replicas", p->replicas()}, {"pp_copies", p->pp_ranks.size()},
                       {"compared", compared}};
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
