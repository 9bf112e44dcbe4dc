// ParallelContext: the parameter table of a model built on a DeviceMesh. Layers create their
// parameters through it (deterministic full init, this rank's tensor-parallel piece), FSDP
// units re-shard them on dim 0 over dp_shard, and after backward it synchronizes gradients
// (DDP and tensor-parallel partial sums), computes the global grad norm and gathers any
// sharded tensor back to its full value. One ShardedParameter per logical parameter: tied
// registrations are one entry (libtorch lists them twice; docs/spike-fsdp.md section 5).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <nlohmann/json_fwd.hpp>

#include "harness/parallel/activation_checkpoint.h"
#include "harness/parallel/activations.h"
#include "harness/parallel/context_parallel.h"
#include "harness/parallel/placement.h"
#include "harness/base/reduction_paths.h"
#include "harness/parallel/shared_state.h"
#include "harness/runtime/device_mesh.h"

namespace torch::nn {
class Module;
}

namespace mih {

/// Returns a parameter's full initial value for `shape`, drawing from `gen` (CPU, float64).
using ParamInit = std::function<at::Tensor(at::IntArrayRef shape, at::Generator& gen)>;

/// Initializers for ParamSpec::init.
namespace init {
ParamInit normal(double std);
ParamInit constant(double value);
}  // namespace init

/// What a layer asks ParallelContext::make_parameter for.
struct ParamSpec {
  /// Logical (unpadded, unsharded) shape, e.g. [V, H] with V = 37.
  std::vector<int64_t> shape;
  /// Layout along the tp axis: Replicate, or Shard(dim[, partitions]); dims must divide by tp
  /// (after padding).
  Placement tp = Placement::replicate();
  ParamInit init;
  /// Pad dim 0 up to a multiple of this (the padding rows are zero and never used), so a
  /// vocabulary of 37 shards over tp=2 as 19 + 19. 1 = no padding.
  int64_t pad_dim0_to_multiple = 1;
  /// The gradient is a partial sum over tp (a parameter replicated over tp that sees only
  /// this rank's tokens, e.g. a norm weight under sequence parallelism, or only this rank's
  /// heads, e.g. a per-head QK norm at any tp > 1: HeadRMSNorm): it is all-reduced over tp
  /// after backward.
  bool tp_partial_grad = false;
  /// Routed experts stacked on dim 0: dim 0 is `experts` equal blocks, one per expert (e.g.
  /// [E * 2F, H] for every expert's fused gate/up projection). Under ep > 1 each ep rank holds
  /// the blocks of its E / ep experts (Shard(0) over ep), FSDP shards that piece over edp, and
  /// the gradient is reduced over edp and dp_replicate only: the EXPERT gradient domain. 0: a
  /// dense parameter. Needs tp = Replicate.
  int64_t experts = 0;
};

/// One logical parameter: its layout over the mesh and this rank's piece.
struct ShardedParameter {
  /// Canonical FQN (the first registration in named_parameters order), and tied aliases.
  std::string fqn;
  std::vector<std::string> aliases;
  /// The leaf registered in the module(s): this rank's piece, what the optimizer updates.
  at::Tensor local;
  /// Logical shape, and the shape with dim-0 padding for even tensor-parallel shards.
  std::vector<int64_t> global_shape;
  std::vector<int64_t> padded_shape;
  Placement tp = Placement::replicate();
  bool tp_partial_grad = false;
  /// The shape compute sees on this rank: the TP piece (an FSDP parameter is gathered to it).
  std::vector<int64_t> tp_local_shape;
  /// This rank's piece and its offset in padded global coordinates (for a partitioned shard,
  /// the offset within each partition).
  std::vector<int64_t> local_shape;
  std::vector<int64_t> local_offset;
  /// Routed experts stacked on dim 0 (ParamSpec::experts; 0: dense), and under ep > 1 the
  /// first global row of this rank's experts (its ep piece is tp_local_shape).
  int64_t experts = 0;
  int64_t ep_row_offset = 0;
  /// Sharded on dim 0 of the TP (or ep) piece over `fsdp_axis` (FSDP: dp_shard, edp for
  /// experts under ep > 1), in `unit`; rows `fsdp_range`.
  bool fsdp = false;
  MeshAxis fsdp_axis = MeshAxis::kDpShard;
  ShardRange fsdp_range;
  std::string unit;
  /// Order of creation: parameters are initialized from seed + this index.
  int64_t index = 0;
  /// The mesh the parameter lives on (its degrees; the knobs are the context's).
  ParallelConfig mesh;

