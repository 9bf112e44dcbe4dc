// DeviceMesh: the world laid out on the named axes dp_replicate, dp_shard, cp, tp (outer to
// inner, TorchTitan's ParallelDims), with a Communicator per axis and for the combined axes
// dp (dp_replicate x dp_shard), dp_shard_cp (FSDP) and dp_cp (loss normalization).
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

namespace mih {

/// Degrees of the mesh axes, outer to inner; 1 means the axis is disabled.
/// rank = ((dp_replicate_rank * dp_shard + dp_shard_rank) * cp + cp_rank) * tp + tp_rank.
struct ParallelDims {
  int dp_replicate = 1;  ///< replicas (DDP / the replicate dim of HSDP)
  int dp_shard = 1;      ///< FSDP shards
  int cp = 1;            ///< context parallel: the sequence dim is sharded
  int tp = 1;            ///< tensor parallel (and sequence parallel regions)

  int product() const { return dp_replicate * dp_shard * cp * tp; }

  /// Parses "dp_shard=2,tp=2"; axes not named stay 1. Whitespace is ignored.
  /// Throws: mih::Error{kInvalidSpec} for an unknown axis (listing the valid ones), a
  ///   repeated axis, or a degree that is not an integer >= 1.
  static ParallelDims parse(std::string_view text);

  /// Returns a mesh for `world_size` that exercises as many axes as it can: prime factors,
  /// smallest first, are given to tp, cp, dp_shard, dp_replicate in turn (4 -> cp=2,tp=2;
  /// 8 -> dp_shard=2,cp=2,tp=2). Used by the selftest when no mesh is given.
  static ParallelDims spread(int world_size);

  /// Throws: mih::Error{kInvalidSpec} with the arithmetic if a degree is < 1 or the product
  ///   differs from `world_size`: "dp_replicate(1) * dp_shard(2) * cp(1) * tp(3) = 6 !=
  ///   world_size(4)".
  void validate(int world_size) const;

  /// "dp_shard=2,tp=2" (axes of degree 1 omitted; "1" if all are).
  std::string str() const;
  bool operator==(const ParallelDims&) const = default;
};

void to_json(nlohmann::json& j, const ParallelDims& d);
void from_json(const nlohmann::json& j, ParallelDims& d);
std::ostream& operator<<(std::ostream& out, const ParallelDims& d);

/// The axes of a mesh with their own process group. Combined axes vary several mesh axes
/// at once (their ranks in outer-to-inner order).
enum class MeshAxis {
  kWorld,
  kDpReplicate,
  kDpShard,
  kCp,
  kTp,
  kDp,         ///< dp_replicate x dp_shard: data loading
  kDpShardCp,  ///< dp_shard x cp: FSDP parameter sharding
  kDpCp,       ///< dp_replicate x dp_shard x cp: gradient and loss reduction
};

/// Every MeshAxis, in the order groups are created.
inline constexpr std::array<MeshAxis, 8> kAllMeshAxes = {
    MeshAxis::kWorld, MeshAxis::kDpReplicate, MeshAxis::kDpShard,   MeshAxis::kCp,
    MeshAxis::kTp,    MeshAxis::kDp,          MeshAxis::kDpShardCp, MeshAxis::kDpCp};

/// "world", "dp_replicate", "dp_shard", "cp", "tp", "dp", "dp_shard_cp", "dp_cp".
std::string_view mesh_axis_name(MeshAxis axis);

/// Parses a name of mesh_axis_name.
/// Throws: mih::Error{kInvalidSpec} listing the valid names.
MeshAxis parse_mesh_axis(std::string_view name);

/// Pure layout arithmetic of a mesh, without groups (usable before any rank starts).
class MeshLayout {
 public:
  /// Throws: as ParallelDims::validate(world_size).
  MeshLayout(const ParallelDims& dims, int world_size);
  const ParallelDims& dims() const { return dims_; }
  int world_size() const { return world_size_; }
  /// Coordinates of `rank`: {dp_replicate, dp_shard, cp, tp}.
  std::array<int, 4> coordinates(int rank) const;
  /// The global ranks of `rank`'s group along `axis`, in axis-rank order.
  std::vector<int> group_ranks(MeshAxis axis, int rank) const;
  /// Every distinct group of `axis`, ordered by their first rank.
  std::vector<std::vector<int>> all_groups(MeshAxis axis) const;

 private:
  ParallelDims dims_;
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
/// cp, tp, dp, dp_shard_cp, dp_cp; within an axis by first rank), so construction cannot
/// deadlock. An axis whose group is this rank alone gets a backend-less self group; an axis
/// whose members equal an earlier axis's shares that axis's backend.
class DeviceMesh {
 public:
  /// Builds the groups; returns when every rank has built all of its groups (a barrier on
  /// the world group ends construction).
  /// Throws: mih::Error{kInvalidSpec} if dims do not multiply to world_size;
  ///   kDeadlineExceeded if a member does not join within options.group.timeout.
  DeviceMesh(const ParallelDims& dims, const compat::Store& store, int rank, int world_size,
             const MeshOptions& options = {});

  const ParallelDims& dims() const { return layout_.dims(); }
  const MeshLayout& layout() const { return layout_; }
  int rank() const { return rank_; }
  int world_size() const { return layout_.world_size(); }
  /// This rank's index along `axis` (combined axes: row-major over their mesh axes).
  int axis_rank(MeshAxis axis) const { return comm(axis).rank(); }
  int axis_size(MeshAxis axis) const { return comm(axis).size(); }
  Communicator& comm(MeshAxis axis);
  const Communicator& comm(MeshAxis axis) const;
  const std::shared_ptr<CommLedger>& ledger() const { return ledger_; }

  /// JSON for evidence: dims, rank, coordinates, and each axis's ranks and backend.
  nlohmann::json to_json() const;

 private:
  MeshLayout layout_;
  int rank_;
  std::shared_ptr<CommLedger> ledger_;
  std::vector<Communicator> comms_;  // indexed by MeshAxis
};

}  // namespace mih
