// ParallelContext: parameter creation and layout, FSDP sharding, gradient synchronization,
// global grad norm, full-tensor gathers.
#include "harness/parallel/parallel_context.h"

#include <algorithm>
#include <cmath>
#include <mutex>
#include <set>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <nlohmann/json.hpp>
#include <torch/nn/module.h>

#include "harness/base/error.h"
#include "harness/base/fault.h"
#include "harness/parallel/regions.h"
#include "harness/runtime/dtypes.h"

namespace mih {
namespace {

// The expert-data-parallel degree: the ranks of dp_shard x cp at one ep index.
int64_t edp_size(const ParallelConfig& mesh) { return static_cast<int64_t>(mesh.dp_shard) * mesh.cp / mesh.ep; }

// This rank's tensor-parallel piece of `full` (see Placement::shard for partitions).
at::Tensor tp_piece(const at::Tensor& full, const Placement& tp, int64_t n, int64_t r, int64_t index) {
  if (!tp.is_shard() || n == 1) return full;
  const int64_t d = tp.dim();
  MIH_CHECK(d >= 0 && d < full.dim(), "parameter #", index, " of shape ", full.sizes(), ": Shard(", d,
            ") names a dim it does not have");
  MIH_CHECK(full.size(d) % (tp.partitions() * n) == 0, "parameter #", index, " of shape ", full.sizes(),
            ": dim ", d, " (size ", full.size(d), ") does not split into partitions(", tp.partitions(), ") x tp(", n,
            ") equal pieces; choose sizes divisible by ", tp.partitions() * n, " or another tp");
  std::vector<at::Tensor> pieces;
  for (const at::Tensor& part : full.chunk(tp.partitions(), d)) pieces.push_back(part.chunk(n, d)[r]);
  return at::cat(pieces, d);
}

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

}  // namespace

namespace init {
ParamInit normal(double std) {
  return [std](at::IntArrayRef shape, at::Generator& gen) {
    return at::empty(shape, at::kDouble).normal_(0.0, std, gen);
  };
}
ParamInit constant(double value) {
  return [value](at::IntArrayRef shape, at::Generator&) { return at::full(shape, value, at::kDouble); };
}
}  // namespace init

std::map<std::string, Placement> ShardedParameter::placements() const {
  std::map<std::string, Placement> out;
  if (expert_parallel()) {
    out.emplace("dp_replicate", Placement::replicate());
    out.emplace("ep", Placement::shard(0));
    out.emplace("edp", fsdp ? Placement::shard(0) : Placement::replicate());
    out.emplace("tp", mesh.tp > 1 ? tp : Placement::replicate());
    return out;
  }
  for (const auto& d : kMeshDims) {
    Placement placement = Placement::replicate();
    if (d.degree == &ParallelConfig::dp_shard && fsdp) placement = Placement::shard(0);
    if (d.degree == &ParallelConfig::tp && mesh.tp > 1) placement = tp;
    out.emplace(std::string(d.name), placement);
  }
  return out;
}

std::vector<std::string> ShardedParameter::grad_domain() const {
  std::vector<std::string> out;
  if (expert_parallel()) {
    if (mesh.dp_replicate > 1) out.emplace_back("dp_replicate");
    if (edp_size(mesh) > 1) out.emplace_back("edp");
    if (mesh.tp > 1 && tp_partial_grad) out.emplace_back("tp");
    return out;
  }
  for (const auto& d : kMeshDims) {
    if (mesh.*d.degree <= 1) continue;
    if (d.data_parallel || (d.degree == &ParallelConfig::tp && tp_partial_grad)) out.emplace_back(d.name);
  }
  return out;
}

int64_t ShardedParameter::replicas() const {
  if (expert_parallel()) {
    return mesh.world_size() / ((tp.is_shard() ? mesh.tp : 1) * mesh.ep * (fsdp ? edp_size(mesh) : 1));
  }
  int64_t pieces = (tp.is_shard() ? mesh.tp : 1) * (fsdp ? mesh.dp_shard : 1);
  return mesh.world_size() / pieces;
}

void to_json(nlohmann::json& j, const ShardedParameter& p) {
  j = {{"fqn", p.fqn},
       {"aliases", p.aliases},
       {"global_shape", p.global_shape},
       {"padded_shape", p.padded_shape},
       {"tp_local_shape", p.tp_local_shape},
       {"local_shape", p.local_shape},
       {"local_offset", p.local_offset},
       {"placements", p.placements()},
       {"grad_domain", p.grad_domain()},
       {"gradient_kind", p.gradient_kind()},
       {"fsdp_unit", p.unit},
       {"dtype", dtype_name(p.local.scalar_type())}};
  if (p.fsdp) {
    j["fsdp_rows"] = {{"offset", p.fsdp_range.offset}, {"size", p.fsdp_range.size}, {"chunk", p.fsdp_range.chunk}};
    j["fsdp_axis"] = mesh_axis_name(p.fsdp_axis);
  }
}

ParallelContext::ParallelContext(DeviceMesh& mesh, const ParallelConfig& config, c10::Device device)
    : mesh_(&mesh), config_(config), param_dtype_(master_dtype(config.dtype)), device_(device) {
  MIH_CHECK(config_.same_mesh(mesh.config()), "parallel context: config '", config_.name(), "' (", config_.mesh_str(),
            ") does not match the mesh (", mesh.config().mesh_str(), ")");
  dropout_gen_ = at::make_generator<at::CPUGeneratorImpl>(config_.seed * 0x9E3779B97F4A7C15ULL + 0x5EEDULL);
  activation_probes_ = std::make_unique<ActivationProbes>(*this);
}

void ParallelContext::begin_micro_batch(int64_t step, int64_t first_row) {
  if (step != step_) gathers_.clear();
  step_ = step;
  first_row_ = first_row;
  ++micro_batch_;
  std::lock_guard<std::mutex> lock(dropout_gen_.mutex());
  dropout_gen_.set_current_seed(config_.seed * 0x9E3779B97F4A7C15ULL + 0x5EEDULL +
                                static_cast<uint64_t>(step) * 0xD1B54A32D192ED03ULL);
}

at::Tensor ParallelContext::dropout(const at::Tensor& x, double p, bool training, const ActivationLayout& layout) {
  MIH_CHECK(p >= 0 && p < 1, "dropout: p must be in [0, 1), got ", p);
  if (!training || p == 0) return x;
  uint64_t key = 0;
  {
    std::lock_guard<std::mutex> lock(dropout_gen_.mutex());
    key = at::check_generator<at::CPUGeneratorImpl>(dropout_gen_)->random64();
  }
  ActivationLayout where = layout;
  if (fault::active(fault::Fault::kF26)) {
    // F26 (FAULTS.md): the mask drawn as if the tensor were whole on every tp rank, so each
    // shard of a tp-sharded activation gets the same mask.
    where.sequence_sharded_over_tp = where.features_sharded_over_tp = false;
  }
  const at::Tensor keep = counter_dropout_keep(global_element_index(*this, x.sizes(), where, first_row_), key, p);
  return x * keep.to(x.device(), x.scalar_type()) / (1 - p);
}

at::Tensor ParallelContext::observe(const torch::nn::Module& module, const at::Tensor& out, const ActivationLayout& layout) {
  return activation_probes_->observe(module, out, layout, first_row_, micro_batch_);
}

at::Tensor ParallelContext::make_parameter(const ParamSpec& spec) {
  const int64_t index = next_index_++;
  MIH_CHECK(static_cast<bool>(spec.init), "parameter #", index, " of shape ", at::IntArrayRef(spec.shape),
            ": ParamSpec::init is empty");
  MIH_CHECK(spec.pad_dim0_to_multiple >= 1, "parameter #", index, ": pad_dim0_to_multiple must be >= 1");
  // Seeded by (seed, index) alone: the same full values whatever the mesh.
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(config_.seed * 1000003ULL + static_cast<uint64_t>(index));
  at::Tensor full = spec.init(spec.shape, gen);
  MIH_INTERNAL_ASSERT(full.sizes() == at::IntArrayRef(spec.shape), "init returned ", full.sizes(),
                      " for a parameter of shape ", at::IntArrayRef(spec.shape));
  at::Tensor padded = full;
  if (spec.pad_dim0_to_multiple > 1) {
    MIH_CHECK(full.dim() >= 1, "parameter #", index, ": a 0-d parameter cannot be padded");
    const int64_t m = spec.pad_dim0_to_multiple;
    const int64_t rows = (full.size(0) + m - 1) / m * m;
    auto sizes = full.sizes().vec();
    sizes[0] = rows;
    padded = at::zeros(sizes, full.options());
    padded.narrow(0, 0, full.size(0)).copy_(full);
  }
  at::Tensor piece = tp_piece(padded, spec.tp, tp_size(), tp_rank(), index);
  // Routed experts: this ep rank's E / ep blocks of dim 0.
  int64_t ep_row_offset = 0;
  const int ep = mesh_->config().ep;
  MIH_CHECK(spec.experts >= 0, "parameter #", index, ": ParamSpec::experts must be >= 0, got ", spec.experts);
  if (spec.experts > 0) {
    MIH_CHECK(!spec.tp.is_shard() || spec.tp.dim() != 0, "parameter #", index, " of shape ",
              at::IntArrayRef(spec.shape), ": experts are stacked on dim 0, which cannot also be Shard(0) over tp");
    MIH_CHECK(full.dim() >= 1 && full.size(0) % spec.experts == 0 && spec.pad_dim0_to_multiple == 1, "parameter #",
              index, " of shape ", at::IntArrayRef(spec.shape), ": dim 0 does not hold ", spec.experts,
              " equal expert blocks");
    MIH_CHECK(spec.experts % ep == 0, "parameter #", index, " of shape ", at::IntArrayRef(spec.shape),
              ": num_experts(", spec.experts, ") is not divisible by ep(", ep, "); every ep rank must own the same ",
              "number of experts: choose ep among the divisors of ", spec.experts);
    if (ep > 1) {
      const int64_t rows = piece.size(0) / ep;
      ep_row_offset = mesh_->axis_rank(MeshAxis::kEp) * rows;
      piece = piece.narrow(0, ep_row_offset, rows);
    }
  }
  at::Tensor leaf = piece.to(device_, param_dtype_).contiguous().clone().detach().requires_grad_(true);

  auto p = std::make_shared<ShardedParameter>();
  p->local = leaf;
  p->global_shape = spec.shape;
  p->padded_shape = padded.sizes().vec();
  p->tp = spec.tp;
  p->tp_partial_grad = spec.tp_partial_grad;
  p->experts = spec.experts;
  p->ep_row_offset = ep_row_offset;
  p->tp_local_shape = piece.sizes().vec();
  p->local_shape = p->tp_local_shape;
  p->local_offset.assign(piece.dim(), 0);
  if (ep_row_offset > 0) p->local_offset[0] = ep_row_offset;
  if (spec.tp.is_shard() && tp_size() > 1) {
    p->local_offset[spec.tp.dim()] = tp_rank() * piece.size(spec.tp.dim()) / spec.tp.partitions();
  }
  p->index = index;
  p->mesh = mesh_->config();
  by_impl_[leaf.unsafeGetTensorImpl()] = p;
  return leaf;
}

ShardedParameter& ParallelContext::parameter(const at::Tensor& leaf) const {
  auto it = by_impl_.find(leaf.unsafeGetTensorImpl());
  MIH_CHECK(it != by_impl_.end(), "a tensor of shape ", leaf.sizes(),
            " is used as a parameter but was not created by ParallelContext::make_parameter; create every "
            "parameter through it so its layout is known");
  return *it->second;
}

at::Tensor ParallelContext::use(const at::Tensor& leaf) {
  const ShardedParameter& p = parameter(leaf);
  if (!p.fsdp) return leaf;
  // Under no-grad (a checkpointed region's first forward) the gather has no graph: nothing
  // saves it, it is freed with the region's temporaries, and the recompute gathers again.
  const bool in_unit = !active_unit_.empty() && p.unit == active_unit_ && at::GradMode::is_enabled();
  if (in_unit) {
    for (const auto& [impl, full] : unit_gathers_) {
      if (impl == leaf.unsafeGetTensorImpl()) return full;
    }
  }
  const int64_t forward = shared_state_.forward_index();
  const bool in_root = active_unit_.empty() && at::GradMode::is_enabled() && forward >= 0;
  if (in_root) {
    for (const auto& g : root_gathers_) {
      if (g.impl == leaf.unsafeGetTensorImpl() && g.forward == forward) return g.full;
    }
  }
  const ReductionPath& path =
      gradient_path(p.expert_parallel() ? GradientKind::kExpert : GradientKind::kDense, GradientLayout::kFsdp,
                    mesh_axis_name(p.fsdp_axis));
  Communicator& over = mesh_->comm(p.fsdp_axis);
  at::Tensor full = fsdp_all_gather(leaf, over, p.tp_local_shape[0], c10::nullopt, c10::nullopt, path.site);
  gathers_.insert({p.fqn, forward});
  if (full.requires_grad()) {
    // The gradient of the gathered tensor goes straight into the gather's backward, which
    // reduce-scatters it over dp_shard (edp for experts).
    full.register_hook([this, record = &reductions_, fqn = p.fqn, axis = std::string(mesh_axis_name(p.fsdp_axis)),
                        path = &path, size = over.size()](const at::Tensor&) {
      (*record)[fqn].insert(axis);
      record_reduction_path(*path, size, fqn);
    });
  }
  if (in_unit) unit_gathers_.emplace_back(leaf.unsafeGetTensorImpl(), full);
  if (in_root) {
    std::erase_if(root_gathers_, [&](const RootGather& g) { return g.forward != forward; });
    root_gathers_.push_back({leaf.unsafeGetTensorImpl(), forward, full});
  }
  return full;
}

namespace {

// Frees the memory of a gathered parameter but keeps its StorageImpl, which the tensors
// autograd saved for backward share.
void release_storage(const at::Tensor& t) {
  c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  storage->set_data_ptr(at::DataPtr());
  storage->set_nbytes(0);
}

// Moves the memory of `fresh` (same byte size) into the storage of `t`.
void adopt_storage(const at::Tensor& t, const at::Tensor& fresh) {
  c10::StorageImpl* source = fresh.storage().unsafeGetStorageImpl();
  const size_t nbytes = source->nbytes();
  c10::StorageImpl* target = t.storage().unsafeGetStorageImpl();
  target->set_data_ptr(source->set_data_ptr(at::DataPtr()));
  target->set_nbytes(nbytes);
}

}  // namespace

at::Tensor ParallelContext::fsdp_forward(const std::string& unit, const std::function<at::Tensor()>& forward) {
  MIH_CHECK(active_unit_.empty(), "fsdp_forward('", unit, "') inside the forward of unit '", active_unit_,
            "': FSDP units do not nest");
  if (mesh_->comm(MeshAxis::kDpShard).size() == 1) return forward();
  active_unit_ = unit;
  at::Tensor out;
  try {
    out = forward();
  } catch (...) {
    active_unit_.clear();
    unit_gathers_.clear();
    throw;
  }
  active_unit_.clear();
  if (out.requires_grad()) {
    // The contract: a unit whose output needs a gradient gathers each of its parameters once
    // more for backward (the regather below, or an activation-checkpoint recompute), moving
    // each rank's padded shard. A unit that is frozen and fed no gradient (a frozen encoder
    // at the input) is gathered once.
    for (const auto& p : ordered_) {
      if (!p->fsdp || p->unit != unit) continue;
      const int64_t rows = std::max<int64_t>(p->tp_local_shape[0], 1);
      int64_t numel = 1;
      for (int64_t d : p->tp_local_shape) numel *= d;
      mesh_->comm(p->fsdp_axis).expect("fsdp.gather_for_backward",
                      p->fsdp_range.chunk * (numel / rows) * static_cast<int64_t>(c10::elementSize(param_dtype_)), unit);
    }
  }
  // Reshard: free every parameter gathered in this forward; gather them again when the
  // output's gradient arrives, which is before any node of the unit runs its backward.
  struct Freed {
    const ShardedParameter* param;
    at::Tensor full;  // detached alias: shares the storage, holds no autograd node
  };
  std::vector<Freed> freed;
  for (auto& [impl, full] : unit_gathers_) {
    freed.push_back({by_impl_.at(impl).get(), full.detach()});
    release_storage(full);
  }
  unit_gathers_.clear();
  if (!freed.empty() && out.requires_grad()) {
    DeviceMesh* mesh = mesh_;
    out.register_hook([freed, mesh](const at::Tensor& grad) {
      for (const Freed& f : freed) {
        const ShardedParameter& p = *f.param;
        Communicator* dp_shard = &mesh->comm(p.fsdp_axis);
        auto sizes = p.local.sizes().vec();
        sizes[0] = p.fsdp_range.chunk;
        at::Tensor padded = at::zeros(sizes, p.local.options().dtype(f.full.scalar_type()));
        padded.narrow(0, 0, p.local.size(0)).copy_(p.local.detach());
        sizes[0] *= dp_shard->size();
        at::Tensor fresh = at::empty(sizes, padded.options());
        dp_shard->all_gather_into_tensor(fresh, padded, "fsdp.regather_for_backward");
        adopt_storage(f.full, fresh);
      }
      return grad;
    });
  }
  return out;
}

std::map<std::string, int64_t> ParallelContext::fsdp_gather_forwards() const {
  std::map<std::string, int64_t> out;
  for (const auto& [fqn, forward] : gathers_) ++out[fqn];
  return out;
}

void ParallelContext::fully_shard(torch::nn::Module& module, const std::string& unit) {
  units_.push_back(unit);
  unit_modules_.emplace_back(&module, unit);
  Communicator& dp_shard = mesh_->comm(MeshAxis::kDpShard);
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    auto it = by_impl_.find(item.value().unsafeGetTensorImpl());
    MIH_CHECK(it != by_impl_.end(), "FSDP unit '", unit, "': parameter '", item.key(),
              "' was not created by ParallelContext::make_parameter");
    ShardedParameter& p = *it->second;
    if (!p.unit.empty()) continue;  // an earlier unit owns it (a tied parameter)
    p.unit = unit;
    if (dp_shard.size() == 1 || p.local.dim() == 0) continue;
    // Experts under ep: their ep piece over the rest of dp_shard x cp (edp), when that is more
    // than one rank; dense parameters over dp_shard.
    if (p.expert_parallel()) p.fsdp_axis = MeshAxis::kEdp;
    Communicator& over = mesh_->comm(p.fsdp_axis);
    if (over.size() == 1) continue;
    p.fsdp_range = shard_range(p.tp_local_shape[0], over.size(), over.rank());
    {
      at::NoGradGuard no_grad;
      p.local.set_data(p.local.narrow(0, p.fsdp_range.offset, p.fsdp_range.size).clone());
    }
    p.fsdp = true;
    p.local_shape[0] = p.fsdp_range.size;
    p.local_offset[0] += p.fsdp_range.offset;
  }
}

