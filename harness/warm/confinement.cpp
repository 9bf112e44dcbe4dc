// The confinement /proc does not show (warm_internal.h's Proof): a caller proves it may examine
// its server as the server examines it.
//
// Why: a Landlock domain is invisible in /proc, so the server's comparison of what the kernel
// reports (read_process) sees a caller confined by Landlock as its equal, and would run its
// command outside the domain (issue 53: `mih export --out <forbidden>` written through an
// unconfined server). What Landlock does show is ptrace access: a process in a domain may
// examine (PTRACE_MODE_READ: readlink of /proc/<pid>/fd/<n> or ns/<kind>) only processes in the
// same domain or one nested in it. The server reads the caller's ns/* links (read_process), so
// a caller it is allowed to examine is in the server's domain or nested in it; the caller reads
// the server's fd link here, so a server it is allowed to examine is in the caller's domain or
// nested in it. Both hold only when the two are in the same domain, or both in none.
// Not /proc/<pid>/environ or mem: root reads those past Landlock (CAP_PERFMON, mm_access).
// Yama's ptrace_scope restricts attaching only, never PTRACE_MODE_READ.
#include <sys/mman.h>
#include <sys/random.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "harness/warm/warm_internal.h"

namespace mih::warm::internal {
namespace {

constexpr char kProofName[] = "mih-warm-proof-";

}  // namespace

bool make_proof(Proof* proof) {
  proof->nonce = 0;
  while (proof->nonce == 0) {
    if (::getrandom(&proof->nonce, sizeof proof->nonce, 0) != static_cast<ssize_t>(sizeof proof->nonce)) {
      if (errno != EINTR) return false;
      proof->nonce = 0;
    }
  }
  char name[64];
  std::snprintf(name, sizeof name, "%s%016llx", kProofName, static_cast<unsigned long long>(proof->nonce));
  proof->fd = ::memfd_create(name, MFD_CLOEXEC);
  return proof->fd >= 0;
}

bool read_proof(pid_t server, int64_t fd, uint64_t* nonce, std::string* why) {
  const std::string path = "/proc/" + std::to_string(server) + "/fd/" + std::to_string(fd);
  char link[256] = {0};
  const ssize_t n = server > 0 && fd >= 0 ? ::readlink(path.c_str(), link, sizeof link - 1) : -1;
  if (n < 0) {
    const int err = server > 0 && fd >= 0 ? errno : EINVAL;
    *why = "this process may not examine the server as the server examines it (" + path + ": " +
           std::strerror(err) + "): the two are confined apart, e.g. in different Landlock domains, which /proc does "
           "not show";
    return false;
  }
  const char* at = std::strstr(link, kProofName);
  char* end = nullptr;
  *nonce = at ? std::strtoull(at + sizeof kProofName - 1, &end, 16) : 0;
  if (!at || end != at + sizeof kProofName - 1 + 16 || *nonce == 0) {
    *why = "the server's " + path + " is '" + link + "', not its proof (" + kProofName + "<16 hex digits>)";
    return false;
  }
  return true;
}

}  // namespace mih::warm::internal
