// ParallelContext's FSDP: units that gather their parameters for forward (and again for
// backward), free them after, and reduce-scatter their gradients.
#include "harness/parallel/parallel_context.h"

#include <functional>
#include <map>
#include <string>

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include "harness/base/error.h"

namespace mih {

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
    // The contract: a unit whose output needs a gradient gathers each parameter its forward
    // gathered once more for backward (the regather below, or an activation-checkpoint
    // recompute), moving each rank's padded shard; one its forward never used (CLIP's
    // post_layernorm in LLaVA) is gathered neither time. A unit that is frozen and fed no
    // gradient (a frozen encoder at the input) is gathered once.
    for (const auto& p : ordered_) {
      if (!p->fsdp || p->unit != unit || !gathers_.count({p->fqn, shared_state_.forward_index()})) continue;
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

}  // namespace mih