struct ParallelContext::CheckpointLedger {
  std::mutex mu;
  std::map<std::string, RegionCounts> counts;
};

at::Tensor ParallelContext::checkpoint_region(const std::string& name, const RegionForward& forward,
                                             const std::vector<at::Tensor>& inputs,
                                             const std::vector<at::Tensor>& params) {
  if (std::find(checkpoint_regions_.begin(), checkpoint_regions_.end(), name) == checkpoint_regions_.end()) {
    checkpoint_regions_.push_back(name);
  }
  if (!config_.activation_checkpointing) return forward(inputs);
  if (!checkpoint_ledger_) checkpoint_ledger_ = std::make_shared<CheckpointLedger>();
  // Counted where it happens: mih::checkpoint's backward reruns this forward on a thread it
  // marks as recomputing this region (a nested region's first forward inside that recompute
  // is not this region's recompute). The ledger outlives the context if the graph does.
  RegionForward counted = [forward, name, ledger = checkpoint_ledger_](const std::vector<at::Tensor>& in) {
    at::Tensor out = forward(in);
    if (in_recompute() && recompute_region() == name) {
      std::lock_guard<std::mutex> lock(ledger->mu);
      ++ledger->counts[name].recomputed;
    }
    return out;
  };
  at::Tensor out = checkpoint(name, counted, inputs, params, {dropout_gen_});
  if (out.requires_grad()) {
    std::lock_guard<std::mutex> lock(checkpoint_ledger_->mu);
    ++checkpoint_ledger_->counts[name].checkpointed;
  }
  return out;
}

