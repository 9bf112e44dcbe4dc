// Activations in global coordinates: counter-based dropout masks and activation probes
// (see activations.h).
#include "harness/parallel/activations.h"

#include <fnmatch.h>

#include <cmath>

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include "harness/base/error.h"
#include "harness/parallel/activation_checkpoint.h"
#include "harness/parallel/context_parallel.h"
#include "harness/parallel/parallel_context.h"

namespace mih {
namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

bool watched(const std::vector<std::string>& patterns, const std::string& fqn) {
  if (patterns.empty()) return true;
  for (const auto& p : patterns) {
    if (::fnmatch(p.c_str(), fqn.c_str(), 0) == 0) return true;
  }
  return false;
}

}  // namespace

ActivationLayout ActivationLayout::residual(const ParallelContext& ctx) {
  ActivationLayout l;
  l.sequence_sharded_over_tp = ctx.sequence_parallel();
  return l;
}

ActivationLayout ActivationLayout::column_parallel(int64_t logical_features, int64_t partitions) {
  ActivationLayout l;
  l.features_sharded_over_tp = true;
  l.logical_features = logical_features;
  l.feature_partitions = partitions;
  return l;
}

ActivationLayout ActivationLayout::replicated(bool sequence_over_cp) {
  ActivationLayout l;
  l.sequence_over_cp = sequence_over_cp;
  return l;
}

at::Tensor global_element_index(const ParallelContext& ctx, at::IntArrayRef sizes, const ActivationLayout& layout,
                                int64_t first_row, at::Tensor* valid) {
  MIH_CHECK(sizes.size() >= 3, "activation of shape ", sizes,
            ": expected [B, S, F...] (rows, sequence, features) to place it in global coordinates");
  const int64_t b = sizes[0], s = sizes[1];
  int64_t f = 1;
  for (size_t d = 2; d < sizes.size(); ++d) f *= sizes[d];
  const int64_t tp = ctx.tp_size();
  const int64_t tp_rank = ctx.tp_rank();
  // Tokens: this cp rank's global positions (or all, for a field every cp rank holds whole),
  // this tp rank's chunk of them under Shard(seq).
  const int64_t seq_tp = layout.sequence_sharded_over_tp ? tp : 1;
  const CpShard cp = layout.sequence_over_cp ? ctx.cp_shard() : CpShard{};
  const int64_t seq_global = s * seq_tp * cp.size();
  const at::Tensor tokens =
      sequence_token_ids(seq_global, cp.size(), cp.rank(), cp.layout, seq_tp, seq_tp > 1 ? tp_rank : 0);
  // Features: this tp rank's chunk of each partition.
  at::Tensor features = at::arange(f, at::kLong);
  int64_t f_global = f;
  if (layout.features_sharded_over_tp && tp > 1) {
    const int64_t parts = layout.feature_partitions;
    MIH_CHECK(parts >= 1 && f % parts == 0, "activation of shape ", sizes, ": ", f, " features do not split into ",
              parts, " partitions");
    const int64_t per = f / parts;  // this rank's features of one partition
    features = features.div(per, "floor") * (per * tp) + tp_rank * per + features.remainder(per);
    f_global = f * tp;
  }
  const int64_t logical = layout.logical_features > 0 ? layout.logical_features : f_global;
  const at::Tensor rows = at::arange(first_row, first_row + b, at::kLong);
  at::Tensor index = (rows.view({b, 1, 1}) * seq_global + tokens.to(at::kLong).view({1, s, 1})) * logical +
                     features.view({1, 1, f});
  if (valid) *valid = features.lt(logical).view({1, 1, f}).expand({b, s, f}).reshape(sizes);
  return index.reshape(sizes).contiguous();
}

at::Tensor counter_dropout_keep(const at::Tensor& index, uint64_t key, double p) {
  const at::Tensor idx = index.to(at::kCPU).to(at::kLong).contiguous();
  at::Tensor keep = at::empty(idx.sizes(), at::TensorOptions().dtype(at::kBool));
  const int64_t* e = idx.data_ptr<int64_t>();
  bool* out = keep.data_ptr<bool>();
  constexpr double kScale = 1.0 / 9007199254740992.0;  // 2^-53
  for (int64_t i = 0, n = idx.numel(); i < n; ++i) {
    const uint64_t h = splitmix64(key ^ splitmix64(static_cast<uint64_t>(e[i])));
    out[i] = static_cast<double>(h >> 11) * kScale >= p;
  }
  return keep;
}

