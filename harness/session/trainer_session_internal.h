// Internal to trainer_session*.cpp: where a piece of a tensor lies in the global tensor,
// sharding-invariant statistics of pieces finished with collectives over the world, and those
// collectives on the device the world's backend moves.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <nlohmann/json.hpp>

#include "harness/runtime/communicator.h"
#include "harness/session/replica_digests_internal.h"
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

/// The current CUDA device of this process; nullopt on a libtorch without CUDA or without a
/// GPU visible.
std::optional<c10::Device> current_cuda_device();

/// The device the session's collectives over a `world` group stage their tensors on
/// (TrainerSessionOptions::collective_device): `requested` when set (CUDA without an index =
/// `current_cuda`), else the CPU for Gloo and `current_cuda` for NCCL, as torch.distributed
/// picks it. `cuda_devices`: how many CUDA devices this process sees.
/// Throws: mih::Error{kInvalidSpec} for a device neither CPU nor CUDA, the CPU on an NCCL
///   world, NCCL or "cuda" without a current CUDA device, or an index >= cuda_devices.
c10::Device choose_collective_device(compat::BackendKind world, std::optional<c10::Device> requested,
                                     std::optional<c10::Device> current_cuda, int cuda_devices);

/// choose_collective_device with this process's CUDA devices, asked only when `world` is NCCL
/// or `requested` is CUDA. Throws: as choose_collective_device.
c10::Device collective_device_of(compat::BackendKind world, std::optional<c10::Device> requested);

/// Refuses a parameter on another CUDA device than `collectives` when the latter was not
/// `requested` but taken as the current device (a trainer that did not set its rank's device).
/// Throws: mih::Error{kInvalidSpec} naming `fqn`, both devices and the fix.
void check_parameter_device(const c10::Device& collectives, bool requested, const c10::Device& parameter,
                            const std::string& fqn);

/// The session's own collectives over the world group, outside the ledger. Each takes and
/// returns CPU tensors or values and stages what it moves on `device` (choose_collective_device:
/// an NCCL group refuses CPU tensors), so no hook can hand the group a tensor elsewhere.
class WorldCollectives {
 public:
  WorldCollectives(compat::Group world, c10::Device device);
  const c10::Device& device() const { return device_; }
  /// `host` (any device, unchanged) reduced over the world, as a new CPU tensor.
  at::Tensor all_reduce(const at::Tensor& host, ReduceOp op, CallSite site);
  /// mih::all_gather_json over the world on device().
  std::vector<nlohmann::json> all_gather_json(const nlohmann::json& value, CallSite site);
  /// session_internal::replica_records over the world on device().
  nlohmann::json replica_records(const std::vector<session_internal::PieceDigest>& mine);
  /// Returns when every rank called it (a one-element all-reduce on device()).
  void barrier(CallSite site);

 private:
  Communicator comm_;
  c10::Device device_;
};

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
nlohmann::json finish_stats(WorldCollectives& world, std::vector<std::pair<std::string, Stats>>& stats, bool with_extrema);

/// SHA-256 (hex) of a tensor's bytes (contiguous, on the CPU).
std::string tensor_sha256(const at::Tensor& t);

}  // namespace mih::trainer_session_internal
