// Internal to trainer_session*.cpp: where a piece of a tensor lies in the global tensor, and
// sharding-invariant statistics of pieces finished with collectives over the world.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include "harness/runtime/communicator.h"
#include "harness/session/trainer_session.h"

namespace mih::trainer_session_internal {

inline constexpr int kProjections = 4;  // as probes::WatchlistOptions::projections

/// A mesh axis of the trainer: its size and this rank's index along it.
struct AxisInfo {
  int size = 1;
  int rank = 0;
  bool data = false;  ///< dp_replicate, dp_shard: its ranks see other rows
};

/// A box of a global tensor: offset and length per dim.
struct Box {
  std::vector<int64_t> offset, length;
  /// "[0:4, 8:16]" (start:end per dim).
  std::string str() const;
};

/// The box `placements` give this rank of a tensor of `global_shape` (torch.chunk's cut per
/// Shard). Axes not in `axes` have size 1.
/// Throws: mih::Error{kInvalidSpec} naming `what` for a dim out of range.
Box piece_box(const std::vector<int64_t>& global_shape, const std::vector<AxisPlacement>& placements,
              const std::map<std::string, AxisInfo>& axes, const std::string& what);

/// Whether this rank is the one of its copies that counts the piece: index 0 along every
/// axis of `axes` that `placements` do not shard (and, for activations, that is not a data
/// axis when `rows_distinct`).
bool counts_piece(const std::vector<AxisPlacement>& placements, const std::map<std::string, AxisInfo>& axes,
                  bool rows_distinct);

/// The global row-major index (int64, shape `box.length`) of each element of the box of a
/// tensor of `global_shape`.
at::Tensor global_index(const std::vector<int64_t>& global_shape, const Box& box);

/// Partial statistics of pieces, summed over the ranks by finish().
struct Stats {
  double sum = 0, sum_sq = 0, nonfinite = 0, numel = 0, defined = 0;
  double max = -1e308, neg_min = -1e308;  // max and -min (both reduced by max)
  std::vector<double> sketch = std::vector<double>(kProjections, 0.0);
  std::vector<double> values;  // global values when small (scattered, summed)
  int64_t total = -1;          // global numel when known
  void add(const at::Tensor& piece, const at::Tensor& index);
};

/// Finishes the named statistics over the world (three all-reduces whatever their number;
/// every rank must pass the same names in the same order) and returns their JSON records as
/// probes/rank0.jsonl holds them ({name: {sum, sum_sq, nonfinite, numel, min, max,
/// defined_ranks, sketch, values?}}).
nlohmann::json finish_stats(Communicator& world, std::vector<std::pair<std::string, Stats>>& stats, bool with_extrema);

/// SHA-256 (hex) of a tensor's bytes (contiguous, on the CPU).
std::string tensor_sha256(const at::Tensor& t);

}  // namespace mih::trainer_session_internal
