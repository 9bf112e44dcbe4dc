// Entry point of the `mih` command on the PATH: the warm front (warm.h), which runs each
// command as the core binary beside it, <prefix>/libexec/mih/mih-core.
#include <unistd.h>

#include <cstdio>
#include <string>

#include "harness/warm/warm.h"

int main(int argc, char** argv) {
  mih::warm::catch_signals();  // first: a signal from here on reaches the command (issue 52)
  char self[4096] = {0};
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) {
    std::perror("mih: cannot resolve /proc/self/exe");
    return 12;
  }
  return mih::warm::front_main(argc, argv, mih::warm::core_beside(std::string(self, static_cast<size_t>(n))));
}
