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

namespace session_internal {

/// Whether the session records every rank's digests of the parameters (`gradients` false:
/// replicas_step<k>.json with digests) or of the gradients (gradient_replicas_step<k>.json):
/// where ReplicaConsistency or GradientSync judge them (suites/replica_consistency.cpp,
/// gradient_sync.cpp), one pipeline stage (under pp a rank holds its stage's parameters only;
/// probes::check_replica_consistency compares the copies). They cost a gather per step. Not the
/// gradients of a spec that declares parameters unused (`declares_unused`: a parameter no rank
/// has a gradient of, which the digests' verdict counts as unsynchronized; GradientPresence
/// judges those against the declaration): GradientSync judges that spec by MIH-GRAD-001 alone.
inline bool digests_recorded(const ParallelConfig& config, bool gradients, bool declares_unused = false) {
  if (config.pp > 1) return false;
  return gradients ? config.world_size() > 1 && !declares_unused : config.tp * config.cp * config.dp_replicate > 1;
}

/// Every rank's digest of its piece of each parameter (`gradients` false: after the optimizer)
/// or of its gradient (true: after the synchronization, with the bytes rank 0's reducing
/// collectives moved per axis since its ledger's record `ledger_from`), written by rank 0 to
/// cases/runtime/replicas_step<step>.json or gradient_replicas_step<step>.json of `evidence`
/// (null: nothing written) through the writer TrainerSession uses (replica_digests_internal.h).
/// A collective over the world (session_replicas.cpp).
void write_replica_digests(ParallelContext& ctx, DeviceMesh& mesh, EvidenceDir* evidence, size_t ledger_from,
                           int64_t step, bool gradients);

}  // namespace session_internal
}  // namespace mih
