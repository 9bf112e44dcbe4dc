// Autocast thread-local state, whose API changed between libtorch versions (1.13:
// is_cpu_enabled / get_autocast_cpu_dtype and is_enabled / get_autocast_gpu_dtype for CUDA;
// 2.x: is_autocast_enabled(device) / get_autocast_dtype(device)). Activation checkpointing
// saves it in forward and re-enters it for the recompute (docs/spike-ac-cp.md section 1.4 P6).
#pragma once

#include <c10/core/ScalarType.h>

namespace mih::compat {

/// The autocast state of the calling thread, for CPU and CUDA.
struct AutocastState {
  bool cpu_enabled = false;
  c10::ScalarType cpu_dtype = c10::ScalarType::BFloat16;
  bool cuda_enabled = false;
  c10::ScalarType cuda_dtype = c10::ScalarType::Half;
};

/// Reads the calling thread's autocast state.
AutocastState autocast_state();

/// Sets the calling thread's autocast state.
void set_autocast_state(const AutocastState& state);

/// Enters `state` for the scope's lifetime, like Python's `with torch.autocast(...)`: on exit
/// the previous state is restored and, when the outermost scope ends, the cache of casted
/// weights is cleared (it is keyed by TensorImpl address, so a stale entry would hand a new
/// tensor the cast of a freed one, with the freed one's graph).
class AutocastScope {
 public:
  explicit AutocastScope(const AutocastState& state);
  ~AutocastScope();
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  AutocastState previous_;
};

}  // namespace mih::compat
