// Entry point of the `mih` command on the PATH: the warm front (warm.h), which runs each
// command as the core binary beside it, <prefix>/libexec/mih/mih-core.
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include "harness/warm/warm.h"

namespace {
// The address space the core needs to load (libtorch maps about 800 MiB; a llama case runs in
// 1.1 GB): below it the dynamic loader fails (127) or torch aborts (134), saying nothing useful.
constexpr rlim_t kCoreAddressSpaceBytes = rlim_t{1} << 30;

// False, having said the limit and the fix, when RLIMIT_AS (`ulimit -v`) is below that.
bool address_space_enough() {
  struct rlimit limit {};
  if (::getrlimit(RLIMIT_AS, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY || limit.rlim_cur >= kCoreAddressSpaceBytes) {
    return true;
  }
  std::fprintf(stderr,
               "mih: the address-space limit (ulimit -v) is %llu KiB: expected at least %llu KiB (1 GiB), which mih's "
               "core needs to load libtorch; raise it (ulimit -v %llu, or unlimited) and run mih again\n",
               static_cast<unsigned long long>(limit.rlim_cur / 1024),
               static_cast<unsigned long long>(kCoreAddressSpaceBytes / 1024),
               static_cast<unsigned long long>(kCoreAddressSpaceBytes / 1024));
  return false;
}
}  // namespace

int main(int argc, char** argv) {
  mih::warm::catch_signals();  // first: a signal from here on reaches the command (issue 52)
  if (!address_space_enough()) return 12;
  char self[4096] = {0};
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) {
    std::perror("mih: cannot resolve /proc/self/exe");
    return 12;
  }
  return mih::warm::front_main(argc, argv, mih::warm::core_beside(std::string(self, static_cast<size_t>(n))));
}
