// ParallelContext's gradient synchronization (each parameter's gradient reduced over its
// reduction path, one bucket per path and dtype), the global grad norm and its clipping.
#include "harness/parallel/parallel_context.h"

#include <cmath>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "harness/base/error.h"
#include "harness/base/fault.h"
#include "harness/base/reduction_paths.h"
#include "harness/parallel/pipeline.h"

namespace mih {
namespace {

// A gradient and the reduction path it takes.
struct PathGrad {
  at::Tensor grad;
  const ReductionPath* path;
};

// Sums every gradient of `grads` over `comm` in place, one flat bucket per reduction path and
// dtype (the same order on every rank), each all-reduce labelled with its path's site.
void all_reduce_bucketed(const std::vector<PathGrad>& grads, Communicator& comm) {
  if (comm.size() == 1 || grads.empty()) return;
  std::map<std::pair<std::string_view, at::ScalarType>, std::vector<at::Tensor>> buckets;
  std::map<std::string_view, const char*> sites;
  for (const auto& g : grads) {
    buckets[{g.path->name, g.grad.scalar_type()}].push_back(g.grad);
    sites[g.path->name] = g.path->site;
  }
  for (auto& [key, list] : buckets) {
    std::vector<at::Tensor> flat;
    for (const auto& g : list) flat.push_back(g.reshape(-1));
    at::Tensor bucket = at::cat(flat);
    comm.all_reduce(bucket, ReduceOp::kSum, sites.at(key.first));
    int64_t offset = 0;
    for (auto& g : list) {
      g.copy_(bucket.narrow(0, offset, g.numel()).view_as(g));
      offset += g.numel();
    }
  }
}

// The reduction axes each parameter's gradient took this step, by FQN (gradient_reductions()).
using Reductions = std::map<std::string, std::set<std::string>>;

GradientLayout layout_of(const ShardedParameter& p) {
  return p.fsdp ? GradientLayout::kFsdp : GradientLayout::kUnsharded;
}

// Whether backward gave each of `trainable` a gradient on some rank of `stage`: one flag per
// parameter, summed over the ranks (the same decision on every rank, so every replica of a
// piece skips or takes the update alike). On the CPU, contiguous.
at::Tensor ranks_with_gradient(const std::vector<const ShardedParameter*>& trainable, Communicator& stage,
                               c10::Device device) {
  at::Tensor present = at::zeros({static_cast<int64_t>(trainable.size())}, at::TensorOptions().dtype(at::kFloat));
  for (size_t i = 0; i < trainable.size(); ++i) {
    if (trainable[i]->local.grad().defined()) present[static_cast<int64_t>(i)] = 1;
  }
  present = present.to(device);
  if (stage.size() > 1 && !trainable.empty()) stage.all_reduce(present, ReduceOp::kSum, "grad_sync.presence");
  return present.cpu().contiguous();
}

// A trainable parameter without a gradient on this rank joins with zeros, so every rank's
// buckets have the same layout (a different layout would make the collectives disagree).
// A frozen one (requires_grad false, the same on every rank) has none and joins no bucket.
void zero_missing_gradients(const ParallelContext& ctx, Reductions& reductions) {
  for (const auto& p : ctx.parameters()) {
    if (p->local.requires_grad() && !p->local.grad().defined()) {
      p->local.mutable_grad() = at::zeros_like(p->local);
      reductions[p->fqn].insert(ParallelContext::kNoGradient);
    }
  }
}

// The gradients each tp rank holds only part of (tp_partial_grad), summed over tp.
void reduce_partial_over_tp(ParallelContext& ctx, Reductions& reductions) {
  std::vector<PathGrad> partial_over_tp;
  for (const auto& p : ctx.parameters()) {
    if (!p->tp_partial_grad || !p->local.requires_grad()) continue;
    const GradientKind kind = p->expert_parallel() ? GradientKind::kExpert : GradientKind::kDense;
    const ReductionPath& path = gradient_path(kind, layout_of(*p), "tp");
    partial_over_tp.push_back({p->local.grad(), &path});
    if (ctx.tp_size() > 1) {
      reductions[p->fqn].insert("tp");
      ctx.record_reduction_path(path, ctx.tp_size(), p->fqn);
    }
  }
  all_reduce_bucketed(partial_over_tp, ctx.tp_group());
}

// Over each data-parallel axis, by the rule of reduction_paths.h (all_reduced_over): experts
// under ep over dp_replicate and edp, dense ones over dp_replicate, cp and dp_shard; not over
// the axis whose FSDP backward already reduce-scattered it.
void reduce_over_data_parallel(ParallelContext& ctx, Reductions& reductions) {
  for (MeshAxis axis : {MeshAxis::kDpReplicate, MeshAxis::kCp, MeshAxis::kDpShard, MeshAxis::kEdp}) {
    const std::string_view axis_name = mesh_axis_name(axis);
    Communicator& comm = ctx.mesh().comm(axis);
    std::vector<PathGrad> grads;
    for (const auto& p : ctx.parameters()) {
      if (!p->local.requires_grad()) continue;
      // F23 (docs/fault-catalog.md): expert gradients reduced like dense ones, over cp and dp_shard (so
      // over the ep ranks, which hold other experts), not over edp.
      const bool expert = p->expert_parallel() && !fault::active(fault::Fault::kF23);
      const GradientKind kind = expert ? GradientKind::kExpert : GradientKind::kDense;
      if (!all_reduced_over(kind, layout_of(*p), axis_name)) continue;
      const ReductionPath& path = gradient_path(kind, layout_of(*p), axis_name);
      grads.push_back({p->local.grad(), &path});
      if (comm.size() > 1) {
        reductions[p->fqn].insert(std::string(axis_name));
        ctx.record_reduction_path(path, comm.size(), p->fqn);
      }
    }
    all_reduce_bucketed(grads, comm);
  }
}

// A parameter tied across pipeline stages (an embedding on the first stage tied to the head
// on the last): its copies' gradients, each already summed over data parallelism, are summed
// over the pp ranks (zeros from a rank holding no copy), so every copy takes the one
// logical parameter's update (Megatron-LM's embedding group). `tied`: (creation index, local
// element count) of each; `options`: the parameters' dtype and device.
void sum_tied_over_pp(const ParallelContext& ctx, const std::vector<std::pair<int64_t, int64_t>>& tied,
                      at::TensorOptions options, Reductions& reductions) {
  std::map<int64_t, ShardedParameter*> mine;
  for (const auto& p : ctx.parameters()) mine[p->index] = p.get();
  int64_t total = 0;
  for (const auto& [index, numel] : tied) total += numel;
  at::Tensor flat = at::zeros({total}, options);
  int64_t offset = 0;
  for (const auto& [index, numel] : tied) {
    auto it = mine.find(index);
    if (it != mine.end() && it->second->local.grad().defined()) {
      flat.narrow(0, offset, numel).copy_(it->second->local.grad().reshape(-1));
    }
    offset += numel;
  }
  pp::sum_tied_gradient(ctx.mesh().comm(MeshAxis::kPp), flat);
  offset = 0;
  for (const auto& [index, numel] : tied) {
    auto it = mine.find(index);
    if (it != mine.end() && it->second->local.grad().defined()) {
      it->second->local.mutable_grad().copy_(flat.narrow(0, offset, numel).view_as(it->second->local));
      reductions[it->second->fqn].insert("pp");
    }
    offset += numel;
  }
}

}  // namespace

void ParallelContext::synchronize_gradients() {
  root_gathers_.clear();
  std::vector<const ShardedParameter*> trainable;
  for (const auto& p : ordered_) {
    if (p->local.requires_grad()) trainable.push_back(p.get());
  }
  // Over the ranks of this pipeline stage, which hold the same parameters (the world when pp = 1).
  const at::Tensor present = ranks_with_gradient(trainable, mesh_->comm(MeshAxis::kStage), device_);
  const auto with_gradient = present.accessor<float, 1>();
  zero_missing_gradients(*this, reductions_);
  reduce_partial_over_tp(*this, reductions_);
  reduce_over_data_parallel(*this, reductions_);
  // F34 (docs/fault-catalog.md): the copies' gradients never summed, so each stage updates its copy with
  // its own part of the gradient and the tie comes apart.
  if (!tied_over_pp_.empty() && !fault::active(fault::Fault::kF34)) {
    sum_tied_over_pp(*this, tied_over_pp_, at::TensorOptions().dtype(param_dtype_).device(device_), reductions_);
  }
  // PyTorch's semantics: a parameter no rank's backward reached keeps no gradient, and the
  // optimizers skip it (torch.optim steps only parameters whose grad is not None; DDP leaves
  // a globally unused parameter's grad None). Zeros would let AdamW decay it and move it by
  // its momentum. One with a gradient on some ranks only took the others' zeros in the sum
  // above, as DDP does.
  without_gradient_.clear();
  for (size_t i = 0; i < trainable.size(); ++i) {
    if (with_gradient[static_cast<int64_t>(i)] > 0) continue;
    trainable[i]->local.mutable_grad() = at::Tensor();
    without_gradient_.insert(trainable[i]->fqn);
  }
}

void ParallelContext::record_reduction_path(const ReductionPath& path, int64_t axis_size, const std::string& fqn) {
  if (axis_size <= 1) return;
  ReachedPath& reached = reached_paths_[std::string(path.name)];
  reached.axis_size = axis_size;
  if (!fqn.empty()) reached.parameters.insert(fqn);
}

double ParallelContext::grad_norm() {
  double local = 0;
  for (const auto& p : ordered_) {
    const at::Tensor& g = p->local.grad();
    if (!g.defined() || g.numel() == 0) continue;
    // A parameter tied across pipeline stages counts once, on the first stage holding it.
    if (!p->pp_counted) continue;
    // Each piece is held by replicas() ranks: weight it so the sum over the world counts it once.
    // F04 (docs/fault-catalog.md): the replicated (unsharded) pieces counted once per rank holding them.
    const double replicas = fault::active(fault::Fault::kF04) ? 1.0 : static_cast<double>(p->replicas());
    local += g.to(at::kDouble).pow(2).sum().item<double>() / replicas;
  }
  at::Tensor total = at::full({1}, local, at::TensorOptions().dtype(at::kDouble).device(device_));
  // F03 (docs/fault-catalog.md): the norm of this rank's shards only, never summed over the mesh.
  if (!fault::active(fault::Fault::kF03)) {
    const ReductionPath& path = reduction_path("grad_norm.world");
    // F35 (docs/fault-catalog.md): under pp, the norm of this stage's parameters only (summed over the
    // stage's ranks, never over pp), so every stage clips by another norm.
    const bool stage_only = mesh_->config().pp > 1 && fault::active(fault::Fault::kF35);
    Communicator& world = mesh_->comm(stage_only ? MeshAxis::kStage : MeshAxis::kWorld);
    world.all_reduce(total, ReduceOp::kSum, path.site);
    record_reduction_path(path, world.size());
  }
  return std::sqrt(total.item<double>());
}

double ParallelContext::clip_grad_norm(double max_norm) {
  const double norm = grad_norm();
  const double coef = max_norm / (norm + 1e-6);
  if (coef < 1) {
    at::NoGradGuard no_grad;
    for (const auto& p : ordered_) {
      if (p->local.grad().defined()) p->local.mutable_grad().mul_(coef);
    }
  }
  return norm;
}

}  // namespace mih