std::map<std::string, ParallelContext::RegionCounts> ParallelContext::checkpoint_counts() const {
  if (!checkpoint_ledger_) return {};
  std::lock_guard<std::mutex> lock(checkpoint_ledger_->mu);
  return checkpoint_ledger_->counts;
}

void ParallelContext::mark_non_persistent(const at::Tensor& buffer, std::function<void()> rebuild) {
  MIH_CHECK(static_cast<bool>(rebuild), "mark_non_persistent: a non-persistent buffer of shape ", buffer.sizes(),
            " needs a rebuild function (it is not loaded from checkpoints)");
  non_persistent_[buffer.unsafeGetTensorImpl()] = std::move(rebuild);
}

void ParallelContext::rebuild_non_persistent_buffers() {
  for (const auto& b : buffers_) {
    if (!b.persistent) b.rebuild();
  }
}

std::string ParallelContext::layer_of(const at::Tensor& leaf) const {
  auto it = by_impl_.find(leaf.unsafeGetTensorImpl());
  if (it == by_impl_.end() || it->second->fqn.empty()) return "";
  const std::string& fqn = it->second->fqn;
  const auto dot = fqn.rfind('.');
  return dot == std::string::npos ? fqn : fqn.substr(0, dot);
}

void ParallelContext::finalize(torch::nn::Module& root) {
  activation_probes_->name_modules(root);
  root_unit_.clear();
  for (const auto& [module, unit] : unit_modules_) {
    if (module == &root) root_unit_ = unit;
  }
  buffers_.clear();
  for (const auto& item : root.named_buffers(/*recurse=*/true)) {
    auto it = non_persistent_.find(item.value().unsafeGetTensorImpl());
    buffers_.push_back({item.key(), item.value(), it == non_persistent_.end(),
                        it == non_persistent_.end() ? std::function<void()>() : it->second});
  }
  ordered_.clear();
  std::set<const void*> seen;
  for (const auto& item : root.named_parameters(/*recurse=*/true)) {
    const void* impl = item.value().unsafeGetTensorImpl();
    auto it = by_impl_.find(impl);
    MIH_CHECK(it != by_impl_.end(), "parameter '", item.key(), "' of shape ", item.value().sizes(),
              " was not created by ParallelContext::make_parameter; create every parameter through it so its "
              "layout over the mesh is known");
    if (seen.insert(impl).second) {
      it->second->fqn = item.key();
      it->second->aliases.clear();
      ordered_.push_back(it->second);
    } else {
      it->second->aliases.push_back(item.key());
    }
  }
  for (const auto& [impl, p] : by_impl_) {
    MIH_CHECK(seen.count(impl), "ParallelContext made parameter #", p->index, " of shape ",
              at::IntArrayRef(p->global_shape), " but the model does not register it");
  }
}

