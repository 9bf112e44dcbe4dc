// DeviceMesh: the world laid out on the mesh dims of ParallelConfig (kMeshDims: pp,
// dp_replicate, dp_shard, cp, tp, outer to inner, TorchTitan's ParallelDims), with a
// Communicator per axis of kMeshAxes: one per dim, the combined axes dp (dp_replicate x
// dp_shard), dp_shard_cp (FSDP), dp_cp (loss normalization) and stage (every dim but pp: the
// ranks holding one pipeline stage's parameters), and the two halves of dp_shard_cp under
// expert parallelism: ep (inner, ParallelConfig::ep ranks) and edp (outer, dp_shard * cp / ep).
#pragma once

#include <array>
#include <iosfwd>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "harness/compat/collectives.h"
#include "harness/compat/store.h"
#include "harness/runtime/comm_ledger.h"
#include "harness/runtime/communicator.h"
#include "harness/base/parallel_config.h"

namespace mih {

/// The axes of a mesh with their own process group: the world, one per mesh dim, and the
/// combined axes that vary several mesh dims at once (their ranks in outer-to-inner order).
enum class MeshAxis {
  kWorld,
  kDpReplicate,
  kDpShard,
  kCp,
  kTp,
  kDp,         ///< dp_replicate x dp_shard: data loading
  kDpShardCp,  ///< dp_shard x cp: FSDP parameter sharding
  kDpCp,       ///< dp_replicate x dp_shard x cp: gradient and loss reduction
  kEp,         ///< expert parallel: ep consecutive ranks of dp_shard_cp (routed experts sharded)
  kEdp,        ///< expert data parallel: the dp_shard_cp ranks at one ep index (expert FSDP)
  kPp,         ///< pipeline parallel: the ranks holding the stages of one model replica
  kStage,      ///< every dim but pp: the ranks holding this rank's pipeline stage(s)
};

/// How an axis takes its ranks from the mesh dims it varies: all of them, or, for the expert
/// axes, one half of them split by ParallelConfig::ep (row-major over the dims, outer to
/// inner: index i of dp_shard_cp is in ep group i / ep at ep rank i % ep).
enum class AxisSplit {
  kNone,
  kEpInner,  ///< the ep consecutive ranks holding index i / ep (ep)
  kEpOuter,  ///< the ranks with the same i % ep, every ep-th one (edp)
};

/// The bit of mesh dim `name` in a MeshAxisRow::dims mask (its index in kMeshDims); 0 for a
/// name that is no mesh dim, so a typo fails the static_assert in device_mesh.cpp.
constexpr unsigned mesh_dim_bit(std::string_view name) {
  for (size_t i = 0; i < kMeshDims.size(); ++i) {
    if (kMeshDims[i].name == name) return 1u << i;
  }
  return 0;
}
/// Every mesh dim.
inline constexpr unsigned kAllMeshDims = (1u << kMeshDims.size()) - 1;

/// One row of kMeshAxes: the axis, its name (group names, ledger records, evidence), the
/// mesh dims it varies and how it splits them.
struct MeshAxisRow {
  MeshAxis axis;
  std::string_view name;
  unsigned dims;
  AxisSplit split = AxisSplit::kNone;
};

/// Every MeshAxis, in enumerator order, which is the order groups are created in on every
/// rank. How to add an axis: an enumerator above and a row here.
inline constexpr std::array<MeshAxisRow, 12> kMeshAxes = {{
    {MeshAxis::kWorld, "world", kAllMeshDims},
    {MeshAxis::kDpReplicate, "dp_replicate", mesh_dim_bit("dp_replicate")},
    {MeshAxis::kDpShard, "dp_shard", mesh_dim_bit("dp_shard")},
    {MeshAxis::kCp, "cp", mesh_dim_bit("cp")},
    {MeshAxis::kTp, "tp", mesh_dim_bit("tp")},
    {MeshAxis::kDp, "dp", mesh_dim_bit("dp_replicate") | mesh_dim_bit("dp_shard")},
    {MeshAxis::kDpShardCp, "dp_shard_cp", mesh_dim_bit("dp_shard") | mesh_dim_bit("cp")},
    {MeshAxis::kDpCp, "dp_cp", mesh_dim_bit("dp_replicate") | mesh_dim_bit("dp_shard") | mesh_dim_bit("cp")},
    {MeshAxis::kEp, "ep", mesh_dim_bit("dp_shard") | mesh_dim_bit("cp"), AxisSplit::kEpInner},
    {MeshAxis::kEdp, "edp", mesh_dim_bit("dp_shard") | mesh_dim_bit("cp"), AxisSplit::kEpOuter},
    {MeshAxis::kPp, "pp", mesh_dim_bit("pp")},
    {MeshAxis::kStage, "stage", kAllMeshDims & ~mesh_dim_bit("pp")},
}};

/// Every MeshAxis, in the order groups are created.
inline constexpr std::array<MeshAxis, kMeshAxes.size()> kAllMeshAxes = [] {
  std::array<MeshAxis, kMeshAxes.size()> out{};
  for (size_t i = 0; i < kMeshAxes.size(); ++i) out[i] = kMeshAxes[i].axis;
  return out;
}();

/// "world", "dp_replicate", "dp_shard", "cp", "tp", "dp", "dp_shard_cp", "dp_cp", "ep", "edp",
/// "pp", "stage".
std::string_view mesh_axis_name(MeshAxis axis);

/// Parses a name of mesh_axis_name.
/// Throws: mih::Error{kInvalidSpec} listing the valid names.
MeshAxis parse_mesh_axis(std::string_view name);

/// A rank's coordinates, one per mesh dim (kMeshDims order).
using MeshCoordinates = std::array<int, kMeshDims.size()>;

/// Pure layout arithmetic of a mesh, without groups (usable before any rank starts).
class MeshLayout {
 public:
  /// Only the mesh degrees of `config` matter.
  /// Throws: as ParallelConfig::validate_mesh(world_size).
  MeshLayout(const ParallelConfig& config, int world_size);
  /// The config the layout was made from (its mesh degrees are the layout's).
  const ParallelConfig& config() const { return config_; }
  int world_size() const { return world_size_; }
  /// Coordinates of `rank`, one per mesh dim: {pp, dp_replicate, dp_shard, cp, tp}.
  MeshCoordinates coordinates(int rank) const;
  /// The global ranks of `rank`'s group along `axis`, in axis-rank order.
  std::vector<int> group_ranks(MeshAxis axis, int rank) const;
  /// Every distinct group of `axis`, ordered by their first rank.
  std::vector<std::vector<int>> all_groups(MeshAxis axis) const;

