// The warm front (warm.h): finds or starts the server of this process's identity, hands it the
// command with fds 0-2 and the cwd, forwards signals to the command and ends as it ended;
// execs the core binary whenever the warm path is not certain.
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

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

// The command's pid once the server said it started, for the signal handlers; signals that
// arrive before are kept in g_pending and sent then.
std::atomic<pid_t> g_command{0};
std::atomic<uint64_t> g_pending{0};

// How long a server has to answer (that it started the command; how it ended, once it is
// gone): warm.h's kTimeoutVar, default 30 s.
int answer_seconds() {
  const char* v = std::getenv(kTimeoutVar);
  const long s = v ? std::atol(v) : 0;
  return s > 0 && s <= 3600 ? static_cast<int>(s) : 30;
}

// Signals a user or a supervisor sends to end or poke a command; forwarded as they come.
constexpr int kForwarded[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGALRM, SIGWINCH, SIGCONT};

void forward(int sig) {
  const pid_t pid = g_command.load();
  if (pid > 0) {
    ::kill(pid, sig);
  } else {
    g_pending.fetch_or(uint64_t{1} << (sig - 1));
  }
}

// Ctrl-Z: the command stops, then the front (with the default action, once this returns).
// Before a command exists the front stops alone: nothing is kept to send later (the user's
// `fg` resumed it; a kept SIGTSTP would stop the command again).
void on_tstp(int) {
  const int saved = errno;
  if (const pid_t pid = g_command.load(); pid > 0) ::kill(pid, SIGTSTP);
  ::signal(SIGTSTP, SIG_DFL);
  ::raise(SIGTSTP);
  errno = saved;
}

void on_forwarded(int sig) {
  const int saved = errno;
  if (sig == SIGCONT) {
    struct sigaction sa {};
    sa.sa_handler = on_tstp;
    ::sigaction(SIGTSTP, &sa, nullptr);
  }
  forward(sig);
  errno = saved;
}

void give_back_signals();

// Execs the core binary with the caller's signal dispositions. SIGINT and SIGTERM cross the
// exec blocked (kHeldVar), one the front caught kept pending: the core delivers it to its own
// handlers (release_held_signals), so an interrupt at any moment ends `mih test` with 130, as
// warm. Another signal the front caught takes its action first.
[[noreturn]] void exec_core(const std::string& core, int argc, char** argv) {
  sigset_t held, caller;
  ::sigemptyset(&held);
  ::sigaddset(&held, SIGINT);
  ::sigaddset(&held, SIGTERM);
  ::sigprocmask(SIG_BLOCK, &held, &caller);
  uint64_t caller_blocked = 0;
  for (int sig : {SIGINT, SIGTERM}) {
    if (::sigismember(&caller, sig) == 1) caller_blocked |= uint64_t{1} << (sig - 1);
  }
  ::setenv(kHeldVar, std::to_string(caller_blocked).c_str(), 1);
  give_back_signals();  // a blocked SIGINT or SIGTERM raised here stays pending, even if ignored
  std::vector<char*> args;
  args.push_back(const_cast<char*>(core.c_str()));
  for (int i = 1; i < argc; ++i) args.push_back(argv[i]);
  args.push_back(nullptr);
  ::execv(core.c_str(), args.data());
  ::unsetenv(kHeldVar);
  ::sigprocmask(SIG_SETMASK, &caller, nullptr);
  std::fprintf(stderr, "mih: cannot run the mih core binary '%s': %s (reinstall mih, or rebuild it)\n", core.c_str(),
               std::strerror(errno));
  std::exit(12);
}

// Which of fds 0-2 this process has open (bits 0-2).
uint32_t open_stdio_bits() {
  uint32_t bits = 0;
  for (int i = 0; i < 3; ++i) {
    if (::fcntl(i, F_GETFD) >= 0) bits |= 1u << i;
  }
  return bits;
}