  /// Whether the experts are sharded over ep (experts > 0 and ep > 1).
  bool expert_parallel() const { return experts > 0 && mesh.ep > 1; }
  /// "EXPERT" for expert_parallel() parameters, else "DENSE".
  std::string gradient_kind() const { return expert_parallel() ? "EXPERT" : "DENSE"; }
  /// Placement along each mesh axis: {"dp_replicate": Replicate(), "dp_shard": Shard(0), ...};
  /// for expert_parallel() ones ep and edp take the place of dp_shard and cp.
  std::map<std::string, Placement> placements() const;
  /// Mesh axes whose gradient contributions are summed: every data-parallel axis (dp_replicate,
  /// dp_shard, cp) and tp when the gradient is partial over tp; for expert_parallel() ones
  /// dp_replicate and edp (every token that reached an expert was sent to its ep rank).
  std::vector<std::string> grad_domain() const;
  /// How many ranks hold the same piece (the product of the axes it is replicated over),
  /// within its pipeline stage.
  int64_t replicas() const;
  /// Pipeline parallelism: the pp ranks holding a copy of this logical parameter, ascending
  /// ({0} when pp = 1). Two or more: a parameter tied across stages (an embedding tied to the
  /// head), whose copies' gradients are summed over them and which counts once, on the first.
  std::vector<int> pp_ranks = {0};
  /// Whether this rank's copy is the one counted in the grad norm and written to checkpoints
  /// (it is on the first of pp_ranks).
  bool pp_counted = true;
};

void to_json(nlohmann::json& j, const ShardedParameter& p);

/// A buffer of the model (not a parameter): replicated on every rank. A non-persistent one
/// (a rotary inv_freq table) is rebuilt from the config, never saved or loaded.
struct BufferEntry {
  std::string fqn;
  at::Tensor tensor;
  bool persistent = true;
  /// Non-persistent only: recomputes the buffer's value in place (after a checkpoint load).
  std::function<void()> rebuild;
};

/// One pipeline stage of this rank (ParallelContext::pipeline_stages): its index in model
/// order and its decoder layers [first_layer, last_layer) in global layer index.
struct PipelineStage {
  int stage = 0;
  int64_t first_layer = 0;
  int64_t last_layer = 0;
  /// The first stage also owns the embeddings; the last the final norm, the head and the loss.
  bool first = true;
  bool last = true;
};

/// The parameters of one model on one mesh. Not thread-safe; one per rank.
class ParallelContext {
 public:
  /// `mesh` must outlive the context. What the context reads of `config`: the knobs
  /// sequence_parallel, cp_layout, activation_checkpointing, noise_twin (the linear layers'
  /// reduction orders), dtype (master_dtype: of the parameters, the master weights) and seed (of parameter init and dropout); its mesh degrees must be the
  /// mesh's. Parameters live on `device`.
  /// Throws: mih::Error{kInvalidSpec} if the config's mesh degrees differ from the mesh's.
  ParallelContext(DeviceMesh& mesh, const ParallelConfig& config,
                  c10::Device device = c10::Device(c10::DeviceType::CPU));

