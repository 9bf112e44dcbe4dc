// Parity runs of the Trainer on thread ranks, in float64, and their comparison with a
// reference run: what the parallel and model tests share. A run keeps, on rank 0, per step the
// metrics, the gathered gradients (after synchronization, before clipping) and the gathered
// parameters (after the optimizer), and the AdamW exp_avg after the last step.
#pragma once

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "harness/compat/optim.h"
#include "harness/training/trainer.h"
#include "tests/support/thread_ranks.h"

namespace mih::testing {

using Tensors = std::map<std::string, at::Tensor>;

// What a run left on rank 0: per step the metrics, the gathered gradients (after
// synchronization, before clipping) and the gathered parameters (after the optimizer).
struct TrainingRun {
  std::vector<StepMetrics> metrics;
  std::vector<Tensors> grads, params;
  Tensors exp_avg;  // after the last step: the optimizer's first state (SGD: momentum_buffer)
  nlohmann::json layout;
};

// Keeps what the ranks with `keep` gather: every rank gathers (the gathers are collectives of
// its stage), one rank per pipeline stage keeps (rank 0 alone when pp = 1), and the kept
// tensors of the stages are merged by FQN, so a pipelined run has every parameter.
class Capture : public TrainingHooks {
 public:
  Capture(TrainingRun* out, bool keep, bool keep_metrics, int64_t steps, std::mutex* merge)
      : out_(out), keep_(keep), keep_metrics_(keep_metrics), steps_(steps), merge_(merge) {}
  void attach_optimizer(const TrainingState& s) override {
    optimizer_ = s.optimizer;
    ctx_ = s.context;
  }
  void after_backward_before_clip(int64_t step) override {
    ParallelContext& ctx = *ctx_;
    Tensors grads;
    // A parameter nothing reached has no gradient (CLIP's post_layernorm in the vlm).
    for (const auto& p : ctx.parameters()) {
      if (p->local.grad().defined()) grads[p->fqn] = ctx.gather_full(*p, p->local.grad());
    }
    if (keep_) merge(out_->grads, step, grads);
  }
  void after_optimizer(int64_t step) override {
    ParallelContext& ctx = *ctx_;
    Tensors params, exp_avg;
    for (const auto& p : ctx.parameters()) {
      params[p->fqn] = ctx.gather_full(*p, p->local);
      const at::Tensor state = compat::optimizer_state(*optimizer_, p->local, compat::state_names(*optimizer_).front());
      if (step == steps_ - 1 && state.defined()) exp_avg[p->fqn] = ctx.gather_full(*p, state);
    }
    if (!keep_) return;
    merge(out_->params, step, params);
    if (step == steps_ - 1) {
      std::lock_guard<std::mutex> lock(*merge_);
      out_->exp_avg.insert(exp_avg.begin(), exp_avg.end());
      if (keep_metrics_) out_->layout = ctx.to_json();
    }
  }
  void end_step(const StepMetrics& m) override {
    if (keep_metrics_) out_->metrics.push_back(m);
  }

 private:
  void merge(std::vector<Tensors>& into, int64_t step, const Tensors& mine) {
    std::lock_guard<std::mutex> lock(*merge_);
    if (into.size() <= static_cast<size_t>(step)) into.resize(static_cast<size_t>(step) + 1);
    into[static_cast<size_t>(step)].insert(mine.begin(), mine.end());
  }