at::Tensor projection_signs(const at::Tensor& index, int64_t j) {
  constexpr int64_t kMask = (int64_t{1} << 31) - 1;
  at::Tensor h = index.bitwise_and(kMask).mul(1540483477).add(j * 668265263 + 374761393).bitwise_and(kMask);
  h = h.bitwise_xor(h.__rshift__(15));
  h = h.mul(739982445).bitwise_and(kMask);
  h = h.bitwise_xor(h.__rshift__(13));
  return h.bitwise_and(1).mul(2).sub(1).to(at::kDouble);
}

void ActivationProbes::configure(std::vector<std::string> patterns, int projections) {
  MIH_CHECK(projections >= 0, "activation probes: projections must be >= 0, got ", projections);
  patterns_ = std::move(patterns);
  projections_ = projections;
  sign_cache_.clear();
}

void ActivationProbes::name_modules(torch::nn::Module& root) {
  names_.clear();
  module_order_.clear();
  for (const auto& item : root.named_modules("", /*include_self=*/false)) {
    if (names_.emplace(item.value().get(), item.key()).second) module_order_.push_back(item.key());
  }
}

const ActivationProbes::Signs& ActivationProbes::signs_for(at::IntArrayRef sizes, const ActivationLayout& l,
                                                            int64_t first_row) {
  std::vector<int64_t> key(sizes.begin(), sizes.end());
  key.insert(key.end(), {first_row, l.sequence_over_cp, l.sequence_sharded_over_tp, l.features_sharded_over_tp,
                         l.feature_partitions, l.logical_features, projections_});
  auto it = sign_cache_.find(key);
  if (it != sign_cache_.end()) return it->second;
  if (sign_cache_.size() > 256) sign_cache_.clear();
  at::Tensor valid;
  const at::Tensor index = global_element_index(*ctx_, sizes, l, first_row, &valid).reshape({-1});
  Signs s;
  std::vector<at::Tensor> cols;
  for (int64_t j = 0; j < projections_; ++j) cols.push_back(projection_signs(index, j));
  s.signs = projections_ > 0 ? at::stack(cols, 1) : at::zeros({index.numel(), 0}, at::kDouble);
  if (!valid.all().item<bool>()) {
    s.valid = valid.reshape({-1}).to(at::kDouble);
    s.signs = s.signs * s.valid.unsqueeze(1);
  }
  s.signs = s.signs.contiguous();
  return sign_cache_[key] = s;
}

void ActivationProbes::add(ActivationStats& into, const at::Tensor& t, const Signs& s, bool contributes,
                           bool linear_only, bool counts) {
  const size_t width = 4 + static_cast<size_t>(projections_);
  if (into.values.empty()) into.values.assign(width, 0.0);
  into.seen = true;
  if (linear_only) into.has_sum_sq = false;
  if (!contributes) return;
  at::Tensor x = t.detach().reshape({-1}).to(at::kCPU).to(at::kDouble).contiguous();
  if (s.valid.defined()) x = x * s.valid;
  double sum = x.sum().item<double>();
  if (!std::isfinite(sum)) {
    const at::Tensor finite = at::isfinite(x);
    into.values[2] += static_cast<double>(x.numel() - finite.sum().item<int64_t>());
    x = at::where(finite, x, at::zeros_like(x));
    sum = x.sum().item<double>();
  }
  into.values[0] += sum;
  if (!linear_only) into.values[1] += at::dot(x, x).item<double>();
  // The element count once per element: partial sums are added by every rank that holds one.
  if (counts) into.values[3] += static_cast<double>(s.valid.defined() ? s.valid.sum().item<double>() : x.numel());
  if (projections_ > 0) {
    const at::Tensor projected = at::mv(s.signs.t(), x);
    const auto pa = projected.accessor<double, 1>();
    for (int64_t j = 0; j < projections_; ++j) into.values[4 + static_cast<size_t>(j)] += pa[j];
  }
}

