// The Trainer: the short real training loop conformance cases run. From a model factory, a
// ParallelConfig and a source of global batches it builds the model on the mesh, the optimizer
// (AdamW, Adam or SGD) over the local shards and the data split, and runs steps: micro-batches
// with the loss normalized by the global valid-token count, gradient synchronization,
// global-norm clipping, the optimizer step at the step's scheduled learning rate. Every
// configuration of one global batch gives the numbers of one rank (DESIGN.md section 4).
// Session hooks are called at each point of DESIGN.md section 6.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <nlohmann/json.hpp>
#include <torch/arg.h>
#include <torch/nn/module.h>

#include "harness/data/batch.h"
#include "harness/data/data_loader.h"
#include "harness/parallel/parallel_context.h"
#include "harness/runtime/device_mesh.h"
#include "harness/base/parallel_config.h"

namespace torch::optim {
class Optimizer;
}


namespace mih {

/// A model the Trainer drives: built from ParallelContext layers, it returns the per-token
/// cross-entropy of a (local) batch; the Trainer sums and normalizes it.
class ParallelModel : public torch::nn::Module {
 public:
  /// Shape: batch [b, s] -> per-token losses [b, s] (0 where labels == -100), replicated
  /// over tp.
  virtual at::Tensor token_losses(const Batch& batch) = 0;
  /// Shape: batch [b, s] -> logits [b, s, vocab / tp] (vocab-parallel over tp), for `mih
  /// export`'s reference logits. Default: an undefined tensor (the model exposes none; the
  /// export then writes its token losses and loss only).
  virtual at::Tensor logits(const Batch& batch) {
    (void)batch;
    return {};
  }
  /// Declares the FSDP units (after construction, before the optimizer): the units decide
  /// what each all-gather and reduce-scatter moves (CommVolume) and what is resident at once.
  /// Default: the whole model is one unit named "root". Override to make each decoder layer
  /// a unit and the root the rest (ctx.fully_shard per unit).
  virtual void apply_fsdp(ParallelContext& ctx) { ctx.fully_shard(*this, "root"); }
  /// Pipeline parallelism (ParallelConfig::pp, vpp). A model that supports it asks
  /// ctx.pipeline_stages(num_layers) in its constructor and builds only those stages'
  /// modules (see there). The forward of micro-batch `micro_batch` through stage `stage` (one
  /// of this rank's): the first stage reads the micro-batch (`input` undefined), every other
  /// one `input`, the activation stage - 1 returned. Returns the activation for stage + 1, or
  /// on the last stage the per-token losses as token_losses does.
  /// Shape: micro_batch [b, s] -> activation [b, s, H] (as between two decoder layers; under
  /// sequence parallelism [b, s/TP, H]), or token losses [b, s] on the last stage.
  /// Default: throws mih::Error{kInvalidSpec}: the model does not split into stages.
  virtual at::Tensor stage_forward(int stage, const at::Tensor& input, const Batch& micro_batch);
  /// A tensor of the shape, dtype and device of the activation stage `stage` (> 0) receives
  /// for `micro_batch` (its contents are overwritten by the receive).
  /// Default: throws mih::Error{kInvalidSpec}: the model does not split into stages.
  virtual at::Tensor stage_input(int stage, const Batch& micro_batch);
};

/// Builds the model on a context; every parameter must come from ctx.make_parameter.
using ModelFactory = std::function<std::shared_ptr<ParallelModel>(ParallelContext& ctx)>;

/// The optimizer the Trainer builds over the local shards (TrainerOptions::optimizer).
enum class OptimizerKind {
  kAdamW,  ///< torch::optim::AdamW: decoupled weight decay (Loshchilov and Hutter 2019)
  kAdam,   ///< torch::optim::Adam: weight decay as L2 in the gradient
  kSgd,    ///< torch::optim::SGD with momentum: its update is linear in the gradient's scale
};

/// "adamw", "adam", "sgd".
std::string optimizer_kind_name(OptimizerKind kind);
/// The kind of a name optimizer_kind_name gives. Throws: mih::Error{kInvalidSpec} listing them.
OptimizerKind parse_optimizer_kind(const std::string& name);

/// Optimizer, learning-rate schedule and clipping of a run. The optimizer's param groups are
/// one per weight-decay rule: weight_decay for the parameters no no_weight_decay pattern names,
/// 0 for the others.
struct TrainerOptions {
  /// The optimizer. Default AdamW.
  TORCH_ARG(OptimizerKind, optimizer) = OptimizerKind::kAdamW;
  /// Peak learning rate (the constant one without a schedule). Default 1e-3.
  TORCH_ARG(double, lr) = 1e-3;
  /// Adam and AdamW betas. Default (0.9, 0.95).
  TORCH_ARG(double, beta1) = 0.9;
  TORCH_ARG(double, beta2) = 0.95;
  /// Adam and AdamW eps. Default 1e-8.
  TORCH_ARG(double, eps) = 1e-8;
  /// SGD momentum (0: plain SGD, no optimizer state). Default 0.9.
  TORCH_ARG(double, momentum) = 0.9;
  /// SGD Nesterov momentum. Default false.
  TORCH_ARG(bool, nesterov) = false;
  /// Weight decay of the decay group. Default 0.1.
  TORCH_ARG(double, weight_decay) = 0.1;
  /// Learning-rate schedule (scheduled_lr): linear warmup over this many steps (0: none).
  TORCH_ARG(int64_t, warmup_steps) = 0;
  /// Then cosine decay from lr to min_lr over this many steps (0: lr stays constant).
  TORCH_ARG(int64_t, decay_steps) = 0;
  /// The learning rate the cosine decay ends at. Default 0.
  TORCH_ARG(double, min_lr) = 0;
  /// Clip gradients to this global L2 norm; <= 0 disables clipping. Default 1.0.
  TORCH_ARG(double, max_grad_norm) = 1.0;
  /// FQN glob patterns (fnmatch) of the parameters without weight decay. Default: biases and
  /// norms.
  TORCH_ARG(std::vector<std::string>, no_weight_decay) = {"*bias", "*norm*"};
  /// FQN glob patterns (fnmatch) of the parameters the run does not train (ModelSpec::frozen):
  /// after sharding they get requires_grad false, they are in no optimizer group and no
  /// gradient of theirs is synchronized. Default: none.
  TORCH_ARG(std::vector<std::string>, frozen) = {};
  /// Batch::fields sharded on the sequence dim (dim 1) under context parallelism.
  TORCH_ARG(std::vector<std::string>, sequence_fields) = {};
  /// Batch::fields every cp rank receives whole (e.g. pixel_values). A field in neither list
  /// is an error when cp > 1, so no field is silently left unsharded.
  TORCH_ARG(std::vector<std::string>, cp_replicated_fields) = {};
  /// Device of the parameters and of compute (a CUDA case: cuda:<LOCAL_RANK>, with the NCCL
  /// backend). Default: CPU.
  TORCH_ARG(c10::Device, device) = c10::Device(c10::DeviceType::CPU);
};

/// The learning rate of step `step` (0-based, counted from the run's first step, across
/// resumes): lr * (step + 1) / warmup_steps during the warmup (its last step at lr), then
/// min_lr + (lr - min_lr) * (1 + cos(pi * min(1, (step + 1 - warmup_steps) / decay_steps))) / 2
/// (linear warmup then cosine decay, as torchtitan's and Megatron-LM's schedulers), lr when
/// decay_steps is 0. Throws: mih::Error{kInvalidSpec} for a negative step count or step.
double scheduled_lr(const TrainerOptions& options, int64_t step);

/// The optimizer `options` names over the local shards: one param group of `decay` with
/// options.weight_decay and one of `no_decay` with 0 (an empty one left out), at options.lr.
/// Throws: mih::Error{kInvalidSpec} for a negative momentum or weight decay, or Nesterov
///   without momentum.
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const TrainerOptions& options, const std::vector<at::Tensor>& decay,
                                                        const std::vector<at::Tensor>& no_decay);