  DeviceMesh& mesh() const { return *mesh_; }
  const ParallelConfig& config() const { return config_; }
  /// dtype and device of the parameters (float32 in the autocast lanes, bfloat16 and float16).
  c10::ScalarType param_dtype() const { return param_dtype_; }
  c10::Device device() const { return device_; }
  /// The tensor-parallel group (tp_size ranks; the ShardedParameter.tp placement is along it).
  Communicator& tp_group() const { return mesh_->comm(MeshAxis::kTp); }
  int64_t tp_size() const { return tp_group().size(); }
  int64_t tp_rank() const { return tp_group().rank(); }
  bool sequence_parallel() const { return config_.sequence_parallel && tp_size() > 1; }
  /// The cp axis and layout: what CP attention and rotary positions need.
  CpShard cp_shard() const { return CpShard{&mesh_->comm(MeshAxis::kCp), config_.cp_layout}; }
  /// This rank's tokens of `x`, a tensor that holds its cp rank's whole local sequence on
  /// `dim` (a batch field as the Trainer hands it to the model: position_ids, an image-token
  /// index): under sequence parallelism the tp_rank()-th of tp_size() contiguous chunks, the
  /// tokens an activation between tensor-parallel layers holds on this rank (the output of
  /// VocabParallelEmbedding or RowParallelLinear, the residual stream); `x` itself otherwise.
  /// Shape: [.., S/CP, ..] -> [.., S/(CP*TP), ..] under sequence parallelism.
  /// Throws: mih::Error{kInvalidSpec} as sp_shard_sequence (context_parallel.h).
  at::Tensor sequence_parallel_chunk(const at::Tensor& x, int64_t dim = 1) const {
    return sequence_parallel() ? sp_shard_sequence(x, dim, tp_size(), tp_rank()) : x;
  }
  /// The global indices of the tokens this rank holds of an activation with `local_seq`
  /// tokens on its sequence dim: cp rank's tokens (its layout), cut to this tp rank's chunk
  /// when `sequence_sharded_over_tp` (an activation between tensor-parallel layers under
  /// sequence parallelism; see sequence_token_ids in context_parallel.h for an example).
  /// Shape: [local_seq] int64 (CPU).
  at::Tensor local_token_ids(int64_t local_seq, bool sequence_sharded_over_tp) const {
    const int64_t sp_tp = sequence_sharded_over_tp ? tp_size() : 1;
    const CpShard cp = cp_shard();
    return sequence_token_ids(local_seq * sp_tp * cp.size(), cp.size(), cp.rank(), cp.layout, sp_tp,
                              sp_tp > 1 ? tp_rank() : 0);
  }

  /// Runs `forward(inputs)` as the activation-checkpoint region `name` (one decoder layer,
  /// say) when activation checkpointing is on, else plainly; either way the region is listed
  /// in checkpoint_regions(). `params` are the leaves the region reads (its module's
  /// parameters, plus tied ones). See mih::checkpoint for what inputs must hold.
  at::Tensor checkpoint_region(const std::string& name, const RegionForward& forward,
                               const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& params);
  /// Starts a micro-batch: the dropout masks of what follows are keyed by (seed, `step`, call,
  /// global element index), and activations are placed from global row `first_row` (the
  /// rank's first row of the micro-batch in the global batch). The Trainer calls it before
  /// each micro-batch's forward; without it, step 0 and row 0.
  void begin_micro_batch(int64_t step, int64_t first_row);
  /// Dropout with probability `p` (inverted: kept values scaled by 1 / (1 - p)) whose mask
  /// depends only on the global position of each element (see activations.h): any split of
  /// the activation over dp_replicate, dp_shard, cp and tp, and any number of micro-batches,
  /// draws the mask of the single-rank run. `layout` says where this rank's piece sits.
  /// Each call draws a key from a generator the activation-checkpoint recompute replays, so
  /// the recompute draws the masks of the forward. Identity when p == 0 or `training` is
  /// false. Shape: [B, S, F...] -> the same.
  /// Throws: mih::Error{kInvalidSpec} for p outside [0, 1), or a shape of fewer than 3 dims.
  at::Tensor dropout(const at::Tensor& x, double p, bool training, const ActivationLayout& layout);

  /// Declares `out` the forward output of `module` (a registered submodule of the model)
  /// for the activation probes: when they are on (the session's first two steps and its last) and
  /// the module is watched, records its statistics and hooks the gradient of the loss with
  /// respect to it. Returns `out` (a view of it when hooked; use the returned tensor).
  /// Shape: [B, S, F...], placed by `layout`.
  at::Tensor observe(const torch::nn::Module& module, const at::Tensor& out, const ActivationLayout& layout);
  ActivationProbes& activation_probes() { return *activation_probes_; }

  /// The model's shared state between layers (see shared_state.h).
  SharedState& shared_state() { return shared_state_; }

  /// The activation-checkpoint regions the model declared, in first-run order.
  const std::vector<std::string>& checkpoint_regions() const { return checkpoint_regions_; }
  /// What activation checkpointing did to one region on this rank since the build.
  struct RegionCounts {
    /// Forwards run under checkpointing whose output needs a gradient: each owes a recompute.
    int64_t checkpointed = 0;
    /// Recomputes of the region in backward (counted as mih::checkpoint's backward reruns it).
    int64_t recomputed = 0;
  };
  /// Per region name, what ran under activation checkpointing and what backward recomputed
  /// (empty when it is off): the runtime's own record, not the config's claim. The session
  /// writes it per step to check/activation_checkpoint.json.
  std::map<std::string, RegionCounts> checkpoint_counts() const;

