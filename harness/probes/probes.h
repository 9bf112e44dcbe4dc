// Tensor probes (DESIGN.md sections 6-7; the seed tool's tensor_probes.py, without its
// per-parameter pickled all-gathers): a watchlist of parameters, and at each stage of a step
// statistics of each watched tensor that do not depend on how it is sharded, computed from
// the local pieces and finished with two all-reduces for the whole watchlist. Also replica
// consistency (every copy of a piece equal) and the process's peak memory.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <c10/core/Device.h>
#include <nlohmann/json.hpp>

#include "harness/parallel/parallel_context.h"
#include "harness/findings/findings.h"

namespace torch::optim {
class Optimizer;
}

namespace mih::probes {

struct WatchlistOptions {
  /// Parameters of at most this many elements are always watched.
  int64_t small_numel = 4096;
  /// A model of at most this many parameter elements is watched whole.
  int64_t watch_all_up_to = 4'000'000;
  /// FQN globs (fnmatch) of parameters the author wants watched.
  std::vector<std::string> patterns;
  /// Tensors of at most this many elements also record their full values (float64).
  int64_t values_up_to = 64;
  /// Random ±1 projections per tensor (the sketch).
  int projections = 4;
};

struct WatchEntry {
  const ShardedParameter* param = nullptr;
  /// Why it is watched: "whole model", "small", "pattern <glob>", "representative of <group>".
  std::string reason;
};

/// The watched parameters, in forward (creation) order: the whole model when it is small
/// enough, else the small ones, the pattern matches, and one representative per group of
/// (FQN with layer indices replaced by '*', placements).
std::vector<WatchEntry> build_watchlist(const ParallelContext& ctx, const WatchlistOptions& options);
nlohmann::json to_json(const std::vector<WatchEntry>& watchlist);

enum class Stage { kModelBefore, kGradBeforeClip, kGradAfterClip, kAfterOptimizer, kOptimizerState };
/// "model_before", "grad_before_clip", "grad_after_clip", "after_optimizer", "optimizer_state".
std::string stage_name(Stage stage);

/// Statistics of each watched tensor at `stage` (collective over the ranks of this pipeline
/// stage, MeshAxis::kStage: the world without pp; each stage probes its own parameters): for the
/// parameters' values (model_before, after_optimizer), gradients (grad_*) or optimizer state
/// (optimizer_state: "<fqn>/<state>" per compat::state_names, "<fqn>/exp_avg" ...). Per tensor: sum, sum_sq, min,
/// max, nonfinite (count), defined_ranks, sketch (k sums of x[i] * sign_j(i), the sign a
/// hash of the global element index i, so it is the same under every sharding) and, for
/// small tensors, values (row-major, float64). Each element is counted once: only the rank
/// that writes a piece (ParallelContext::writes_piece) contributes it.
/// Returns {"stage": name, "tensors": {name: {...}}}.
nlohmann::json probe_stage(ParallelContext& ctx, const std::vector<WatchEntry>& watchlist, Stage stage,
                           torch::optim::Optimizer* optimizer, const WatchlistOptions& options);

/// The ±1 signs of the sketches (harness/parallel/activations.h; the activation probes use
/// the same).
using ::mih::projection_signs;

/// Replica consistency after the optimizer (collective over the world): every rank holding
/// the same piece of a parameter (the same boxes) holds the same bytes, and so do the copies
/// of a parameter tied across pipeline stages (ShardedParameter::pp_ranks). Findings
/// MIH-PROBE-001 name the parameter, the step and the ranks that differ.
FindingReport check_replica_consistency(ParallelContext& ctx, int64_t step, nlohmann::json* evidence);

/// The process's peak memory in bytes: CUDA allocator peak on a CUDA device (when built
/// with CUDA), else the resident-set high-water mark (getrusage ru_maxrss).
int64_t peak_memory_bytes(c10::Device device);

}  // namespace mih::probes
