// Trainer: model/optimizer construction, the data split, and one training step.
#include "harness/training/trainer.h"

#include <fnmatch.h>

#include <algorithm>
#include <chrono>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>
#include <torch/optim/optimizer.h>

#include "harness/base/error.h"
#include "harness/base/fault.h"
#include "harness/base/json_fields.h"
#include "harness/checkpoint/distributed_checkpoint.h"
#include "harness/compat/autocast.h"
#include "harness/compat/optim.h"
#include "harness/parallel/pipeline.h"
#include "harness/runtime/dtypes.h"

namespace mih {
namespace {

constexpr int64_t kIgnoreIndex = -100;

bool matches_any(const std::vector<std::string>& patterns, const ShardedParameter& p) {
  std::vector<std::string> names = {p.fqn};
  names.insert(names.end(), p.aliases.begin(), p.aliases.end());
  for (const auto& pattern : patterns) {
    for (const auto& name : names) {
      if (::fnmatch(pattern.c_str(), name.c_str(), 0) == 0) return true;
    }
  }
  return false;
}

Batch rows(const Batch& b, int64_t start, int64_t count) {
  Batch out{b.input_ids.narrow(0, start, count), b.labels.narrow(0, start, count),
            b.position_ids.narrow(0, start, count), {}, nullptr, {}};
  for (const auto& [name, t] : b.fields) out.fields[name] = t.narrow(0, start, count);
  return out;
}

bool contains(const std::vector<std::string>& list, const std::string& name) {
  return std::find(list.begin(), list.end(), name) != list.end();
}

// The step's global batch on the device, its shapes checked (position_ids 0..S-1 when absent).
Batch global_batch_on(Batch global, int64_t step, c10::Device device) {
  MIH_CHECK(global.input_ids.dim() == 2 && global.labels.sizes() == global.input_ids.sizes(),
            "step ", step, ": expected input_ids and labels of the same shape [B, S], got ", global.input_ids.sizes(),
            " and ", global.labels.sizes());
  const int64_t seq = global.input_ids.size(1);
  if (!global.position_ids.defined()) {
    global.position_ids = at::arange(seq, at::kLong).unsqueeze(0).expand({global.input_ids.size(0), seq});
  }
  MIH_CHECK(global.position_ids.sizes() == global.input_ids.sizes(), "step ", step, ": position_ids ",
            global.position_ids.sizes(), " do not match input_ids ", global.input_ids.sizes());
  global.input_ids = global.input_ids.to(device);
  global.labels = global.labels.to(device);
  global.position_ids = global.position_ids.to(device);
  for (auto& [name, t] : global.fields) {
    MIH_CHECK(t.dim() >= 1 && t.size(0) == global.input_ids.size(0), "step ", step, ": field '", name, "' of shape ",
              t.sizes(), " does not have the batch's ", global.input_ids.size(0), " rows on dim 0");
    t = t.to(device);
  }
  return global;
}

// This data-parallel rank's rows of the global batch (split on the batch dim over the
// data-parallel ranks, then into micro-batches; tensor-parallel ranks see the same rows).
struct LocalBatch {
  Batch batch;
  int64_t first_row = 0;  // its first row in the global batch
  int64_t rows = 0;
};

LocalBatch local_batch(const Batch& global, Communicator& dp, const ParallelConfig& config, int64_t step) {
  const int64_t batch = global.input_ids.size(0);
  MIH_CHECK(batch % dp.size() == 0, "step ", step, ": the global batch of ", batch,
            " sequences does not split over dp_replicate(", config.dp_replicate, ") * dp_shard(", config.dp_shard,
            ") = ", dp.size(), " data-parallel ranks");
  const int64_t local_rows = batch / dp.size();
  MIH_CHECK(local_rows % config.micro_batches == 0, "step ", step, ": the local batch of ", local_rows,
            " sequences does not split into ", config.micro_batches, " micro-batches");
  // F17 (docs/fault-catalog.md): every data-parallel rank takes the first rows (the sampler not sharded).
  const int64_t first_local_row = fault::active(fault::Fault::kF17) ? 0 : dp.rank() * local_rows;
  return {rows(global, first_local_row, local_rows), first_local_row, local_rows};
}

// Context parallelism: this cp rank's tokens of every sequence-sharded field of `local`.
void shard_over_cp(Batch& local, Communicator& cp, const ParallelConfig& config, const TrainerOptions& options,
                   int64_t step, int64_t seq) {
  auto shard = [&](const at::Tensor& t) { return cp_shard_sequence(t, 1, cp.size(), cp.rank(), config.cp_layout); };
  with_context(internal::str("step ", step, ": sharding the sequence of ", seq, " tokens over cp"), [&] {
    local.input_ids = shard(local.input_ids);
    local.labels = shard(local.labels);
    local.position_ids = shard(local.position_ids);
    // F07 (docs/fault-catalog.md): each cp rank numbers its own tokens from 0.
    if (fault::active(fault::Fault::kF07)) {
      local.position_ids = at::arange(local.input_ids.size(1), local.position_ids.options()).expand_as(local.input_ids);
    }
    for (auto& [name, t] : local.fields) {
      if (contains(options.sequence_fields(), name)) {
        MIH_CHECK(t.dim() >= 2 && t.size(1) == seq, "field '", name, "' is declared sharded on the sequence dim but ",
                  "has shape ", t.sizes(), " (dim 1 must be the sequence of ", seq, ")");
        t = shard(t);
      } else {
        MIH_CHECK(contains(options.cp_replicated_fields(), name), "field '", name,
                  "' has no context-parallel sharding: add it to TrainerOptions::sequence_fields (sharded on "
                  "dim 1) or cp_replicated_fields (whole on every cp rank)");
      }
    }
  });
}

// What each micro-batch's summed token losses are divided by: the global count of valid
// targets, so every split of the global batch over ranks and micro-batches gives the same
// gradients (but under the faults F05 and F22).
std::vector<double> loss_normalizers(const Batch& local, int64_t global_valid, Communicator& dp_cp,
                                     const ParallelConfig& config, int64_t mb_rows, c10::Device device,
                                     const char* site) {
  std::vector<double> normalizers(config.micro_batches, static_cast<double>(global_valid));
  // (The pipelined step normalizes by the global count in its executor: these faults are not
  // planted there.)
  if (!config.pipelined() && fault::active(fault::Fault::kF05)) {
    // F05 (docs/fault-catalog.md): the loss divided by this rank's own valid-token count, then averaged
    // over the data-parallel ranks.
    const double own = static_cast<double>(local.labels.ne(kIgnoreIndex).sum().item<int64_t>());
    std::fill(normalizers.begin(), normalizers.end(), own * dp_cp.size());
  } else if (!config.pipelined() && fault::active(fault::Fault::kF22)) {
    // F22: each micro-batch's loss divided by its own (global) valid-token count, then averaged
    // over the micro-batches (transformers' gradient-accumulation loss before 4.46).
    at::Tensor counts = at::empty({config.micro_batches}, at::kLong);
    for (int mb = 0; mb < config.micro_batches; ++mb) {
      counts[mb] = rows(local, mb * mb_rows, mb_rows).labels.ne(kIgnoreIndex).sum();
    }
    counts = counts.to(device);
    dp_cp.all_reduce(counts, ReduceOp::kSum, site);
    counts = counts.cpu();
    for (int mb = 0; mb < config.micro_batches; ++mb) {
      normalizers[mb] = static_cast<double>(counts[mb].item<int64_t>()) * config.micro_batches;
    }
  }
  return normalizers;
}

// What a step's forwards and backwards run with.
struct StepRun {
  ParallelContext& context;
  ParallelModel& model;
  TrainingHooks& hooks;
  const ParallelConfig& config;
  c10::Device device;
  int64_t step, first_row, mb_rows;

