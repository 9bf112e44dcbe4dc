// The fork server (fork_server.h): the server loop, the rank's start, and the launcher's
// client. A request is one SOCK_SEQPACKET message: two uint32 counts (argv, env), then the
// log path, the argv strings and the env strings, each NUL-terminated. The reply is one
// int64: the rank's pid, or -errno.
#include "harness/runtime/fork_server.h"

#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <utility>
#include <string_view>
#include <vector>

#include "harness/base/child_process.h"

extern char** environ;

#ifdef MIH_COVERAGE
extern "C" void __gcov_dump(void);  // libgcov, linked by --coverage
#endif

namespace mih {
namespace {

// Within the default socket buffer (net.core.wmem_default); a larger request is exec'd.
constexpr size_t kMaxRequest = 64 << 10;

int g_fd = -1;  // the launcher's end of the socket pair; -1: no server
pid_t g_server = 0;
std::vector<pid_t> g_ranks;  // every pid the server handed out (the launcher's to supervise)
std::mutex g_mutex;
RankEntry g_entry = nullptr;
child::TitleArea g_title;  // main's argv text, rewritten as a forked rank's title

// BLAS and OpenMP threads of this process, through the libraries libtorch loaded (absent
// ones are skipped): what a freshly exec'd rank gets from OPENBLAS_NUM_THREADS and
// OMP_NUM_THREADS when its libraries load. OpenBLAS restarts its pool on any call after a
// fork, so the server sets one thread and shuts the pool down again (its threads would be
// copied as locks, not threads); a rank asks only for a count other than the server's.
void set_library_threads(const char* blas, const char* omp, bool shut_pool) {
  using SetThreads = void (*)(int);
  using GetThreads = int (*)();
  using Shutdown = int (*)();
  if (blas && std::atoi(blas) > 0) {
    auto get = reinterpret_cast<GetThreads>(::dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
    auto set = reinterpret_cast<SetThreads>(::dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
    if (set && (shut_pool || !get || get() != std::atoi(blas))) set(std::atoi(blas));
    auto shutdown = reinterpret_cast<Shutdown>(::dlsym(RTLD_DEFAULT, "blas_thread_shutdown_"));
    if (shut_pool && shutdown) {
      shutdown();
      // The pool's size, fixed when OpenBLAS loaded (from the launcher's environment): a rank
      // restarts a pool of that size on its first BLAS call, so make it what
      // OPENBLAS_NUM_THREADS=1 makes it at load, one thread (the caller's).
      if (auto* size = static_cast<int*>(::dlsym(RTLD_DEFAULT, "blas_num_threads"))) *size = 1;
    }
  }
  if (omp && std::atoi(omp) > 0) {
    if (auto f = reinterpret_cast<SetThreads>(::dlsym(RTLD_DEFAULT, "omp_set_num_threads"))) f(std::atoi(omp));
  }
}

// In the forked rank: becomes the process an exec would have made, then runs main().
[[noreturn]] void become_rank(std::vector<char*>& argv, std::vector<char*>& env, int log_fd, int go_fd,
                              pid_t launcher) {
  ::setpgid(0, 0);
  child::reset_signal_dispositions();
  child::set_signal_mask();
  // The middle process has exited (the server waited for it before answering), so the
  // launcher has adopted this rank; the death signal the worker asks for is the launcher's.
  for (int i = 0; i < 20000 && ::getppid() != launcher; ++i) ::usleep(100);
  if (::getppid() != launcher) ::_exit(127);
  // Runs only once the launcher has its pid: the server says so after its answer went out.
  // A server that died first closes the pipe instead, and this rank, which nobody would
  // supervise, never starts (the launcher reaps it and execs the rank).
  char go = 0;
  ssize_t got;
  do {
    got = ::read(go_fd, &go, 1);
  } while (got < 0 && errno == EINTR);
  if (got != 1) {
    static const char why[] = "mih: the fork server died before the launcher learnt this rank's pid; not starting\n";
    (void)!::write(log_fd, why, sizeof why - 1);
    ::_exit(16);
  }
  ::close(go_fd);
  const int in = ::open("/dev/null", O_RDONLY);
  if (in >= 0 && in != 0) ::dup2(in, 0);
  ::dup2(log_fd, 1);
  ::dup2(log_fd, 2);
  child::close_descriptors_from(3);
  environ = env.data();  // the strings live in this process's copy of the request
  const char* rank = std::getenv("RANK");
  child::set_name(std::string("mih-rank") + (rank ? rank : ""));
  child::set_title(g_title, std::vector<std::string_view>(argv.begin(), argv.end() - 1));  // argv ends in nullptr
  set_library_threads(std::getenv("OPENBLAS_NUM_THREADS"), std::getenv("OMP_NUM_THREADS"), /*shut_pool=*/false);
  const int status = g_entry(static_cast<int>(argv.size()) - 1, argv.data());
  std::fflush(stdout);
  std::fflush(stderr);
  ::_exit(status);
}

// Splits a request into its NUL-terminated strings (pointers into `buf`). False if malformed.
bool decode(char* buf, size_t n, std::string* log, std::vector<char*>* argv, std::vector<char*>* env) {
  uint32_t counts[2];
  if (n < sizeof counts) return false;
  std::memcpy(counts, buf, sizeof counts);
  char* p = buf + sizeof counts;
  char* end = buf + n;
  auto next = [&]() -> char* {
    char* s = p;
    while (p < end && *p) ++p;
    if (p == end) return nullptr;
    ++p;
    return s;
  };
  char* l = next();
  if (!l || counts[0] == 0) return false;
  *log = l;
  for (uint32_t i = 0; i < counts[0]; ++i) {
    char* s = next();
    if (!s) return false;
    argv->push_back(s);
  }
  for (uint32_t i = 0; i < counts[1]; ++i) {
    char* s = next();
    if (!s) return false;
    env->push_back(s);
  }
  argv->push_back(nullptr);
  env->push_back(nullptr);
  return true;
}

// Starts one rank of a request; returns its pid or -errno. Only this (single) thread runs.
// `*go` is the write end of the rank's start signal: one byte once the answer went out.
int64_t start_rank(char* buf, size_t n, pid_t launcher, int* go) {
  *go = -1;
  std::string log;
  std::vector<char*> argv, env;
  if (!decode(buf, n, &log, &argv, &env)) return -EINVAL;
  // A fork of a process with other threads would copy their locks, not them. (A thread the
  // server's libraries end, like OpenBLAS's pool, may take a moment to be gone.)
  for (int i = 0; i < 200 && process_thread_count() != 1; ++i) ::usleep(1000);
  if (process_thread_count() != 1) return -EDEADLK;
  const int log_fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (log_fd < 0) return -errno;
  int pipe_fds[2], go_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) {
    const int err = errno;
    ::close(log_fd);
    return -err;
  }
  if (::pipe2(go_fds, O_CLOEXEC) != 0) {
    const int err = errno;
    ::close(log_fd);
    ::close(pipe_fds[0]);
    ::close(pipe_fds[1]);
    return -err;
  }
  const pid_t server = ::getpid();
  const pid_t middle = ::fork();
  if (middle == 0) {
    // A server that dies now takes its middle process along: no rank is started unseen.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != server) ::_exit(0);
    const pid_t rank = ::fork();
    if (rank == 0) {
      ::close(pipe_fds[0]);
      ::close(pipe_fds[1]);
      ::close(go_fds[1]);
      become_rank(argv, env, log_fd, go_fds[0], launcher);
    }
    const int64_t reply = rank < 0 ? -errno : rank;
    (void)!::write(pipe_fds[1], &reply, sizeof reply);
    ::_exit(0);
  }
  const int err = errno;
  ::close(log_fd);
  ::close(pipe_fds[1]);
  ::close(go_fds[0]);
  int64_t reply = -err;
  if (middle > 0) {
    int status = 0;
    while (::waitpid(middle, &status, 0) < 0 && errno == EINTR) {
    }
    // Once the middle process is reaped, its child has been reparented to the launcher.
    if (::read(pipe_fds[0], &reply, sizeof reply) != static_cast<ssize_t>(sizeof reply)) reply = -ECHILD;
  }
  ::close(pipe_fds[0]);
  if (reply > 0) {
    *go = go_fds[1];
  } else {
    ::close(go_fds[1]);
  }
  return reply;
}

[[noreturn]] void serve(int fd, pid_t launcher) {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != launcher) ::_exit(0);
  // Ctrl-C reaches the launcher's process group: the launcher stops its ranks and exits, and
  // the server ends when it does (end of file, or the death signal).
  ::signal(SIGINT, SIG_IGN);
  ::signal(SIGTERM, SIG_IGN);
  ::signal(SIGPIPE, SIG_IGN);
  // The launcher's stdio is not the server's to hold open (a pipe would stay open after the
  // launcher exits until the server has too); ranks get their logs.
  if (const int null_fd = ::open("/dev/null", O_RDWR); null_fd >= 0) {
    for (int fd = 0; fd < 3; ++fd) ::dup2(null_fd, fd);
    if (null_fd > 2) ::close(null_fd);
  }
  child::set_name("mih-forkserver");
  child::set_title(g_title, {"mih-forkserver"});
  set_library_threads("1", "1", /*shut_pool=*/true);
  // Test hook (tests/cli/fork_server.py): die with a rank forked and adopted, unanswered.
  const char* die = std::getenv("MIH_FORK_SERVER_TEST_DIE");
  const bool die_after_fork = die && std::strcmp(die, "after_fork") == 0;
  std::vector<char> buf(kMaxRequest);
  for (;;) {
    const ssize_t n = ::recv(fd, buf.data(), buf.size(), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) ::_exit(0);  // the launcher is gone or done
    int go = -1;
    const int64_t reply = start_rank(buf.data(), static_cast<size_t>(n), launcher, &go);
    if (die_after_fork && reply > 0) ::_exit(9);
    if (::send(fd, &reply, sizeof reply, MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof reply)) ::_exit(0);
    if (go >= 0) {
      (void)!::write(go, "1", 1);
      ::close(go);
    }
  }
}

// Children of this process (pid, comm) from /proc.
std::vector<std::pair<pid_t, std::string>> children_of_this_process() {
  std::vector<std::pair<pid_t, std::string>> out;
  const std::string self = std::to_string(::getpid());
  DIR* d = ::opendir("/proc");
  if (!d) return out;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    const std::string path = std::string("/proc/") + e->d_name + "/stat";
    FILE* f = std::fopen(path.c_str(), "r");
    if (!f) continue;
    char buf[512] = {0};
    const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
    std::fclose(f);
    const std::string stat(buf, n);
    const auto open = stat.find('('), close = stat.rfind(')');
    if (open == std::string::npos || close == std::string::npos || close + 4 > stat.size()) continue;
    // After ") ": the state, then the parent's pid.
    const auto ppid_begin = stat.find(' ', close + 2) + 1;
    const std::string ppid = stat.substr(ppid_begin, stat.find(' ', ppid_begin) - ppid_begin);
    if (ppid == self) out.emplace_back(std::atoi(e->d_name), stat.substr(open + 1, close - open - 1));
  }
  ::closedir(d);
  return out;
}

// The server died while answering: it may have forked a middle process or a rank this
// process has since adopted but was never told about. Reaps the server (its death has then
// reparented its children here), and kills and reaps every such process (named after the
// server, or mih-rank<r> but no pid it handed out) until none is left.
void reap_after_server_death() {
  if (g_server > 0) {
    while (::waitpid(g_server, nullptr, 0) < 0 && errno == EINTR) {
    }
    g_server = 0;
  }
  for (int round = 0; round < 50; ++round) {
    bool found = false;
    for (const auto& [pid, comm] : children_of_this_process()) {
      const bool ours = comm.rfind("mih-forkserver", 0) == 0 || comm.rfind("mih-rank", 0) == 0;
      if (!ours || std::find(g_ranks.begin(), g_ranks.end(), pid) != g_ranks.end()) continue;
      found = true;
      ::kill(pid, SIGKILL);
      while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
      }
    }
    if (!found) return;  // a killed middle process's rank, if any, was found in a later round
  }
}

