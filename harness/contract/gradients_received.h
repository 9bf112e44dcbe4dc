// check/gradients_received.json read typed: what a later phase of a run (a resume's load)
// continues from, the trainable parameters no rank gave a gradient at any step so far and
// those steps. One validation where the file is read; a missing or mistyped field a refusal.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace mih::contract {

/// The fields of check/gradients_received.json a continuing phase reads.
struct GradientsReceived {
  std::vector<std::string> never_received;  ///< FQNs no rank gave a gradient at any step
  std::vector<int64_t> steps;               ///< the steps examined so far
};

/// Reads `file` (an earlier phase's check/gradients_received.json).
/// Throws: mih::Error{kFailedPrecondition} "evidence file <file> has no list never_received of
///   names or steps of integers: it was edited or written by another version; rerun the case";
///   as read_json_file for a file that cannot be read or is not JSON.
GradientsReceived read_gradients_received(const std::filesystem::path& file);

}  // namespace mih::contract