/// What one step measured.
struct StepMetrics {
  int64_t step = 0;
  /// Cross entropy averaged over the global valid targets of the step (all micro-batches).
  double loss = 0;
  /// Global L2 norm of the gradients before and after clipping (the latter measured).
  double grad_norm_pre_clip = 0;
  double grad_norm_post_clip = 0;
  /// The learning rate the optimizer stepped with (scheduled_lr of the step).
  double lr = 0;
  /// Targets with a label (!= -100) in the global batch.
  int64_t valid_tokens = 0;
  /// What this rank divided each micro-batch's summed token losses by (the contract: the
  /// global valid-token count, so every split gives the same gradients). Not in to_json.
  std::vector<double> loss_normalizers;
  /// Wall time of the step on this rank, milliseconds.
  double step_ms = 0;
  /// Under pp: the forwards and backwards this rank ran, in order ("F0.1", "B0.1", ...:
  /// pp::Action::text), the bytes it sent to other pp ranks, and the shape and dtype of the
  /// first activation (or activation gradient) it moved. Not in to_json.
  std::vector<std::string> pipeline_order;
  /// The step's sample-id ledger (a loader with epochs: Batch::samples; empty otherwise) and the
  /// data loader's state after the step (data::DataLoader::state_dict).
  std::vector<SampleId> samples;
  nlohmann::json data_state;
  int64_t pipeline_bytes_sent = 0;
  std::vector<int64_t> pipeline_message_shape;
  std::string pipeline_message_dtype;
};

