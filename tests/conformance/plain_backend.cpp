// A second TrainingBackend, to prove the interface real: a plain single-process libtorch loop
// (world size 1) that owns its optimizer, its micro-batching, its clipping
// (torch::nn::utils::clip_grad_norm_) and calls the session hooks itself, in TrainingHooks
// order, the way a team's own trainer would. It shares nothing with mih's Trainer but the
// spec's model factory and the checkpoint format. The suites that apply to world size 1 run
// on it (tests/conformance/CMakeLists.txt), and its numbers must equal the Trainer's
// reference.
#include <fnmatch.h>

#include <chrono>
#include <vector>

#include <torch/types.h>  // clip_grad.h is not self-contained in libtorch 1.13
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adamw.h>

#include "harness/base/error.h"
#include "harness/checkpoint/distributed_checkpoint.h"
#include "harness/compat/optim.h"
#include "harness/session/backend.h"

namespace mih::testing {
namespace {

class PlainBackend : public TrainingBackend {
 public:
  std::string unsupported(const ParallelConfig& config, bool /*resume*/) const override {
    return config.world_size() == 1 && !config.activation_checkpointing
               ? ""
               : "the plain loop runs world size 1 without activation checkpointing";
  }

  void build(const spec::ModelSpec& spec, DeviceMesh& mesh, const ParallelConfig& config, const TrainerOptions& options,
             TrainingHooks& hooks) override {
    MIH_CHECK(unsupported(config, false).empty(), "plain backend: ", unsupported(config, false));
    config_ = config;
    options_ = options;
    hooks_ = &hooks;
    batches_ = spec.data.make_batches();
    context_ = std::make_unique<ParallelContext>(mesh, config);
    model_ = spec.factory(*context_);
    context_->finalize(*model_);
    std::vector<at::Tensor> decay, no_decay;
    for (const auto& p : context_->parameters()) {
      bool exempt = false;
      for (const auto& pattern : options.no_weight_decay()) exempt = exempt || ::fnmatch(pattern.c_str(), p->fqn.c_str(), 0) == 0;
      (exempt ? no_decay : decay).push_back(p->local);
    }
    auto adamw = [&](double wd) {
      return torch::optim::AdamWOptions(options.lr()).betas({options.beta1(), options.beta2()}).eps(options.eps()).weight_decay(wd);
    };
    std::vector<torch::optim::OptimizerParamGroup> groups;
    if (!decay.empty()) groups.emplace_back(decay, std::make_unique<torch::optim::AdamWOptions>(adamw(options.weight_decay())));
    if (!no_decay.empty()) groups.emplace_back(no_decay, std::make_unique<torch::optim::AdamWOptions>(adamw(0.0)));
    optimizer_ = std::make_unique<torch::optim::AdamW>(groups, adamw(options.weight_decay()));
    hooks.attach_optimizer(state());
    hooks.attach_data_pipeline(batches_);
  }

  StepMetrics step() override {
    const auto start = std::chrono::steady_clock::now();
    const int64_t step = next_step_++;
    hooks_->begin_step(step);
    Batch batch = batches_(step);
    const int64_t rows = batch.input_ids.size(0), seq = batch.input_ids.size(1);
    if (!batch.position_ids.defined()) batch.position_ids = at::arange(seq, at::kLong).unsqueeze(0).expand({rows, seq});
    const int64_t valid = batch.labels.ne(-100).sum().item<int64_t>();
    const int64_t mb_rows = rows / config_.micro_batches;
    double loss_sum = 0;
    for (int mb = 0; mb < config_.micro_batches; ++mb) {
      Batch micro;
      micro.input_ids = batch.input_ids.narrow(0, mb * mb_rows, mb_rows);
      micro.labels = batch.labels.narrow(0, mb * mb_rows, mb_rows);
      micro.position_ids = batch.position_ids.narrow(0, mb * mb_rows, mb_rows);
      for (const auto& [name, t] : batch.fields) micro.fields[name] = t.narrow(0, mb * mb_rows, mb_rows);
      hooks_->record_batch(step, mb, mb * mb_rows, micro);
      // Dropout masks and activation probes in global coordinates: the micro-batch's first row.
      context_->begin_micro_batch(step, mb * mb_rows);
      context_->shared_state().begin_forward();
      const at::Tensor token_losses = model_->token_losses(micro);
      hooks_->record_token_losses(step, mb, token_losses.detach(), micro);
      at::Tensor loss = token_losses.sum() / static_cast<double>(valid);
      loss.backward();
      loss_sum += loss.item<double>();
    }
    hooks_->after_backward_before_clip(step);
    std::vector<at::Tensor> params;
    for (const auto& p : context_->parameters()) params.push_back(p->local);
    StepMetrics m;
    m.step = step;
    m.grad_norm_pre_clip = torch::nn::utils::clip_grad_norm_(params, options_.max_grad_norm());
    double post = 0;
    for (const auto& t : params) {
      if (t.grad().defined()) post += t.grad().pow(2).sum().item<double>();
    }
    m.grad_norm_post_clip = std::sqrt(post);
    hooks_->after_clip(step, m.grad_norm_pre_clip);
    optimizer_->step();
    for (auto& t : params) t.mutable_grad() = at::Tensor();
    hooks_->after_optimizer(step);
    m.loss = loss_sum;
    m.lr = options_.lr();
    m.valid_tokens = valid;
    m.loss_normalizers.assign(static_cast<size_t>(config_.micro_batches), static_cast<double>(valid));
    m.step_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    hooks_->end_step(m);
    hooks_->record_fsdp_trace(step);
    return m;
  }

  int64_t next_step() const override { return next_step_; }
  TrainingState state() override { return {context_.get(), model_.get(), optimizer_.get(), &config_}; }
  at::Tensor gather_full(const ShardedParameter& p, const std::string& what) override {
    if (what == "param") return p.local;
    if (what == "grad") return p.local.grad();
    return compat::adamw_state(*optimizer_, p.local, what);
  }
  void save(const std::filesystem::path& dir) override {
    save_checkpoint(dir, *context_, optimizer_.get(), {{"next_step", next_step_}});
    hooks_->capture_checkpoint_payload("save", dir, read_checkpoint_index(dir));
  }
  void load(const std::filesystem::path& dir) override {
    next_step_ = load_checkpoint(dir, *context_, optimizer_.get()).at("next_step").get<int64_t>();
    hooks_->capture_checkpoint_payload("load", dir, read_checkpoint_index(dir));
  }

 private:
  ParallelConfig config_;
  TrainerOptions options_;
  TrainingHooks* hooks_ = nullptr;
  BatchSource batches_;
  std::unique_ptr<ParallelContext> context_;
  std::shared_ptr<ParallelModel> model_;
  std::unique_ptr<torch::optim::AdamW> optimizer_;
  int64_t next_step_ = 0;
};

}  // namespace
}  // namespace mih::testing

MIH_REGISTER_TRAINING_BACKEND(plain, mih::testing::PlainBackend);
