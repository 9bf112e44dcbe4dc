// The launcher's rank processes: spawning (posix_spawn for local ranks, fork for the template
// shell) into their own process groups with their logs, reaping through pidfds, and stopping
// every process group with SIGTERM then SIGKILL.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>

#include <csignal>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "harness/runtime/fork_server.h"
#include "harness/runtime/launcher_internal.h"

namespace mih::launcher_internal {
namespace {

std::vector<char*> c_strings(std::vector<std::string>& strings) {
  std::vector<char*> out;
  out.reserve(strings.size() + 1);
  for (auto& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

bool reap(Child& c, bool block) {
  if (!c.running) return true;
  int status = 0;
  pid_t r;
  do {
    r = ::waitpid(c.pid, &status, block ? 0 : WNOHANG);
  } while (r < 0 && errno == EINTR);
  if (r == 0) return false;
  c.running = false;
  c.status = r == c.pid ? status : 0;
  c.end = Clock::now();
  if (c.pidfd >= 0) {
    ::close(c.pidfd);
    c.pidfd = -1;
  }
  return true;
}

}  // namespace

int open_pidfd(pid_t pid) {
#ifdef SYS_pidfd_open
  return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
#else
  (void)pid;
  return -1;
#endif
}

std::vector<std::string> env_list(const Env& env) {
  std::vector<std::string> out;
  out.reserve(env.size());
  for (const auto& [k, v] : env) out.push_back(k + "=" + v);
  return out;
}

pid_t spawn_rank(std::vector<std::string> argv, std::vector<std::string> env, const std::filesystem::path& log,
                 bool* forked) {
  *forked = false;
  // This executable's own ranks: forked by the fork server, no exec and no libtorch load.
  if (fork_server_can_start(argv)) {
    const pid_t pid = fork_server_spawn(argv, env, log);
    if (pid > 0) {
      *forked = true;
      return pid;
    }  // else nothing was started: exec it as below
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 34))
  posix_spawn_file_actions_addclosefrom_np(&actions, 3);  // e.g. a TCPStore listening socket
#endif
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none, all;
  sigemptyset(&none);
  sigfillset(&all);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &all);
  auto args = c_strings(argv);
  auto envp = c_strings(env);
  pid_t pid = 0;
  int rc = ::posix_spawn(&pid, args[0], &actions, &attr, args.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) return -rc;
  return pid;
}

// Only async-signal-safe calls between fork and exec.
pid_t fork_shell(const std::string& command, std::vector<std::string> env, const std::filesystem::path& log) {
  std::vector<std::string> argv = {"/bin/sh", "-c", command};
  auto args = c_strings(argv);
  auto envp = c_strings(env);
  pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) return -errno;
  if (pid == 0) {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(127);
    int in = ::open("/dev/null", O_RDONLY);
    int out = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW, 0644);
    if (in >= 0) ::dup2(in, 0);
    if (out >= 0) {
      ::dup2(out, 1);
      ::dup2(out, 2);
    }
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::execve("/bin/sh", args.data(), envp.data());
    ::_exit(127);
  }
  return pid;
}

namespace {
volatile std::sig_atomic_t g_interrupt = 0;
extern "C" void on_interrupt(int sig) {
  if (g_interrupt == 0) g_interrupt = sig;
}
}  // namespace

std::vector<Child*> wait_some(std::vector<Child>& children, Clock::time_point until, bool interruptible) {
  std::vector<Child*> reaped;
  for (;;) {
    if (interruptible && g_interrupt != 0) return reaped;  // the caller stops the ranks
    std::vector<pollfd> fds;
    std::vector<Child*> polled;
    bool any_running = false;
    for (auto& c : children) {
      if (!c.running) continue;
      any_running = true;
      if (reap(c, false)) {
        reaped.push_back(&c);
      } else if (c.pidfd >= 0) {
        fds.push_back({c.pidfd, POLLIN, 0});
        polled.push_back(&c);
      }
    }
    if (!reaped.empty() || !any_running) return reaped;
    auto now = Clock::now();
    if (now >= until) return reaped;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - now).count();
    bool all_have_pidfd = polled.size() == fds.size() &&
                          std::all_of(children.begin(), children.end(), [](const Child& c) { return !c.running || c.pidfd >= 0; });
    if (all_have_pidfd && !fds.empty()) {
      ::poll(fds.data(), fds.size(), static_cast<int>(std::min<long long>(left, 1000)));
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(std::min<long long>(left, 2)));
    }
  }
}

void stop_all(std::vector<Child>& children, std::chrono::milliseconds grace) {
  for (auto& c : children) {
    if (!c.running) continue;
    c.stopped = true;
    ::kill(-c.pid, SIGTERM);
  }
  auto until = Clock::now() + grace;
  while (Clock::now() < until &&
         std::any_of(children.begin(), children.end(), [](const Child& c) { return c.running; })) {
    wait_some(children, until, /*interruptible=*/false);
  }
  for (auto& c : children) {
    if (!c.running) continue;
    ::kill(-c.pid, SIGKILL);
    reap(c, true);
  }
}

int pending_interrupt() { return static_cast<int>(g_interrupt); }

void install_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_interrupt;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART: a blocking wait returns at once
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
}

}  // namespace mih::launcher_internal
