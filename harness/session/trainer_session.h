// TrainerSession: the validation session's hooks for a libtorch trainer that is not mih's
// (docs/evidence.md, "Use mih with your own trainer"). The trainer keeps its modules, its
// optimizer (any torch::optim::Optimizer), its own gradient synchronization and sharding; it
// describes its parameters (a parameter table), passes its c10d process groups through
// recording wrappers, marks its modules' outputs, and calls the hooks at the seed's points.
// The session writes the evidence contract (mih-evidence version 1) under the case directory,
// and `mih check <root>` judges it against the case's 1-rank run (compare_to): NumericParity
// (localized to the first module or parameter that diverges), InputIdentity,
// ReplicaConsistency (every copy of a parameter piece after the optimizer), GradientSync
// (every copy of a gradient piece after the trainer's synchronization) and CheckpointRoundTrip.
//
// No mih layer, model class, ParallelContext or spec is needed. Every rank calls every hook in
// the same order (several are collectives over the world group); rank 0 writes the files.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include "harness/compat/adopt.h"
#include "harness/runtime/communicator.h"

namespace torch::optim {
class Optimizer;
}

namespace mih {

/// How a local tensor lies in its global tensor along one mesh axis (DTensor's placements):
/// Replicate() (every rank of the axis holds the same elements) or Shard(dim) (the global
/// dim is cut into size() chunks as torch.chunk cuts it, ceil(n / size) each, axis rank r
/// holding chunk r, the last ones shorter or empty).
struct AxisPlacement {
  std::string axis;  ///< the mesh axis: "dp_replicate", "dp_shard", "tp", "cp", "ep"
  bool shard = false;
  int64_t dim = 0;   ///< the global dim cut, when shard
  static AxisPlacement replicate(std::string axis) { return {std::move(axis), false, 0}; }
  static AxisPlacement sharded(std::string axis, int64_t dim) { return {std::move(axis), true, dim}; }
  /// "Replicate()" or "Shard(<dim>)".
  std::string str() const;
};

/// One row of the parameter table: a tensor the optimizer steps.
struct ParameterEntry {
  /// The FQN in the unsharded model ("layers.0.mlp.up.weight"): the name the 1-rank run
  /// gives the same parameter.
  std::string fqn;
  /// The tensor the optimizer steps (this rank's piece); its grad() is read at the hooks.
  at::Tensor local;
  /// The global shape; empty = local's shape (a parameter not sharded).
  std::vector<int64_t> global_shape;
  /// Placements, applied in this order (a dim cut by two axes is cut by the first, then
  /// each chunk by the second). A registered axis not named is Replicate().
  std::vector<AxisPlacement> placements;
  /// The axes its gradient must be reduced over (the data axes whose ranks saw other rows;
  /// dp_shard for a ZeRO-3 / FSDP piece, which reduce-scatter gives it).
  std::vector<std::string> grad_reduce_axes;
  /// Its FSDP (ZeRO-3) unit: the module whose parameters are gathered together; "" = none.
  std::string fsdp_unit;
};

struct TrainerSessionOptions {
  /// The case directory, <root>/<spec>/<case>; must not hold a run's evidence yet.
  std::filesystem::path case_dir;
  /// This case's name ("DpShard2") and the case it must equal (its 1-rank run, a sibling
  /// directory), "" for that 1-rank run itself.
  std::string case_name;
  std::string compare_to;
  /// The trainer's name and version, written into the evidence's writer field.
  std::string trainer = "libtorch trainer";
  /// What each rank's backpropagated loss is over its share of the global loss: 1 when the
  /// gradients are summed over the data axes (each rank's loss is its tokens' sum over the
  /// global token count), the data-parallel size when they are averaged.
  double loss_scale = 1.0;
  /// Steps the run will train (recorded; 0 = unknown).
  int64_t steps = 0;
  /// Tensors of at most this many elements also record their values.
  int64_t values_up_to = 64;
  /// The device the session's own collectives over the world stage their tensors on (the
  /// start handshake, the statistics' sums, the digests' and input rows' gathers, the
  /// checkpoint's full tensors, finish's barrier); what they return is read on the CPU, and
  /// parameters, gradients and batches on any device are read through copies to the CPU.
  /// Unset (the default): the world's, as torch.distributed picks it: the CPU for a Gloo
  /// world, the current CUDA device for an NCCL world (call c10::cuda::set_device(local_rank)
  /// before constructing the session, as ProcessGroupNCCL expects). c10::Device(kCUDA) without
  /// an index is the current CUDA device. The constructor throws mih::Error{kInvalidSpec} for
  /// a device neither the CPU nor CUDA, the CPU on an NCCL world (NCCL moves CUDA tensors
  /// only), an NCCL world or CUDA device without a current CUDA device, or an index past the
  /// CUDA devices this process sees; unset, describe_parameters throws kInvalidSpec for a
  /// parameter on another CUDA device than the current one (the rank's device was not set).
  std::optional<c10::Device> collective_device;
};

/// The hooks; see the file comment. Not thread-safe: the training thread calls them.
/// All methods throw mih::Error: kInvalidSpec for an inconsistent description (a local
/// shape that is not the piece its placements give, an unknown axis, a hook out of order),
/// kFailedPrecondition when the case directory holds files already, and the collectives'
/// codes (kDeadlineExceeded, kUnavailable) when a peer fails.
class TrainerSession {
 public:
  /// `world`: the trainer's group of every rank (a ProcessGroupGloo or ProcessGroupNCCL);
  /// the session's own collectives (sums of statistics, digests) use it, outside the ledger,
  /// on options.collective_device (the world backend's device when unset).
  TrainerSession(TrainerSessionOptions options, const c10::intrusive_ptr<compat::C10dBackend>& world);
  ~TrainerSession();
  TrainerSession(const TrainerSession&) = delete;
  TrainerSession& operator=(const TrainerSession&) = delete;