  /// Declares a buffer the model registered as non-persistent: rebuilt from the config, not
  /// saved in or loaded from checkpoints (PyTorch's register_buffer(persistent=False)).
  /// `rebuild` recomputes it in place; a checkpoint load calls it. Capture tensors and
  /// values, not the module.
  void mark_non_persistent(const at::Tensor& buffer, std::function<void()> rebuild);
  /// Recomputes every non-persistent buffer (see mark_non_persistent).
  void rebuild_non_persistent_buffers();
  /// Every buffer of the model with its FQN (after finalize), in named_buffers order.
  const std::vector<BufferEntry>& buffers() const { return buffers_; }

  /// Creates a parameter: the full value of spec.shape from spec.init (seeded by the config's
  /// seed and the creation index), padded, and this rank's tp piece of it, as a leaf that
  /// requires grad, in param_dtype() on device(). The caller registers it in its module.
  /// Throws: mih::Error{kInvalidSpec} if the sharded dim does not divide by tp (naming the
  ///   dim, its size and tp, and the fix).
  at::Tensor make_parameter(const ParamSpec& spec);

  /// The tensor a layer computes with: for an FSDP parameter the all-gathered TP piece (its
  /// backward reduce-scatters the gradient), else the leaf itself. Inside
  /// fsdp_forward of the parameter's unit, a second use (a tied parameter) reuses the gather.
  /// Throws: mih::Error{kInvalidSpec} if `leaf` was not made by this context.
  at::Tensor use(const at::Tensor& leaf);

  /// Runs the forward of FSDP unit `unit` (`forward` returns its output) and reshards after
  /// it, as PyTorch FSDP does: the parameters gathered during it are freed when it returns,
  /// and gathered again (into the same storage, so the saved tensors of backward see them)
  /// when the gradient of the output arrives, before the unit's own backward runs. Their
  /// gradients are reduce-scattered by the gathers' backward as usual. Use it for every unit
  /// but the root (whose parameters backward needs at once). Identity when dp_shard == 1.
  /// Throws: mih::Error{kInvalidSpec} when called inside another unit's forward.
  at::Tensor fsdp_forward(const std::string& unit, const std::function<at::Tensor()>& forward);

  /// Makes `module` an FSDP unit named `unit`: every parameter registered under it that no
  /// earlier unit took is sharded on dim 0 over dp_shard (uneven: ceil-sized chunks, the last
  /// ones smaller or empty). Call before the optimizer is built. No-op when dp_shard == 1
  /// (the unit is still recorded).
  void fully_shard(torch::nn::Module& module, const std::string& unit);

  /// Pipeline parallelism: the stages of this rank for a model of `layers` decoder layers,
  /// in model order (pp::stage_layers over the config's pp and vpp): one stage holding every
  /// layer, first and last, when the config is not pipelined. A model that supports pp calls
  /// it in its constructor, builds the layers of these stages (named by their global index)
  /// and the embeddings or head only on the first or last stage, and builds every other
  /// module under skip_parameters(), so that the creation indices, and so the initial
  /// values, are those of the unsplit model.
  /// Throws: mih::Error{kInvalidSpec} with the arithmetic when the stages do not divide the
  ///   layers, or when called twice with different layer counts.
  std::vector<PipelineStage> pipeline_stages(int64_t layers);
  /// The layer count the model split (pipeline_stages); 0 if it never asked.
  int64_t pipeline_layers() const { return pipeline_layers_; }
  /// While the returned guard lives, make_parameter creates no parameter: it advances the
  /// creation index and returns an uninitialized tensor of the logical shape on the meta
  /// device (no storage), for a module of another pipeline stage that is built only to keep
  /// the creation indices and then dropped (never registered in the model).
  class SkipParameters {
   public:
    explicit SkipParameters(ParallelContext& ctx) : ctx_(&ctx), before_(ctx.skipping_) { ctx.skipping_ = true; }
    ~SkipParameters() { ctx_->skipping_ = before_; }
    SkipParameters(const SkipParameters&) = delete;
    SkipParameters& operator=(const SkipParameters&) = delete;

   private:
    ParallelContext* ctx_;
    bool before_;
  };
  SkipParameters skip_parameters() { return SkipParameters(*this); }

