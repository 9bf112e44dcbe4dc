// The warm front and server's shared wire format and helpers (warm.h says what they do).
// One request per connection on a SOCK_STREAM unix socket. A run: the front sends a Header
// and the RunRequest; the server answers kReady (or kDiffers); the front sends a kFds Header
// with its fds 0-2 and cwd attached; the server forks the command, which waits, and answers
// kStarted; the front confirms with one byte 'g' (a front that gave up never does, and the
// unconfirmed command dies unstarted); the server answers kExited when the command is gone.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace mih::warm::internal {

inline constexpr uint32_t kMagic = 0x7768696d;  // "mihw"
inline constexpr uint32_t kVersion = 1;

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
  kReady = 5,    // the request is accepted: send the fds
};

enum class Why : int64_t {
  kIdentity = 1,  // the request's identity is not the server's
  kStale = 2,     // a file the server has mapped was replaced since it started
  kBusy = 3,      // the server is not single-threaded, or cannot fork now
  kBadRequest = 4,
  kStopping = 5,
};

struct Reply {
  uint32_t kind = 0;
  uint32_t reserved = 0;
  int64_t value = 0;
};

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
/// Sends `header` with `fds` attached (SCM_RIGHTS), then `payload`.
bool send_request(int fd, const Header& header, const std::vector<int>& fds, const std::string& payload);
/// Receives a header and up to 4 attached fds (appended to *fds, close-on-exec).
bool receive_header(int fd, Header* header, std::vector<int>* fds);

/// A pidfd of `pid` (pidfd_open), or -1 (errno set) where the kernel has none.
int open_pidfd(pid_t pid);

/// What is wrong with MIH_WARM, MIH_WARM_IDLE or MIH_WARM_TIMEOUT ("" when nothing: unset or
/// well-formed), naming the variable, its value and what it takes.
std::string bad_settings();

/// True when the variable is set to 0, false, no or off.
bool switched_off(const char* var);

}  // namespace mih::warm::internal
