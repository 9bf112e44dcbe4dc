// How the ranks of a run find each other: which store they meet at (FileStore for local
// runs, TCPStore for multi-host) and a join step that names the ranks that never arrived.
#pragma once

#include <chrono>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "harness/compat/store.h"
#include "harness/runtime/world.h"

namespace mih {

/// Variables of mih's own rendezvous protocol (set by mih's launcher; settable by hand).
inline constexpr const char* kStoreFileVar = "MIH_STORE_FILE";      ///< path of a FileStore
inline constexpr const char* kStoreHostedVar = "MIH_STORE_HOSTED";  ///< "1": the launcher hosts the TCPStore

/// torchrun's elastic agent hosts the TCPStore on MASTER_ADDR:MASTER_PORT itself and says so
/// to its workers with this variable ("True"); each attempt (TORCHELASTIC_RESTART_COUNT) then
/// meets under the key prefix "/worker/attempt_<n>", as torch.distributed's env:// does.
inline constexpr const char* kAgentStoreVar = "TORCHELASTIC_USE_AGENT_STORE";
inline constexpr const char* kRestartCountVar = "TORCHELASTIC_RESTART_COUNT";

/// Connects this rank to the run's store:
///   - MIH_STORE_FILE=<path>: a FileStore shared by world.world_size processes (local runs;
///     no ports, so concurrent runs cannot collide);
///   - otherwise MASTER_ADDR/MASTER_PORT: a TCPStore, hosted by rank 0 (srun, mpirun), by
///     mih's launcher when MIH_STORE_HOSTED=1, or by torchrun's agent when
///     TORCHELASTIC_USE_AGENT_STORE=True (every rank a client, keys under
///     "/worker/attempt_<TORCHELASTIC_RESTART_COUNT>").
/// Throws: mih::Error{kInvalidSpec} if neither is set (the message says what to export), or
///   TORCHELASTIC_USE_AGENT_STORE / TORCHELASTIC_RESTART_COUNT are malformed;
///   kUnavailable if the TCPStore cannot be reached within `timeout`.
compat::Store connect_store(const World& world, const Env& env, std::chrono::milliseconds timeout);

/// Announces this rank (host, pid) under `tag` and waits until all world_size ranks have.
/// Throws: mih::Error{kDeadlineExceeded} after `timeout`, naming the ranks that never joined
///   and those that did, e.g. "rendezvous 'run' timed out after 5000 ms: rank(s) [2] of 4
///   never joined (joined: [0, 1, 3])".
void join(compat::Store& store, int rank, int world_size, std::chrono::milliseconds timeout,
          const std::string& tag = "run");

/// What every rank announced when it joined under `tag`, after join returned:
/// [{"rank", "host", "pid"}] (host "" and pid 0 for a record that does not parse).
/// Throws: as compat::Store::get.
nlohmann::json join_records(compat::Store& store, int world_size, const std::string& tag = "run");

}  // namespace mih
