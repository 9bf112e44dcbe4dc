// How the ranks of a run find each other: which store they meet at (FileStore for local
// runs, TCPStore for multi-host) and a join step that names the ranks that never arrived.
#pragma once

#include <chrono>
#include <string>

#include "harness/compat/store.h"
#include "harness/runtime/world.h"

namespace mih {

/// Variables of mih's own rendezvous protocol (set by mih's launcher; settable by hand).
inline constexpr const char* kStoreFileVar = "MIH_STORE_FILE";      ///< path of a FileStore
inline constexpr const char* kStoreHostedVar = "MIH_STORE_HOSTED";  ///< "1": the launcher hosts the TCPStore

/// Connects this rank to the run's store:
///   - MIH_STORE_FILE=<path>: a FileStore shared by world.world_size processes (local runs;
///     no ports, so concurrent runs cannot collide);
///   - otherwise MASTER_ADDR/MASTER_PORT: a TCPStore, hosted by rank 0, or by the launcher
///     when MIH_STORE_HOSTED=1.
/// Throws: mih::Error{kInvalidSpec} if neither is set (the message says what to export);
///   kUnavailable if the TCPStore cannot be reached within `timeout`.
compat::Store connect_store(const World& world, const Env& env, std::chrono::milliseconds timeout);

/// Announces this rank (host, pid) under `tag` and waits until all world_size ranks have.
/// Throws: mih::Error{kDeadlineExceeded} after `timeout`, naming the ranks that never joined
///   and those that did, e.g. "rendezvous 'run' timed out after 5000 ms: rank(s) [2] of 4
///   never joined (joined: [0, 1, 3])".
void join(compat::Store& store, int rank, int world_size, std::chrono::milliseconds timeout,
          const std::string& tag = "run");

}  // namespace mih
