// The module parity engine: a candidate module against an independent reference
// implementation, forward and backward. The harness builds the candidate on a one-rank
// context, feeds the reference the candidate's weights through the case's weight adapter, runs
// both on the same random float64 inputs with the same random upstream gradient, and compares
// the output, every input gradient and every trainable parameter's gradient.
//
// How to add one (complete small examples: fused_swiglu_case in specs/llama_spec.cpp, the
// function-only attention_case next to it, moe_loop_case in specs/moe_spec.cpp):
//
//   spec::ModuleParityCase c;
//   c.name = "fused_swiglu_vs_unfused";
//   c.candidate = [](ParallelContext& ctx) {
//     models::LlamaMlp mlp(ctx, options);
//     return spec::ParityCandidate{mlp.ptr(), [mlp](const auto& in) { return mlp->forward(in[0]); }};
//   };
//   c.weights = {{"gate_up_proj.weight", "gate", [](const at::Tensor& w) { return w.narrow(0, 0, F); }},
//                {"gate_up_proj.weight", "up", [](const at::Tensor& w) { return w.narrow(0, F, F); }},
//                {"down_proj.weight", "down"}};
//   c.reference = [](const spec::ReferenceWeights& w, const std::vector<at::Tensor>& in) {
//     return at::linear(at::silu(at::linear(in[0], w.at("gate"))) * at::linear(in[0], w.at("up")), w.at("down"));
//   };
//   c.input_shapes = {{2, 5, H}};
//   s.parity_cases.push_back(c);
//
// Evidence (check/module_parity.json, one object per case, see ModuleParityResult::to_json):
// passed, trainable, unmapped, error, and observations [{name, shape, max_abs_error,
// relative_error, tolerance, passed, note}] with names "output", "aux_loss", "input_grad[i]"
// and "grad:<FQN>".
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json_fwd.hpp>

namespace torch::nn {
class Module;
}  // namespace torch::nn

namespace mih {
class ParallelContext;
}  // namespace mih

namespace mih::spec {

/// What a candidate or a reference returns: its output, and optionally a scalar loss term the
/// module adds to the gradients besides its output (a load-balancing loss attached the way
/// Megatron-LM's MoEAuxLossAutoScaler does). Implicit from a tensor, so a lambda that returns
/// the output alone fits.
struct ParityOutput {
  ParityOutput(at::Tensor output, at::Tensor aux_loss = {})  // NOLINT(google-explicit-constructor)
      : output(std::move(output)), aux_loss(std::move(aux_loss)) {}
  at::Tensor output;
  /// Undefined: none. When it requires grad, backward adds it with upstream gradient 1; when
  /// both sides return one, its value is the observation "aux_loss".
  at::Tensor aux_loss;
};

/// The module under test, built by the case on a one-rank ParallelContext (float64
/// parameters, the case's seed).
struct ParityCandidate {
  /// Its trainable parameters (named_parameters() with requires_grad) are what the weight
  /// adapter must map, each compared by gradient. Null: a function of its inputs (e.g.
  /// cp_causal_attention on q, k, v); then only the output and the input gradients are compared.
  std::shared_ptr<torch::nn::Module> module;
  /// The forward on the inputs (float64 leaves that require grad).
  std::function<ParityOutput(const std::vector<at::Tensor>& inputs)> forward;
};

/// One entry of a weight adapter: the reference reads weight `reference` as
/// `transform(candidate tensor at FQN candidate)`. The transform is differentiable (narrow,
/// reshape, transpose, cat with a constant, ...): the reference's gradient reaches the
/// candidate's layout through it, so a parameter's gradients compare without a hand-written
/// inverse. Several entries may read one candidate tensor (a fused [gate; up] split in two);
/// their gradients add.
struct ParityWeight {
  ParityWeight(std::string candidate, std::string reference = "",  // NOLINT(google-explicit-constructor)
               std::function<at::Tensor(const at::Tensor&)> transform = {})
      : candidate(std::move(candidate)), reference(std::move(reference)), transform(std::move(transform)) {}
  /// FQN of a parameter or buffer of the candidate module ("gate_up_proj.weight").
  std::string candidate;
  /// The name the reference reads it under (ReferenceWeights::at). Empty: `candidate`.
  std::string reference;
  /// Empty: the identity.
  std::function<at::Tensor(const at::Tensor&)> transform;
};

/// The weights a reference reads, by the adapter's reference names.
class ReferenceWeights {
 public:
  explicit ReferenceWeights(std::map<std::string, at::Tensor> tensors) : tensors_(std::move(tensors)) {}
  /// Throws: mih::Error{kInvalidSpec} for a name the adapter does not produce, listing those it does.
  const at::Tensor& at(const std::string& name) const;
  std::vector<std::string> names() const;