// The pid of the process at the other end of a unix socket (0 if unknown).
pid_t peer_pid(int fd) {
  ucred peer{};
  socklen_t len = sizeof peer;
  return ::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &len) == 0 ? peer.pid : 0;
}

int connect_to(const std::string& path) {
  sockaddr_un addr{};
  if (path.size() >= sizeof addr.sun_path) return -1;
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  int r;
  do {
    r = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  } while (r < 0 && errno == EINTR);
  if (r != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Starts a server for `socket` (exec'd from `core` with this process's environment, in a
// session of its own, stdio /dev/null, cwd /) and waits until it listens or has died.
bool start_server(const std::string& core, const std::string& socket) {
  int ready[2];
  if (::pipe2(ready, O_CLOEXEC) != 0) return false;
  const pid_t middle = ::fork();
  if (middle < 0) {
    ::close(ready[0]);
    ::close(ready[1]);
    return false;
  }
  if (middle == 0) {
    ::setsid();
    if (::fork() != 0) ::_exit(0);  // the server is nobody's child here: init reaps it
    const int null_fd = ::open("/dev/null", O_RDWR);
    for (int fd = 0; fd < 3; ++fd) ::dup2(null_fd, fd);
    if (::chdir("/") != 0) ::_exit(127);
    ::dup2(ready[1], 3);  // dup2 clears close-on-exec
    for (int fd = 4; fd < 1024; ++fd) ::close(fd);
    // Room in argv for each command's title (the server writes it there for `ps`).
    std::string pad(1024, ' ');
    char* args[] = {const_cast<char*>(core.c_str()), const_cast<char*>(kServeArg), const_cast<char*>(socket.c_str()),
                    const_cast<char*>("3"), pad.data(), nullptr};
    ::execv(core.c_str(), args);
    ::_exit(127);
  }
  ::close(ready[1]);
  while (::waitpid(middle, nullptr, 0) < 0 && errno == EINTR) {
  }
  // The server writes one byte once it listens (end of file if it died); one that takes longer
  // than loading libtorch ever should is left to itself, and this command exec'd.
  char byte = 0;
  ssize_t n = -1;
  pollfd p{ready[0], POLLIN, 0};
  int r;
  do {
    r = ::poll(&p, 1, 60 * 1000);
  } while (r < 0 && errno == EINTR);
  if (r > 0) {
    do {
      n = ::read(ready[0], &byte, 1);
    } while (n < 0 && errno == EINTR);
  }
  ::close(ready[0]);
  return n == 1;
}

// Removes the socket of the server of `identity` (one that stopped answering: its connections
// still queue, so no front would start another), so that a later front starts a fresh server.
void retire_socket(const std::string& identity) {
  std::string why;
  const std::string dir = internal::socket_dir(&why);
  if (!dir.empty()) ::unlink((dir + "/" + internal::key_of(identity) + ".sock").c_str());
}

// A connection to the server of `identity`, started when there is none; -1 when warm start
// cannot be used (then the caller execs).
int server_connection(const std::string& core, const std::string& identity, bool restart) {
  std::string why;
  const std::string dir = internal::socket_dir(&why);
  if (dir.empty()) {
    std::fprintf(stderr, "mih: warm start off: %s\n", why.c_str());
    return -1;
  }
  const std::string base = dir + "/" + internal::key_of(identity);
  const std::string socket = base + ".sock";
  if (!restart) {
    if (const int fd = connect_to(socket); fd >= 0) return fd;
  }
  // One front starts a server at a time (one lock file for the directory); the others wait on
  // the lock and then connect to it.
  const int lock = ::open((dir + "/.start.lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (lock < 0) return -1;
  while (::flock(lock, LOCK_EX) != 0 && errno == EINTR) {
  }
  int fd = restart ? -1 : connect_to(socket);
  if (fd < 0) {
    ::unlink(socket.c_str());  // a dead server's, or a stale one's that would refuse
    if (start_server(core, socket)) fd = connect_to(socket);
  }
  ::close(lock);
  return fd;
}

// What this process had when it started, before the front changed anything: which of fds 0-2
// were open (the closed ones are then held by /dev/null, close-on-exec, so that no socket of the
// front's takes their place), its umask, blocked and ignored signals, and each forwarded
// signal's disposition (restored before an exec).
struct Caller {
  uint32_t stdio_bits = 0;
  uint32_t umask = 022;
  uint64_t blocked = 0, ignored = 0;
  struct sigaction forwarded[sizeof kForwarded / sizeof kForwarded[0]] = {};
  struct sigaction tstp {};
};
Caller g_caller;

bool g_captured = false;

// Once, from take_signals (which checks g_captured).
void capture_caller() {
  g_captured = true;
  g_caller.stdio_bits = open_stdio_bits();
  for (int i = 0; i < 3; ++i) {
    if (!((g_caller.stdio_bits >> i) & 1)) (void)::open("/dev/null", O_RDWR | O_CLOEXEC);  // takes slot i
  }
  const mode_t mask = ::umask(0);
  ::umask(mask);
  g_caller.umask = mask;
  sigset_t blocked;
  ::sigprocmask(SIG_SETMASK, nullptr, &blocked);
  for (int sig = 1; sig <= 64 && sig < NSIG; ++sig) {
    if (sigismember(&blocked, sig) == 1) g_caller.blocked |= uint64_t{1} << (sig - 1);
    struct sigaction sa {};
    if (::sigaction(sig, nullptr, &sa) == 0 && sa.sa_handler == SIG_IGN) g_caller.ignored |= uint64_t{1} << (sig - 1);
  }
  for (size_t i = 0; i < sizeof kForwarded / sizeof kForwarded[0]; ++i) {
    ::sigaction(kForwarded[i], nullptr, &g_caller.forwarded[i]);
  }
  ::sigaction(SIGTSTP, nullptr, &g_caller.tstp);
}

// The caller's state captured, then the forwarding handlers in: a signal from now on reaches
// the command (kept in g_pending until it exists), whose own dispositions, the caller's ignored
// ones included, decide what it does, as when exec'd.
void take_signals() {
  if (g_captured) return;
  capture_caller();
  struct sigaction sa {};
  sa.sa_handler = on_forwarded;
  for (int sig : kForwarded) ::sigaction(sig, &sa, nullptr);
  struct sigaction tstp {};
  tstp.sa_handler = on_tstp;
  ::sigaction(SIGTSTP, &tstp, nullptr);
}

// Where the front runs no command of its own (an exec, `mih warm`, an early error): the
// caller's dispositions back, then each signal that came meanwhile takes its action (Ctrl-C
// before the start ends the front here, with SIGINT, as it would have ended the command).
void give_back_signals() {
  if (!g_captured) return;
  for (size_t i = 0; i < sizeof kForwarded / sizeof kForwarded[0]; ++i) {
    ::sigaction(kForwarded[i], &g_caller.forwarded[i], nullptr);
  }
  ::sigaction(SIGTSTP, &g_caller.tstp, nullptr);
  const uint64_t pending = g_pending.exchange(0);
  for (int sig = 1; sig <= 64; ++sig) {
    if ((pending >> (sig - 1)) & 1) ::raise(sig);
  }
}

// Sends the run request (the fds go only once the server said it is ready: send_fds).
bool send_run(int fd, const std::string& core, const std::string& identity, int argc, char** argv) {
  internal::RunRequest r;
  r.identity = identity;
  r.umask = g_caller.umask;
  r.blocked = g_caller.blocked;
  r.ignored = g_caller.ignored;
  r.argv.emplace_back(core);  // as exec'ing the core binary would
  for (int i = 1; i < argc; ++i) r.argv.emplace_back(argv[i]);
  for (char** e = environ; e && *e; ++e) r.env.emplace_back(*e);
  Header h;
  h.kind = static_cast<uint32_t>(Kind::kRun);
  h.fd_bits = g_caller.stdio_bits;
  const std::string payload = internal::encode(r);
  h.payload_bytes = payload.size();
  return internal::send_request(fd, h, {}, payload);
}

// Sends the caller's open fds of 0-2 and its cwd, with the nonce of the server's proof, in one
// message: it proves that this process, the one the server examined, is the one that sends them,
// and that it may examine the server (internal::Proof).
bool send_fds(int fd, uint64_t nonce) {
  Header h;
  h.kind = static_cast<uint32_t>(Kind::kFds);
  h.fd_bits = g_caller.stdio_bits;
  const std::string echo(reinterpret_cast<const char*>(&nonce), sizeof nonce);
  h.payload_bytes = echo.size();
  std::vector<int> fds;
  for (int i = 0; i < 3; ++i) {
    if ((h.fd_bits >> i) & 1) fds.push_back(i);
  }
  const int cwd = ::open(".", O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (cwd < 0) return false;
  fds.push_back(cwd);
  const bool ok = internal::send_request(fd, h, fds, echo);
  ::close(cwd);
  return ok;
}

// Said when a server does not serve this process (it would otherwise cost every command an exec
// without a word), with the reason; the command runs exec'd.
void say_not_served(int fd, const std::string& why) {
  std::fprintf(stderr, "mih: the warm server (pid %d) does not serve this process: %s; running the command without "
               "it (%s=0 skips warm start)\n", static_cast<int>(peer_pid(fd)), why.c_str(), kWarmVar);
}

// A server refused this process as a caller of another identity: said, with its reason.
void say_refused(int fd, const Reply& reply) {
  if (reply.kind != static_cast<uint32_t>(ReplyKind::kDiffers) || reply.value != static_cast<int64_t>(Why::kIdentity)) {
    return;
  }
  std::string why(std::min(reply.text_bytes, internal::kMaxWhyBytes), '\0');
  if (why.empty() || !internal::read_all(fd, why.data(), why.size())) why = "no reason given";
  for (char& c : why) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
  }
  say_not_served(fd, why);
}

// The command ran in `fd`'s server and is gone; ends this process the way it ended.
[[noreturn]] void end_as(int status) {
  if (WIFEXITED(status)) std::exit(WEXITSTATUS(status));
  const int sig = WIFSIGNALED(status) ? WTERMSIG(status) : SIGKILL;
  ::signal(sig, SIG_DFL);
  sigset_t one;
  sigemptyset(&one);
  sigaddset(&one, sig);
  ::sigprocmask(SIG_UNBLOCK, &one, nullptr);
  ::raise(sig);
  std::exit(128 + sig);
}

// The exit status (12: no core, 2: bad settings) of a front that cannot run the command, said,
// with the signals given back; 0 when it can.
int setup_error(const std::string& core) {
  if (::access(core.c_str(), X_OK) != 0) {
    give_back_signals();
    std::fprintf(stderr, "mih: the mih core binary '%s' is missing or not executable: %s (reinstall mih, or rebuild "
                 "it)\n", core.c_str(), std::strerror(errno));
    return 12;
  }
  if (const std::string bad = internal::bad_settings(); !bad.empty()) {
    give_back_signals();
    std::fprintf(stderr, "mih: %s\n", bad.c_str());
    return 2;
  }
  return 0;
}

// The identity a warm server for this process is kept under; execs the command instead where
// warm start does not serve it.
std::string warm_identity(const std::string& core, int argc, char** argv) {
  const std::string command = argc > 1 ? argv[1] : "";
  // A worker is the process its launcher (torchrun, srun, mpirun) started and watches: never forked elsewhere.
  if (command == "worker" || internal::switched_off(kWarmVar)) exec_core(core, argc, argv);
  // A server pins its caller with a pidfd (Linux 5.3+); without one it would refuse every caller.
  if (const int self = internal::open_pidfd(::getpid()); self >= 0) {
    ::close(self);
  } else {
    exec_core(core, argc, argv);
  }
  const std::string id = identity(core);
  if (id.empty()) exec_core(core, argc, argv);
  return id;
}

// What one request to a server came to: the command started (and is this front's), a fresh
// server may take it (this one was stale or stopping), or it runs exec'd.
enum class Attempt { kStarted, kRetry, kExec };

// Asks the server on `fd` to run the command (its answers in *reply); says why where the
// caller should know.
Attempt request_run(int fd, const std::string& core, const std::string& id, int argc, char** argv, Reply* reply) {
  // A server that does not answer in time (stopped, stuck) is given up: the command is
  // exec'd, and the server, never confirmed, kills the copy it may start later.
  timeval limit{answer_seconds(), 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
  bool sent = send_run(fd, core, id, argc, argv) && internal::read_all(fd, reply, sizeof *reply);
  if (sent && reply->kind == static_cast<uint32_t>(ReplyKind::kReady)) {
    uint64_t nonce = 0;
    std::string why;
    if (!internal::read_proof(peer_pid(fd), reply->value, &nonce, &why)) {
      say_not_served(fd, why);  // confined apart from the server: exec'd, confined as the caller is
      return Attempt::kExec;
    }
    sent = send_fds(fd, nonce) && internal::read_all(fd, reply, sizeof *reply);
  }
  if (!sent) {
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      // Said, and its socket taken away, so that the next command starts a fresh server.
      std::fprintf(stderr, "mih: the warm server (pid %d) did not answer within %d s (%s; stopped or stuck?): "
                   "running this command without it; the next one starts a fresh server\n",
                   static_cast<int>(peer_pid(fd)), answer_seconds(), kTimeoutVar);
      retire_socket(id);
    }
    return Attempt::kExec;
  }
  say_refused(fd, *reply);
  if (reply->kind == static_cast<uint32_t>(ReplyKind::kStarted)) {
    timeval forever{0, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &forever, sizeof forever);
    return internal::write_all(fd, "g", 1) ? Attempt::kStarted : Attempt::kExec;
  }
  const bool retry = reply->kind == static_cast<uint32_t>(ReplyKind::kDiffers) &&
                     (reply->value == static_cast<int64_t>(Why::kStale) ||
                      reply->value == static_cast<int64_t>(Why::kStopping));
  return retry ? Attempt::kRetry : Attempt::kExec;
}

// The connection to the server that started the command (kStarted in *reply), or -1 when none
// did: this server, or a fresh one where it was stale or stopping.
int start_in_server(const std::string& core, const std::string& id, int argc, char** argv, Reply* reply) {
  for (int attempt = 0; attempt < 2; ++attempt) {
    const int fd = server_connection(core, id, attempt > 0);
    if (fd < 0) return -1;
    const Attempt outcome = request_run(fd, core, id, argc, argv, reply);
    if (outcome == Attempt::kStarted) return fd;
    ::close(fd);
    if (outcome == Attempt::kExec) return -1;
  }
  return -1;
}

// Waits for the command `pid` the server on `fd` runs, and ends as it ended; 16 when its
// server dies or stops answering first. The server answers once more, when the command is
// gone. Should the server die first, the command (whose parent it was) is sent SIGTERM by its
// death signal, and this front waits for it to end (its interrupted run recorded) before it
// ends; should the server stop answering, the command's own end is seen here. Either way the
// command's status is lost.
int wait_for_command(int fd, pid_t pid) {
  const pid_t server = peer_pid(fd);
  const int pidfd = internal::open_pidfd(pid);
  bool command_gone = false, server_gone = false;
  Reply reply;
  for (;;) {
    pollfd p[2] = {{server_gone ? -1 : fd, POLLIN, 0}, {command_gone ? -1 : pidfd, POLLIN, 0}};
    const int wait_ms = command_gone ? answer_seconds() * 1000 : server_gone ? 30 * 1000 : -1;
    const int n = ::poll(p, pidfd >= 0 ? 2 : 1, wait_ms);
    if (n < 0 && errno == EINTR) continue;
    if (n > 0 && !server_gone && (p[0].revents & (POLLIN | POLLHUP | POLLERR))) {
      if (internal::read_all(fd, &reply, sizeof reply) && reply.kind == static_cast<uint32_t>(ReplyKind::kExited)) {
        end_as(static_cast<int>(reply.value));
      }
      server_gone = true;
      if (pidfd < 0 || command_gone) break;
      continue;
    }
    if (n > 0 && (p[1].revents & POLLIN)) {
      command_gone = true;  // its server has this long to say how it ended
      if (server_gone) break;
      continue;
    }
    break;  // a wait above ran out
  }
  std::fprintf(stderr, "mih: the warm server (pid %d) running this command (pid %d) %s; the command's outcome is "
               "unknown: rerun it, or run it with %s=0\n", static_cast<int>(server), static_cast<int>(pid),
               server_gone ? "died" : "stopped answering", kWarmVar);
  return 16;
}

}  // namespace

std::string core_beside(const std::string& front) {
  const auto slash = front.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : front.substr(0, slash);
  return dir + "/../libexec/mih/mih-core";
}

void catch_signals() { take_signals(); }

int front_main(int argc, char** argv, const std::string& core) {
  take_signals();  // first (issue 52): no signal meets the default action while the front decides
  if (const int status = setup_error(core); status != 0) return status;
  if (argc > 1 && std::string(argv[1]) == "warm") {
    give_back_signals();
    return warm_command(std::vector<std::string>(argv + 2, argv + argc));
  }
  const std::string id = warm_identity(core, argc, argv);
  Reply reply;
  const int fd = start_in_server(core, id, argc, argv, &reply);
  // Nothing was started: the command runs exec'd, with the signals as they were (exec_core).
  if (fd < 0) exec_core(core, argc, argv);
  const auto pid = static_cast<pid_t>(reply.value);
  g_command.store(pid);
  const uint64_t pending = g_pending.exchange(0);
  for (int sig = 1; sig <= 64; ++sig) {
    if ((pending >> (sig - 1)) & 1) ::kill(pid, sig);
  }
  return wait_for_command(fd, pid);
}

int warm_command(const std::vector<std::string>& args) {
  const std::string what = args.empty() ? "status" : args[0];
  if (args.size() > 1 || (what != "status" && what != "stop")) {
    std::fprintf(stderr, "mih warm: expected 'status' or 'stop', got '%s'\nUsage: mih warm [status|stop]\n",
                 what.c_str());
    return 2;
  }
  std::string why;
  const std::string dir = internal::socket_dir(&why);
  if (dir.empty()) {
    std::fprintf(stderr, "mih warm: %s\n", why.c_str());
    return 12;
  }
  std::vector<std::string> sockets;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name.size() > 5 && name.compare(name.size() - 5, 5, ".sock") == 0) sockets.push_back(dir + "/" + name);
    }
    ::closedir(d);
  }
  std::sort(sockets.begin(), sockets.end());
  int listed = 0;
  for (const auto& socket : sockets) {
    const int fd = connect_to(socket);
    if (fd < 0) {
      ::unlink(socket.c_str());  // its server is gone
      continue;
    }
    timeval limit{5, 0};  // a stopped server is skipped, not waited for
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
    Header h;
    h.kind = static_cast<uint32_t>(what == "stop" ? Kind::kStop : Kind::kStatus);
    Reply reply;
    std::string text;
    if (internal::send_request(fd, h, {}, "") && internal::read_all(fd, &reply, sizeof reply) &&
        reply.kind == static_cast<uint32_t>(ReplyKind::kText) && reply.value >= 0 && reply.value < (1 << 20)) {
      text.resize(static_cast<size_t>(reply.value));
      if (!internal::read_all(fd, text.data(), text.size())) text.clear();
    }
    ::close(fd);
    if (text.empty()) continue;
    std::printf("%s%s %s", what == "stop" ? "stopping " : "", socket.c_str(), text.c_str());
    ++listed;
  }
  if (listed == 0) std::printf("no warm server in %s\n", dir.c_str());
  return 0;
}

}  // namespace mih::warm