at::Tensor ParallelContext::gather_full(const ShardedParameter& p, const at::Tensor& piece) const {
  MIH_CHECK(piece.defined(), "gather_full('", p.fqn, "'): the tensor is undefined (no gradient yet?)");
  MIH_CHECK(piece.sizes() == at::IntArrayRef(p.local_shape), "gather_full('", p.fqn, "'): expected a piece of shape ",
            at::IntArrayRef(p.local_shape), ", got ", piece.sizes());
  at::Tensor t = piece.detach().contiguous();
  if (p.fsdp) {
    Communicator& dp_shard = mesh_->comm(p.fsdp_axis);
    auto sizes = t.sizes().vec();
    sizes[0] = p.fsdp_range.chunk;
    at::Tensor padded = at::zeros(sizes, t.options());
    padded.narrow(0, 0, t.size(0)).copy_(t);
    sizes[0] *= dp_shard.size();
    at::Tensor all = at::empty(sizes, t.options());
    dp_shard.all_gather_into_tensor(all, padded, "gather_full.dp_shard");
    t = all.narrow(0, 0, p.tp_local_shape[0]);
  }
  // Experts: every ep rank's blocks, in ep rank order (which is expert order).
  if (p.expert_parallel()) t = all_gather_dim(t, mesh_->comm(MeshAxis::kEp), 0);
  Communicator& tp_comm = tp_group();
  if (p.tp.is_shard() && tp_comm.size() > 1) {
    const int64_t d = p.tp.dim(), n = tp_comm.size(), parts = p.tp.partitions();
    at::Tensor g = all_gather_dim(t, tp_comm, d);  // [.., n * parts * q, ..]: rank-major
    if (parts > 1) {
      at::Tensor front = g.movedim(d, 0);
      auto rest = front.sizes().slice(1).vec();
      std::vector<int64_t> split = {n, parts, front.size(0) / (n * parts)};
      split.insert(split.end(), rest.begin(), rest.end());
      front = front.reshape(split).transpose(0, 1).reshape(front.sizes());  // partition-major
      g = front.movedim(0, d);
    }
    t = g;
  }
  if (t.dim() >= 1 && t.size(0) != p.global_shape[0]) t = t.narrow(0, 0, p.global_shape[0]);
  return t.contiguous().clone();
}

