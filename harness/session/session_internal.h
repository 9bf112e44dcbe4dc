// What session.cpp and session_steps.cpp share: the guard every hook runs in.
#pragma once

#include <chrono>
#include <exception>
#include <string>
#include <string_view>

#include "harness/session/session.h"

namespace mih {

// Runs a hook's body: times it (end_step times itself) and, when it throws, fails the case
// naming the hook before rethrowing.
template <class Fn>
void ValidationSession::guarded(const char* hook, Fn&& fn) {
  const auto start = std::chrono::steady_clock::now();
  try {
    fn();
    // end_step measures itself (it writes the per-step figures).
    if (std::string_view(hook) != "end_step") {
      hook_ms_[hook] += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    }
  } catch (const std::exception& e) {
    fail_case(std::string("the session's ") + hook + " raised: " + e.what());
    throw;
  }
}

}  // namespace mih
