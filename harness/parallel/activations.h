// Activations in global coordinates (DESIGN.md section 6): where each element of a rank's
// activation sits in the activation of the whole global batch, whatever the split over
// dp_replicate, dp_shard, cp (zigzag or contiguous) and tp (sequence or feature shards).
// Two things are built on it:
//  - dropout masks drawn per element from a counter-based hash of (seed, step, call, global
//    element index), so every split of an activation draws the mask one rank draws (the idea
//    of veScale's and TTrace's consistent random tensors); the per-call key comes from a CPU
//    generator the activation-checkpoint recompute replays;
//  - activation probes: per module of the watch set, the forward output and the gradient of
//    the loss with respect to it, as sharding-invariant statistics and random-projection
//    sketches whose signs hash the global element index; every rank adds what it holds and
//    one all-reduce finishes them, like the parameter probes (harness/probes).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace torch::nn {
class Module;
}

namespace mih {

class ParallelContext;

/// How a rank's activation of shape [B, S_local, F...] maps into the global one
/// [B_global, S, F_global] (F the trailing dims, flattened row-major). Rows are the rank's
/// rows of the micro-batch (ParallelContext::begin_micro_batch gives the first one). The
/// sequence is this cp rank's tokens (CpShard::query_ids) unless `sequence_over_cp` is
/// false (a field every cp rank holds whole: vision patches), cut to this tp rank's
/// contiguous chunk when `sequence_sharded_over_tp` (Shard(seq) under sequence parallelism;
/// sequence_token_ids in context_parallel.h places them).
/// The features are this tp rank's contiguous chunk when `features_sharded_over_tp`
/// (Shard(hidden): a column-parallel output, attention heads), in `feature_partitions` equal
/// parts each split over tp (a fused [gate; up] output); `logical_features` > 0 drops the
/// padding past it (a vocabulary padded to a multiple of tp).
struct ActivationLayout {
  bool sequence_over_cp = true;
  bool sequence_sharded_over_tp = false;
  bool features_sharded_over_tp = false;
  int64_t feature_partitions = 1;
  int64_t logical_features = -1;
  /// The gradient of the loss with respect to the activation is a partial sum over tp (or
  /// cp) on each rank, summed later by a collective (a tensor every tp rank computes whole
  /// and consumes only its own tokens of). Its probe then records the linear statistics
  /// only (sum, sketch), which the all-reduce finishes.
  bool grad_partial_over_tp = false;
  bool grad_partial_over_cp = false;

  /// The residual stream of a transformer: Shard(seq) over tp under sequence parallelism,
  /// else replicated over tp.
  static ActivationLayout residual(const ParallelContext& ctx);
  /// A column-parallel output: Shard(features) over tp (replicated when tp == 1).
  static ActivationLayout column_parallel(int64_t logical_features = -1, int64_t partitions = 1);
  /// Replicated over tp (and over cp when `sequence_over_cp` is false).
  static ActivationLayout replicated(bool sequence_over_cp = true);
};

/// The global row-major index of every element of a rank's activation of shape `sizes`
/// (int64, CPU, `sizes`), and in `valid` (when given) whether it is a real element rather
/// than padding. `first_row`: global index of the rank's first row.
/// Throws: mih::Error{kInvalidSpec} for fewer than 3 dims, or features that do not split as
///   the layout says.
at::Tensor global_element_index(const ParallelContext& ctx, at::IntArrayRef sizes, const ActivationLayout& layout,
                                int64_t first_row, at::Tensor* valid = nullptr);

/// The dropout keep-mask (bool, CPU, shape of `index`) of call key `key`: element with global
/// index e is kept iff u(splitmix64(key ^ splitmix64(e))) >= p, u the top 53 bits in [0, 1).
at::Tensor counter_dropout_keep(const at::Tensor& index, uint64_t key, double p);

/// The ±1 sign of sketch projection `j` for global element indices `index` (int64, any
/// shape): a 31-bit multiply-xorshift hash, computed with torch ops on non-negative values
/// only (the parameter and activation probes share it).
at::Tensor projection_signs(const at::Tensor& index, int64_t j);

/// The statistics of one module's activation, summed over micro-batches and ranks:
/// [sum, sum_sq, nonfinite, count, sketch_0 .. sketch_{k-1}].
struct ActivationStats {
  std::vector<double> values;
  bool seen = false;
  /// False when the gradient is a partial sum on each rank: sum_sq is not comparable.
  bool has_sum_sq = true;
};

/// The activation probes of one ParallelContext (see the file comment). Not thread-safe.
class ActivationProbes {
 public:
  explicit ActivationProbes(ParallelContext& ctx) : ctx_(&ctx) {}

  /// Which modules are watched: FQN globs (fnmatch); empty watches every module the model
  /// observes. `projections`: sketch width k.
  void configure(std::vector<std::string> patterns, int projections);
  /// Records the steps it is on for (the session turns it on for the first two steps and the
  /// last).
  void set_enabled(bool on) { enabled_ = on; }
  bool enabled() const { return enabled_; }
  /// The module FQNs, from the model's named_modules (ParallelContext::finalize).
  void name_modules(torch::nn::Module& root);

  /// See ParallelContext::observe.
  at::Tensor observe(const torch::nn::Module& module, const at::Tensor& out, const ActivationLayout& layout,
                     int64_t first_row, int64_t micro_batch);

  struct Record {
    std::string module;
    ActivationStats forward, grad;
  };
  /// This rank's records since the last take, reduced over the ranks of this pipeline stage
  /// (MeshAxis::kStage, the world without pp; a collective: every rank calls it), in this rank's first-observation (forward) order; empties them.
  std::vector<Record> take_reduced();

 private:
  struct Signs {
    at::Tensor signs;  // [numel, k] float64, zero on padding
    at::Tensor valid;  // [numel] float64 (1 real, 0 padding), undefined when none is padding
  };
  const Signs& signs_for(at::IntArrayRef sizes, const ActivationLayout& layout, int64_t first_row);
  // Adds `x` when `contributes`; its element count when `counts` (the one rank of each element).
  void add(ActivationStats& into, const at::Tensor& x, const Signs& s, bool contributes, bool linear_only, bool counts);

  ParallelContext* ctx_;
  bool enabled_ = false;
  int projections_ = 4;
  std::vector<std::string> patterns_;
  std::map<const torch::nn::Module*, std::string> names_;
  std::vector<std::string> module_order_;  // every named module, named_modules order
  std::map<std::string, Record> records_;
  std::vector<std::string> observed_order_;
  // (module, micro-batch, recompute) already observed: a module observed twice in one forward
  // records once.
  std::map<std::string, std::pair<int64_t, bool>> last_;
  std::map<std::vector<int64_t>, Signs> sign_cache_;
};

}  // namespace mih
