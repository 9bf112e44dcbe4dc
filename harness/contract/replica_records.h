// cases/runtime/replicas_step<k>.json and gradient_replicas_step<k>.json read typed, as a writer
// other than mih's session records them (schemas/evidence/v1/cases.runtime.{replicas_step,
// gradient_replicas_step}.schema.json): per step and parameter, each rank's SHA-256 of its piece
// (and the box of the global tensor the piece is), validated against the schema once and checked
// against the case before a verdict reads them: one file per step the metrics record, named by
// its step; every parameter of check/structure.json in each; one digest (and box) per rank; boxes
// that tile their parameter's global shape exactly. A record that does not say what it claims is
// refused naming the file and the field (bad evidence, exit 12), never judged.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace mih::contract {

enum class ReplicaKind {
  kParameters,  ///< replicas_step<k>.json: the parameters after the optimizer
  kGradients,   ///< gradient_replicas_step<k>.json: the gradients after the synchronization
};

/// One parameter's copies in one step's record.
struct ReplicaRecord {
  /// Each rank's SHA-256 of its piece, by world rank; nullopt where a rank holds no gradient.
  std::vector<std::optional<std::string>> digests;
  /// Each rank's box ("[0:4, 8:16]"), by world rank; empty when every rank holds the whole tensor.
  std::vector<std::string> boxes;
  /// The axes its gradient is declared reduced over (kGradients only).
  std::vector<std::string> grad_domain;
  /// The ranks holding each piece, by box ("" without boxes), in rank order.
  std::map<std::string, std::vector<size_t>> holders() const;
};

/// One step's record.
struct ReplicaStep {
  int64_t step = 0;
  std::filesystem::path file;
  std::map<std::string, ReplicaRecord> parameters;
  /// Bytes rank 0's reducing collectives moved per mesh axis (kGradients only).
  std::map<std::string, int64_t> reductions;
};

/// What a case's records must agree with: its parameters' global shapes (check/structure.json),
/// the steps its metrics record and its world size.
struct ReplicaFrame {
  std::map<std::string, std::vector<int64_t>> shapes;
  std::set<int64_t> steps;
  int64_t world_size = 1;
};

/// The global shapes of the parameters of check/structure.json (`structure`, the parsed file;
/// `file` names it in a refusal) that record one.
/// Throws: mih::Error{kFailedPrecondition} naming the file and field the schema refuses.
std::map<std::string, std::vector<int64_t>> global_shapes(const nlohmann::json& structure, const std::string& file);

/// The records of `kind` of case directory `dir`, by step (empty when it holds none).
/// Throws: mih::Error{kFailedPrecondition} (exit 12) naming the file and field where a record
///   breaks its schema or the frame (see above).
std::map<int64_t, ReplicaStep> replica_steps(const std::filesystem::path& dir, ReplicaKind kind, const ReplicaFrame& frame);

}  // namespace mih::contract
