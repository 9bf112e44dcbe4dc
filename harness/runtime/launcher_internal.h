// Internal to the launcher (launcher.cpp, launcher_process.cpp, launcher_report.cpp): the rank
// processes it supervises, how they are started, reaped and stopped, and what it reads back
// from the run directory to explain a failure. Not part of mih's API.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "harness/runtime/comm_ledger.h"
#include "harness/runtime/launcher.h"
#include "harness/runtime/world.h"

namespace mih::launcher_internal {

using Clock = std::chrono::steady_clock;

struct Child {
  int rank = -1;
  pid_t pid = 0;
  int pidfd = -1;
  bool running = true;
  bool stopped = false;  // the launcher sent it SIGTERM/SIGKILL
  bool forked = false;   // started by the fork server
  int status = 0;
  int reap_order = -1;
  Clock::time_point start, end;
  std::filesystem::path log;
};

// ---- Processes (launcher_process.cpp) ------------------------------------------------------

/// A pidfd of `pid` to poll for its exit, or -1 where the kernel has none.
int open_pidfd(pid_t pid);

/// "KEY=value" strings of `env`.
std::vector<std::string> env_list(const Env& env);

/// Local ranks: forked by the fork server when it can start argv (fork_server.h), else
/// posix_spawn (vfork-fast); own process group, stdout+stderr to the log.
/// Returns the pid, or -errno when the process cannot be started; `forked`: by the server.
pid_t spawn_rank(std::vector<std::string> argv, std::vector<std::string> env, const std::filesystem::path& log,
                 bool* forked);

/// Template mode: fork so the shell gets a parent-death signal (a killed launcher must not
/// leave an srun behind). Returns the pid, or -errno when the fork fails.
pid_t fork_shell(const std::string& command, std::vector<std::string> env, const std::filesystem::path& log);

/// Waits until a running child ends or `until`; returns the children reaped.
std::vector<Child*> wait_some(std::vector<Child>& children, Clock::time_point until, bool interruptible = true);

/// The signal caught by install_handlers (SIGINT, SIGTERM), or 0.
int pending_interrupt();
/// Installs the SIGINT/SIGTERM handlers that record pending_interrupt() (no SA_RESTART).
void install_handlers();

/// SIGTERM to every running child's process group, SIGKILL after the grace period, reap all.
void stop_all(std::vector<Child>& children, std::chrono::milliseconds grace);

// ---- Diagnosis (launcher_report.cpp) -------------------------------------------------------

/// The rank to blame when several failed: a crash or a plain non-zero exit comes before a
/// transport timeout or a dead peer (14, 15), which are usually what the others see of it;
/// among equals, the first one reaped. Ranks ended by the launcher's signal are not failures
/// (one that exited with its own status during the grace period is). -1 for none.
int root_cause(const std::vector<Child>& children);

/// Ranks of the failed rank's last collective group that never entered it: the cause of a
/// collective timeout is usually a member that is elsewhere (stuck, or on another code path).
/// Calls are matched by their number on the axis, as every member issues them in order.
/// "" when the failed rank did not time out in a collective or no member is missing.
std::string diagnose_stragglers(const std::map<int, std::vector<CommRecord>>& ledgers, int failed_rank);

/// Fills o.error_code and o.error_message from errors/rank<o.rank>.json when the rank wrote one.
void read_error_file(const std::filesystem::path& run_dir, RankOutcome& o);

/// The comm ledger of `rank` in the run directory; empty when it has none.
std::vector<CommRecord> rank_ledger(const std::filesystem::path& run_dir, int rank);

}  // namespace mih::launcher_internal