std::vector<Box> ParallelContext::local_boxes(const ShardedParameter& p) const {
  // Per dim: segments (local start, padded global start, length) of the tp piece.
  struct Segment {
    int64_t local, global, length;
  };
  const size_t rank = p.global_shape.size();
  std::vector<std::vector<Segment>> dims(rank);
  for (size_t d = 0; d < rank; ++d) {
    if (p.tp.is_shard() && static_cast<size_t>(p.tp.dim()) == d && tp_size() > 1) {
      const int64_t part = p.padded_shape[d] / p.tp.partitions(), chunk = part / tp_size();
      for (int64_t j = 0; j < p.tp.partitions(); ++j) dims[d].push_back({j * chunk, j * part + tp_rank() * chunk, chunk});
    } else {
      // An expert piece starts at its first expert's row.
      dims[d].push_back({0, d == 0 ? p.ep_row_offset : 0, p.tp_local_shape[d]});
    }
  }
  // FSDP keeps rows [offset, offset + size) of the tp piece, renumbered from 0.
  if (p.fsdp && rank > 0) {
    std::vector<Segment> rows;
    const int64_t lo = p.fsdp_range.offset, hi = p.fsdp_range.offset + p.fsdp_range.size;
    for (const Segment& s : dims[0]) {
      const int64_t a = std::max(s.local, lo), b = std::min(s.local + s.length, hi);
      if (a < b) rows.push_back({a - lo, s.global + (a - s.local), b - a});
    }
    dims[0] = rows;
  }
  // Padding (rows at or past the logical size) belongs to no box.
  for (size_t d = 0; d < rank; ++d) {
    std::vector<Segment> kept;
    for (const Segment& s : dims[d]) {
      const int64_t length = std::min(s.global + s.length, p.global_shape[d]) - s.global;
      if (length > 0) kept.push_back({s.local, s.global, length});
    }
    dims[d] = kept;
  }
  std::vector<Box> boxes = {Box{}};
  for (size_t d = 0; d < rank; ++d) {
    std::vector<Box> next;
    for (const Box& b : boxes) {
      for (const Segment& s : dims[d]) {
        Box e = b;
        e.local_offset.push_back(s.local);
        e.global_offset.push_back(s.global);
        e.lengths.push_back(s.length);
        next.push_back(e);
      }
    }
    boxes = next;
  }
  return boxes;
}

