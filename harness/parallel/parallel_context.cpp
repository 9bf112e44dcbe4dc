// ParallelContext: parameter creation and layout, full-tensor gathers, checkpoint regions;
// FSDP in parallel_context_fsdp.cpp, gradient synchronization and the grad norm in
// parallel_context_grads.cpp.
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
  if (pp_ranks.size() > 1) out.emplace_back("pp");  // copies tied across stages, summed over pp
  return out;
}

int64_t ShardedParameter::replicas() const {
  if (expert_parallel()) {
    return mesh.world_size() / mesh.pp / ((tp.is_shard() ? mesh.tp : 1) * mesh.ep * (fsdp ? edp_size(mesh) : 1));
  }
  int64_t pieces = (tp.is_shard() ? mesh.tp : 1) * (fsdp ? mesh.dp_shard : 1);
  return mesh.world_size() / mesh.pp / pieces;
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
  if (p.mesh.pp > 1) {
    j["pp_ranks"] = p.pp_ranks;
    j["pp_counted"] = p.pp_counted;  // this copy is the one the grad norm counts
  }
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
  // The keys are drawn in the call order of one forward through the whole model, restarted
  // per micro-batch; a pipeline stage would restart them at its first layer, and a recompute
  // under 1F1B would see another micro-batch's rows.
  MIH_CHECK(!config_.pipelined(), "dropout(p=", p, ") under pipeline parallelism (", config_.name(),
            ") is not supported yet: the masks would differ from the unsplit model's; set dropout to 0 for pp "
            "configs");
  uint64_t key = 0;
  {
    std::lock_guard<std::mutex> lock(dropout_gen_.mutex());
    key = at::check_generator<at::CPUGeneratorImpl>(dropout_gen_)->random64();
  }
  ActivationLayout where = layout;
  if (fault::active(fault::Fault::kF26)) {
    // F26 (docs/fault-catalog.md): the mask drawn as if the tensor were whole on every tp rank, so each
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
  // A module of another pipeline stage: its creation index is taken, nothing is created.
  if (skipping_) return at::empty(spec.shape, at::TensorOptions().dtype(param_dtype_).device(c10::DeviceType::Meta));
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

std::vector<PipelineStage> ParallelContext::pipeline_stages(int64_t layers) {
  MIH_CHECK(layers >= 1, "pipeline_stages: the model has ", layers, " decoder layers; it needs at least 1");
  MIH_CHECK(pipeline_layers_ == 0 || pipeline_layers_ == layers, "pipeline_stages: asked for ", layers,
            " layers after ", pipeline_layers_, "; a model splits one stack of decoder layers");
  pipeline_layers_ = layers;
  if (!config_.pipelined()) return {PipelineStage{0, 0, layers, true, true}};
  const pp::PipelineShape shape = config_.pipeline_shape();
  const auto split = with_context(internal::str("parallel config '", config_.name(), "'"),
                                  [&] { return pp::stage_layers(layers, shape); });
  std::vector<PipelineStage> out;
  for (int stage : shape.stages_of(mesh_->axis_rank(MeshAxis::kPp))) {
    out.push_back({stage, split[static_cast<size_t>(stage)].first, split[static_cast<size_t>(stage)].second,
                   stage == 0, stage == shape.stages() - 1});
  }
  return out;
}

void ParallelContext::mark_non_persistent(const at::Tensor& buffer, std::function<void()> rebuild) {
  if (skipping_) return;  // a module of another pipeline stage, never registered
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
  if (mesh_->config().pp > 1) find_pipeline_copies();
}

void ParallelContext::find_pipeline_copies() {
  Communicator& pp = mesh_->comm(MeshAxis::kPp);
  // Every pp rank took the same creation indices (the unsplit model's), its own stage's
  // parameters made, the others skipped: compare the counts first.
  at::Tensor counts = at::zeros({pp.size()}, at::kLong);
  counts[pp.rank()] = next_index_;
  counts = counts.to(device_);
  pp.all_reduce(counts, ReduceOp::kSum, "pipeline.parameter_count");
  counts = counts.cpu();
  for (int r = 0; r < pp.size(); ++r) {
    MIH_CHECK(counts[r].item<int64_t>() == next_index_, "pipeline: pp rank ", pp.rank(), " created ", next_index_,
              " parameters but pp rank ", r, " ", counts[r].item<int64_t>(),
              ": every stage must take the creation indices of the unsplit model; build the modules of other "
              "stages under ParallelContext::skip_parameters() (ParallelContext::pipeline_stages)");
  }
  // held[r][i]: the element count of pp rank r's copy of parameter i (0: r holds none).
  at::Tensor held = at::zeros({pp.size(), next_index_}, at::kLong);
  for (const auto& p : ordered_) held[pp.rank()][p->index] = p->local.numel();
  held = held.to(device_);
  pp.all_reduce(held, ReduceOp::kSum, "pipeline.parameter_copies");
  held = held.cpu().contiguous();
  const auto copies = held.accessor<int64_t, 2>();
  for (const auto& p : ordered_) {
    p->pp_ranks.clear();
    for (int r = 0; r < pp.size(); ++r) {
      const int64_t numel = copies[r][p->index];
      if (numel == 0 && r != pp.rank()) continue;
      MIH_CHECK(numel == p->local.numel(), "pipeline: '", p->fqn, "' has ", p->local.numel(),
                " elements on pp rank ", pp.rank(), " but its copy on pp rank ", r, " has ", numel,
                "; a parameter tied across stages must have one layout on every stage");
      p->pp_ranks.push_back(r);
    }
    p->pp_counted = p->pp_ranks.front() == pp.rank();
  }
  // A tied parameter's names on every stage (the embedding's FQN on the first, the head's
  // alias on the last) are each copy's names, so a pattern (frozen, no weight decay) that
  // names either treats every copy alike.
  nlohmann::json names = nlohmann::json::object();
  for (const auto& p : ordered_) {
    if (p->pp_ranks.size() < 2) continue;
    nlohmann::json list = {p->fqn};
    for (const auto& a : p->aliases) list.push_back(a);
    names[std::to_string(p->index)] = list;
  }
  const std::vector<nlohmann::json> every_stage = all_gather_json(pp, names, device_, "pipeline.tied_names");
  for (const auto& p : ordered_) {
    if (p->pp_ranks.size() < 2) continue;
    for (const nlohmann::json& stage : every_stage) {
      const auto it = stage.find(std::to_string(p->index));
      if (it == stage.end()) continue;
      for (const auto& n : *it) {
        const std::string name = n.get<std::string>();
        if (name != p->fqn && std::find(p->aliases.begin(), p->aliases.end(), name) == p->aliases.end()) {
          p->aliases.push_back(name);
        }
      }
    }
  }
  // The parameters tied across stages, in creation order (every pp rank walks the same list
  // in synchronize_gradients, holders and others alike): index and local element count.
  tied_over_pp_.clear();
  for (int64_t i = 0; i < next_index_; ++i) {
    int holders = 0;
    int64_t numel = 0;
    for (int r = 0; r < pp.size(); ++r) {
      if (copies[r][i] > 0) {
        ++holders;
        numel = copies[r][i];
      }
    }
    if (holders > 1) tied_over_pp_.emplace_back(i, numel);
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
  if (!p.pp_counted) return false;  // a copy tied across stages: the first stage's is written
  return m.axis_rank(MeshAxis::kDpReplicate) == 0 && m.axis_rank(MeshAxis::kCp) == 0 &&
         (p.fsdp || m.axis_rank(MeshAxis::kDpShard) == 0) && ((p.tp.is_shard() && tp_size() > 1) || m.axis_rank(MeshAxis::kTp) == 0);
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