// Ends the fork server: it sees end of file and exits; reaped here rather than left to init.
void stop_server() {
  if (g_fd >= 0) ::close(g_fd);
  g_fd = -1;
  if (g_server <= 0) return;
  const pid_t server = g_server;
  g_server = 0;
  for (int i = 0; i < 1000; ++i) {  // it ends at once; a stopped one is killed after 1 s
    if (::waitpid(server, nullptr, WNOHANG) != 0) return;
    ::usleep(1000);
  }
  ::kill(server, SIGKILL);
  ::waitpid(server, nullptr, 0);
}

// The server is gone: later ranks are exec'd.
void lose_server() {
  ::close(g_fd);
  g_fd = -1;
  reap_after_server_death();
}

bool same_file(const char* a, const char* b) {
  struct stat sa {}, sb {};
  return ::stat(a, &sa) == 0 && ::stat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

}  // namespace

void start_fork_server(int argc, char** argv, RankEntry entry) {
  if (g_fd >= 0 || !entry) return;
  if (const char* off = std::getenv(kForkServerVar)) {
    const std::string v = off;
    if (v == "0" || v == "false" || v == "no" || v == "off") return;
  }
  g_title = child::title_area(argc, argv);
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, fds) != 0) return;
  g_entry = entry;
  const pid_t launcher = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    return;
  }
  if (pid == 0) {
    ::close(fds[0]);
    serve(fds[1], launcher);
  }
  ::close(fds[1]);
  g_server = pid;
  // At exit the server sees end of file and ends; reap it, rather than leave it to init.
  std::atexit(stop_server);
  // Ranks are the server's grandchildren: when their middle process exits they come to the
  // nearest subreaper ancestor, this process, which then reaps them like its own children.
  if (::prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) {
    ::close(fds[0]);
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    return;
  }
  g_fd = fds[0];
}

