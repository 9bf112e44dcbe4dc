// launch(): spawn, supervise, stop and reap the rank processes, then build the report from
// exit statuses, the ranks' error files, comm ledgers and logs.
#include "harness/runtime/launcher.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "harness/base/files.h"
#include "harness/compat/store.h"
#include "harness/runtime/comm_ledger.h"
#include "harness/runtime/rendezvous.h"

namespace mih {
namespace {

using Clock = std::chrono::steady_clock;

struct Child {
  int rank = -1;
  pid_t pid = 0;
  int pidfd = -1;
  bool running = true;
  bool stopped = false;  // the launcher sent it SIGTERM/SIGKILL
  int status = 0;
  int reap_order = -1;
  Clock::time_point start, end;
  std::filesystem::path log;
};

std::string signal_name(int sig) {
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 32))
  if (const char* abbrev = ::sigabbrev_np(sig)) return std::string("SIG") + abbrev;
#endif
  return "signal " + std::to_string(sig);
}

int open_pidfd(pid_t pid) {
#ifdef SYS_pidfd_open
  return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
#else
  (void)pid;
  return -1;
#endif
}

// A free TCP port for MASTER_PORT in file-rendezvous mode, where it is informational only.
int pick_free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 29500;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = 29500;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  ::close(fd);
  return port;
}

// An exclusive lock on the run directory for the launch: two launches writing one directory
// would share a FileStore and interleave their ledgers. Released when the fd closes.
class RunDirLock {
 public:
  explicit RunDirLock(const std::filesystem::path& dir) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    MIH_CHECK_CODE(!ec, Code::kFailedPrecondition, "cannot create the run directory '", dir.string(), "': ",
                   ec.message(), "; choose a writable run/evidence directory");
    auto path = dir / ".lock";
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    MIH_CHECK_CODE(fd_ >= 0, Code::kFailedPrecondition, "cannot create '", path.string(), "': ", std::strerror(errno),
                   "; choose a writable run/evidence directory");
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      char owner[32] = {0};
      ssize_t n = ::pread(fd_, owner, sizeof(owner) - 1, 0);
      ::close(fd_);
      MIH_THROW(Code::kFailedPrecondition, "run directory '", dir.string(), "' is in use by another launch (pid ",
                n > 0 ? std::string(owner, static_cast<size_t>(n)) : std::string("?"),
                "); give this run another --run-id or run directory");
    }
    std::string pid = std::to_string(::getpid());
    if (::ftruncate(fd_, 0) == 0) (void)!::pwrite(fd_, pid.data(), pid.size(), 0);
  }
  ~RunDirLock() { ::close(fd_); }
  RunDirLock(const RunDirLock&) = delete;
  RunDirLock& operator=(const RunDirLock&) = delete;

 private:
  int fd_ = -1;
};

// Removes what an earlier run left under the names this run will write (a stale FileStore
// makes the rendezvous hang; stale error files and ledgers would be misreported).
void prepare_run_dir(const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir / "logs", ec);
  MIH_CHECK_CODE(!ec, Code::kFailedPrecondition, "cannot create the run directory '", dir.string(), "': ",
                 ec.message(), "; choose a writable run/evidence directory");
  fs::remove(dir / "store", ec);
  fs::remove_all(dir / "errors", ec);
  for (const char* sub : {"logs", "comm"}) {
    for (auto it = fs::directory_iterator(dir / sub, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
      std::string name = it->path().filename().string();
      if (name.rfind("rank", 0) == 0 || name.rfind("ledger_rank", 0) == 0 || name == "launcher.log") {
        fs::remove(it->path(), ec);
      }
    }
    ec.clear();
  }
}

std::vector<std::string> env_list(const Env& env) {
  std::vector<std::string> out;
  out.reserve(env.size());
  for (const auto& [k, v] : env) out.push_back(k + "=" + v);
  return out;
}

