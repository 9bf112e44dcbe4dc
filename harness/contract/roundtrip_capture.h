// checkpoint/roundtrip_load.json and before_save/checkpoint/roundtrip_save.json read typed
// (schemas/evidence/v1/checkpoint.roundtrip_{load,save}.schema.json): every tensor's hash at a
// checkpoint's save or load and the step counter, validated against the contract's schema once.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace mih::contract {

/// One tensor of a capture: the SHA-256 of the full tensor and its global shape.
struct TensorHash {
  std::string sha256;
  std::vector<int64_t> shape;
  bool operator==(const TensorHash&) const = default;
};

/// What a save or a load captured: "<fqn>" and "<fqn>/<optimizer state>" -> hash, and the step
/// the run goes on at.
struct RoundtripCapture {
  std::map<std::string, TensorHash> tensors;
  int64_t next_step = 0;
};

/// The capture `value` holds: the file at `relative` in a case directory (layout::kRoundtripLoad
/// or layout::before_save(layout::kRoundtripSave)); `file` names it in a refusal.
/// Throws: mih::Error{kFailedPrecondition} naming the file and the field the schema refuses (a
///   missing next_step, a tensor without its sha256 or shape).
RoundtripCapture roundtrip_capture(const std::string& relative, const nlohmann::json& value, const std::string& file);

}  // namespace mih::contract
