// apply_determinism: torch seeds and flags, and the BLAS thread count.
#include "harness/runtime/determinism.h"

#include <dlfcn.h>

#include <cstdlib>

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <nlohmann/json.hpp>

#include "harness/base/error.h"

namespace mih {
namespace {

// OpenBLAS reads OPENBLAS_NUM_THREADS only when it loads (the launcher sets it for its
// children); a running process must call openblas_set_num_threads, if OpenBLAS is the BLAS.
void set_blas_threads(int threads) {
  using SetThreads = void (*)(int);
  if (auto fn = reinterpret_cast<SetThreads>(::dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) fn(threads);
}

}  // namespace

void apply_determinism(const DeterminismOptions& options) {
  MIH_CHECK(options.intra_op_threads >= 1, "intra_op_threads must be >= 1, got ", options.intra_op_threads);
  at::manual_seed(options.seed);
  at::set_num_threads(options.intra_op_threads);
  set_blas_threads(options.intra_op_threads);
  if (options.deterministic_algorithms) {
    at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/false);
    at::globalContext().setDeterministicCuDNN(true);
    at::globalContext().setBenchmarkCuDNN(false);
    ::setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
  }
}

nlohmann::json determinism_state(const DeterminismOptions& options) {
  return {{"seed", options.seed},
          {"intra_op_threads", at::get_num_threads()},
          {"deterministic_algorithms", at::globalContext().deterministicAlgorithms()}};
}

}  // namespace mih