bool ParallelContext::writes_piece(const ShardedParameter& p) const {
  const DeviceMesh& m = *mesh_;
  if (p.expert_parallel()) {  // one piece per ep rank (and edp rank when FSDP-sharded)
    return m.axis_rank(MeshAxis::kDpReplicate) == 0 && (p.fsdp || m.axis_rank(MeshAxis::kEdp) == 0) &&
           ((p.tp.is_shard() && tp_size() > 1) || m.axis_rank(MeshAxis::kTp) == 0);
  }
  return m.axis_rank(MeshAxis::kDpReplicate) == 0 && m.axis_rank(MeshAxis::kCp) == 0 &&
         (p.fsdp || m.axis_rank(MeshAxis::kDpShard) == 0) && ((p.tp.is_shard() && tp_size() > 1) || m.axis_rank(MeshAxis::kTp) == 0);
}

void ParallelContext::synchronize_gradients() {
  root_gathers_.clear();
  // Whether backward gave each trainable parameter a gradient on some rank: one flag per
  // parameter, summed over the world (the same decision on every rank, so every replica of a
  // piece skips or takes the update alike).
  std::vector<const ShardedParameter*> trainable;
  for (const auto& p : ordered_) {
    if (p->local.requires_grad()) trainable.push_back(p.get());
  }
  at::Tensor present = at::zeros({static_cast<int64_t>(trainable.size())}, at::TensorOptions().dtype(at::kFloat));
  for (size_t i = 0; i < trainable.size(); ++i) {
    if (trainable[i]->local.grad().defined()) present[static_cast<int64_t>(i)] = 1;
  }
  present = present.to(device_);
  Communicator& world = mesh_->comm(MeshAxis::kWorld);
  if (world.size() > 1 && !trainable.empty()) world.all_reduce(present, ReduceOp::kSum, "grad_sync.presence");
  present = present.cpu().contiguous();
  const auto ranks_with_gradient = present.accessor<float, 1>();
  // A trainable parameter without a gradient on this rank joins with zeros, so every rank's
  // buckets have the same layout (a different layout would make the collectives disagree).
  // A frozen one (requires_grad false, the same on every rank) has none and joins no bucket.
  for (const auto& p : ordered_) {
    if (p->local.requires_grad() && !p->local.grad().defined()) {
      p->local.mutable_grad() = at::zeros_like(p->local);
      reductions_[p->fqn].insert(kNoGradient);
    }
  }
  auto layout_of = [](const ShardedParameter& p) {
    return p.fsdp ? GradientLayout::kFsdp : GradientLayout::kUnsharded;
  };
  std::vector<PathGrad> partial_over_tp;
  for (const auto& p : ordered_) {
    if (!p->tp_partial_grad || !p->local.requires_grad()) continue;
    const GradientKind kind = p->expert_parallel() ? GradientKind::kExpert : GradientKind::kDense;
    const ReductionPath& path = gradient_path(kind, layout_of(*p), "tp");
    partial_over_tp.push_back({p->local.grad(), &path});
    if (tp_size() > 1) {
      reductions_[p->fqn].insert("tp");
      record_reduction_path(path, tp_size(), p->fqn);
    }
  }
  all_reduce_bucketed(partial_over_tp, tp_group());
  // Over each data-parallel axis, by the rule of reduction_paths.h (all_reduced_over): experts
  // under ep over dp_replicate and edp, dense ones over dp_replicate, cp and dp_shard; not over
  // the axis whose FSDP backward already reduce-scattered it.
  for (MeshAxis axis : {MeshAxis::kDpReplicate, MeshAxis::kCp, MeshAxis::kDpShard, MeshAxis::kEdp}) {
    const std::string_view axis_name = mesh_axis_name(axis);
    std::vector<PathGrad> grads;
    for (const auto& p : ordered_) {
      if (!p->local.requires_grad()) continue;
      // F23 (FAULTS.md): expert gradients reduced like dense ones, over cp and dp_shard (so
      // over the ep ranks, which hold other experts), not over edp.
      const bool expert = p->expert_parallel() && !fault::active(fault::Fault::kF23);
      const GradientKind kind = expert ? GradientKind::kExpert : GradientKind::kDense;
      if (!all_reduced_over(kind, layout_of(*p), axis_name)) continue;
      const ReductionPath& path = gradient_path(kind, layout_of(*p), axis_name);
      grads.push_back({p->local.grad(), &path});
      if (mesh_->comm(axis).size() > 1) {
        reductions_[p->fqn].insert(std::string(axis_name));
        record_reduction_path(path, mesh_->comm(axis).size(), p->fqn);
      }
    }
    all_reduce_bucketed(grads, mesh_->comm(axis));
  }
  // PyTorch's semantics: a parameter no rank's backward reached keeps no gradient, and the
  // optimizers skip it (torch.optim steps only parameters whose grad is not None; DDP leaves
  // a globally unused parameter's grad None). Zeros would let AdamW decay it and move it by
  // its momentum. One with a gradient on some ranks only took the others' zeros in the sum
  // above, as DDP does.
  without_gradient_.clear();
  for (size_t i = 0; i < trainable.size(); ++i) {
    if (ranks_with_gradient[static_cast<int64_t>(i)] > 0) continue;
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
    // Each piece is held by replicas() ranks: weight it so the sum over the world counts it once.
    // F04 (FAULTS.md): the replicated (unsharded) pieces counted once per rank holding them.
    const double replicas = fault::active(fault::Fault::kF04) ? 1.0 : static_cast<double>(p->replicas());
    local += g.to(at::kDouble).pow(2).sum().item<double>() / replicas;
  }
  at::Tensor total = at::full({1}, local, at::TensorOptions().dtype(at::kDouble).device(device_));
  // F03 (FAULTS.md): the norm of this rank's shards only, never summed over the mesh.
  if (!fault::active(fault::Fault::kF03)) {
    const ReductionPath& path = reduction_path("grad_norm.world");
    Communicator& world = mesh_->comm(MeshAxis::kWorld);
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

nlohmann::json ParallelContext::to_json() const {
  nlohmann::json params = nlohmann::json::array();
  for (const auto& p : ordered_) params.push_back(*p);
  nlohmann::json buffers = nlohmann::json::array();
  for (const auto& b : buffers_) {
    buffers.push_back({{"fqn", b.fqn}, {"shape", b.tensor.sizes().vec()}, {"persistent", b.persistent}});
  }
  return {{"parameters", params},
          {"buffers", buffers},
          {"fsdp_units", units_},
          {"sequence_parallel", sequence_parallel()},
          {"cp_layout", cp_layout_name(config_.cp_layout)},
          {"activation_checkpointing", config_.activation_checkpointing},
          {"checkpoint_regions", checkpoint_regions_}};
}

}  // namespace mih