  /// Names every parameter by its FQNs in `root` (ties become aliases). Under pp (a
  /// collective over the pp group then) it also finds which pp ranks hold each logical
  /// parameter (ShardedParameter::pp_ranks).
  /// Throws: mih::Error{kInvalidSpec} naming a parameter of `root` that was not made by
  ///   this context, or one made here that `root` does not register; under pp, when the pp
  ///   ranks created different numbers of parameters (a stage built its skipped modules
  ///   without skip_parameters) or hold tied copies of different shapes.
  void finalize(torch::nn::Module& root);

  /// Every logical parameter once, in named_parameters order (after finalize).
  const std::vector<std::shared_ptr<ShardedParameter>>& parameters() const { return ordered_; }
  /// The entry of a leaf. Throws: mih::Error{kInternal} if it is not in the table.
  ShardedParameter& parameter(const at::Tensor& leaf) const;
  /// The module that owns `leaf` (its FQN less the last component: "layers.0.mlp.down_proj"),
  /// or "" before finalize or for a tensor not in the table. For naming layers in evidence.
  std::string layer_of(const at::Tensor& leaf) const;

  /// The full logical value of a tensor laid out like `p.local` (the parameter, its gradient
  /// or an optimizer state), on every rank: all-gathered over dp_shard (FSDP) and tp, the
  /// partitions of a strided shard put back in order, padding removed.
  /// Shape: piece p.local_shape -> p.global_shape.
  at::Tensor gather_full(const ShardedParameter& p, const at::Tensor& piece) const;

  /// Where this rank's piece of `p` (and of any tensor laid out like p.local: its gradient,
  /// its optimizer state) sits in the logical tensor, as boxes: the tp shard's partitions, cut
  /// to the FSDP rows, with padding removed. The boxes of all ranks cover the logical tensor;
  /// replicas cover the same boxes.
  std::vector<Box> local_boxes(const ShardedParameter& p) const;

  /// True if this rank is the one copy of `p`'s piece that a checkpoint writes: coordinate 0
  /// on every mesh axis the piece is replicated over.
  bool writes_piece(const ShardedParameter& p) const;

  /// After the backward passes of a step: all-reduces (sum) the gradients that are partial
  /// over tp, then every gradient over dp_replicate and cp, and over dp_shard for parameters
  /// not sharded by FSDP (whose backward already reduce-scattered them); expert_parallel()
  /// ones over dp_replicate, and over edp unless FSDP reduce-scattered them. Flat buckets,
  /// one all-reduce per axis, reduction path (reduction_paths.h: its site labels the
  /// collective) and dtype. A trainable parameter that backward gave no gradient
  /// on this rank joins them with zeros; one that no rank's backward gave a gradient (a
  /// vision tower on a text-only batch) is left without one afterwards (grad undefined, and
  /// listed in parameters_without_gradient()), so the optimizer skips it as PyTorch's do for
  /// a grad of None (DDP leaves a globally unused parameter's grad None too). Which is decided
  /// on every rank alike from one all-reduce of a flag per parameter over the world
  /// ("grad_sync.presence").
  void synchronize_gradients();

  /// The trainable parameters (canonical FQNs) that no rank's backward gave a gradient before
  /// the last synchronize_gradients(): their grad is undefined until the next backward.
  const std::set<std::string>& parameters_without_gradient() const { return without_gradient_; }

  /// The mesh axes (of degree > 1) each parameter's gradient was reduced over since
  /// reset_gradient_reductions(), by canonical FQN: dp_shard when FSDP's backward
  /// reduce-scattered it, and the axes of synchronize_gradients' all-reduces; kNoGradient
  /// when backward left it no gradient on this rank (zero-filled for the synchronization,
  /// and undefined after it when no rank had one).
  /// What the GradientSync suite holds against each parameter's grad_domain().
  const std::map<std::string, std::set<std::string>>& gradient_reductions() const { return reductions_; }
  static constexpr const char* kNoGradient = "(no gradient)";
  /// Starts a step's record of gradient_reductions() (the Trainer calls it before backward).
  void reset_gradient_reductions() { reductions_.clear(); }

