// autocast_state / set_autocast_state over the version-specific autocast API.
#include "harness/compat/autocast.h"

#include <ATen/autocast_mode.h>
#include <torch/version.h>

namespace mih::compat {

AutocastState autocast_state() {
  AutocastState s;
#if TORCH_VERSION_MAJOR >= 2
  s.cpu_enabled = at::autocast::is_autocast_enabled(at::kCPU);
  s.cpu_dtype = at::autocast::get_autocast_dtype(at::kCPU);
  s.cuda_enabled = at::autocast::is_autocast_enabled(at::kCUDA);
  s.cuda_dtype = at::autocast::get_autocast_dtype(at::kCUDA);
#else
  s.cpu_enabled = at::autocast::is_cpu_enabled();
  s.cpu_dtype = at::autocast::get_autocast_cpu_dtype();
  s.cuda_enabled = at::autocast::is_enabled();
  s.cuda_dtype = at::autocast::get_autocast_gpu_dtype();
#endif
  return s;
}

void set_autocast_state(const AutocastState& s) {
#if TORCH_VERSION_MAJOR >= 2
  at::autocast::set_autocast_enabled(at::kCPU, s.cpu_enabled);
  at::autocast::set_autocast_dtype(at::kCPU, s.cpu_dtype);
  at::autocast::set_autocast_enabled(at::kCUDA, s.cuda_enabled);
  at::autocast::set_autocast_dtype(at::kCUDA, s.cuda_dtype);
#else
  at::autocast::set_cpu_enabled(s.cpu_enabled);
  at::autocast::set_autocast_cpu_dtype(s.cpu_dtype);
  at::autocast::set_enabled(s.cuda_enabled);
  at::autocast::set_autocast_gpu_dtype(s.cuda_dtype);
#endif
}

AutocastScope::AutocastScope(const AutocastState& state) : previous_(autocast_state()) {
  set_autocast_state(state);
  at::autocast::increment_nesting();
}

AutocastScope::~AutocastScope() {
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  set_autocast_state(previous_);
}

}  // namespace mih::compat
