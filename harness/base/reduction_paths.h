// The reduction paths of the runtime as data: every way a gradient or a loss term is summed
// across ranks (ParallelContext::synchronize_gradients, the FSDP reduce-scatter, grad_norm, the
// Trainer's loss normalizers), one named row each. Each collective of a path is labelled with
// the path's site, and ParallelContext records which paths a step took, with which parameters
// (cases/runtime/reduction_paths.json), so `mih reach` can tell which paths a run exercised.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "harness/base/parallel_config.h"

namespace mih {

/// Which parameters a gradient path carries: dense ones, or routed experts sharded over ep
/// (ShardedParameter::expert_parallel(), whose gradient domain is edp and dp_replicate).
enum class GradientKind { kDense, kExpert };
/// What the collective sums: the whole (tp-local) gradient of a parameter FSDP does not shard
/// (dp_shard == 1, a 0-d parameter, one outside every unit), or its FSDP shard.
enum class GradientLayout { kUnsharded, kFsdp };

/// "dense" / "expert", "unsharded" / "fsdp".
std::string_view gradient_kind_name(GradientKind kind);
std::string_view gradient_layout_name(GradientLayout layout);

/// One reduction path.
struct ReductionPath {
  /// "dense.unsharded.dp_replicate": kind.layout.axis for a gradient path, else what it sums
  /// and the axis ("grad_norm.world", "loss.valid_tokens.dp_cp").
  std::string_view name;
  /// The mesh axis the collective runs over (mesh_axis_name: "tp", "dp_replicate", "cp",
  /// "dp_shard", "edp", "world", "dp_cp"), or "micro_batches" for the local accumulation.
  /// A path is exercised when this axis has more than one rank (micro-batch).
  std::string_view axis;
  /// "all_reduce.sum", "reduce_scatter.sum" (FSDP) or "accumulate" (no collective).
  std::string_view op;
  /// The CallSite label of its collectives (the comm ledger's `site`): "grad_sync.<name>" for a
  /// gradient path (the FSDP reduce-scatter included), "grad_norm", "trainer.valid_tokens",
  /// "trainer.loss"; "" for the accumulation, which moves nothing.
  const char* site;
  /// One line: what is summed and when a parameter takes it.
  std::string_view what;
  /// A gradient path: one per parameter (kind and layout below); else one per step.
  bool per_parameter = true;
  GradientKind kind = GradientKind::kDense;
  GradientLayout layout = GradientLayout::kUnsharded;
};

/// Every reduction path of the runtime, in a fixed order. How to add one: a row in
/// reduction_paths.cpp, then label its collective with the row's site and record it
/// (ParallelContext::record_reduction_path); `mih reach` and its test pick it up.
std::span<const ReductionPath> reduction_paths();

/// The path `name`. Throws: mih::Error{kInvalidSpec} listing the names.
const ReductionPath& reduction_path(std::string_view name);

/// The gradient path of a parameter of `kind` and `layout` over `axis` ("tp" for a gradient
/// partial over tp). Throws: mih::Error{kInternal} when the runtime has no such path (e.g.
/// a dense gradient over edp).
const ReductionPath& gradient_path(GradientKind kind, GradientLayout layout, std::string_view axis);

/// The rule synchronize_gradients applies (with the tp-partial sum, which is separate): whether
/// a gradient of `kind` and `layout` is all-reduced over the data-parallel `axis`
/// ("dp_replicate", "cp", "dp_shard", "edp"). Dense gradients over dp_replicate, cp and
/// dp_shard; expert ones over dp_replicate and edp (every token that reached an expert was sent
/// to its ep rank); never over the axis FSDP already reduce-scattered them over (dp_shard for
/// dense, edp for experts).
bool all_reduced_over(GradientKind kind, GradientLayout layout, std::string_view axis);

/// The size of `axis` (a mesh axis name, or "micro_batches") on `mesh`: edp is
/// dp_shard * cp / ep, dp_cp dp_replicate * dp_shard * cp, world every rank.
/// Throws: mih::Error{kInvalidSpec} for another name.
int axis_size(const ParallelConfig& mesh, std::string_view axis);

/// The smallest mesh on which a model can take `path` with its axis of size > 1: the meshes
/// of at most 16 ranks (degrees 1, 2, 4, 8; ep dividing dp_shard * cp), for each a parameter
/// of the path's kind in any layout the runtime can give it (FSDP needs dp_shard > 1, and
/// edp > 1 for experts; any parameter can stay unsharded: 0-d, or outside every FSDP unit),
/// tp-partial or not, and the rule above. Fewest ranks first, then TorchTitan's axis order.
ParallelConfig smallest_mesh(const ReductionPath& path);

}  // namespace mih