std::vector<char*> c_strings(std::vector<std::string>& strings) {
  std::vector<char*> out;
  out.reserve(strings.size() + 1);
  for (auto& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

// Local ranks: posix_spawn (vfork-fast), own process group, stdout+stderr to the log.
pid_t spawn_rank(std::vector<std::string> argv, std::vector<std::string> env, const std::filesystem::path& log) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
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

// Template mode: fork so the shell gets a parent-death signal (a killed launcher must not
// leave an srun behind). Only async-signal-safe calls between fork and exec.
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
    int out = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
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

// Waits until a running child ends or `until`; returns the children reaped.
std::vector<Child*> wait_some(std::vector<Child>& children, Clock::time_point until) {
  std::vector<Child*> reaped;
  for (;;) {
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

// SIGTERM to every running child's process group, SIGKILL after the grace period, reap all.
void stop_all(std::vector<Child>& children, std::chrono::milliseconds grace) {
  for (auto& c : children) {
    if (!c.running) continue;
    c.stopped = true;
    ::kill(-c.pid, SIGTERM);
  }
  auto until = Clock::now() + grace;
  while (Clock::now() < until &&
         std::any_of(children.begin(), children.end(), [](const Child& c) { return c.running; })) {
    wait_some(children, until);
  }
  for (auto& c : children) {
    if (!c.running) continue;
    ::kill(-c.pid, SIGKILL);
    reap(c, true);
  }
}

// The rank to blame when several failed: a crash or a plain non-zero exit comes before a
// transport timeout or a dead peer (14, 15), which are usually what the others see of it;
// among equals, the first one reaped. Ranks ended by the launcher's signal are not failures
// (one that exited with its own status during the grace period is).
int root_cause(const std::vector<Child>& children) {
  const Child* best = nullptr;
  auto consequence = [](const Child& c) {
    if (!WIFEXITED(c.status)) return false;
    Code code = code_from_exit_status(WEXITSTATUS(c.status));
    return code == Code::kDeadlineExceeded || code == Code::kUnavailable;
  };
  auto order = [](const Child& c) { return c.reap_order < 0 ? std::numeric_limits<int>::max() : c.reap_order; };
  for (const auto& c : children) {
    if ((c.stopped && WIFSIGNALED(c.status)) || (WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0)) continue;
    if (!best || std::make_pair(consequence(c), order(c)) < std::make_pair(consequence(*best), order(*best))) best = &c;
  }
  return best ? best->rank : -1;
}

std::string seconds_str(double s) {
  std::ostringstream out;
  out.precision(2);
  out << std::fixed << s << " s";
  return out.str();
}

// Ranks of the failed rank's last collective group that never entered it: the cause of a
// collective timeout is usually a member that is elsewhere (stuck, or on another code path).
// Calls are matched by their number on the axis, as every member issues them in order.
std::string diagnose_stragglers(const std::map<int, std::vector<CommRecord>>& ledgers, int failed_rank) {
  auto it = ledgers.find(failed_rank);
  if (it == ledgers.end() || it->second.empty()) return "";
  const CommRecord& last = it->second.back();
  bool timed_out = last.event == "begin" || (last.event == "error" && last.error.find("did not complete") != std::string::npos);
  if (!timed_out) return "";
  auto calls_on = [&](const std::vector<CommRecord>& records) {
    return std::count_if(records.begin(), records.end(),
                         [&](const CommRecord& r) { return r.event == "begin" && r.axis == last.axis && r.ranks == last.ranks; });
  };
  const auto call = calls_on(it->second);
  std::vector<int> missing;
  for (int member : last.ranks) {
    auto m = ledgers.find(member);
    if (member != failed_rank && (m == ledgers.end() || calls_on(m->second) < call)) missing.push_back(member);
  }
  if (missing.empty()) return "";
  std::string list;
  for (size_t i = 0; i < missing.size(); ++i) list += (i ? ", " : "") + std::to_string(missing[i]);
  return mih::internal::str("rank(s) [", list, "] never entered call #", call, " on axis '", last.axis, "' (", last.op,
                            " from ", last.site, ") that rank ", failed_rank, " timed out in");
}

void read_error_file(const std::filesystem::path& run_dir, RankOutcome& o) {
  std::string text;
  if (read_file(run_dir / "errors" / ("rank" + std::to_string(o.rank) + ".json"), &text)) {
    auto j = nlohmann::json::parse(text, nullptr, false);
    if (j.is_object()) {
      o.error_code = j.value("code", "");
      o.error_message = j.value("message", "");
      for (const auto& line : j.value("context", std::vector<std::string>{})) o.error_message += "\n" + line;
    }
  }
}

std::vector<CommRecord> rank_ledger(const std::filesystem::path& run_dir, int rank) {
  auto path = run_dir / "comm" / ("ledger_rank" + std::to_string(rank) + ".jsonl");
  return std::filesystem::exists(path) ? read_ledger(path) : std::vector<CommRecord>{};
}

std::string indent(const std::string& text, const std::string& prefix) {
  std::string out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) out += prefix + line + "\n";
  return out;
}

}  // namespace

std::string shell_quote(const std::string& arg) {
  bool safe = !arg.empty() && arg.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
                                                    "_-./=:,+@%") == std::string::npos;
  if (safe) return arg;
  std::string out = "'";
  for (char c : arg) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string RankOutcome::how() const {
  if (state == State::kStopped) return "stopped by the launcher (" + signal_name(signal) + ")";
  if (state == State::kSignaled) return "killed by " + signal_name(signal);
  std::string out = "exited with code " + std::to_string(exit_code);
  Code code = code_from_exit_status(exit_code);
  if (exit_code != 0 && code != Code::kOk) out += " (" + std::string(code_name(code)) + ")";
  return out;
}

Code LaunchResult::code() const {
  switch (status) {
    case Status::kOk: return Code::kOk;
    case Status::kTimedOut: return Code::kDeadlineExceeded;
    case Status::kRankFailed:
      for (const auto& r : ranks) {
        if (r.rank != failed_rank) continue;
        Code own = r.state == RankOutcome::State::kExited ? code_from_exit_status(r.exit_code) : Code::kOk;
        return own == Code::kOk ? Code::kAborted : own;
      }
      return Code::kAborted;
  }
  return Code::kInternal;
}

std::string LaunchResult::report() const {
  std::ostringstream out;
  const int n = static_cast<int>(ranks.size());
  auto name = [&](const RankOutcome& r) {
    return r.rank >= 0 ? "rank " + std::to_string(r.rank) + "/" + std::to_string(n) : std::string("launcher command");
  };
  std::vector<int> still_running;
  for (const auto& r : ranks) {
    if (r.state == RankOutcome::State::kStopped) still_running.push_back(r.rank);
  }
  auto list = [](const std::vector<int>& v) {
    std::string s;
    for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
    return "[" + s + "]";
  };
  if (status == Status::kOk) {
    out << "all " << n << " rank(s) exited 0 in " << seconds_str(seconds) << "\n";
    return out.str();
  }
  const RankOutcome* cause = nullptr;
  if (status == Status::kRankFailed) {
    for (const auto& r : ranks) {
      if (r.rank == failed_rank) cause = &r;
    }
    out << "run failed: " << (cause ? name(*cause) + " " + cause->how() : "a rank failed") << " after "
        << seconds_str(cause ? cause->seconds : seconds) << "\n";
    if (cause && !cause->error_message.empty()) {
      out << "  error [" << cause->error_code << "]:\n" << indent(cause->error_message, "    ");
    }
    if (cause && !cause->last_activity.empty()) out << "  last activity: " << cause->last_activity << "\n";
    if (!diagnosis.empty()) out << "  likely cause: " << diagnosis << "\n";
    if (cause && !failed_log_tail.empty()) out << "  log tail (" << cause->log.string() << "):\n" << indent(failed_log_tail, "    | ");
    if (!still_running.empty()) out << "ranks still running when the run was stopped: " << list(still_running) << "\n";
  } else {
    out << "run timed out after " << seconds_str(static_cast<double>(timeout.count()) / 1000.0)
        << "; ranks still running were stopped: " << list(still_running) << "\n";
    bool none_started = std::all_of(ranks.begin(), ranks.end(),
                                    [](const RankOutcome& r) { return r.last_activity == "no collective yet"; });
    if (none_started) out << "  no rank reached a collective: if they were still starting, raise the run timeout\n";
  }
  out << "every rank:\n";
  for (const auto& r : ranks) {
    out << "  " << name(r) << " (pid " << r.pid << "): " << r.how() << " after " << seconds_str(r.seconds) << "\n";
    if (!r.last_activity.empty()) out << "    " << r.last_activity << "\n";
    if (&r != cause && !r.error_message.empty()) {
      out << "    error [" << r.error_code << "]:\n" << indent(r.error_message, "      ");
    }
  }
  if (status == Status::kTimedOut) {
    for (const auto& r : ranks) {
      if (r.state != RankOutcome::State::kStopped) continue;
      std::string tail = tail_lines(r.log, 3);
      if (!tail.empty()) out << "  " << name(r) << " log tail (" << r.log.string() << "):\n" << indent(tail, "    | ");
    }
  }
  return out.str();
}

void to_json(nlohmann::json& j, const LaunchResult& result) {
  static const char* kStatus[] = {"ok", "rank_failed", "timed_out"};
  static const char* kState[] = {"exited", "signaled", "stopped"};
  nlohmann::json ranks = nlohmann::json::array();
  for (const auto& r : result.ranks) {
    nlohmann::json o = {{"rank", r.rank},
                        {"pid", r.pid},
                        {"state", kState[static_cast<int>(r.state)]},
                        {"how", r.how()},
                        {"seconds", r.seconds},
                        {"log", r.log.string()},
                        {"last_activity", r.last_activity}};
    if (r.state == RankOutcome::State::kExited) o["exit_code"] = r.exit_code;
    if (r.signal != 0) o["signal"] = signal_name(r.signal);
    if (!r.error_code.empty()) o["error"] = {{"code", r.error_code}, {"message", r.error_message}};
    ranks.push_back(std::move(o));
  }
  j = {{"status", kStatus[static_cast<int>(result.status)]},
       {"code", std::string(code_name(result.code()))},
       {"seconds", result.seconds},
       {"timeout_seconds", static_cast<double>(result.timeout.count()) / 1000.0},
       {"ranks", ranks}};
  if (result.status == LaunchResult::Status::kRankFailed) j["failed_rank"] = result.failed_rank;
  if (!result.diagnosis.empty()) j["diagnosis"] = result.diagnosis;
}

LaunchResult launch(const LaunchOptions& options) {
  const bool templated = !options.command_template.empty();
  MIH_CHECK(options.world_size >= 1, "launch: world_size must be >= 1, got ", options.world_size);
  MIH_CHECK(!options.command.empty(), "launch: the rank command is empty");
  MIH_CHECK(!templated || options.command_template.find("{cmd}") != std::string::npos,
            "launcher template '", options.command_template,
            "' has no '{cmd}' placeholder; e.g. \"srun -N2 --ntasks-per-node=8 {cmd}\"");
  MIH_CHECK(options.timeout.count() > 0, "launch: timeout must be > 0 ms");
  RunDirLock lock(options.run_dir);
  prepare_run_dir(options.run_dir);

  Env base = process_env();
  // Outer launchers' rank variables would contradict ours in the children.
  for (const char* var : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "SLURM_PROCID", "SLURM_LOCALID",
                          "SLURM_NTASKS", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                          "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", kStoreFileVar, kStoreHostedVar,
                          kLauncherStoreVar}) {
    if (!templated || std::string_view(var).rfind("SLURM", 0) != 0) base.erase(var);
  }
  const std::string threads = std::to_string(options.threads_per_rank);
  base["OMP_NUM_THREADS"] = threads;
  base["OPENBLAS_NUM_THREADS"] = threads;
  base["MKL_NUM_THREADS"] = threads;

  // The TCPStore the ranks meet at, when the launcher hosts it; kept alive until the end.
  std::optional<compat::Store> hosted_store;
  if (templated || options.rendezvous == RendezvousKind::kTcp) {
    compat::TcpStoreOptions so;
    so.host = "127.0.0.1";
    so.port = 0;
    so.is_server = true;
    so.world_size = options.world_size;
    so.timeout = options.timeout;
    hosted_store = compat::make_tcp_store(so);
    std::string addr = "127.0.0.1";
    if (templated) {
      if (const std::string* user = find_env(base, "MASTER_ADDR")) {
        addr = *user;
      } else {
        char host[256] = {0};
        ::gethostname(host, sizeof(host) - 1);
        addr = host;
      }
    }
    base["MASTER_ADDR"] = addr;
    base["MASTER_PORT"] = std::to_string(hosted_store->port());
    base[kStoreHostedVar] = "1";
    if (templated) base[kLauncherStoreVar] = addr + ":" + std::to_string(hosted_store->port());
  } else {
    base["MASTER_ADDR"] = "127.0.0.1";
    base["MASTER_PORT"] = std::to_string(pick_free_port());
    base[kStoreFileVar] = (std::filesystem::absolute(options.run_dir) / "store").string();
  }
  base[kLauncherPidVar] = std::to_string(::getpid());
  base[kExpectedWorldSizeVar] = std::to_string(options.world_size);
  for (const auto& [k, v] : options.extra_env) base[k] = v;

  LaunchResult result;
  result.timeout = options.timeout;
  const auto start = Clock::now();
  std::vector<Child> children;
  auto start_failed = [&](int rank, int err) {
    stop_all(children, std::chrono::milliseconds(0));
    MIH_THROW(Code::kFailedPrecondition, "cannot start ", rank >= 0 ? "rank " + std::to_string(rank) : "the launcher command",
              ": ", std::strerror(err), " (command '", options.command.front(), "')");
  };
  if (templated) {
    std::string cmd;
    for (const auto& a : options.command) cmd += (cmd.empty() ? "" : " ") + shell_quote(a);
    std::string line = options.command_template;
    for (size_t pos; (pos = line.find("{cmd}")) != std::string::npos;) line.replace(pos, 5, cmd);
    base.erase(kLauncherPidVar);  // ranks are not our children
    Child c;
    c.log = options.run_dir / "logs" / "launcher.log";
    c.start = Clock::now();
    c.pid = fork_shell(line, env_list(base), c.log);
    if (c.pid < 0) start_failed(-1, -c.pid);
    c.pidfd = open_pidfd(c.pid);
    children.push_back(c);
  } else {
    children.reserve(static_cast<size_t>(options.world_size));
    for (int r = 0; r < options.world_size; ++r) {
      Env env = base;
      env["RANK"] = std::to_string(r);
      env["WORLD_SIZE"] = std::to_string(options.world_size);
      env["LOCAL_RANK"] = std::to_string(r);
      env["LOCAL_WORLD_SIZE"] = std::to_string(options.world_size);
      Child c;
      c.rank = r;
      c.log = options.run_dir / "logs" / ("rank" + std::to_string(r) + ".log");
      c.start = Clock::now();
      c.pid = spawn_rank(options.command, env_list(env), c.log);
      if (c.pid < 0) start_failed(r, -c.pid);
      c.pidfd = open_pidfd(c.pid);
      children.push_back(c);
    }
  }

  const auto deadline = start + options.timeout;
  int reaped = 0;
  result.status = LaunchResult::Status::kOk;
  while (std::any_of(children.begin(), children.end(), [](const Child& c) { return c.running; })) {
    if (Clock::now() >= deadline) {
      result.status = LaunchResult::Status::kTimedOut;
      break;
    }
    bool failed = false;
    for (Child* c : wait_some(children, deadline)) {
      c->reap_order = reaped++;
      failed = failed || !(WIFEXITED(c->status) && WEXITSTATUS(c->status) == 0);
    }
    if (failed) {
      result.status = LaunchResult::Status::kRankFailed;
      break;
    }
  }
  if (result.status == LaunchResult::Status::kRankFailed) {
    const auto settle_until = std::min(deadline, Clock::now() + options.settle);
    while (Clock::now() < settle_until &&
           std::any_of(children.begin(), children.end(), [](const Child& c) { return c.running; })) {
      for (Child* c : wait_some(children, settle_until)) c->reap_order = reaped++;
    }
  }
  stop_all(children, options.grace);
  if (result.status == LaunchResult::Status::kRankFailed) result.failed_rank = root_cause(children);
  // Anything a rank started in its process group goes too.
  for (const auto& c : children) ::kill(-c.pid, SIGKILL);
  result.seconds = std::chrono::duration<double>(Clock::now() - start).count();

  const int64_t now_us = wall_clock_us();
  std::map<int, std::vector<CommRecord>> ledgers;
  for (const auto& c : children) {
    RankOutcome o;
    o.rank = c.rank;
    o.pid = c.pid;
    o.log = c.log;
    o.seconds = std::chrono::duration<double>(c.end - c.start).count();
    if (WIFSIGNALED(c.status)) {
      o.state = c.stopped ? RankOutcome::State::kStopped : RankOutcome::State::kSignaled;
      o.signal = WTERMSIG(c.status);
    } else {
      o.state = RankOutcome::State::kExited;
      o.exit_code = WIFEXITED(c.status) ? WEXITSTATUS(c.status) : -1;
    }
    if (c.rank >= 0) {
      read_error_file(options.run_dir, o);
      ledgers[c.rank] = rank_ledger(options.run_dir, c.rank);
      o.last_activity = describe_last_activity(ledgers[c.rank], now_us);
    }
    result.ranks.push_back(std::move(o));
  }
  if (result.status == LaunchResult::Status::kRankFailed) result.diagnosis = diagnose_stragglers(ledgers, result.failed_rank);
  if (result.status == LaunchResult::Status::kRankFailed) {
    for (const auto& c : children) {
      if (c.rank == result.failed_rank) result.failed_log_tail = tail_lines(c.log, static_cast<size_t>(options.log_tail_lines));
    }
  }
  if (templated && result.ok()) {
    // The command succeeded; did it run every rank? Each reports its exit through the store.
    std::vector<int> silent;
    for (int r = 0; r < options.world_size; ++r) {
      if (!hosted_store->check({"mih/exit/rank" + std::to_string(r)})) silent.push_back(r);
    }
    if (!silent.empty()) {
      std::string list;
      for (size_t i = 0; i < silent.size(); ++i) list += (i ? ", " : "") + std::to_string(silent[i]);
      result.status = LaunchResult::Status::kRankFailed;
      result.failed_rank = -1;
      result.diagnosis = mih::internal::str("the launcher command exited 0, but rank(s) [", list, "] of ",
                                            options.world_size,
                                            " never reported completion: the template must start world_size(",
                                            options.world_size, ") ranks of '{cmd}' with their rank variables");
    }
  }
  if (templated) {
    // Ranks started by the template may have left error reports in a shared run directory.
    for (int r = 0; r < options.world_size; ++r) {
      RankOutcome o;
      o.rank = r;
      read_error_file(options.run_dir, o);
      o.last_activity = describe_last_activity(rank_ledger(options.run_dir, r), now_us);
      if (!o.error_message.empty()) {
        result.ranks.front().error_message += "\n  rank " + std::to_string(r) + " [" + o.error_code + "]: " + o.error_message;
        if (result.ranks.front().error_code.empty()) result.ranks.front().error_code = o.error_code;
      }
    }
  }
  return result;
}

}  // namespace mih