  /// A reduction path (reduction_paths.h) taken with its axis of more than one rank: the
  /// axis size, and the canonical FQNs of the parameters whose gradients took it (empty for a
  /// per-step path: grad_norm, the loss normalizers).
  struct ReachedPath {
    int64_t axis_size = 0;
    std::set<std::string> parameters;
  };
  /// The reduction paths taken since the context was made, by path name: what the runtime's
  /// collectives did (each labelled with its path's site), not what the layout predicts.
  const std::map<std::string, ReachedPath>& reached_reduction_paths() const { return reached_paths_; }
  /// Records that `path` ran over an axis of `axis_size` ranks (nothing when it is 1: the
  /// collective moved nothing), for the gradient of parameter `fqn` ("" for a per-step path).
  /// synchronize_gradients, the FSDP reduce-scatter and grad_norm call it; a training loop
  /// calls it for the loss normalizers (the Trainer does).
  void record_reduction_path(const ReductionPath& path, int64_t axis_size, const std::string& fqn = "");

  /// The global L2 norm of the gradients: every element of every logical parameter counted
  /// exactly once whatever its placements (local sums of squares weighted by 1 / replicas,
  /// one all-reduce over the world). Computed in float64.
  double grad_norm();

  /// Clips the gradients to `max_norm` by global L2 norm with PyTorch's rule
  /// (clip_coef = max_norm / (norm + 1e-6), applied when < 1; torch.nn.utils.clip_grad_norm_)
  /// and returns the norm before clipping.
  double clip_grad_norm(double max_norm);

  /// The FSDP units, in declaration order.
  const std::vector<std::string>& fsdp_units() const { return units_; }
  /// The FSDP-sharded parameters (canonical FQNs) all-gathered (use()) in the forwards of the
  /// current step (since its first begin_micro_batch), each with the number of forwards
  /// (micro-batches) that gathered it: what FSDP moved this step. A parameter the step never
  /// used (a vision tower, a projector on a text-only batch) is absent.
  std::map<std::string, int64_t> fsdp_gather_forwards() const;
  /// The unit fully_shard made of the model's root module (the one finalize names), whose
  /// parameters FSDP never reshards after forward; "" if none.
  const std::string& root_unit() const { return root_unit_; }

  /// JSON for evidence: every parameter's layout, and the FSDP units.
  nlohmann::json to_json() const;

 private:
  DeviceMesh* mesh_;
  ParallelConfig config_;
  c10::ScalarType param_dtype_;
  c10::Device device_;
  int64_t next_index_ = 0;
  void find_pipeline_copies();  // finalize under pp: pp_ranks, tied_over_pp_
  // Parameters tied across pipeline stages: (creation index, local element count).
  std::vector<std::pair<int64_t, int64_t>> tied_over_pp_;
  bool skipping_ = false;          // SkipParameters alive
  int64_t pipeline_layers_ = 0;    // pipeline_stages(layers)
  std::map<const void*, std::shared_ptr<ShardedParameter>> by_impl_;
  std::vector<std::shared_ptr<ShardedParameter>> ordered_;
  std::vector<std::string> units_;
  std::vector<std::pair<const torch::nn::Module*, std::string>> unit_modules_;
  std::string root_unit_;
  std::vector<std::string> checkpoint_regions_;
  struct CheckpointLedger;  // checkpoint_counts(), shared with the recomputes in backward
  std::shared_ptr<CheckpointLedger> checkpoint_ledger_;
  std::map<const void*, std::function<void()>> non_persistent_;
  std::vector<BufferEntry> buffers_;
  std::map<std::string, std::set<std::string>> reductions_;
  std::set<std::string> without_gradient_;
  std::map<std::string, ReachedPath> reached_paths_;
  SharedState shared_state_;
  at::Generator dropout_gen_;  // the per-call dropout keys (see dropout())
  int64_t first_row_ = 0, micro_batch_ = 0;
  int64_t step_ = -1;
  // (parameter, forward index) of every FSDP gather of the current step: fsdp_gather_forwards().
  std::set<std::pair<std::string, int64_t>> gathers_;
  std::unique_ptr<ActivationProbes> activation_probes_;
  // fsdp_forward: the unit whose forward runs, and the parameters gathered in it, in the
  // order of their first use, the same on every rank (the regathers are collectives).
  std::string active_unit_;
  std::vector<std::pair<const void*, at::Tensor>> unit_gathers_;
  // The root's gathered parameters of the current forward (shared_state_.forward_index()):
  // a parameter the root uses twice (a tied embedding and head) is gathered, and its gradient
  // reduce-scattered, once per forward, as FSDP does for the root, which it does not reshard
  // after forward. Dropped after backward (synchronize_gradients).
  struct RootGather {
    const void* impl;
    int64_t forward;
    at::Tensor full;
  };
  std::vector<RootGather> root_gathers_;
};

}  // namespace mih
