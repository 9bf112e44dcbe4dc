// Comparison of a case's evidence with its reference (DESIGN.md section 7): the input identity
// of every step, the loss, the grad norm before and after clipping and the lr, then every
// watched tensor at every probe stage, in step, stage and forward order. Small tensors are
// compared elementwise (their values are in the probes); larger ones by their sharding-
// invariant statistics (sum, sum of squares, the random-projection sketch). The first
// divergence names the parameter (or field, or scalar), the step and stage, the max abs
// error, the relative error and the tolerance, and the evidence file to open. No torch.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace mih {

struct CompareOptions {
  /// Relative tolerance (float64 oracle lane: 1e-10; see spec::Tolerances).
  double tolerance = 1e-10;
  /// Compare only steps >= first_step (a resume against its uninterrupted twin).
  int64_t first_step = 0;
};

struct Divergence {
  std::string kind;  // "input", "metric", "tensor" (a watched parameter), "activation" (a module)
  std::string name;  // field, metric or tensor ("norm.weight", "layers.0.mlp.router/exp_avg")
  int64_t step = 0;
  std::string stage;  // probe stage, or "metrics"
  double max_abs_error = 0;
  double relative_error = 0;  // relative L2 for values; max relative over statistics otherwise
  double tolerance = 0;
  std::string evidence;  // the file to open
  std::string message;
  /// "candidate" or "reference" when the quantity is recorded by one side only.
  std::string missing_from;
};

struct Comparison {
  std::vector<Divergence> divergences;  ///< the first divergence first
  int64_t compared = 0;                 ///< quantities compared
  /// The modules the activation probes recorded, in forward order (localize() walks it).
  std::vector<std::string> activation_order;
  bool passed() const { return divergences.empty(); }
  nlohmann::json to_json() const;
  /// "match: N quantities within tolerance T", or where localize() puts the fault, the first
  /// divergence's message and a count.
  std::string summary() const;
};

/// Where a comparison puts the fault: the first place whose numbers leave the reference's.
struct Localization {
  /// A module FQN ("layers.1.self_attn"), or "data" (the global batch), "loss" (the
  /// activations match through the head and the loss or its gradient differs), "grad_norm",
  /// "optimizer" (gradients match, the update does not), "checkpoint" (a resumed run's
  /// parameters before its first step); "" when nothing diverges.
  std::string blamed;
  /// One sentence: why that place, what matched before it.
  std::string reason;
};

/// Localizes the first step with a divergence: the input; the parameters before the step
/// (a resumed run's first step: the checkpoint; else the parameter's module); the first
/// module whose forward output diverges, in forward order; the loss, when every forward
/// output matches and the loss differs; else, in backward order (the forward order
/// reversed), the module whose backward produced the first divergent output gradient (the
/// one before it; the loss when it is the head's); else the module of the first parameter
/// whose gradient diverges; the grad norm; the optimizer. `resumed`: the candidate starts from
/// a checkpoint.
Localization localize(const Comparison& comparison, bool resumed = false);

/// The module of a parameter FQN: "layers.0.mlp.down_proj.weight" -> "layers.0.mlp.down_proj"
/// (an optimizer state's "/exp_avg" dropped first); a top-level parameter is its own name.
std::string module_of_parameter(const std::string& fqn);

/// Compares evidence directory `candidate` with `reference` (both written by a session).
/// Throws: mih::Error{kFailedPrecondition} naming the file and directory when a required
///   evidence file (cases/runtime/metrics.jsonl, probes/rank0.jsonl,
///   check/parameter_watchlist.json) is missing; kInvalidSpec when the two have no step in
///   common.
Comparison compare_evidence(const std::filesystem::path& reference, const std::filesystem::path& candidate,
                            const CompareOptions& options = {});

}  // namespace mih