  TrainingRun* out_;
  bool keep_;
  bool keep_metrics_;
  int64_t steps_;
  std::mutex* merge_;
  torch::optim::Optimizer* optimizer_ = nullptr;
  ParallelContext* ctx_ = nullptr;
};

/// Trains `steps` steps of `factory`'s model under `config` on thread ranks and returns what
/// rank 0 captured (and under pp the first rank of every stage); rank errors are reported
/// as test failures.
inline TrainingRun train_on_threads(const ParallelConfig& config, const ModelFactory& factory, const BatchSource& batches,
                                    const TrainerOptions& options, int64_t steps) {
  TrainingRun run;
  std::mutex merge;
  std::vector<std::string> errors = run_mesh(config, [&](DeviceMesh& mesh) {
    Capture capture(&run, mesh.axis_rank(MeshAxis::kStage) == 0, mesh.rank() == 0, steps, &merge);
    Trainer trainer(mesh, config, factory, batches, options, &capture);
    trainer.run(steps);
  });
  EXPECT_TRUE(errors.empty()) << config.name() << ": " << (errors.empty() ? "" : errors.front());
  return run;
}

// `floor`: a gradient (or moment) whose reference is below tolerance x the step's gradient
// norm is rounding residue of a gradient zero in exact arithmetic (CLIP's key bias), measured
// against that norm, as mih's NumericParity does (cancellation_scale).
inline double relative_error(const at::Tensor& a, const at::Tensor& b, double floor = 0) {
  const double reference = b.abs().max().item<double>();
  double scale = std::max(reference, 1e-30);
  if (floor > 0 && reference <= floor) scale = floor;
  return (a - b).abs().max().item<double>() / scale;
}

inline double relative_error(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-30); }

// Names the first value (in step and forward order) that differs by more than the tolerance.
inline ::testing::AssertionResult MatchesReference(const TrainingRun& run, const TrainingRun& ref,
                                                   double tolerance = 1e-10) {
  if (run.metrics.size() != ref.metrics.size() || run.grads.size() != ref.grads.size()) {
    return ::testing::AssertionFailure() << "ran " << run.metrics.size() << " steps, the reference " << ref.metrics.size();
  }
  double worst = 0;
  for (size_t s = 0; s < ref.metrics.size(); ++s) {
    const auto& m = run.metrics[s];
    const auto& r = ref.metrics[s];
    for (auto [name, a, b] : {std::tuple{"loss", m.loss, r.loss}, std::tuple{"grad norm", m.grad_norm_pre_clip, r.grad_norm_pre_clip},
                              std::tuple{"post-clip grad norm", m.grad_norm_post_clip, r.grad_norm_post_clip}}) {
      double e = relative_error(a, b);
      worst = std::max(worst, e);
      if (!(e <= tolerance)) {
        return ::testing::AssertionFailure() << "step " << s << " " << name << ": " << a << " vs reference " << b
                                             << " (relative error " << e << " > " << tolerance << ")";
      }
    }
    if (m.lr != r.lr) return ::testing::AssertionFailure() << "step " << s << " lr " << m.lr << " vs reference " << r.lr;
    if (m.valid_tokens != r.valid_tokens) {
      return ::testing::AssertionFailure() << "step " << s << " valid tokens " << m.valid_tokens << " vs " << r.valid_tokens;
    }
    for (const auto& [stage, got, want] : {std::tuple{"gradient", &run.grads[s], &ref.grads[s]},
                                           std::tuple{"parameter after the optimizer", &run.params[s], &ref.params[s]}}) {
      for (const auto& [fqn, expected] : *want) {
        auto it = got->find(fqn);
        if (it == got->end()) return ::testing::AssertionFailure() << "no parameter '" << fqn << "' in the run";
        if (it->second.sizes() != expected.sizes()) {
          return ::testing::AssertionFailure() << "step " << s << " " << stage << " of '" << fqn << "': shape "
                                               << it->second.sizes() << " vs reference " << expected.sizes();
        }
        const bool gradient = std::string(stage) == "gradient";
        double e = relative_error(it->second, expected, gradient ? tolerance * r.grad_norm_pre_clip : 0);
        worst = std::max(worst, e);
        if (!(e <= tolerance)) {
          return ::testing::AssertionFailure() << "step " << s << " " << stage << " of '" << fqn << "': relative error "
                                               << e << " > " << tolerance;
        }
      }
    }
  }
  const double last_norm = ref.metrics.empty() ? 0 : ref.metrics.back().grad_norm_post_clip;
  for (const auto& [fqn, expected] : ref.exp_avg) {
    double e = relative_error(run.exp_avg.at(fqn), expected, tolerance * last_norm);
    if (!(e <= tolerance)) {
      return ::testing::AssertionFailure() << "optimizer state (exp_avg / momentum_buffer) of '" << fqn
                                           << "': relative error " << e;
    }
  }
  return ::testing::AssertionSuccess() << "worst relative error " << worst;
}

}  // namespace mih::testing
