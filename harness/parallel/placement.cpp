// Placement names and the chunking rule of uneven shards.
#include "harness/parallel/placement.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "harness/base/error.h"

namespace mih {

std::string Placement::str() const {
  switch (kind_) {
    case Kind::kReplicate: return "Replicate()";
    case Kind::kShard:
      return partitions_ == 1 ? internal::str("Shard(", dim_, ")")
                              : internal::str("Shard(", dim_, ", partitions=", partitions_, ")");
  }
  return "?";
}

void to_json(nlohmann::json& j, const Placement& p) { j = p.str(); }

ShardRange shard_range(int64_t n, int64_t degree, int64_t index) {
  MIH_CHECK(degree >= 1 && index >= 0 && index < degree, "shard ", index, " of ", degree,
            ": expected 0 <= index < degree");
  ShardRange r;
  r.chunk = (n + degree - 1) / degree;
  r.offset = std::min(n, index * r.chunk);
  r.size = std::min(n, r.offset + r.chunk) - r.offset;
  return r;
}

int64_t Box::numel() const {
  int64_t n = 1;
  for (int64_t l : lengths) n *= l;
  return n;
}

}  // namespace mih
