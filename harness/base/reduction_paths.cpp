// The table of reduction paths (see reduction_paths.h).
#include "harness/base/reduction_paths.h"

#include <array>

#include "harness/base/error.h"
#include "harness/base/strings.h"

namespace mih {
namespace {

using K = GradientKind;
using L = GradientLayout;

// The rows. A gradient path's name is kind.layout.axis and its site grad_sync.<name> (string
// literals: a CallSite keeps the pointer).
constexpr std::array<ReductionPath, 18> kPaths = {{
    {"dense.unsharded.tp", "tp", "all_reduce.sum", "grad_sync.dense.unsharded.tp",
     "a dense gradient partial over tp (a norm or bias under sequence parallelism, a per-head norm), whole", true,
     K::kDense, L::kUnsharded},
    {"dense.fsdp.tp", "tp", "all_reduce.sum", "grad_sync.dense.fsdp.tp",
     "a dense gradient partial over tp, its FSDP shard (after the reduce-scatter over dp_shard)", true, K::kDense,
     L::kFsdp},
    {"dense.unsharded.dp_replicate", "dp_replicate", "all_reduce.sum", "grad_sync.dense.unsharded.dp_replicate",
     "a dense gradient summed over the replicas, whole: plain data parallelism (DDP)", true, K::kDense, L::kUnsharded},
    {"dense.fsdp.dp_replicate", "dp_replicate", "all_reduce.sum", "grad_sync.dense.fsdp.dp_replicate",
     "a dense FSDP shard's gradient summed over the replicas: HSDP's replicate dim", true, K::kDense, L::kFsdp},
    {"dense.unsharded.cp", "cp", "all_reduce.sum", "grad_sync.dense.unsharded.cp",
     "a dense gradient summed over the cp ranks (each saw its tokens of every sequence), whole", true, K::kDense,
     L::kUnsharded},
    {"dense.fsdp.cp", "cp", "all_reduce.sum", "grad_sync.dense.fsdp.cp",
     "a dense FSDP shard's gradient summed over the cp ranks", true, K::kDense, L::kFsdp},
    {"dense.unsharded.dp_shard", "dp_shard", "all_reduce.sum", "grad_sync.dense.unsharded.dp_shard",
     "a dense gradient FSDP does not shard (a 0-d parameter, one outside every unit) summed over dp_shard", true,
     K::kDense, L::kUnsharded},
    {"dense.fsdp.dp_shard", "dp_shard", "reduce_scatter.sum", "grad_sync.dense.fsdp.dp_shard",
     "FSDP: the backward of a dense parameter's all-gather reduce-scatters its gradient over dp_shard", true,
     K::kDense, L::kFsdp},
    {"expert.unsharded.tp", "tp", "all_reduce.sum", "grad_sync.expert.unsharded.tp",
     "an expert gradient partial over tp (sequence parallelism routes each tp rank's tokens), whole", true,
     K::kExpert, L::kUnsharded},
    {"expert.fsdp.tp", "tp", "all_reduce.sum", "grad_sync.expert.fsdp.tp",
     "an expert gradient partial over tp, its FSDP shard over edp", true, K::kExpert, L::kFsdp},
    {"expert.unsharded.dp_replicate", "dp_replicate", "all_reduce.sum", "grad_sync.expert.unsharded.dp_replicate",
     "an expert gradient summed over the replicas, whole (edp == 1, or dp_shard == 1)", true, K::kExpert,
     L::kUnsharded},
    {"expert.fsdp.dp_replicate", "dp_replicate", "all_reduce.sum", "grad_sync.expert.fsdp.dp_replicate",
     "an expert FSDP shard's gradient summed over the replicas", true, K::kExpert, L::kFsdp},
    {"expert.unsharded.edp", "edp", "all_reduce.sum", "grad_sync.expert.unsharded.edp",
     "an expert gradient summed over the ranks of its ep index (edp), whole: FSDP does not shard it (dp_shard == 1, "
     "ep carved out of cp)",
     true, K::kExpert, L::kUnsharded},
    {"expert.fsdp.edp", "edp", "reduce_scatter.sum", "grad_sync.expert.fsdp.edp",
     "FSDP over edp: the backward of an expert parameter's all-gather reduce-scatters its gradient over edp", true,
     K::kExpert, L::kFsdp},
    {"grad_norm.world", "world", "all_reduce.sum", "grad_norm",
     "the global gradient norm: each rank's sum of squares weighted by 1 / replicas, summed over the world", false,
     K::kDense, L::kUnsharded},
    {"loss.valid_tokens.dp_cp", "dp_cp", "all_reduce.sum", "trainer.valid_tokens",
     "the loss normalizer: the valid targets of the global batch, counted over the data-parallel and cp ranks", false,
     K::kDense, L::kUnsharded},
    {"loss.sum.dp_cp", "dp_cp", "all_reduce.sum", "trainer.loss",
     "the reported loss: each rank's normalized loss summed over the data-parallel and cp ranks", false, K::kDense,
     L::kUnsharded},
    {"loss.micro_batches", "micro_batches", "accumulate", "",
     "gradient accumulation: each micro-batch's loss divided by the step's global valid-target count, the gradients "
     "summed locally over the micro-batches",
     false, K::kDense, L::kUnsharded},
}};

int fsdp_axis_size(const ParallelConfig& mesh, GradientKind kind) {
  // ParallelContext::fully_shard: nothing is sharded when dp_shard == 1; experts under ep are
  // sharded over edp, when it has more than one rank.
  if (mesh.dp_shard <= 1) return 1;
  return kind == GradientKind::kExpert ? axis_size(mesh, "edp") : mesh.dp_shard;
}

// Whether a parameter of the path's kind and layout, tp-partial when the path is over tp, takes
// `path` on `mesh` with its axis of size > 1.
bool reaches(const ReductionPath& path, const ParallelConfig& mesh) {
  if (axis_size(mesh, path.axis) <= 1) return false;
  if (!path.per_parameter) return true;
  if (path.kind == GradientKind::kExpert && mesh.ep <= 1) return false;  // experts are dense at ep = 1
  if (path.layout == GradientLayout::kFsdp && fsdp_axis_size(mesh, path.kind) <= 1) return false;
  if (path.axis == "tp") return true;  // a tp-partial parameter of either layout
  if (path.op == "reduce_scatter.sum") return true;
  return all_reduced_over(path.kind, path.layout, path.axis);
}

}  // namespace

std::string_view gradient_kind_name(GradientKind kind) { return kind == GradientKind::kExpert ? "expert" : "dense"; }

std::string_view gradient_layout_name(GradientLayout layout) {
  return layout == GradientLayout::kFsdp ? "fsdp" : "unsharded";
}

std::span<const ReductionPath> reduction_paths() { return kPaths; }

const ReductionPath& reduction_path(std::string_view name) {
  for (const auto& p : kPaths) {
    if (p.name == name) return p;
  }
  MIH_THROW(Code::kInvalidSpec, "unknown reduction path '", name, "'; paths: ",
            join(kPaths, ", ", [](const ReductionPath& p) { return std::string(p.name); }));
}

const ReductionPath& gradient_path(GradientKind kind, GradientLayout layout, std::string_view axis) {
  for (const auto& p : kPaths) {
    if (p.per_parameter && p.kind == kind && p.layout == layout && p.axis == axis) return p;
  }
  MIH_INTERNAL_ASSERT(false, "no reduction path for a ", gradient_kind_name(kind), " ", gradient_layout_name(layout),
                      " gradient over '", axis, "'");
  return kPaths[0];
}

bool all_reduced_over(GradientKind kind, GradientLayout layout, std::string_view axis) {
  const bool expert = kind == GradientKind::kExpert;
  if (layout == GradientLayout::kFsdp && axis == (expert ? "edp" : "dp_shard")) return false;
  if (expert) return axis == "dp_replicate" || axis == "edp";
  return axis == "dp_replicate" || axis == "cp" || axis == "dp_shard";
}

int axis_size(const ParallelConfig& mesh, std::string_view axis) {
  if (axis == "dp_replicate") return mesh.dp_replicate;
  if (axis == "dp_shard") return mesh.dp_shard;
  if (axis == "cp") return mesh.cp;
  if (axis == "tp") return mesh.tp;
  if (axis == "ep") return mesh.ep;
  if (axis == "edp") return mesh.dp_shard * mesh.cp / mesh.ep;
  if (axis == "dp") return mesh.dp_replicate * mesh.dp_shard;
  if (axis == "dp_cp") return mesh.dp_replicate * mesh.dp_shard * mesh.cp;
  if (axis == "dp_shard_cp") return mesh.dp_shard * mesh.cp;
  if (axis == "world") return mesh.world_size();
  if (axis == "micro_batches") return mesh.micro_batches;
  MIH_THROW(Code::kInvalidSpec, "unknown axis '", axis,
            "'; axes: dp_replicate, dp_shard, cp, tp, ep, edp, dp, dp_cp, dp_shard_cp, world, micro_batches");
}

ParallelConfig smallest_mesh(const ReductionPath& path) {
  if (path.axis == "micro_batches") {
    ParallelConfig c;
    c.micro_batches = 2;
    return c;
  }
  constexpr int kDegrees[] = {1, 2, 4, 8};
  for (int world = 1; world <= 16; world *= 2) {
    for (int dp_replicate : kDegrees) {
      for (int dp_shard : kDegrees) {
        for (int cp : kDegrees) {
          for (int tp : kDegrees) {
            if (dp_replicate * dp_shard * cp * tp != world) continue;
            for (int ep : kDegrees) {
              if ((dp_shard * cp) % ep != 0) continue;
              ParallelConfig c;
              c.dp_replicate = dp_replicate;
              c.dp_shard = dp_shard;
              c.cp = cp;
              c.tp = tp;
              c.ep = ep;
              if (reaches(path, c)) return c;
            }
          }
        }
      }
    }
  }
  MIH_INTERNAL_ASSERT(false, "reduction path '", path.name, "' is reached by no mesh of at most 16 ranks");
  return {};
}

}  // namespace mih