at::Tensor ActivationProbes::observe(const torch::nn::Module& module, const at::Tensor& out,
                                     const ActivationLayout& layout, int64_t first_row, int64_t micro_batch) {
  if (!enabled_ || !out.defined()) return out;
  auto it = names_.find(&module);
  if (it == names_.end() || !watched(patterns_, it->second)) return out;
  const std::string& name = it->second;
  const bool recompute = in_recompute();
  auto last = last_.find(name);
  if (last != last_.end() && last->second == std::make_pair(micro_batch, recompute)) return out;
  last_[name] = {micro_batch, recompute};
  auto [rec, fresh] = records_.try_emplace(name);
  if (fresh) {
    rec->second.module = name;
    observed_order_.push_back(name);
  }
  const Signs& s = signs_for(out.sizes(), layout, first_row);
  // Each element once: a tensor replicated over tp (cp) is added by tp (cp) rank 0 only.
  const bool tp_replicated = !layout.sequence_sharded_over_tp && !(layout.features_sharded_over_tp && ctx_->tp_size() > 1);
  const bool tp0 = ctx_->tp_rank() == 0, cp0 = ctx_->cp_shard().rank() == 0;
  const bool forward_adds = (!tp_replicated || tp0) && (layout.sequence_over_cp || cp0);
  // The forward of a checkpointed region is observed when it first runs; its recompute only
  // hooks the gradient (the first run has no graph to hook).
  if (!recompute) add(rec->second.forward, out, s, forward_adds, false, true);
  if (out.requires_grad()) {
    const bool partial = (layout.grad_partial_over_tp && ctx_->tp_size() > 1) ||
                         (layout.grad_partial_over_cp && ctx_->cp_shard().size() > 1);
    const bool grad_adds = (!tp_replicated || tp0 || layout.grad_partial_over_tp) &&
                           (layout.sequence_over_cp || cp0 || layout.grad_partial_over_cp);
    const Signs signs = s;  // by value: the cache may be cleared before backward
    ActivationStats* target = &rec->second.grad;
    at::Tensor hooked = out.view_as(out);
    hooked.register_hook([this, target, signs, grad_adds, partial, forward_adds](const at::Tensor& grad) {
      add(*target, grad, signs, grad_adds, partial, forward_adds);
    });
    return hooked;
  }
  return out;
}

std::vector<ActivationProbes::Record> ActivationProbes::take_reduced() {
  // One slot per named module (the same list on every rank), forward then grad: the
  // statistics, then seen flags and sum_sq flags.
  const int64_t width = 4 + projections_, n = static_cast<int64_t>(module_order_.size());
  const int64_t per = 2 * width + 4;
  std::vector<double> flat(static_cast<size_t>(n * per), 0.0);
  for (int64_t m = 0; m < n; ++m) {
    auto it = records_.find(module_order_[static_cast<size_t>(m)]);
    if (it == records_.end()) continue;
    double* row = flat.data() + m * per;
    for (int half = 0; half < 2; ++half) {
      const ActivationStats& st = half == 0 ? it->second.forward : it->second.grad;
      for (size_t j = 0; j < st.values.size(); ++j) row[half * width + static_cast<int64_t>(j)] = st.values[j];
      row[2 * width + half] = st.seen ? 1 : 0;
      row[2 * width + 2 + half] = st.seen && !st.has_sum_sq ? 1 : 0;
    }
  }
  at::Tensor t = at::from_blob(flat.data(), {static_cast<int64_t>(flat.size())}, at::kDouble)
                     .to(ctx_->device(), /*non_blocking=*/false, /*copy=*/true);
  if (!flat.empty()) ctx_->mesh().comm(MeshAxis::kStage).all_reduce(t, ReduceOp::kSum, "mih.session.activations");
  const at::Tensor reduced = t.cpu().contiguous();
  const double* r = reduced.data_ptr<double>();
  std::map<std::string, int64_t> slot;
  for (int64_t m = 0; m < n; ++m) slot[module_order_[static_cast<size_t>(m)]] = m;
  std::vector<Record> out;
  for (const auto& name : observed_order_) {
    const double* row = r + slot.at(name) * per;
    Record rec;
    rec.module = name;
    for (int half = 0; half < 2; ++half) {
      ActivationStats& st = half == 0 ? rec.forward : rec.grad;
      st.seen = row[2 * width + half] > 0;
      st.has_sum_sq = row[2 * width + 2 + half] == 0;
      if (st.seen) st.values.assign(row + half * width, row + (half + 1) * width);
    }
    out.push_back(std::move(rec));
  }
  records_.clear();
  observed_order_.clear();
  last_.clear();
  return out;
}

}  // namespace mih
