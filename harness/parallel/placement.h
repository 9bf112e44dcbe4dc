// How a logical tensor is laid out over the mesh: a Placement per mesh axis (PyTorch
// DTensor's Shard(dim) / Replicate), and the local piece a rank holds. A gradient that is a
// partial sum over tp is ShardedParameter::tp_partial_grad, not a placement of the parameter.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "harness/runtime/device_mesh.h"

namespace mih {

/// The layout of a tensor along one mesh axis.
class Placement {
 public:
  /// Every rank of the axis holds the whole tensor.
  static Placement replicate() { return Placement(Kind::kReplicate, 0, 1); }
  /// The axis's ranks hold consecutive chunks of `dim`. With `partitions` > 1 the dim is
  /// first cut into that many equal partitions (e.g. [gate; up] of a fused projection) and
  /// each partition is sharded, so every rank holds matching pieces of each partition
  /// (DTensor's _StridedShard).
  static Placement shard(int64_t dim, int64_t partitions = 1) { return Placement(Kind::kShard, dim, partitions); }

  bool is_replicate() const { return kind_ == Kind::kReplicate; }
  bool is_shard() const { return kind_ == Kind::kShard; }
  /// Shard only: the sharded tensor dim, and the number of partitions of it.
  int64_t dim() const { return dim_; }
  int64_t partitions() const { return partitions_; }

  /// "Replicate()", "Shard(0)", "Shard(0, partitions=2)".
  std::string str() const;
  bool operator==(const Placement&) const = default;

 private:
  enum class Kind { kReplicate, kShard };
  Placement(Kind kind, int64_t dim, int64_t partitions) : kind_(kind), dim_(dim), partitions_(partitions) {}
  Kind kind_;
  int64_t dim_;
  int64_t partitions_;
};

void to_json(nlohmann::json& j, const Placement& p);

/// The piece of one dim a rank holds under Shard: `size` elements from `offset` (global
/// coordinates, per partition). Uneven: the first ranks get ceil(n / degree), the last
/// ones the rest, possibly 0 (PyTorch FSDP2 and DTensor chunking).
struct ShardRange {
  int64_t offset = 0;
  int64_t size = 0;
  /// ceil(n / degree): the padded size every rank's piece is stretched to in collectives.
  int64_t chunk = 0;
};

/// One rectangular piece of a logical tensor that a rank holds: `lengths` elements per dim,
/// starting at `local_offset` in the rank's local tensor and at `global_offset` in the logical
/// (unpadded, unsharded) tensor. A rank's local tensor is one or more boxes (several for a
/// partitioned shard such as a fused [gate; up]); padding rows belong to no box. The unit of
/// a resharding checkpoint (PyTorch DCP's ChunkStorageMetadata).
struct Box {
  std::vector<int64_t> local_offset;
  std::vector<int64_t> global_offset;
  std::vector<int64_t> lengths;
  int64_t numel() const;
};

/// Returns the range of `n` elements that shard `index` of `degree` holds.
/// Throws: mih::Error{kInvalidSpec} if degree < 1 or index is outside [0, degree).
ShardRange shard_range(int64_t n, int64_t degree, int64_t index);

}  // namespace mih