void to_json(nlohmann::json& j, const StepMetrics& m);

/// What a session (and a state invariant) sees of a training run: the parameter table, the
/// model and its optimizer. The pointers outlive every hook call.
struct TrainingState {
  ParallelContext* context = nullptr;
  ParallelModel* model = nullptr;
  /// The run's optimizer (AdamW, Adam or SGD: compat::optimizer_kind; its state through
  /// harness/compat/optim.h).
  torch::optim::Optimizer* optimizer = nullptr;
  /// The run's config (micro-batches, dtype...); null when the backend has none.
  const ParallelConfig* config = nullptr;
};

/// Points where a validation session observes training (DESIGN.md section 6). Every method
/// is a no-op by default; a backend calls them in this order, on every rank (a session may
/// run collectives in them). The Trainer always calls them: without a session it calls the
/// no-op object no_training_hooks(), so the training code has no branch on "is a session
/// attached".
class TrainingHooks {
 public:
  virtual ~TrainingHooks() = default;
  /// After the model is built and sharded and its optimizer made, before any step.
  virtual void attach_optimizer(const TrainingState&) {}
  virtual void attach_data_pipeline(const BatchSource&) {}
  virtual void begin_step(int64_t /*step*/) {}
  /// Per micro-batch, before its forward: the rank's local micro-batch exactly as the model
  /// receives it, whose first row is row `first_row` of the global batch.
  /// Shape: batch [b, S/CP] (fields as TrainerOptions shards them).
  virtual void record_batch(int64_t /*step*/, int /*micro_batch*/, int64_t /*first_row*/, const Batch&) {}
  /// Per micro-batch, after its forward: the model's per-token losses (detached) of the
  /// micro-batch given to record_batch, before they are summed and normalized.
  /// Shape: token_losses [b, S/CP], like micro_batch.labels.
  virtual void record_token_losses(int64_t /*step*/, int /*micro_batch*/, const at::Tensor& /*token_losses*/,
                                   const Batch& /*micro_batch*/) {}
  /// After the backward of the step's last micro-batch, before the gradients are
  /// synchronized: every rank's gradients are its own partial sums.
  virtual void before_gradient_sync(int64_t /*step*/) {}
  /// After the gradients are synchronized, before clipping.
  virtual void after_backward_before_clip(int64_t /*step*/) {}
  /// After clipping; `grad_norm` is the global norm before clipping.
  virtual void after_clip(int64_t /*step*/, double /*grad_norm*/) {}
  virtual void after_optimizer(int64_t /*step*/) {}
  virtual void end_step(const StepMetrics&) {}
  /// After end_step: the FSDP units and every parameter's layout (ParallelContext::to_json).
  virtual void record_fsdp_trace(int64_t /*step*/) {}
  /// After a checkpoint save ("save") or load ("load") completed on every rank: its
  /// directory and index (read_checkpoint_index).
  virtual void capture_checkpoint_payload(const std::string& /*event*/, const std::filesystem::path& /*dir*/,
                                          const nlohmann::json& /*index*/) {}
};

