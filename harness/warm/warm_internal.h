// The warm front and server's shared wire format and helpers (warm.h says what they do).
// One request per connection on a SOCK_STREAM unix socket. A run: the front sends a Header
// and the RunRequest; the server answers kReady (or kDiffers); the front sends a kFds Header
// with its fds 0-2 and cwd attached; the server forks the command, which waits, and answers
// kStarted; the front confirms with one byte 'g' (a front that gave up never does, and the
// unconfirmed command dies unstarted); the server answers kExited when the command is gone.
//
// Who asks is what the kernel says, never what the front says: the server examines the
// connecting process through /proc/<pid> (its pid from SO_PEERCRED, pinned by a pidfd) and
// serves it only when that equals its own account of itself; the identity the request carries
// is a consistency check. kReady names a proof (a memfd of the server's whose name holds a
// nonce): the front reads the nonce through /proc/<server>/fd, which only a process allowed to
// examine the server can (the Landlock domain /proc does not show: confinement.cpp), and echoes
// it with its fds, in one message that carries the sender's credentials (SO_PASSCRED): the
// process that sent it after kReady is the process examined (its pidfd still alive then), not a
// later one that reused its pid, and it may examine the server as the server examined it.
#pragma once

#include <sys/socket.h>
#include <sys/types.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace mih::warm::internal {

inline constexpr uint32_t kMagic = 0x7768696d;  // "mihw"
inline constexpr uint32_t kVersion = 2;  // 2: kReady names a Proof's fd

enum class Kind : uint32_t { kRun = 1, kStatus = 2, kStop = 3, kFds = 4 };

struct Header {
  uint32_t magic = kMagic;
  uint32_t version = kVersion;
  uint32_t kind = 0;
  uint32_t fd_bits = 0;  // which of stdin, stdout, stderr the kFds message carries (bits 0-2); the cwd always
  uint64_t payload_bytes = 0;
};

enum class ReplyKind : uint32_t {
  kStarted = 1,  // value: the command's pid
  kDiffers = 2,  // value: a Why; the front execs (or, for kStale/kStopping, tries a new server)
  kExited = 3,   // value: the command's wait status
  kText = 4,     // value: the byte count of text that follows (status)
  kReady = 5,    // the request is accepted: value, the server's fd of its Proof; send the fds, echoing its nonce
};

enum class Why : int64_t {
  kIdentity = 1,  // the caller (as the kernel reports it) or its request is not the server's: text_bytes say why
  kStale = 2,     // a file the server has mapped was replaced since it started
  kBusy = 3,      // the server is not single-threaded, or cannot fork now
  kBadRequest = 4,
  kStopping = 5,
};

struct Reply {
  uint32_t kind = 0;
  uint32_t text_bytes = 0;  // kDiffers: the length of the text that follows (why; at most kMaxWhyBytes)
  int64_t value = 0;
};

inline constexpr uint32_t kMaxWhyBytes = 4096;

/// The run request's payload after the header: the identity, then umask, the blocked and the
/// ignored signals (bit sig-1, signals 1..64), argv and the environment (each a count, then
/// NUL-terminated strings).
struct RunRequest {
  std::string identity;
  uint32_t umask = 022;
  uint64_t blocked = 0;
  uint64_t ignored = 0;
  std::vector<std::string> argv;
  std::vector<std::string> env;
};

std::string encode(const RunRequest& r);
/// False when `bytes` is not a well-formed RunRequest.
bool decode(const std::string& bytes, RunRequest* r);

/// The socket directory (warm.h's kDirVar), created 0700 when missing; empty when it cannot be
/// made or is not private to this user (then *why says why).
std::string socket_dir(std::string* why);
/// 16 hex digits naming a server of `identity` in the socket directory.
std::string key_of(const std::string& identity);

/// Whole writes and reads that retry on EINTR; false on error or end of file.
bool write_all(int fd, const void* data, size_t n);
bool read_all(int fd, void* data, size_t n);
/// Sends `header` and `payload` in one message with `fds` attached (SCM_RIGHTS); what the socket
/// did not take at once follows.
bool send_request(int fd, const Header& header, const std::vector<int>& fds, const std::string& payload);
/// Receives a header and up to 4 attached fds (appended to *fds, close-on-exec).
bool receive_header(int fd, Header* header, std::vector<int>* fds);
/// Receives a header with its 8-byte payload (the echoed nonce) and up to 4 attached fds, all in
/// one message that carries its sender's credentials (the socket has SO_PASSCRED): false unless
/// it came whole, in one piece, from one sender (*sender).
bool receive_echo(int fd, Header* header, uint64_t* nonce, std::vector<int>* fds, ucred* sender);

/// An identity: (name, value) fields in a fixed order, serialized as `name length:value\n`.
using Fields = std::vector<std::pair<std::string, std::string>>;
std::string serialize(const Fields& fields);
/// False when `text` is not a serialized identity.
bool parse(const std::string& text, Fields* fields);
/// The names of the fields in which `a` and `b` differ, comma-separated ("" when equal).
std::string differing(const Fields& a, const Fields& b);

/// What exec passes on to a command of the process whose /proc directory `proc` is open (of
/// /proc/self, or /proc/<pid>: reads through it see that process or fail, never a later one
/// with its pid), as the kernel reports it: uids and gids (real, effective, saved, fs), groups,
/// capability sets, no_new_privs, seccomp mode and filter count, CPU and memory-node affinity,
/// nice value and scheduling policy, OOM score adjustment, resource limits, namespaces, cgroup,
/// LSM labels, and the environment (less `_`, `PWD`, `OLDPWD`, `SHLVL`, `MIH_WARM*`; the whole
/// of it, in order, in *env when not null). False, with *why, when some of it cannot be
/// read: the process is gone, or not the reader's to examine.
bool read_process(int proc, Fields* fields, std::vector<std::string>* env, std::string* why);

/// What a caller must read to be served: a memfd of the server's named "mih-warm-proof-<nonce as
/// 16 hex digits>" (readlink of /proc/<server>/fd/<fd> needs PTRACE_MODE_READ of the server).
struct Proof {
  int fd = -1;
  uint64_t nonce = 0;  // never 0
};
/// A new proof (close-on-exec); false, errno set, when none can be made.
bool make_proof(Proof* proof);
/// The caller's part: the nonce of the proof at fd `fd` of the process `server`; false, with
/// *why, when this process may not examine the server (confined apart from it) or that fd is
/// no proof.
bool read_proof(pid_t server, int64_t fd, uint64_t* nonce, std::string* why);

/// A pidfd of `pid` (pidfd_open), or -1 (errno set) where the kernel has none.
int open_pidfd(pid_t pid);
/// True while the process of `pidfd` holds its pid (not reaped, so no other process has it):
/// pidfd_send_signal with signal 0 succeeds.
bool pidfd_alive(int pidfd);

/// What is wrong with MIH_WARM, MIH_WARM_IDLE or MIH_WARM_TIMEOUT ("" when nothing: unset or
/// well-formed), naming the variable, its value and what it takes.
std::string bad_settings();

/// True when the variable is set to 0, false, no or off.
bool switched_off(const char* var);

}  // namespace mih::warm::internal
