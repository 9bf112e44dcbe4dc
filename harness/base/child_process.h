// What a process forked from a server does to become the one an exec would have made: its
// title (what ps shows), its descriptors, its signal dispositions and mask. Shared by the fork
// server (runtime/fork_server.cpp, a rank) and the warm server (warm/server.cpp, a command).
// Header-only, torch-free and free of any other mih component: the warm server links none,
// so that the warm front keeps its millisecond start.
#pragma once

#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace mih::child {

/// main's argv text: the strings are contiguous, so their whole extent (argv[0] up to the end
/// of the last contiguous one) can be rewritten as a forked process's title.
struct TitleArea {
  char* begin = nullptr;
  size_t size = 0;  ///< bytes, terminators included
};

/// The title area of main's `argc`/`argv`; empty for argc <= 0.
inline TitleArea title_area(int argc, char** argv) {
  if (argc <= 0 || argv[0] == nullptr) return {};
  char* end = argv[0] + std::strlen(argv[0]) + 1;
  for (int i = 1; i < argc && argv[i] == end; ++i) end = argv[i] + std::strlen(argv[i]) + 1;
  return {argv[0], static_cast<size_t>(end - argv[0])};
}

/// Rewrites `area` as `words`, each NUL-terminated, the rest zeroed; what does not fit is cut
/// (the area always keeps a final NUL). No-op on an area under 2 bytes.
inline void set_title(const TitleArea& area, const std::vector<std::string_view>& words) {
  if (!area.begin || area.size < 2) return;
  size_t at = 0;
  for (const std::string_view w : words) {
    if (at + 1 >= area.size) break;
    const size_t take = std::min(w.size(), area.size - 1 - at);
    std::memcpy(area.begin + at, w.data(), take);
    at += take;
    area.begin[at++] = '\0';
  }
  std::memset(area.begin + at, 0, area.size - at);
}

/// The process name (prctl PR_SET_NAME, at most 15 bytes shown).
inline void set_name(const std::string& name) { ::prctl(PR_SET_NAME, name.c_str()); }

/// Closes every descriptor from `first` up: close_range(2) where the kernel has it, else one
/// close per descriptor number below 65536.
inline void close_descriptors_from(int first) {
#ifdef SYS_close_range
  if (::syscall(SYS_close_range, static_cast<unsigned>(first), ~0U, 0U) == 0) return;
#endif
  for (int fd = first; fd < 65536; ++fd) ::close(fd);
}

/// Every signal's disposition back to SIG_DFL, except those whose bit (signal - 1) is set in
/// `ignored`, which get SIG_IGN (as exec keeps ignored signals ignored).
inline void reset_signal_dispositions(uint64_t ignored = 0) {
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  struct sigaction ign {};
  ign.sa_handler = SIG_IGN;
  for (int sig = 1; sig < NSIG; ++sig) {
    const bool ignore = sig <= 64 && ((ignored >> (sig - 1)) & 1);
    ::sigaction(sig, ignore ? &ign : &dfl, nullptr);
  }
}

/// Sets the signal mask to the signals whose bit (signal - 1) is set in `blocked`.
inline void set_signal_mask(uint64_t blocked = 0) {
  sigset_t mask;
  sigemptyset(&mask);
  for (int sig = 1; sig < NSIG && sig <= 64; ++sig) {
    if ((blocked >> (sig - 1)) & 1) sigaddset(&mask, sig);
  }
  ::sigprocmask(SIG_SETMASK, &mask, nullptr);
}

}  // namespace mih::child