 private:
  ParallelConfig config_;
  int world_size_;
};

/// How a DeviceMesh creates its groups.
struct MeshOptions {
  compat::GroupOptions group;
  /// Prefix of the mesh's rendezvous keys; meshes built on one store are told apart by it
  /// and by a per-rank count of meshes of that name (build them in the same order on every
  /// rank).
  std::string name = "mesh";
  /// Where collectives are recorded; null = not recorded.
  std::shared_ptr<CommLedger> ledger;
};

/// The mesh as seen by one rank: its coordinates and a Communicator per MeshAxis.
/// Groups are created in one global order on every rank (world, dp_replicate, dp_shard,
/// cp, tp, dp, dp_shard_cp, dp_cp, ep, edp, pp, stage; within an axis by first rank), so construction cannot
/// deadlock. An axis whose group is this rank alone gets a backend-less self group (the
/// world axis only where this build lacks options.group.backend: a one-rank world is built
/// on its backend otherwise); an axis whose members equal an earlier axis's shares that
/// axis's backend.
class DeviceMesh {
 public:
  /// Builds the groups; returns when every rank has built all of its groups (a barrier on
  /// the world group ends construction).
  /// Only the mesh degrees of `config` matter (a ParallelConfig::parse_mesh("tp=2") will do).
  /// Throws: mih::Error{kInvalidSpec} if the degrees do not multiply to world_size;
  ///   kDeadlineExceeded if a member does not join within options.group.timeout.
  DeviceMesh(const ParallelConfig& config, const compat::Store& store, int rank, int world_size,
             const MeshOptions& options = {});

  /// The config the mesh was built from (its degrees are the mesh's).
  const ParallelConfig& config() const { return layout_.config(); }
  const MeshLayout& layout() const { return layout_; }
  int rank() const { return rank_; }
  int world_size() const { return layout_.world_size(); }
  /// This rank's index along `axis` (combined axes: row-major over their mesh axes).
  int axis_rank(MeshAxis axis) const { return comm(axis).rank(); }
  Communicator& comm(MeshAxis axis);
  const Communicator& comm(MeshAxis axis) const;
  const std::shared_ptr<CommLedger>& ledger() const { return ledger_; }

  /// JSON for evidence: the mesh degrees, rank, coordinates, and each axis's ranks and
  /// process-group backend.
  nlohmann::json to_json() const;

 private:
  MeshLayout layout_;
  int rank_;
  std::shared_ptr<CommLedger> ledger_;
  std::vector<Communicator> comms_;  // indexed by MeshAxis
};

}  // namespace mih
