// Internal to foreign_check.cpp and foreign_suites.cpp: a foreign writer's case as `mih check`
// reads it, the checks of its records before any test, and the bodies of the Foreign suites.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>

namespace mih::cases::foreign {

struct ForeignCase {
  std::filesystem::path dir, reference;
  std::string spec, name, dtype, writer;
  int64_t world_size = 1;
};

/// The cases/runtime/<prefix><k>.json files of `dir` (prefix replicas_step or
/// gradient_replicas_step), by the step each holds.
std::map<int64_t, std::filesystem::path> replica_files(const std::filesystem::path& dir, const std::string& prefix);
/// Whether some piece of some record of `files` is held by two ranks or more.
bool any_compared(const std::map<int64_t, std::filesystem::path>& files);
/// Throws mih::Error{kFailedPrecondition} (exit 12) naming the file and field where the case's
/// records do not say what they claim (see foreign_suites.cpp).
void check_records(const ForeignCase& c);

// The suites' bodies (GoogleTest assertions).
void numeric_parity(const ForeignCase& c, double tolerance);
void same_inputs(const ForeignCase& c);
void replicas_agree(const ForeignCase& c);
void gradients_agree(const ForeignCase& c);
void checkpoint_round_trip(const ForeignCase& c);

}  // namespace mih::cases::foreign
