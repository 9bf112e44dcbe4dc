// Per-rank determinism: seeds, deterministic algorithms, and a fixed intra-op thread count
// (torch and BLAS), so a run's numbers depend only on its inputs and parallel layout.
#pragma once

#include <cstdint>

#include <nlohmann/json_fwd.hpp>

namespace mih {

/// What apply_determinism sets.
struct DeterminismOptions {
  /// Seed of the CPU generator and of every CUDA generator (at::manual_seed).
  uint64_t seed = 0;
  /// Intra-op threads of torch and of the BLAS library. Local multi-rank runs default to 1:
  /// N ranks on a few cores oversubscribe otherwise, and timings become noise.
  int intra_op_threads = 1;
  /// at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/false); on CUDA
  /// also deterministic cuDNN without benchmarking and CUBLAS_WORKSPACE_CONFIG=:4096:8.
  bool deterministic_algorithms = true;
};

/// Applies `options` to this process. Call once per rank before building a model.
/// Throws: mih::Error{kInvalidSpec} if intra_op_threads < 1.
void apply_determinism(const DeterminismOptions& options);

/// Returns what this process runs with now (seed given, thread counts read back).
nlohmann::json determinism_state(const DeterminismOptions& options);

}  // namespace mih