  // The mixed-precision lanes: the forward under autocast (float32 master weights, casts for
  // the matmuls), the per-token losses summed in float32 as a user's loss would be.
  at::Tensor forward(const std::function<at::Tensor()>& run) const {
    if (!autocast_lane(config.dtype)) return run();
    compat::AutocastState mixed;
    const bool cuda = device.is_cuda();
    (cuda ? mixed.cuda_enabled : mixed.cpu_enabled) = true;
    (cuda ? mixed.cuda_dtype : mixed.cpu_dtype) = scalar_type(config.dtype);
    const compat::AutocastScope scope(mixed);
    return run();
  }
  // Dropout masks and activation probes in global coordinates: the micro-batch's first row.
  void begin_micro_batch(int mb) const { context.begin_micro_batch(step, first_row + mb * mb_rows); }
};

// Without pp: each micro-batch's forward and backward in turn; returns the summed loss.
double run_micro_batches(const StepRun& r, const Batch& local, const std::vector<double>& normalizers) {
  double loss_sum = 0;
  for (int mb = 0; mb < r.config.micro_batches; ++mb) {
    Batch micro = rows(local, mb * r.mb_rows, r.mb_rows);
    r.hooks.record_batch(r.step, mb, r.first_row + mb * r.mb_rows, micro);
    r.begin_micro_batch(mb);
    r.context.shared_state().begin_forward();
    at::Tensor token_losses = r.forward([&] { return r.model.token_losses(micro); });
    if (token_losses.scalar_type() != r.context.param_dtype()) token_losses = token_losses.to(r.context.param_dtype());
    r.hooks.record_token_losses(r.step, mb, token_losses.detach(), micro);
    at::Tensor loss = token_losses.sum() / normalizers[mb];
    loss.backward();
    loss_sum += loss.item<double>();
  }
  return loss_sum;
}

// What every pp rank ran, checked from the orders alone (not from the generator that made
// them): each action once, each forward before its backward, an order the ranks can run, the
// schedule's bound on activations in flight.
void check_pipeline_order(Communicator& pp, const ParallelConfig& config, const pp::PipelineShape& shape,
                          const pp::PipelineStep& pipelined, c10::Device device, int64_t step) {
  nlohmann::json mine = nlohmann::json::array();
  for (const auto& a : pipelined.executed) mine.push_back(a.text());
  std::vector<std::vector<pp::Action>> executed;
  for (const nlohmann::json& rank : all_gather_json(pp, mine, device, "trainer.pipeline_order")) {
    executed.emplace_back();
    for (const auto& text : rank) executed.back().push_back(pp::Action::parse(text.get<std::string>()));
  }
  const std::vector<std::string> problems = pp::order_problems(config.pp_schedule, shape, executed);
  MIH_CHECK_CODE(problems.empty(), Code::kInternal, "step ", step, ": the pipeline ran an order that is not a valid ",
                 pp::schedule_name(config.pp_schedule), " step: ", problems.front());
}

// With pp: the schedule's order of forwards and backwards over the stages; every micro-batch's
// loss normalized by the global valid-token count before its backward (pipeline.h).
pp::PipelineStep run_pipelined(const StepRun& r, const Batch& local, Communicator& pp, int64_t global_valid) {
  std::vector<Batch> micro;
  for (int mb = 0; mb < r.config.micro_batches; ++mb) {
    micro.push_back(rows(local, mb * r.mb_rows, r.mb_rows));
    r.hooks.record_batch(r.step, mb, r.first_row + mb * r.mb_rows, micro.back());
  }
  const pp::PipelineShape shape = r.config.pipeline_shape();
  const int last_stage = shape.stages() - 1;
  pp::StageModel stages;
  stages.forward = [&](int stage, int mb, const at::Tensor& input) {
    r.begin_micro_batch(mb);
    r.context.shared_state().begin_forward();
    at::Tensor out = r.forward([&] { return r.model.stage_forward(stage, input, micro[static_cast<size_t>(mb)]); });
    if (stage != last_stage) return out;
    if (out.scalar_type() != r.context.param_dtype()) out = out.to(r.context.param_dtype());
    r.hooks.record_token_losses(r.step, mb, out.detach(), micro[static_cast<size_t>(mb)]);
    return out.reshape(-1);
  };
  stages.loss_mask = [&](int mb) { return micro[static_cast<size_t>(mb)].labels.ne(kIgnoreIndex).reshape(-1); };
  // A recompute in backward (activation checkpointing) runs under its own micro-batch's rows
  // (the activation probes' signs and deduplication), not the last forward's.
  stages.before_backward = [&](int /*stage*/, int mb) { r.begin_micro_batch(mb); };
  stages.empty_activation = [&](int stage, int mb) { return r.model.stage_input(stage, micro[static_cast<size_t>(mb)]); };
  pp::PipelineStep pipelined = pp::run_pipeline_step(pp, r.config.pp_schedule, shape,
                                                     pp::schedule(r.config.pp_schedule, shape), stages, global_valid);
  check_pipeline_order(pp, r.config, shape, pipelined, r.device, r.step);
  return pipelined;
}

}  // namespace

void to_json(nlohmann::json& j, const StepMetrics& m) {
  j = {{"step", m.step},
       {"loss", m.loss},
       {"grad_norm_pre_clip", m.grad_norm_pre_clip},
       {"grad_norm_post_clip", m.grad_norm_post_clip},
       {"lr", m.lr},
       {"valid_tokens", m.valid_tokens},
       {"step_ms", m.step_ms}};
  if (!m.data_state.is_null()) j["data_loader"] = m.data_state;
  if (!m.samples.empty()) j["samples"] = m.samples;
}

at::Tensor ParallelModel::stage_forward(int stage, const at::Tensor& /*input*/, const Batch& /*micro_batch*/) {
  MIH_THROW(Code::kInvalidSpec, "pipeline stage ", stage, ": this model does not split into pipeline stages; ",
            "override ParallelModel::stage_forward and stage_input, or run it without pp");
}

at::Tensor ParallelModel::stage_input(int stage, const Batch& /*micro_batch*/) {
  MIH_THROW(Code::kInvalidSpec, "pipeline stage ", stage, ": this model does not split into pipeline stages; ",
            "override ParallelModel::stage_forward and stage_input, or run it without pp");
}

TrainingHooks& no_training_hooks() {
  static TrainingHooks none;
  return none;
}

Trainer::Trainer(DeviceMesh& mesh, const ParallelConfig& config, const ModelFactory& factory, BatchSource batches,
                 const TrainerOptions& options, TrainingHooks* hooks, std::unique_ptr<data::DataLoader> loader)
    : mesh_(&mesh), config_(config), options_(options), batches_(std::move(batches)), loader_(std::move(loader)),
      hooks_(hooks ? hooks : &no_training_hooks()) {
  config_.validate(mesh.world_size());
  MIH_CHECK(config_.same_mesh(mesh.config()), "parallel config '", config_.name(), "' (", config_.mesh_str(),
            ") does not match the mesh (", mesh.config().mesh_str(), ")");
  MIH_CHECK(static_cast<bool>(batches_), "Trainer: the batch source is empty");
  if (!loader_) loader_ = std::make_unique<data::StepLoader>(batches_);
  context_ = std::make_unique<ParallelContext>(mesh, config_, options_.device());
  model_ = factory(*context_);
  MIH_CHECK(model_ != nullptr, "Trainer: the model factory returned no model");
  MIH_CHECK(!config_.pipelined() || context_->pipeline_layers() > 0, "parallel config '", config_.name(),
            "' is pipelined (pp(", config_.pp, ") x vpp(", config_.vpp, ") stages) but the model did not split ",
            "itself into stages: it must call ParallelContext::pipeline_stages in its constructor, build only its ",
            "stages' modules and override stage_forward; run it without pp otherwise");
  // F15 (docs/fault-catalog.md): the optimizer's parameters taken from the model before fully_shard. FSDP1
  // without use_orig_params swaps the modules' parameters for flat shards, so such an optimizer
  // holds unsharded originals the model no longer reads (here: copies of them).
  std::vector<at::Tensor> before_sharding;
  if (fault::active(fault::Fault::kF15)) {
    at::NoGradGuard no_grad;
    for (const auto& t : model_->parameters()) before_sharding.push_back(t.detach().clone().requires_grad_(true));
  }
  model_->apply_fsdp(*context_);
  context_->finalize(*model_);
  for (const auto& p : context_->parameters()) {
    if (matches_any(options_.frozen(), *p)) p->local.requires_grad_(false);
  }

  std::vector<at::Tensor> decay, no_decay;
  for (const auto& p : context_->parameters()) {
    if (!p->local.requires_grad()) continue;  // frozen: no optimizer state, never updated
    (matches_any(options_.no_weight_decay(), *p) ? no_decay : decay).push_back(p->local);
  }
  if (!before_sharding.empty()) {
    decay = before_sharding;
    no_decay.clear();
  }
  optimizer_ = make_optimizer(options_, decay, no_decay);
  hooks_->attach_optimizer(state());
  hooks_->attach_data_pipeline(batches_);
}

Trainer::~Trainer() = default;

StepMetrics Trainer::step() {
  const auto start = std::chrono::steady_clock::now();
  const int64_t step = next_step_++;
  hooks_->begin_step(step);
  const c10::Device device = context_->device();
  Batch drawn = loader_->next();
  std::vector<SampleId> samples = std::move(drawn.samples);
  const Batch global = global_batch_on(std::move(drawn), step, device);
  const int64_t seq = global.input_ids.size(1);
  LocalBatch local = local_batch(global, mesh_->comm(MeshAxis::kDp), config_, step);
  if (config_.cp > 1) shard_over_cp(local.batch, mesh_->comm(MeshAxis::kCp), config_, options_, step, seq);

  // The loss is normalized by the global count of valid targets, so every split of the
  // global batch over ranks and micro-batches gives the same gradients.
  Communicator& dp_cp = mesh_->comm(MeshAxis::kDpCp);
  at::Tensor valid = local.batch.labels.ne(kIgnoreIndex).sum().to(at::kLong).reshape({1});
  const ReductionPath& valid_path = reduction_path("loss.valid_tokens.dp_cp");
  dp_cp.all_reduce(valid, ReduceOp::kSum, valid_path.site);
  context_->record_reduction_path(valid_path, dp_cp.size());
  context_->record_reduction_path(reduction_path("loss.micro_batches"), config_.micro_batches);
  const int64_t global_valid = valid.item<int64_t>();
  MIH_CHECK(global_valid > 0, "step ", step, ": the global batch has no valid target (every label is -100)");

  const int64_t mb_rows = local.rows / config_.micro_batches;
  const std::vector<double> normalizers =
      loss_normalizers(local.batch, global_valid, dp_cp, config_, mb_rows, device, valid_path.site);
  context_->reset_gradient_reductions();
  const StepRun run{*context_, *model_, *hooks_, config_, device, step, local.first_row, mb_rows};
  pp::PipelineStep pipelined;
  double loss_sum = 0;
  if (config_.pipelined()) {
    pipelined = run_pipelined(run, local.batch, mesh_->comm(MeshAxis::kPp), global_valid);
    loss_sum = pipelined.loss;
  } else {
    loss_sum = run_micro_batches(run, local.batch, normalizers);
  }

  hooks_->before_gradient_sync(step);
  context_->synchronize_gradients();
  hooks_->after_backward_before_clip(step);
  StepMetrics m;
  m.step = step;
  m.grad_norm_pre_clip = options_.max_grad_norm() > 0 ? context_->clip_grad_norm(options_.max_grad_norm())
                                                       : context_->grad_norm();
  m.grad_norm_post_clip = context_->grad_norm();
  hooks_->after_clip(step, m.grad_norm_pre_clip);
  m.lr = scheduled_lr(options_, step - schedule_origin_);
  for (auto& group : optimizer_->param_groups()) group.options().set_lr(m.lr);
  optimizer_->step();
  for (const auto& p : context_->parameters()) p->local.mutable_grad() = at::Tensor();  // set to none
  hooks_->after_optimizer(step);

  at::Tensor loss = at::full({1}, loss_sum, at::TensorOptions().dtype(at::kDouble).device(device));
  const ReductionPath& loss_path = reduction_path("loss.sum.dp_cp");
  dp_cp.all_reduce(loss, ReduceOp::kSum, loss_path.site);
  context_->record_reduction_path(loss_path, dp_cp.size());
  // Under pp only the last stage's ranks computed losses: the batch loss on every rank.
  if (config_.pp > 1) mesh_->comm(MeshAxis::kPp).all_reduce(loss, ReduceOp::kSum, "trainer.loss.pp");
  m.loss = loss.item<double>();
  m.valid_tokens = global_valid;
  m.loss_normalizers = normalizers;
  m.samples = std::move(samples);
  m.data_state = loader_->state_dict();
  for (const auto& a : pipelined.executed) m.pipeline_order.push_back(a.text());
  m.pipeline_bytes_sent = pipelined.bytes_sent;
  m.pipeline_message_shape = pipelined.message_shape;
  m.pipeline_message_dtype = pipelined.message_dtype;
  m.step_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  hooks_->end_step(m);
  hooks_->record_fsdp_trace(step);
  return m;
}

void Trainer::save(const std::filesystem::path& dir) {
  nlohmann::json state = {{"next_step", next_step_},
                          {"parallel_config", config_},
                          {"world_size", mesh_->world_size()},
                          {"optimizer", compat::optimizer_kind(*optimizer_)},
                          {"data_loader", loader_->state_dict()}};
  save_checkpoint(dir, *context_, optimizer_.get(), state);
  hooks_->capture_checkpoint_payload("save", dir, read_checkpoint_index(dir));
}

void Trainer::load(const std::filesystem::path& dir) {
  // A checkpoint of another optimizer's state would load as a fresh one (its keys unknown):
  // refused by name. Checkpoints written before the field were AdamW's.
  const nlohmann::json trainer_state = read_checkpoint_index(dir).at("trainer_state");
  const std::string saved = json_string(trainer_state, "optimizer", "adamw", "checkpoint " + dir.string() + " trainer state");
  MIH_CHECK(saved == compat::optimizer_kind(*optimizer_), "checkpoint ", dir.string(), " holds the state of optimizer '",
            saved, "', this trainer's is '", compat::optimizer_kind(*optimizer_), "': build the trainer with ",
            "TrainerOptions::optimizer '", saved, "' to resume it");
  // The loader continues where the checkpoint's stood; a checkpoint of an older harness has
  // no loader state and its batches were drawn by step.
  MIH_CHECK(trainer_state.contains("next_step"), "checkpoint ", dir.string(), ": its trainer state has no 'next_step'");
  const int64_t saved_step = json_int(trainer_state, "next_step", 0, "checkpoint " + dir.string() + " trainer state", 0);
  const nlohmann::json fresh = loader_->state_dict();
  MIH_CHECK(trainer_state.contains("data_loader") || fresh.at("kind") == "steps", "checkpoint ", dir.string(),
            " holds no data loader state (written before loaders kept one: its batches were drawn by step), and this ",
            "run's loader is of kind '", fresh.at("kind").get<std::string>(), "', which cannot continue it; resume ",
            "it with the data it was trained on, or start the run again");
  const nlohmann::json data_state = trainer_state.contains("data_loader")
                                        ? trainer_state.at("data_loader")
                                        : nlohmann::json{{"kind", "steps"}, {"next_step", saved_step}};
  // Refuses another data's state before anything loads, changing nothing.
  with_context("checkpoint " + dir.string(), [&] { loader_->load_state_dict(data_state); });
  try {
    load_checkpoint(dir, *context_, optimizer_.get());
  } catch (...) {
    loader_->load_state_dict(fresh);
    throw;
  }
  next_step_ = saved_step;
  // F44 (docs/fault-catalog.md): the data loader left out of what a load restores (the
  // checkpoint never given it): the resumed run draws from the first batch again.
  if (fault::active(fault::Fault::kF44)) loader_->load_state_dict(fresh);
  // F40 (docs/fault-catalog.md): the schedule's step not restored with the checkpoint (a
  // scheduler whose state is not saved): the warmup starts again at the resumed step.
  schedule_origin_ = fault::active(fault::Fault::kF40) ? next_step_ : 0;
  hooks_->capture_checkpoint_payload("load", dir, read_checkpoint_index(dir));
}

std::vector<StepMetrics> Trainer::run(int64_t steps) {
  std::vector<StepMetrics> out;
  for (int64_t i = 0; i < steps; ++i) out.push_back(step());
  return out;
}

at::Tensor Trainer::gather_full(const ShardedParameter& p, const std::string& what) {
  at::Tensor piece;
  if (what == "param") {
    piece = p.local;
  } else if (what == "grad") {
    piece = p.local.grad();
  } else {
    piece = compat::optimizer_state(*optimizer_, p.local, what);
    if (!piece.defined()) return piece;  // no state: the parameter never had a gradient
  }
  MIH_CHECK(piece.defined(), "gather_full('", p.fqn, "', '", what, "'): not defined at this point of the step");
  return context_->gather_full(p, piece);
}

}  // namespace mih
