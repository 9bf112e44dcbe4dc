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
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/contract/metrics_row.h"

namespace mih {

/// One compared quantity (a metric, or a watched tensor or module activation at one step and
/// stage) and its error against the reference: relative to the reference's scale (its
/// absolute value for a metric, its L2 norm for a tensor; the largest over a tensor's
/// statistics when it is compared by its sketch).
struct Measurement {
  std::string kind;  ///< "metric", "tensor" or "activation"
  std::string name;
  int64_t step = 0;
  std::string stage;  ///< the probe stage, or "metrics"
  double relative_error = 0;
  double max_abs_error = 0;
  /// "metric|loss|0|metrics": what a calibration is keyed by.
  std::string key() const;
  /// "metric|0|metrics": the quantities of one kind at one step and stage.
  std::string group() const;
};

/// The calibration of a reduced-precision lane (DESIGN.md section 7, docs/precision.md): the
/// rounding noise of every quantity, measured between the lane's world-size-1 reference and
/// its noise twin, and from it each quantity's tolerance
///   tolerance = factor x max(k x noise, floor_eps x epsilon)
/// noise = max(the quantity's own noise, the median noise of its kind at that step and
/// stage): one pair of runs gives one sample of each quantity's noise, and a sample can happen
/// to be tiny (two roundings that agree), so the median of its stage guards it. A parameter
/// after an update (after_optimizer; model_before from step 1) takes k_update and the largest
/// noise of its stage instead: AdamW's first updates are nearly the sign of the gradient, so an
/// element whose gradient is within noise of zero moves by +-lr depending on the rounding, a
/// discrete event one twin may not sample. A gradient norm's noise is at least the median
/// noise of the gradients at its step: the norm's error is bounded by theirs (| |a| - |b| | <=
/// |a - b|), and the twin's sample of the norm alone is unrepresentative: the twin's rounding
/// differences are unbiased and average out over the norm's elements (vlm, bfloat16: 1.1e-5),
/// while a parallel configuration's can be biased (Tp2Sp: 3.2e-4, 28 of those noises; the
/// gradients' median noise was 3.7e-3). The loss's noise at a step is at least its noise at
/// every earlier step: one number gives one sample per step, and a later one can be small by
/// chance while the runs' difference only compounds. The floor is the dtype's epsilon times the tensor's
/// scale (errors are relative to it): two runs may differ by a rounding the twin's reduction
/// order did not reach. `factor` is 1 for a case against its lane's reference and
/// noise_oracle_factor for the lane's reference and twin against the float64 Reference, whose
/// difference includes the lane's systematic rounding (identical in the twin, so not in its
/// noise). The floor's epsilon is that of the dtype the quantity is held in: the lane's for
/// activations, float32 for the rest in the autocast lanes (bfloat16, float16), whose master
/// weights, gradients, loss and grad norm are float32. Failure messages and evidence divide
/// each error by its noise (error / noise).
struct Calibration {
  std::string dtype;       ///< "float32", "bfloat16"
  double epsilon = 0;      ///< the dtype's machine epsilon (2^-23, 2^-7): the floor of activations
  /// The epsilon of the dtype every other quantity is held in: float32 in the autocast lanes
  /// (master weights, gradients, optimizer states, the loss and grad norm), else `epsilon`.
  double master_epsilon = 0;
  double k = 0;            ///< tolerance multiple of the noise
  double k_update = 0;     ///< the same for a parameter after an update
  double floor_eps = 0;    ///< the floor, in epsilons
  double factor = 1;       ///< 1, or the oracle factor (the lane's anchors against float64)
  std::map<std::string, double> noise;        ///< Measurement::key() -> the twin's relative error
  std::map<std::string, double> group_noise;  ///< Measurement::group() -> median nonzero noise
  std::map<std::string, double> group_max;    ///< Measurement::group() -> largest noise
  /// A parameter after an update: after_optimizer, or model_before from step 1.
  static bool updated_parameter(const Measurement& m);
  /// The metrics grad_norm_pre_clip and grad_norm_post_clip: L2 norms of every gradient.
  static bool gradient_norm(const Measurement& m);
  /// `epsilon` for an activation (computed in the lane's dtype), `master_epsilon` otherwise.
  double floor_epsilon(const Measurement& m) const { return m.kind == "activation" ? epsilon : master_epsilon; }
  /// max(own noise, its group's median, or for an updated parameter its group's largest); for
  /// a gradient norm also the median noise of the gradients (stage grad_before_clip) at that
  /// step; for the loss also its noise at every earlier step; -1 when the twin did not record
  /// the quantity.
  double noise_of(const Measurement& m) const;
  /// factor x max(k (or k_update) x noise_of, floor_eps x floor_epsilon); the floor alone
  /// for a quantity without noise.
  double tolerance_of(const Measurement& m) const;
};

/// The machine epsilon of a dtype name: float64 2^-52, float32 2^-23, bfloat16 2^-7, float16
/// 2^-10. Throws: mih::Error{kInvalidSpec} for another name.
double dtype_epsilon(const std::string& dtype);

struct Comparison;

/// The calibration from `twin` (compare_evidence of the noise twin against the lane's
/// reference, any tolerance) with `settings`' k, k_update, floor_eps and factor.
/// Throws: mih::Error{kInvalidSpec} for a setting negative or not finite (factor <= 0), or an
///   unknown dtype.
Calibration calibrate(const Comparison& twin, const std::string& dtype, const Calibration& settings);

struct CompareOptions {
  /// Relative tolerance (float64 oracle lane: 1e-10; see spec::Tolerances).
  double tolerance = 1e-10;
  /// Compare only steps >= first_step (a resume against its uninterrupted twin).
  int64_t first_step = 0;
  /// A reduced-precision lane: each quantity's tolerance is the calibration's (tolerance is
  /// then unused), and a divergence reports its error / noise.
  const Calibration* calibration = nullptr;
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
  /// The calibrated noise of the quantity (0 without a calibration; -1 not measured).
  double noise = 0;
};

struct Comparison {
  std::vector<Divergence> divergences;  ///< the first divergence first
  int64_t compared = 0;                 ///< quantities compared
  /// Every metric, tensor and activation compared, in comparison order (inputs and what one
  /// side lacks are divergences only).
  std::vector<Measurement> measurements;
  /// The modules the activation probes recorded, in forward order (localize() walks it).
  /// Empty when the port observes none (it never calls ParallelContext::observe).
  std::vector<std::string> activation_order;
  /// The modules that own the candidate's parameters (check/structure.json, else the
  /// watchlist), and those of them no observed module is or contains: where a fault shows
  /// first in a later observed output or in the loss, so localize() says the blame is coarse.
  int64_t parameter_modules = 0;
  std::vector<std::string> unobserved_modules;
  /// Modules whose output (or its gradient) one side's writer saw but could not place on its
  /// mesh (ProbeRow::unplaced), so not compared; the summary names them.
  std::vector<std::string> unplaced_modules;
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
/// a checkpoint. The reason says what the activation probes could not see: when no module
/// output was observed, that the blame cannot go below the loss and how to observe them;
/// when only some modules with parameters were, which ones were not.
Localization localize(const Comparison& comparison, bool resumed = false);

/// The error of one tensor's probe record `candidate` against `reference` (the probes' JSON:
/// "values" for a small tensor, else "sum", "sum_sq", "sketch", "numel", "nonfinite"): the
/// relative L2 error of the values when both hold them, else the largest error of the
/// statistics relative to the reference's L2 norm (the sum of squares relative to itself);
/// infinite when the element or non-finite counts differ (`counts` then says how).
struct TensorError {
  double relative = 0;
  double max_abs = 0;
  std::string counts;
};
/// `scale_floor` (> 0): the norm the errors are relative to at least (cancellation_scale).
TensorError tensor_error(const nlohmann::json& candidate, const nlohmann::json& reference, double scale_floor = 0);

/// The L2 norm of a probe record: of its values, else the square root of its sum of squares,
/// else its largest sketch projection.
double record_norm(const nlohmann::json& record);

/// For a gradient stage ("grad_before_clip", "grad_after_clip") or an AdamW moment
/// ("optimizer_state", `name` ending "/exp_avg" or "/exp_avg_sq"): the step's gradient norm
/// G (`reference_metrics`' grad_norm_pre_clip, or grad_norm_post_clip after clipping and for
/// the moments; G^2 for exp_avg_sq) when the reference's record is at most `tolerance` of it,
/// i.e. a gradient zero in exact arithmetic and rounding residue as computed (a key
/// projection's bias under softmax: its gradient cancels); else 0. Its errors are then
/// relative to that scale: tolerance x G absolute. 0 for a tolerance outside (0, 1) (a pass
/// that measures every quantity's error, as the noise twin's calibration does).
double cancellation_scale(const std::string& stage, const std::string& name,
                          const contract::MetricsRow& reference_metrics, const nlohmann::json& reference_record,
                          double tolerance);

/// The module of a parameter FQN: "layers.0.mlp.down_proj.weight" -> "layers.0.mlp.down_proj"
/// (an optimizer state's "/exp_avg" dropped first); a top-level parameter is its own name.
std::string module_of_parameter(const std::string& fqn);

/// Compares evidence directory `candidate` with `reference` (both written by a session).
/// Throws: mih::Error{kFailedPrecondition} naming the file and directory when a required
///   evidence file (cases/runtime/metrics.jsonl, probes/rank0.jsonl,
///   check/parameter_watchlist.json) is missing, when the two have no step in common, and naming
///   the file, the line (and step) and the field when one of the files it reads (those, and
///   spec.resolved.json and check/structure.json when present) is not as the evidence
///   contract's schema describes it (harness/contract: read typed, never with a default).
Comparison compare_evidence(const std::filesystem::path& reference, const std::filesystem::path& candidate,
                            const CompareOptions& options = {});

}  // namespace mih