 private:
  std::map<std::string, at::Tensor> tensors_;
};

/// A candidate module against an independent reference implementation, forward and backward.
struct ModuleParityCase {
  std::string name;
  /// Builds the module under test.
  std::function<ParityCandidate(ParallelContext& ctx)> candidate;
  /// The weight adapter: every trainable parameter of the candidate must appear as the
  /// `candidate` of at least one entry (one left out is the failure "unmapped", naming it).
  std::vector<ParityWeight> weights;
  /// The independent implementation: never calls the candidate. Inputs are fresh leaves with
  /// the candidate's input values.
  std::function<ParityOutput(const ReferenceWeights& weights, const std::vector<at::Tensor>& inputs)> reference;
  /// The inputs: standard normal float64 tensors of these shapes (drawn from the case's seed).
  std::vector<std::vector<int64_t>> input_shapes;
  /// Relative tolerance of the output (and aux_loss) observations; see ParityObservation.
  double tolerance = 1e-12;
  /// Relative tolerance of the input and parameter gradient observations. Negative (default):
  /// `tolerance`.
  double grad_tolerance = -1;
  /// Seed of the candidate's parameter init, the inputs and the upstream gradient.
  uint64_t seed = 7;

  /// Throws: mih::Error{kInvalidSpec} naming the case: no name, candidate or reference, no
  ///   input shape, a tolerance that is not positive, an adapter entry without a candidate FQN,
  ///   or two entries with the same reference name. (Whether the FQNs exist and cover the
  ///   candidate's parameters is known once it is built: run_module_parity.)
  void validate() const;
  /// {name, input_shapes, weights [{candidate, reference, transform}], tolerance,
  /// grad_tolerance, seed} (the spec's declaration, for spec.resolved.json).
  nlohmann::json to_json() const;
};

/// One comparison of candidate against reference.
struct ParityObservation {
  /// "output", "aux_loss", "input_grad[<i>]" or "grad:<FQN>".
  std::string name;
  std::vector<int64_t> shape;
  double max_abs_error = 0;
  /// max_abs_error / max(max |candidate|, max |reference|); 0 when both are zero everywhere.
  double relative_error = 0;
  double tolerance = 0;
  bool passed = false;
  /// Why a side counts as zero: its gradient is undefined (the tensor did not reach the output).
  std::string note;
};

/// The outcome of one case.
struct ModuleParityResult {
  std::string name;
  /// The candidate's trainable parameter FQNs, in registration order.
  std::vector<std::string> trainable;
  /// Those no adapter entry maps (then nothing is run).
  std::vector<std::string> unmapped;
  /// In the order output, aux_loss, input gradients, parameter gradients.
  std::vector<ParityObservation> observations;
  /// What building or running the case threw ("" if nothing).
  std::string error;

  /// No error, nothing unmapped, at least one observation and every observation passed.
  bool passed() const;
  /// "" when passed; else one sentence naming the case and the first failure (for an
  /// observation: its name, relative error, tolerance and max abs error).
  std::string failure() const;
  /// {passed, failure, trainable, unmapped, error, observations [{name, shape, max_abs_error,
  /// relative_error, tolerance, passed, note}]}.
  nlohmann::json to_json() const;
};

/// Runs the case: builds the candidate on a one-rank mesh (float64, the case's seed), checks
/// that the adapter maps every trainable parameter, runs candidate and reference forward on
/// the same inputs and backward from the same random upstream gradient, and compares. Never
/// throws for the case's own faults: what the case throws (an adapter FQN the candidate does
/// not have, a reference name the adapter does not produce, a shape mismatch) is `error`.
ModuleParityResult run_module_parity(const ModuleParityCase& c);

}  // namespace mih::spec
