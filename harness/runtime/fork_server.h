// The fork server: local ranks without paying for libtorch once per rank.
//
// A mih process that may launch local ranks forks a copy of itself first thing in main(),
// before any of mih's code has run: the fork server. It holds the binary and libtorch loaded
// and initialized exactly as a freshly exec'd process has them at main(), and never runs
// anything else. For each rank the launcher asks it for, it forks twice: the rank is the
// grandchild, and the launcher (a child subreaper) adopts it as soon as the middle process
// exits, before the request returns. So the launcher reaps, signals and polls the rank like a
// rank it spawned itself (pidfd, process group, death signal, log, report); only the start
// differs. A forked rank starts from the server's untouched state: its own environment in
// place of the inherited one, fds 0-2 only (stdin /dev/null, stdout and stderr the log),
// default signal dispositions and an empty mask, its own process group, one BLAS thread and
// the intra-op threads its OMP_NUM_THREADS says, then the binary's main() with the rank's argv.
//
// MIH_FORK_SERVER=0 (or false, no, off) turns it off (every rank exec'd by posix_spawn, as
// from a test binary). Should the server die while starting a rank, the launcher kills and
// reaps whatever of that start it adopted, so the rank it then execs is the only one.
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <string>
#include <vector>

namespace mih {

/// The variable that turns the fork server off ("0", "false", "no", "off").
inline constexpr const char* kForkServerVar = "MIH_FORK_SERVER";

/// The binary's own main(), run by a forked rank with the rank's argv (argv[0] the binary).
using RankEntry = int (*)(int argc, char** argv);

/// Forks this process's fork server. Call it first in main(), before any thread or state of
/// mih's exists; `argv` is main's (the server rewrites its text as each rank's title, so `ps`
/// shows the rank's command). A no-op when MIH_FORK_SERVER=0, when the fork fails (local
/// ranks are then exec'd), or on a second call. Makes this process a child subreaper.
void start_fork_server(int argc, char** argv, RankEntry entry);

/// True when the fork server runs and `argv` is a command of this very executable (argv[0]
/// names /proc/self/exe), which it can start without an exec.
bool fork_server_can_start(const std::vector<std::string>& argv);

/// Starts a rank through the fork server: `argv` (argv[0] this executable), exactly the
/// environment `env` ("KEY=value"), stdout and stderr to `log` (truncated). Returns its pid,
/// a child of this process by the time this returns, or -errno when it could not be started
/// (the server gone, the log not creatable: then nothing was started). Thread-safe.
pid_t fork_server_spawn(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                        const std::filesystem::path& log);

/// Ends this process with `status` as returning from main() would, without libtorch's static
/// teardown (deregistering every operator: about 0.1 s per process, most of a short command's
/// exit): flushes stdio, ends and reaps the fork server, writes the counters of a coverage
/// build (MIH_COVERAGE), then _Exit. Every file mih writes is complete before this (atomic
/// writes, whole JSONL lines).
[[noreturn]] void end_process(int status);

/// The threads of this process (/proc/self/task entries), or -1 where unreadable: the
/// server forks only when it is 1.
int process_thread_count();

}  // namespace mih
