// The one writer of the per-rank digests a replicas record holds (cases/runtime/replicas_step<k>.json
// and gradient_replicas_step<k>.json; schemas/evidence/v1/cases.runtime.{replicas_step,
// gradient_replicas_step}.schema.json), which ReplicaConsistency and GradientSync judge
// (harness/compare/verdicts_replicas.cpp): every rank's SHA-256 of its piece of each parameter
// (or of its gradient) and the box of the global tensor the piece is, gathered over the world.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/runtime/communicator.h"

namespace mih::session_internal {

/// One rank's piece of one parameter (or of its gradient).
struct PieceDigest {
  std::string fqn;
  std::string box;                    ///< "[0:4, 8:16]": where the piece lies in the global tensor
  std::optional<std::string> sha256;  ///< of the piece's bytes; nullopt where the rank holds none
  /// Gradient records only: the axes the gradient must be reduced over and the placements
  /// ({axis: "Replicate()" | "Shard(<dim>)"}); null in a parameters record.
  std::optional<std::vector<std::string>> grad_domain = std::nullopt;
  nlohmann::json placements = nullptr;
};

/// The records of `mine`'s parameters over every rank, as a replicas file's "parameters":
/// {fqn: {replicas, compared, pieces, boxes, digests[, grad_domain, placements]}}, boxes and
/// digests by world rank. A collective over `world` (every rank passes the same parameters in
/// the same order); the same on every rank.
/// Throws: as the collectives; mih::Error{kInternal} when a rank lacks a parameter of rank 0's.
nlohmann::json replica_records(Communicator& world, const std::vector<PieceDigest>& mine,
                               c10::Device device = c10::Device(c10::DeviceType::CPU));

}  // namespace mih::session_internal