  /// Registers mesh axis `axis` ("dp_replicate", "dp_shard", "tp", "cp", "ep") with the
  /// trainer's process group over it (`global_ranks`: its members, in its rank order) and
  /// returns the recording wrapper the trainer issues its collectives through: each is
  /// ledgered (op, axis, bytes, call site) into run/train/comm/ledger_rank<r>.jsonl and
  /// counted in the step's metrics, and computes what the group's own call computes.
  /// Ranks along dp_replicate and dp_shard see other rows of the global batch; along the
  /// other axes, the same rows. Call before describe_parameters, on every rank.
  Communicator axis(const std::string& axis, const c10::intrusive_ptr<compat::C10dBackend>& group,
                    const std::vector<int>& global_ranks);

  /// The parameter table, once, after the model is built and before the first step
  /// (collective): writes check/structure.json and the watchlist, and probes the initial values.
  void describe_parameters(std::vector<ParameterEntry> table);
  /// Records the optimizer (its class and learning rate are read from it).
  void attach_optimizer(torch::optim::Optimizer& optimizer);

  void begin_step(int64_t step);
  /// Per micro-batch, before its forward: this rank's rows of the global batch, the first of
  /// which is global row `first_row`. batch: field -> tensor [b, ...] ("input_ids", "labels":
  /// labels -100 are not counted as tokens).
  void record_batch(int64_t step, int micro_batch, int64_t first_row, const std::map<std::string, at::Tensor>& batch);
  /// Marks a module's forward output for localization, one call per module in its forward:
  /// `return session.mark_output("layers.0.mlp", y);` (returns `output` itself). Its
  /// statistics and those of the loss's gradient with respect to it are probed each step, in
  /// global coordinates. `output` is [b, ...] (this rank's rows); `placements` say how its
  /// other dims lie along the model axes (Shard(2) over tp: a column-parallel output); it is
  /// Replicate() over every axis not named. A no-op outside training (grad mode off).
  at::Tensor mark_output(const std::string& module, const at::Tensor& output,
                         const std::vector<AxisPlacement>& placements = {});
  /// After backward and the trainer's gradient synchronization, before clipping
  /// (collective): the inputs' identity, the gradients' probes and their copies' digests.
  void after_backward_before_clip(int64_t step);
  /// After clipping: the gradient norm before clipping (as the trainer computed it).
  void after_clip(int64_t step, double grad_norm);
  /// After optimizer.step() (collective): the parameters' probes and copies' digests.
  void after_optimizer(int64_t step);
  /// The loss over the global batch (every rank's tokens), in nats.
  void end_step(int64_t step, double loss);
  /// After a checkpoint is saved ("save") or loaded ("load") (collective): the SHA-256 of
  /// every full parameter and of the optimizer's state, and the step the run resumes at.
  /// The save's are written under before_save/ of this case directory (the save phase's run
  /// writes into `<case>/before_save` as its case_dir), the load's into this one;
  /// CheckpointRoundTrip compares the two.
  void capture_checkpoint_payload(const std::string& event, int64_t next_step);
  /// Ends the run (collective): a barrier, so rank 0's files are whole when any rank returns.
  void finish();

  /// This process's rank in the world group, and the world's size.
  int rank() const;
  int world_size() const;
  /// The device the session's collectives run on (TrainerSessionOptions::collective_device,
  /// resolved: the CPU for a Gloo world unless set, cuda:<i> for an NCCL world).
  c10::Device collective_device() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace mih