bool fork_server_can_start(const std::vector<std::string>& argv) {
  return g_fd >= 0 && !argv.empty() && same_file(argv[0].c_str(), "/proc/self/exe");
}

pid_t fork_server_spawn(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                        const std::filesystem::path& log) {
  std::string msg(2 * sizeof(uint32_t), '\0');
  const uint32_t counts[2] = {static_cast<uint32_t>(argv.size()), static_cast<uint32_t>(env.size())};
  std::memcpy(msg.data(), counts, sizeof counts);
  msg += log.string();
  msg.push_back('\0');
  for (const auto* list : {&argv, &env}) {
    for (const auto& s : *list) {
      msg += s;
      msg.push_back('\0');
    }
  }
  if (msg.size() > kMaxRequest) return -E2BIG;
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_fd < 0) return -ESRCH;
  if (::send(g_fd, msg.data(), msg.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(msg.size())) {
    const int err = errno;
    lose_server();
    return -(err ? err : EPIPE);
  }
  int64_t reply = 0;
  ssize_t n;
  do {
    n = ::recv(g_fd, &reply, sizeof reply, 0);
  } while (n < 0 && errno == EINTR);
  if (n != static_cast<ssize_t>(sizeof reply)) {
    lose_server();  // after it, no rank of this request runs: the caller may exec one
    return -EPIPE;
  }
  if (reply == -EDEADLK) lose_server();  // the server is not single-threaded: never fork it again
  if (reply > 0) g_ranks.push_back(static_cast<pid_t>(reply));
  return static_cast<pid_t>(reply);
}

void end_process(int status) {
  std::fflush(stdout);
  std::fflush(stderr);
  stop_server();
#ifdef MIH_COVERAGE
  __gcov_dump();
#endif
  std::_Exit(status);
}

int process_thread_count() {
  DIR* d = ::opendir("/proc/self/task");
  if (!d) return -1;
  int n = 0;
  while (dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
  ::closedir(d);
  return n;
}

}  // namespace mih
