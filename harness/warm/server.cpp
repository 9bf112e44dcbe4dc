// The warm server (warm.h): one thread, a poll loop over the listening socket, each running
// command's connection and pidfd. Each command is forked from the state exec left (nothing
// of mih's has run here but this loop) and made the process an exec would have made.
#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dirent.h>
#include <fstream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "harness/base/child_process.h"
#include "harness/warm/warm.h"
#include "harness/warm/warm_internal.h"

extern char** environ;

namespace mih::warm {
namespace {

using internal::Header;
using internal::Kind;
using internal::Reply;
using internal::ReplyKind;
using internal::Why;
using Clock = std::chrono::steady_clock;

// How long a command whose front died has after SIGTERM before SIGKILL.
constexpr auto kTermGrace = std::chrono::seconds(10);

// How long a front has to confirm a command the server started (its 'g'), else the command,
// which has not run yet, is killed: the front may have given up waiting and exec'd it.
constexpr auto kGoTimeout = std::chrono::seconds(30);

struct Job {
  pid_t pid = 0;
  int pidfd = -1;
  int conn = -1;   // the front's connection; -1 once it is gone
  int go_fd = -1;  // until the front confirms: the command waits for one byte here before it runs
  Clock::time_point go_by = Clock::time_point::max();
  Clock::time_point kill_at = Clock::time_point::max();
};

struct Server {
  std::string socket;
  ino_t socket_ino = 0;
  int listen_fd = -1;
  std::string identity;       // as a front of this server computes it (its socket's key)
  int self_proc = -1;         // /proc/self, to read the server's own account as the kernel gives it now
  internal::Fields self;      // that account when the server started (the identity less "core")
  std::vector<Job> jobs;
  long served = 0;
  bool stopping = false;
  Clock::time_point started = Clock::now(), last_activity = Clock::now();
  std::chrono::seconds idle{120};
  child::TitleArea title;  // main's argv text, rewritten as each command's title
  int blas_threads = 0;  // OpenBLAS's pool size when it loaded (0: no OpenBLAS)
  CommandEntry entry = nullptr;
};

Server* g_server = nullptr;
volatile sig_atomic_t g_stop = 0;

// The signals a forked command holds blocked until it has its handlers (release_held_signals).
constexpr uint64_t kHeldBits = (uint64_t{1} << (SIGINT - 1)) | (uint64_t{1} << (SIGTERM - 1));
// In a forked command: the caller's mask and which held signals it ignored, until released.
struct Held {
  bool active = false;
  uint64_t ignored = 0, blocked = 0;
};
Held g_held;

int thread_count() {
  DIR* d = ::opendir("/proc/self/task");
  if (!d) return -1;
  int n = 0;
  while (dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
  ::closedir(d);
  return n;
}

// A file this process maps was deleted or replaced since it was mapped (a rebuilt binary, an
// upgraded library): a command forked now would not run what an exec would.
bool stale() {
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    const auto path = line.find('/');
    if (path == std::string::npos || line.size() < 10 || line.compare(line.size() - 10, 10, " (deleted)") != 0) continue;
    if (line.compare(path, 7, "/memfd:") == 0 || line.compare(path, 5, "/dev/") == 0 ||
        line.compare(path, 5, "/SYSV") == 0) {
      continue;
    }
    return true;
  }
  return false;
}

void send_reply(int fd, ReplyKind kind, int64_t value, const std::string& text = "") {
  Reply r;
  r.kind = static_cast<uint32_t>(kind);
  r.value = value;
  const std::string why = text.substr(0, internal::kMaxWhyBytes);
  r.text_bytes = static_cast<uint32_t>(why.size());
  (void)internal::write_all(fd, &r, sizeof r);
  if (!why.empty()) (void)internal::write_all(fd, why.data(), why.size());
}

// The server's own account as the kernel gives it now differs from when it started (a cgroup
// move, a prlimit or renice from outside): fronts keyed by the old one would be refused.
bool changed_since_start(const Server& s) {
  internal::Fields now;
  std::string why;
  return !internal::read_process(s.self_proc, &now, nullptr, &why) || now != s.self;
}

// Why the process `pid` that sent `r` is not served ("" when it is): what the kernel reports of
// it (through /proc/<pid>, opened while `pidfd` pins the pid) must be the server's own account,
// its request's identity the server's, and its request's environment the one it has (then in
// *env). The pidfd is checked again once its fds arrive (see handle).
std::string examine_caller(const Server& s, pid_t pid, int pidfd, int pidfd_error, const internal::RunRequest& r,
                           std::vector<std::string>* env) {
  const std::string who = "the calling process (pid " + std::to_string(pid) + ")";
  if (pidfd < 0) {
    return "cannot pin " + who + " with a pidfd: " + std::strerror(pidfd_error) +
           " (warm start needs Linux 5.3 or later)";
  }
  const int proc = ::open(("/proc/" + std::to_string(pid)).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (proc < 0) return "cannot open /proc/" + std::to_string(pid) + ": " + std::strerror(errno);
  internal::Fields caller;
  std::string why;
  const bool read = internal::read_process(proc, &caller, env, &why);
  ::close(proc);
  if (!read) return "cannot examine " + who + ": " + why;
  if (!internal::pidfd_alive(pidfd)) return who + " is gone";
  if (const std::string d = internal::differing(caller, s.self); !d.empty()) {
    return "the kernel reports " + who + " other than the server in: " + d;
  }
  internal::Fields claimed, mine;
  if (!internal::parse(r.identity, &claimed) || !internal::parse(s.identity, &mine)) {
    return "its request's identity is malformed";
  }
  if (const std::string d = internal::differing(claimed, mine); !d.empty()) {
    return "its request's identity differs from the server's in: " + d;
  }
  if (r.env != *env) return "its request's environment is not the one the kernel reports for it";
  return "";
}

// OpenBLAS starts its thread pool when it loads; the server stops it (a fork copies threads
// as held locks, not as threads) and a command gets back the pool size it had at load, which
// OpenBLAS starts on the command's first BLAS call (as the fork server's ranks do).
void stop_blas_pool(Server& s) {
  auto* size = static_cast<int*>(::dlsym(RTLD_DEFAULT, "blas_num_threads"));
  using Shutdown = int (*)();
  auto shutdown = reinterpret_cast<Shutdown>(::dlsym(RTLD_DEFAULT, "blas_thread_shutdown_"));
  if (!size || !shutdown) return;
  s.blas_threads = *size;
  shutdown();
  for (int i = 0; i < 500 && thread_count() > 1; ++i) ::usleep(1000);
}

void restore_blas_pool(const Server& s) {
  if (s.blas_threads <= 0) return;
  if (auto* size = static_cast<int*>(::dlsym(RTLD_DEFAULT, "blas_num_threads"))) *size = s.blas_threads;
}

// In the forked command: becomes the process exec'ing the core binary with the request would
// have made, then runs the command. Never returns.
[[noreturn]] void become_command(Server& s, const internal::RunRequest& r, const std::vector<int>& fds,
                                 uint32_t fd_bits, pid_t server, int go_fd) {
  // Nothing runs until the front has confirmed it waits for this command (else it execs it).
  char go = 0;
  ssize_t got;
  do {
    got = ::read(go_fd, &go, 1);
  } while (got < 0 && errno == EINTR);
  if (got != 1 || go != 'g') ::_exit(0);
  // The front's request: its fds 0-2 (those it had open), then its cwd.
  const int cwd = fds.back();
  if (::fchdir(cwd) != 0) ::_exit(127);
  size_t next = 0;
  int mine[3] = {-1, -1, -1};
  for (int i = 0; i < 3; ++i) {
    if ((fd_bits >> i) & 1) mine[i] = fds[next++];
  }
  // Above 2 first, so that dup2 onto 0-2 cannot overwrite one not yet placed.
  for (int& fd : mine) {
    if (fd >= 0 && fd < 3) fd = ::fcntl(fd, F_DUPFD_CLOEXEC, 3);
  }
  for (int i = 0; i < 3; ++i) {
    if (mine[i] >= 0) {
      ::dup2(mine[i], i);
    } else {
      ::close(i);
    }
  }
  child::close_descriptors_from(3);
  ::setpgid(0, 0);
  // The server's death ends the command (nobody would learn how it ended); its front's death
  // the server sees, and ends it too.
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (::getppid() != server) ::_exit(16);
  // SIGINT and SIGTERM stay blocked, with their default action, until the command has
  // installed its handlers (release_held_signals): an interrupt forwarded meanwhile is kept
  // for them, not lost to SIG_IGN (which would discard it) nor taken by the default action.
  child::reset_signal_dispositions(r.ignored & ~kHeldBits);
  g_held = {true, r.ignored & kHeldBits, r.blocked};
  ::umask(static_cast<mode_t>(r.umask));
  const std::string exe = r.argv[0];
  child::set_name(exe.substr(exe.rfind('/') + 1));
  child::set_title(s.title, std::vector<std::string_view>(r.argv.begin(), r.argv.end()));
  restore_blas_pool(s);
  child::set_signal_mask(r.blocked | kHeldBits);
  // Owned by this process until it exits, as exec's copies would be.
  auto* args = new std::vector<std::string>(r.argv);
  auto* env = new std::vector<std::string>(r.env);
  auto* argv = new std::vector<char*>();
  auto* envp = new std::vector<char*>();
  for (auto& a : *args) argv->push_back(a.data());
  argv->push_back(nullptr);
  for (auto& e : *env) envp->push_back(e.data());
  envp->push_back(nullptr);
  environ = envp->data();
  std::exit(s.entry(static_cast<int>(args->size()), argv->data()));
}

std::string status_text(const Server& s) {
  const auto now = Clock::now();
  char line[512];
  std::snprintf(line, sizeof line, "pid %d served %ld running %zu idle_s %lld up_s %lld", static_cast<int>(::getpid()),
                s.served, s.jobs.size(),
                s.jobs.empty()
                    ? static_cast<long long>(std::chrono::duration_cast<std::chrono::seconds>(now - s.last_activity).count())
                    : 0LL,
                static_cast<long long>(std::chrono::duration_cast<std::chrono::seconds>(now - s.started).count()));
  char exe[4096] = {0};
  const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
  return std::string(line) + " core " + (n > 0 ? std::string(exe, static_cast<size_t>(n)) : "?") + "\n";
}

// Stops taking commands: the socket goes (if it is still this server's), running ones finish.
void stop_listening(Server& s) {
  if (s.listen_fd < 0) return;
  struct stat st {};
  if (::stat(s.socket.c_str(), &st) == 0 && st.st_ino == s.socket_ino) ::unlink(s.socket.c_str());
  ::close(s.listen_fd);
  s.listen_fd = -1;
  s.stopping = true;
}

struct FdCloser {
  int fd;
  ~FdCloser() { if (fd >= 0) ::close(fd); }
};

// An accepted connection and the fds its messages brought, closed when handle returns; a
// started command's job keeps the connection (release).
struct Connection {
  int fd;
  std::vector<int> fds;
  ~Connection() {
    close_fds();
    if (fd >= 0) ::close(fd);
  }
  void close_fds() {
    for (int f : fds) ::close(f);
    fds.clear();
  }
  int release() { return std::exchange(fd, -1); }
};

// The peer's credentials, its messages carrying their sender's from now on (the echo of
// kReady's nonce); false for another user's peer or one without a pid.
bool peer_of(int conn, ucred* peer) {
  socklen_t len = sizeof *peer;
  const int one = 1;
  return ::getsockopt(conn, SOL_SOCKET, SO_PEERCRED, peer, &len) == 0 && peer->uid == ::getuid() && peer->pid > 0 &&
         ::setsockopt(conn, SOL_SOCKET, SO_PASSCRED, &one, sizeof one) == 0;
}

// The request's header and payload (cleared when short); false when none came in time.
bool receive_request(Connection& c, Header* h, std::string* payload) {
  timeval timeout{5, 0};  // a front sends its request at once; a silent peer does not hold the loop
  ::setsockopt(c.fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  if (!internal::receive_header(c.fd, h, &c.fds) || h->magic != internal::kMagic || h->version != internal::kVersion ||
      h->payload_bytes >= (64u << 20)) {
    return false;
  }
  payload->resize(h->payload_bytes);
  if (!internal::read_all(c.fd, payload->data(), payload->size())) payload->clear();
  return true;
}

// A status or stop request, answered with the status line; false for any other kind.
bool answer_status(Server& s, int conn, const Header& h) {
  const bool stop = h.kind == static_cast<uint32_t>(Kind::kStop);
  if (!stop && h.kind != static_cast<uint32_t>(Kind::kStatus)) return false;
  const std::string text = status_text(s);
  if (stop) stop_listening(s);
  send_reply(conn, ReplyKind::kText, static_cast<int64_t>(text.size()));
  (void)internal::write_all(conn, text.data(), text.size());
  return true;
}

// Why a run request is refused before the caller's fds are asked for (an identity refusal's
// text in *text), or nullopt when it is served; the decoded request in *r.
std::optional<Why> refusal(Server& s, const Header& h, const Connection& c, const std::string& payload,
                           pid_t caller, int caller_pidfd, int pidfd_error, internal::RunRequest* r, std::string* text) {
  if (h.kind != static_cast<uint32_t>(Kind::kRun) || !c.fds.empty() || !internal::decode(payload, r)) {
    return Why::kBadRequest;
  }
  if (s.stopping) return Why::kStopping;
  if (stale() || changed_since_start(s)) {
    stop_listening(s);  // every later command would be refused too: the next front starts a fresh server
    return Why::kStale;
  }
  std::vector<std::string> caller_env;
  *text = examine_caller(s, caller, caller_pidfd, pidfd_error, *r, &caller_env);
  if (!text->empty()) return Why::kIdentity;
  if (thread_count() != 1) return Why::kBusy;
  return std::nullopt;
}

// The caller's fds 0-2 (those of h.fd_bits) and cwd, in the message that echoes the nonce.
bool receive_fds(Connection& c, const Header& h, uint64_t* echo, ucred* sender) {
  Header fd_message;
  const size_t expected_fds = static_cast<size_t>(__builtin_popcount(h.fd_bits & 7u)) + 1;
  return internal::receive_echo(c.fd, &fd_message, echo, &c.fds, sender) && fd_message.magic == internal::kMagic &&
         fd_message.kind == static_cast<uint32_t>(Kind::kFds) && c.fds.size() == expected_fds;
}

// Why the fds' message is not proven to come from the process examined ("" when it is): sent
// after kReady, it echoes the nonce, from the caller's pid, which the caller's pidfd, alive
// still, held since before /proc/<pid> was read: not a later process with that pid.
std::string unproven(const internal::Proof& proof, uint64_t echo, const ucred& sender, pid_t caller,
                     int caller_pidfd) {
  const std::string examined = "the process examined (pid " + std::to_string(caller) + ")";
  if (echo != proof.nonce) {
    return "its fds did not echo the nonce of this server's /proc/" + std::to_string(::getpid()) + "/fd/" +
           std::to_string(proof.fd) + " (only a process in this server's Landlock domain, or none, may read it)";
  }
  if (sender.pid != caller) return "its fds came from pid " + std::to_string(sender.pid) + ", not from " + examined;
  if (!internal::pidfd_alive(caller_pidfd)) return examined + " is gone";
  return "";
}

// Forks the command, which waits for its front's 'g' (confirm), and keeps it as a job.
void start_command(Server& s, Connection& c, const Header& h, const internal::RunRequest& r) {
  // Test hook (tests/cli/warm.py): stall after taking the fds and again after answering, as a
  // server stopped there would; the front gives up meanwhile, and only the 'g' gate stops the
  // command it forked from running.
  const char* stall = std::getenv("MIH_TEST_WARM_STALL");
  if (stall) ::sleep(static_cast<unsigned>(std::atoi(stall)));
  int go[2];
  if (::pipe2(go, O_CLOEXEC) != 0) {
    send_reply(c.fd, ReplyKind::kDiffers, static_cast<int64_t>(Why::kBusy));
    return;
  }
  const pid_t server = ::getpid();
  // The command is forked with every signal blocked: one its front forwards before the command
  // has its own dispositions waits (pending) instead of meeting the server's (SIGINT ignored,
  // SIGTERM this loop's), which would lose it.
  sigset_t all, before;
  sigfillset(&all);
  ::sigprocmask(SIG_SETMASK, &all, &before);
  const pid_t pid = ::fork();
  if (pid == 0) become_command(s, r, c.fds, h.fd_bits, server, go[0]);
  ::sigprocmask(SIG_SETMASK, &before, nullptr);
  c.close_fds();
  ::close(go[0]);
  if (pid < 0) {
    ::close(go[1]);
    send_reply(c.fd, ReplyKind::kDiffers, static_cast<int64_t>(Why::kBusy));
    return;
  }
  const int conn = c.release();
  s.jobs.push_back(Job{.pid = pid, .pidfd = internal::open_pidfd(pid), .conn = conn, .go_fd = go[1],
                       .go_by = Clock::now() + kGoTimeout});
  ++s.served;
  send_reply(conn, ReplyKind::kStarted, pid);
  if (stall) ::sleep(static_cast<unsigned>(std::atoi(stall)));
}

// One accepted connection: a run (forks the command), a status or a stop request.
void handle(Server& s, int conn) {
  Connection c{conn, {}};
  ucred peer{};
  if (!peer_of(conn, &peer)) return;
  // The caller's pid is pinned from now on: a process that reuses it later is not the caller
  // (see examine_caller and unproven).
  const int caller_pidfd = internal::open_pidfd(peer.pid);
  const int pidfd_error = errno;
  const FdCloser closer{caller_pidfd};
  Header h;
  std::string payload;
  if (!receive_request(c, &h, &payload) || answer_status(s, conn, h)) return;
  internal::RunRequest r;
  std::string text;
  if (const auto why = refusal(s, h, c, payload, peer.pid, caller_pidfd, pidfd_error, &r, &text)) {
    send_reply(conn, ReplyKind::kDiffers, static_cast<int64_t>(*why), text);
    return;
  }
  // Only a front that heard this server is ready sends its fds 0-2 and cwd: a stopped server
  // never holds a caller's pipes open (a front that gave up exec'd its command meanwhile). It
  // echoes the nonce it read through this server's /proc/<pid>/fd: it may examine this server
  // as this server examined it, so neither is in a Landlock domain the other is not in.
  internal::Proof proof;
  const bool proof_made = internal::make_proof(&proof);
  const FdCloser proof_closer{proof.fd};
  if (!proof_made) {
    send_reply(conn, ReplyKind::kDiffers, static_cast<int64_t>(Why::kBusy));
    return;
  }
  send_reply(conn, ReplyKind::kReady, proof.fd);
  uint64_t echo = 0;
  ucred sender{};
  if (!receive_fds(c, h, &echo, &sender)) return;
  if (const std::string why = unproven(proof, echo, sender, peer.pid, caller_pidfd); !why.empty()) {
    send_reply(conn, ReplyKind::kDiffers, static_cast<int64_t>(Why::kIdentity), why);
    return;
  }
  start_command(s, c, h, r);
}

// The front confirms the command (one 'g') or has gone: the command runs, or dies unstarted.
void confirm(Job& job, bool readable) {
  char g = 0;
  ssize_t n = 0;
  if (readable) {
    do {
      n = ::recv(job.conn, &g, 1, MSG_DONTWAIT);
    } while (n < 0 && errno == EINTR);
  }
  if (n == 1 && g == 'g') {
    (void)!::write(job.go_fd, "g", 1);
  } else if (readable || Clock::now() >= job.go_by) {
    ::kill(job.pid, SIGKILL);  // it has run nothing of the command
    ::close(job.conn);
    job.conn = -1;
  } else {
    return;
  }
  ::close(job.go_fd);
  job.go_fd = -1;
}

// A command ended: its front learns how (then ends the same way).
void reap(Job& job) {
  int status = 0;
  pid_t r;
  do {
    r = ::waitpid(job.pid, &status, WNOHANG);
  } while (r < 0 && errno == EINTR);
  if (r == 0) return;
  if (job.conn >= 0) {
    send_reply(job.conn, ReplyKind::kExited, status);
    ::close(job.conn);
  }
  if (job.pidfd >= 0) ::close(job.pidfd);
  if (job.go_fd >= 0) ::close(job.go_fd);
  job.pid = 0;
}

void on_term(int) { g_stop = 1; }

int serve(Server& s) {
  for (;;) {
    if (g_stop) stop_listening(s);
    s.jobs.erase(std::remove_if(s.jobs.begin(), s.jobs.end(), [](const Job& j) { return j.pid == 0; }), s.jobs.end());
    const auto now = Clock::now();
    if (!s.jobs.empty()) s.last_activity = now;
    if (s.jobs.empty() && (s.stopping || now - s.last_activity >= s.idle)) {
      stop_listening(s);
      return 0;
    }
    // [listening socket], then per job its pidfd and its front's connection (hang-up only).
    std::vector<pollfd> fds;
    const size_t first_job = s.listen_fd >= 0 ? 1 : 0;
    if (s.listen_fd >= 0) fds.push_back({s.listen_fd, POLLIN, 0});
    for (const Job& j : s.jobs) {
      fds.push_back({j.pidfd, POLLIN, 0});
      fds.push_back({j.conn, static_cast<short>(j.go_fd >= 0 ? POLLIN : 0), 0});  // the 'g', or a hang-up
    }
    auto wait = s.idle - (now - s.last_activity);
    for (const Job& j : s.jobs) {
      if (j.kill_at != Clock::time_point::max()) wait = std::min<Clock::duration>(wait, j.kill_at - now);
      if (j.go_fd >= 0) wait = std::min<Clock::duration>(wait, j.go_by - now);
    }
    if (!s.jobs.empty() && wait > std::chrono::seconds(1)) wait = std::chrono::seconds(1);  // kernels without pidfds
    const int ms = static_cast<int>(
        std::max<int64_t>(1, std::chrono::duration_cast<std::chrono::milliseconds>(wait).count()));
    const int n = ::poll(fds.data(), fds.size(), ms);
    if (n < 0 && errno != EINTR) return 17;
    const size_t polled = s.jobs.size();
    for (size_t i = 0; i < polled; ++i) {
      Job& job = s.jobs[i];
      const short conn_events = n > 0 ? fds[first_job + 2 * i + 1].revents : 0;
      if (job.go_fd >= 0 && job.conn >= 0) confirm(job, (conn_events & (POLLIN | POLLHUP | POLLERR)) != 0);
      reap(job);  // also without a pidfd event: cheap, and covers kernels without pidfds
      if (job.pid == 0) continue;
      if (job.conn >= 0 && job.go_fd < 0 && (conn_events & (POLLHUP | POLLERR))) {
        ::close(job.conn);
        job.conn = -1;
        ::kill(job.pid, SIGTERM);
        job.kill_at = Clock::now() + kTermGrace;
      }
      if (job.kill_at <= Clock::now()) {
        ::kill(job.pid, SIGKILL);
        job.kill_at = Clock::time_point::max();
      }
    }
    if (first_job == 1 && n > 0 && (fds[0].revents & POLLIN) && s.listen_fd >= 0) {
      const int conn = ::accept4(s.listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
      if (conn >= 0) {
        s.last_activity = Clock::now();
        handle(s, conn);
      }
    }
  }
}

}  // namespace

void release_held_signals() {
  if (const char* held = std::getenv(kHeldVar)) {  // exec'd by the front with them held
    const uint64_t caller_blocked = std::strtoull(held, nullptr, 10) & kHeldBits;
    ::unsetenv(kHeldVar);  // the command's own children start from their own masks
    sigset_t release;
    ::sigemptyset(&release);
    for (int sig : {SIGINT, SIGTERM}) {
      if (!((caller_blocked >> (sig - 1)) & 1)) ::sigaddset(&release, sig);
    }
    ::sigprocmask(SIG_UNBLOCK, &release, nullptr);
  }
  if (!g_held.active) return;
  g_held.active = false;
  for (int sig : {SIGINT, SIGTERM}) {
    struct sigaction now {};
    // One the command does not catch gets the caller's disposition, as exec would have kept
    // it (SIG_IGN discards one that came meanwhile, as exec'd it would have been discarded).
    if (((g_held.ignored >> (sig - 1)) & 1) && ::sigaction(sig, nullptr, &now) == 0 && now.sa_handler == SIG_DFL) {
      ::signal(sig, SIG_IGN);
    }
  }
  child::set_signal_mask(g_held.blocked);
}

bool serve_if_asked(int argc, char** argv, CommandEntry entry, int* status) {
  if (argc < 4 || std::strcmp(argv[1], kServeArg) != 0) return false;
  *status = 0;
  Server s;
  g_server = &s;
  s.entry = entry;
  s.socket = argv[2];
  const int ready = std::atoi(argv[3]);
  s.title = child::title_area(argc, argv);
  char exe[4096] = {0};
  const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
  // The identity as the front computes it, for the core binary by its path.
  s.identity = identity(n > 0 ? std::string(exe, static_cast<size_t>(n)) : std::string(argv[0]));
  s.self_proc = ::open("/proc/self", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (!internal::parse(s.identity, &s.self) || s.self.empty() || s.self_proc < 0) {
    *status = 12;
    return true;  // the front sees the ready pipe close and execs
  }
  s.self.erase(s.self.begin());  // "core": the binary, not the process
  if (const char* idle = std::getenv(kIdleVar)) {
    const long v = std::atol(idle);
    if (v > 0 && v <= 86400) s.idle = std::chrono::seconds(v);
  }
  ::signal(SIGPIPE, SIG_IGN);
  ::signal(SIGINT, SIG_IGN);
  ::signal(SIGHUP, SIG_IGN);
  struct sigaction term {};
  term.sa_handler = on_term;
  ::sigaction(SIGTERM, &term, nullptr);
  child::set_name("mih-warm");
  child::set_title(s.title, {argv[0], kServeArg, s.socket});  // the front's padding, left for the commands' titles
  stop_blas_pool(s);

  s.listen_fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (s.listen_fd < 0 || s.socket.size() >= sizeof addr.sun_path) return true;
  std::memcpy(addr.sun_path, s.socket.c_str(), s.socket.size() + 1);
  const mode_t old = ::umask(077);
  const int bound = ::bind(s.listen_fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  ::umask(old);
  struct stat st {};
  if (bound != 0 || ::listen(s.listen_fd, 64) != 0 || ::stat(s.socket.c_str(), &st) != 0) {
    *status = 12;
    return true;  // the front sees the ready pipe close and execs
  }
  s.socket_ino = st.st_ino;
  (void)!::write(ready, "1", 1);
  ::close(ready);
  *status = serve(s);
  return true;
}

}  // namespace mih::warm