/// The hooks that do nothing (a session in mode off).
TrainingHooks& no_training_hooks();

/// Runs training steps of one model on one rank of a mesh.
class Trainer {
 public:
  /// Builds the model (factory, apply_fsdp, finalize) and the optimizer. `mesh` and `hooks`
  /// (null: no_training_hooks()) must outlive the Trainer.
  /// Throws: mih::Error{kInvalidSpec} if config differs from the mesh's, or as
  ///   ParallelConfig::validate, or if the config is pipelined and the model did not ask
  ///   for its stages (ParallelContext::pipeline_stages).
  /// `batches` is the pure source the session's data checks read (attach_data_pipeline); the
  /// steps draw from `loader` (null: a data::StepLoader over `batches`), whose state the
  /// checkpoint saves and a load restores.
  Trainer(DeviceMesh& mesh, const ParallelConfig& config, const ModelFactory& factory, BatchSource batches,
          const TrainerOptions& options = {}, TrainingHooks* hooks = nullptr,
          std::unique_ptr<data::DataLoader> loader = nullptr);
  ~Trainer();

  /// Runs the next step and returns what it measured (the same on every rank).
  /// Throws: mih::Error{kInvalidSpec} if the global batch does not split over dp ranks and
  ///   micro-batches or its sequence over cp, naming the sizes, or if a field's cp sharding
  ///   is undeclared.
  StepMetrics step();
  /// Runs `steps` steps.
  std::vector<StepMetrics> run(int64_t steps);

  /// Saves a resharding checkpoint of the model, the optimizer state, the step count and the
  /// data loader's state to `dir` (distributed_checkpoint.h). A collective. Throws: as
  /// save_checkpoint.
  void save(const std::filesystem::path& dir);
  /// Loads a checkpoint saved under any ParallelConfig of the same model (and dtype); the
  /// next step() continues from the saved step (and its learning rate from the schedule at
  /// that step) and the data loader where it stood (a checkpoint without a loader state, of an
  /// older harness, continues a StepLoader at the saved step). A collective; nothing is loaded
  /// on error.
  /// Throws: as load_checkpoint; as data::DataLoader::load_state_dict (another loader's or
  ///   another data's state, or none for a loader of epochs).
  void load(const std::filesystem::path& dir);
  /// The index of the next step to run.
  int64_t next_step() const { return next_step_; }

  ParallelContext& context() { return *context_; }
  TrainingState state() { return {context_.get(), model_.get(), optimizer_.get(), &config_}; }
  ParallelModel& model() { return *model_; }
  torch::optim::Optimizer& optimizer() { return *optimizer_; }
  const ParallelConfig& config() const { return config_; }

  /// The full value of a parameter, of its gradient ("grad") or of an optimizer state
  /// (compat::state_names: "exp_avg", "exp_avg_sq", "momentum_buffer"), on every rank. A
  /// collective: call it on every rank. A state the optimizer does not hold (a parameter no step gave a gradient yet, as CLIP's
  /// post_layernorm in LLaVA) is an undefined tensor on every rank, as PyTorch's optimizers
  /// hold no state for it. Throws: mih::Error naming the parameter for an undefined value or
  /// gradient.
  at::Tensor gather_full(const ShardedParameter& p, const std::string& what = "param");

 private:
  DeviceMesh* mesh_;
  ParallelConfig config_;
  TrainerOptions options_;
  BatchSource batches_;
  std::unique_ptr<data::DataLoader> loader_;
  TrainingHooks* hooks_;
  std::unique_ptr<ParallelContext> context_;
  std::shared_ptr<ParallelModel> model_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  int64_t next_step_ = 0;
  /// The step scheduled_lr counts from: 0 (F40 sets it to the step a load restored).
  int64_t schedule_origin_ = 0;
};

}  // namespace mih
