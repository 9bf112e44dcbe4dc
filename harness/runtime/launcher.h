// The launcher: starts the N rank processes of a run and supervises them. When one rank
// fails it stops the others and reports which rank, how (exit code or signal), the tail of
// its log and what every rank was last doing; a run that outlives its timeout is stopped
// the same way. Never leaves a process behind.
//
// Modes:
//   local:    N children of this machine, torchrun variables set, a FileStore (or a TCPStore
//             hosted by the launcher) in the run directory, one log per rank;
//   template: one command such as "srun -N2 --ntasks-per-node=8 {cmd}" that starts the
//             ranks itself; the launcher hosts the TCPStore they meet at;
//   external: no launcher; the worker runs under torchrun/srun/mpirun (see worker.h).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "harness/base/error.h"
#include "harness/runtime/world.h"

namespace mih {

/// Set in every local rank's environment to the launcher's pid: the rank asks the kernel
/// to kill it if the launcher dies (PR_SET_PDEATHSIG).
inline constexpr const char* kLauncherPidVar = "MIH_LAUNCHER_PID";

/// Set in every rank's environment to the number of ranks the launcher started (or expects
/// a template to start); a rank that sees another world size fails at once, naming both.
inline constexpr const char* kExpectedWorldSizeVar = "MIH_EXPECTED_WORLD_SIZE";

/// Set in template mode to "<host>:<port>" of the TCPStore the launcher hosts. Every rank
/// reports its exit status there (so a template that starts too few ranks is caught), and
/// stops if the store goes away (a killed launcher cannot signal ranks srun started).
inline constexpr const char* kLauncherStoreVar = "MIH_LAUNCHER_STORE";

/// Where local ranks meet.
enum class RendezvousKind {
  kFile,  ///< FileStore in the run directory: no ports, concurrent runs cannot collide
  kTcp,   ///< TCPStore hosted by the launcher on 127.0.0.1 (the multi-host path, locally)
};

/// What to launch and how long to let it run.
struct LaunchOptions {
  /// Number of rank processes (local mode).
  int world_size = 1;
  /// The rank command, program first (usually worker_command(...)).
  std::vector<std::string> command;
  /// Run directory: logs/rank<r>.log, comm/, errors/, the FileStore. Stale files of these
  /// names from an earlier run are removed first.
  std::filesystem::path run_dir;
  /// The whole run must finish within this; then every rank still running is stopped.
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  /// After SIGTERM, how long ranks get before SIGKILL.
  std::chrono::milliseconds grace{std::chrono::seconds(2)};
  /// After the first rank fails, how long the others get to end on their own (ranks failing
  /// the same way report their own errors) before they are stopped.
  std::chrono::milliseconds settle{std::chrono::milliseconds(500)};
  /// OMP_NUM_THREADS / OPENBLAS_NUM_THREADS / MKL_NUM_THREADS of each rank.
  int threads_per_rank = 1;
  RendezvousKind rendezvous = RendezvousKind::kFile;
  /// Template mode when non-empty: a shell command containing "{cmd}", which is replaced by
  /// the shell-quoted rank command; it must start world_size ranks (e.g. srun, mpirun).
  std::string command_template;
  /// Extra variables for every rank (override the launcher's).
  Env extra_env;
  /// Lines of a failed rank's log quoted in the report.
  int log_tail_lines = 20;
};

/// How one rank process ended.
struct RankOutcome {
  enum class State {
    kExited,    ///< exited by itself with exit_code
    kSignaled,  ///< killed by signal `signal` not sent by the launcher
    kStopped,   ///< still running when the launcher stopped it (after a failure/timeout)
  };
  /// Rank, or -1 for the command of template mode.
  int rank = -1;
  pid_t pid = 0;
  State state = State::kExited;
  int exit_code = 0;
  int signal = 0;
  /// Seconds from start to end.
  double seconds = 0;
  /// How the launcher started it: "fork_server" (forked, no exec), "exec" (posix_spawn), or
  /// "template" (the command of template mode).
  std::string started_by;
  std::filesystem::path log;
  /// The rank's own error report (errors/rank<r>.json), if it wrote one.
  std::string error_code;
  std::string error_message;
  /// From the rank's comm ledger: what it was doing last.
  std::string last_activity;

  bool ok() const { return state == State::kExited && exit_code == 0; }
  /// "exited with code 13 (failed_precondition)", "killed by SIGSEGV", "stopped by the launcher".
  std::string how() const;
};

/// The result of a launch.
struct LaunchResult {
  enum class Status { kOk, kRankFailed, kTimedOut, kInterrupted };
  Status status = Status::kOk;
  /// kInterrupted: the signal this process received (SIGINT, SIGTERM); every rank was stopped.
  int interrupt_signal = 0;
  /// kRankFailed: the first rank that failed (-1 for the template command).
  int failed_rank = -1;
  std::vector<RankOutcome> ranks;
  /// Wall time of the launch, seconds.
  double seconds = 0;
  /// Lines quoted from the failed rank's log.
  std::string failed_log_tail;
  /// From the comm ledgers, when the failed rank timed out in a collective: which members
  /// of that group never entered it (the usual culprits), e.g. "rank(s) [1] never entered
  /// call #3 on axis 'world' (all_reduce.sum from grad_sync @ ...)". Empty otherwise.
  std::string diagnosis;
  std::chrono::milliseconds timeout{0};

  bool ok() const { return status == Status::kOk; }
  /// The code to report: kOk; the failed rank's own error code; kAborted for a crash, a
  /// plain non-zero exit or an interrupt; kDeadlineExceeded for a timeout.
  Code code() const;
  /// Multi-line human report: the cause first (rank, exit code or signal, error, log tail),
  /// then every other rank's state and last activity.
  std::string report() const;
};

/// Makes SIGINT and SIGTERM of this process interrupt the current launch instead of ending
/// the process at once: launch() stops every rank and returns Status::kInterrupted, and the
/// caller writes what is done, says so and exits 128 + the signal. Idempotent.
void install_interrupt_handlers();

/// The first SIGINT or SIGTERM received since install_interrupt_handlers(), or 0.
int interrupt_signal();

/// Launches and supervises a run; returns when every process has ended and been reaped.
/// A failure of the run is a LaunchResult, not an exception. In template mode a command
/// that exits 0 fails the run unless every rank reported completion through the store.
/// Holds an exclusive lock on the run directory while running.
/// Throws: mih::Error{kInvalidSpec} for bad options (world_size < 1, empty command, a
///   template without "{cmd}"); kFailedPrecondition if the run directory cannot be
///   prepared, is in use by another launch, or a process cannot be started (nothing is
///   left running).
LaunchResult launch(const LaunchOptions& options);

/// JSON of a launch result for evidence (run.json): status, code, failed rank, diagnosis,
/// seconds, and every rank's outcome.
void to_json(nlohmann::json& j, const LaunchResult& result);

/// Quotes `arg` for /bin/sh ('...' with embedded quotes escaped) when it needs quoting.
std::string shell_quote(const std::string& arg);

}  // namespace mih
