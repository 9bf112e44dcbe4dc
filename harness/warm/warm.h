// Warm start: `mih` commands forked from a server that has the binary and libtorch loaded
// already, so a command does not pay the ~0.35-0.55 s of loading and initializing libtorch.
//
// The `mih` on the PATH is a small front that links no torch. It runs each command as the
// core binary (`<prefix>/libexec/mih/mih-core`) would run it, through that binary's warm
// server: a process exec'd from the core binary that never runs any of mih's code but the
// server loop, and forks each command from its state as exec left it. The server is keyed by
// everything an exec would give the command (the core binary's identity, the whole
// environment, credentials, resource limits, scheduling, namespaces, cgroup, capabilities,
// no_new_privs, seccomp, LSM label): a request is served only when the calling process, as
// the kernel reports it (the server reads /proc/<pid> of its socket's peer, never trusting
// what the front says), equals the server's in all of it, byte for byte, and each of the two
// may examine the other (the same Landlock domain, or none: /proc shows no domain); the rest
// (argv, cwd, umask, signal mask and ignored signals, fds 0-2) travels with the request.
// The command's exit status or signal is the front's; signals sent to the front reach the
// command; a front that dies takes its command along (SIGTERM, then SIGKILL after 10 s).
//
// Any doubt falls back to exec'ing the core binary (the state exec gives, at exec's cost):
// MIH_WARM=0, `mih worker` (a launcher's own process), a server that cannot start, is
// stale (a mapped file replaced, e.g. a rebuilt binary or an upgraded libtorch) or differs
// (then the front says what differs, on stderr).
// Servers exit after MIH_WARM_IDLE seconds without a command (default 120); `mih warm status`
// lists this user's servers, `mih warm stop` stops them (running commands finish first).
#pragma once

#include <string>
#include <vector>

namespace mih::warm {

/// The variable that turns warm start off ("0", "false", "no", "off"): every command exec'd.
inline constexpr const char* kWarmVar = "MIH_WARM";
/// Seconds a server waits for its next command before it exits (default 120; 1 to 86400). The
/// MIH_WARM* variables are not part of a server's identity: a server keeps its creator's idle
/// time. A malformed value of any of them is a usage error of the front (exit 2).
inline constexpr const char* kIdleVar = "MIH_WARM_IDLE";
/// Seconds a front waits for its server to answer (that the command started; how it ended,
/// once it is gone) before it gives up: exec'ing the command, or exit 16 (default 30).
inline constexpr const char* kTimeoutVar = "MIH_WARM_TIMEOUT";
/// The directory of the servers' sockets (default $XDG_RUNTIME_DIR/mih, else /tmp/mih-<uid>);
/// it must be a directory of this user's that nobody else may enter (mode 0700).
inline constexpr const char* kDirVar = "MIH_WARM_DIR";
/// Set by the front when it execs the core (not warm): SIGINT and SIGTERM are blocked across
/// the exec, one that came meanwhile kept pending, and the value (decimal bits, bit sig - 1)
/// says which of them the caller itself had blocked; release_held_signals reads and removes it.
inline constexpr const char* kHeldVar = "MIH_WARM_HELD_SIGNALS";
/// argv[1] of the core binary started as a warm server (`mih-core __warm-serve SOCKET FD`).
inline constexpr const char* kServeArg = "__warm-serve";

/// The core binary's main() for one command (argv[0] the core binary).
using CommandEntry = int (*)(int argc, char** argv);

/// The front's first call in main(): records the caller's signal dispositions and mask, then
/// installs the handlers that forward signals to the command (kept until it exists), so that
/// no signal meets a default action while the front starts. front_main calls it too (once).
void catch_signals();

/// The front's main(): runs `argv` (argv[0] the front) as a command of `core`, warm when it
/// can, else by exec'ing `core` with argv[0] = `core`. Returns only the command's exit status
/// (a command killed by a signal kills the front with it); exit 12 when `core` is missing.
int front_main(int argc, char** argv, const std::string& core);

/// The core binary of the front at `front` (its /proc/self/exe): `<dir>/../libexec/mih/mih-core`.
std::string core_beside(const std::string& front);

/// The core binary's part: when argv[1] is kServeArg, runs the warm server (returns when it
/// ends: idle, stopped or stale) and returns true with its exit status in *status; false
/// otherwise (a command: call `entry` as usual). Call it first in main(), before anything else.
bool serve_if_asked(int argc, char** argv, CommandEntry entry, int* status);

/// In a command forked by the warm server, or exec'd by the front, which starts with SIGINT
/// and SIGTERM blocked (one that came early waits for the command's handlers): gives the
/// command its caller's signal mask, and (forked) SIG_IGN back to a held signal the caller
/// ignored and the command did not catch (exec'd, exec kept the caller's SIG_IGN). No-op in a
/// core binary run directly. Call it in the CommandEntry, right after installing the command's
/// own handlers and before anything else.
void release_held_signals();

/// `mih warm status|stop`: lists this user's warm servers (socket, pid, commands served and
/// running, seconds idle, core binary) or stops them; returns the exit status (0; 2 on a bad
/// argument).
int warm_command(const std::vector<std::string>& args);

/// The identity a request must share with a server (what exec gives a process, see above) of
/// this process as the kernel reports it in /proc/self, for `core`: length-prefixed fields,
/// byte-comparable; "" when /proc/self cannot be read. Exposed for tests.
std::string identity(const std::string& core);

}  // namespace mih::warm
