// launch(): prepare and lock the run directory, set the ranks' environment (and host their
// TCPStore), start the ranks, supervise them until they end, fail or time out, then collect
// each rank's outcome. Processes are in launcher_process.cpp, the report in launcher_report.cpp.
#include "harness/runtime/launcher.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <thread>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "harness/base/error.h"
#include "harness/contract/evidence_layout.h"
#include "harness/base/files.h"
#include "harness/base/safe_open.h"
#include "harness/compat/store.h"
#include "harness/runtime/comm_ledger.h"
#include "harness/runtime/launcher_internal.h"
#include "harness/runtime/rendezvous.h"
#include "harness/runtime/world.h"
#include "harness/base/strings.h"

namespace mih {
namespace {

// True for an IPv4 or IPv6 literal (10.0.0.5, ::1), false for a host name.
bool is_numeric_address(const std::string& text) {
  unsigned char buf[sizeof(in6_addr)];
  return ::inet_pton(AF_INET, text.c_str(), buf) == 1 || ::inet_pton(AF_INET6, text.c_str(), buf) == 1;
}

using launcher_internal::Child;
using launcher_internal::Clock;
using launcher_internal::diagnose_stragglers;
using launcher_internal::env_list;
using launcher_internal::fork_shell;
using launcher_internal::open_pidfd;
using launcher_internal::rank_ledger;
using launcher_internal::read_error_file;
using launcher_internal::root_cause;
using launcher_internal::spawn_rank;
using launcher_internal::stop_all;
using launcher_internal::wait_some;

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

constexpr char kRunDirFix[] = "choose a writable run/evidence directory of your own";

// An exclusive lock on the run directory for the launch: two launches writing one directory
// would share a FileStore and interleave their ledgers. Released when the fd closes.
class RunDirLock {
 public:
  explicit RunDirLock(const std::filesystem::path& dir) {
    // Entered a component at a time: a link or a directory another user planted on the way
    // would send the logs and ledgers elsewhere (issue 53).
    make_secure_directory(dir, kRunDirFix);
    auto path = dir / layout::kRunLock;
    std::string why;
    fd_ = open_own_file(path, O_RDWR, &why);
    MIH_CHECK_CODE(fd_ >= 0, Code::kFailedPrecondition, "cannot create '", path.string(), "': ", why, "; remove it, or ",
                   kRunDirFix);
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
  make_secure_directory(dir / layout::kLogsDir, kRunDirFix);
  std::error_code ec;
  fs::remove(dir / layout::kStore, ec);
  fs::remove_all(dir / layout::kErrorsDir, ec);
  for (const char* sub : {layout::kLogsDir, layout::kCommDir}) {
    for (auto it = fs::directory_iterator(dir / sub, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
      std::string name = it->path().filename().string();
      if (name.rfind(layout::kRankPrefix, 0) == 0 || name.rfind(layout::kLedgerPrefix, 0) == 0 ||
          name == fs::path(layout::kLauncherLog).filename().string()) {
        fs::remove(it->path(), ec);
      }
    }
    ec.clear();
  }
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

void install_interrupt_handlers() { launcher_internal::install_handlers(); }

int interrupt_signal() { return launcher_internal::pending_interrupt(); }

namespace {

void check_launch_options(const LaunchOptions& options, bool templated) {
  MIH_CHECK(options.world_size >= 1, "launch: world_size must be >= 1, got ", options.world_size);
  // Local ranks are processes of this machine: a world far beyond its cores is a typo, and
  // starting it would swamp the machine before any rank could fail.
  const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  MIH_CHECK(!options.command_template.empty() || options.world_size <= 16 * cores, "launch: ", options.world_size,
            " local ranks on ", cores, " CPU core(s) is more than this machine can run (at most ", 16 * cores,
            "); use a command template (--launcher \"srun ... {cmd}\") to spread ranks over hosts");
  MIH_CHECK(!options.command.empty(), "launch: the rank command is empty");
  MIH_CHECK(!templated || options.command_template.find("{cmd}") != std::string::npos,
            "launcher template '", options.command_template,
            "' has no '{cmd}' placeholder; e.g. \"srun -N2 --ntasks-per-node=8 {cmd}\"");
  MIH_CHECK(options.timeout.count() > 0, "launch: timeout must be > 0 ms");
}

// This process's environment for the ranks: outer launchers' rank variables dropped (they
// would contradict ours in the children), the thread counts set.
Env rank_base_env(const LaunchOptions& options, bool templated) {
  Env base = process_env();
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
  return base;
}

// Where the ranks meet, into `base`: the TCPStore the launcher hosts (returned, kept alive until
// the end), or a file store in the run directory.
std::optional<compat::Store> meeting_point(const LaunchOptions& options, bool templated, Env& base) {
  if (!templated && options.rendezvous != RendezvousKind::kTcp) {
    base["MASTER_ADDR"] = "127.0.0.1";
    base["MASTER_PORT"] = std::to_string(pick_free_port());
    base[kStoreFileVar] = (std::filesystem::absolute(options.run_dir) / layout::kStore).string();
    return std::nullopt;
  }
  // Where the ranks reach the store: loopback for local ranks; under a template the exported
  // MASTER_ADDR, else this host's name. The store listens on that address alone when it is a
  // numeric one (a host name may resolve differently on other hosts, so then it listens on
  // every interface: export MASTER_ADDR=<this host's address> to narrow it).
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
  compat::TcpStoreOptions so;
  so.port = 0;
  so.is_server = true;
  so.world_size = options.world_size;
  so.timeout = options.timeout;
  if (!templated) {
    so.host = so.bind_address = "127.0.0.1";
  } else if (is_numeric_address(addr)) {
    so.host = so.bind_address = addr;
  }
  std::optional<compat::Store> hosted_store = compat::make_tcp_store(so);
  base["MASTER_ADDR"] = addr;
  base["MASTER_PORT"] = std::to_string(hosted_store->port());
  base[kStoreHostedVar] = "1";
  if (templated) base[kLauncherStoreVar] = addr + ":" + std::to_string(hosted_store->port());
  return hosted_store;
}

// The ranks started: the template's one shell command, or one process per local rank.
std::vector<Child> start_children(const LaunchOptions& options, bool templated, Env base) {
  std::vector<Child> children;
  auto start_failed = [&](int rank, int err) {
    stop_all(children, std::chrono::milliseconds(0));
    MIH_THROW(Code::kFailedPrecondition, "cannot start ", rank >= 0 ? "rank " + std::to_string(rank) : "the launcher command",
              ": ", std::strerror(err), " (command '", options.command.front(), "')");
  };
  if (templated) {
    std::string cmd = join(options.command, " ", [](const auto& a) { return shell_quote(a); });
    std::string line = options.command_template;
    for (size_t pos; (pos = line.find("{cmd}")) != std::string::npos;) line.replace(pos, 5, cmd);
    base.erase(kLauncherPidVar);  // ranks are not our children
    Child c;
    c.log = options.run_dir / layout::kLauncherLog;
    c.start = Clock::now();
    c.pid = fork_shell(line, env_list(base), c.log);
    if (c.pid < 0) start_failed(-1, -c.pid);
    c.pidfd = open_pidfd(c.pid);
    children.push_back(c);
    return children;
  }
  children.reserve(static_cast<size_t>(options.world_size));
  for (int r = 0; r < options.world_size; ++r) {
    Env env = base;
    env["RANK"] = std::to_string(r);
    env["WORLD_SIZE"] = std::to_string(options.world_size);
    env["LOCAL_RANK"] = std::to_string(r);
    env["LOCAL_WORLD_SIZE"] = std::to_string(options.world_size);
    Child c;
    c.rank = r;
    c.log = options.run_dir / layout::rank_log(r);
    c.start = Clock::now();
    c.pid = spawn_rank(options.command, env_list(env), c.log, &c.forked);
    if (c.pid < 0) start_failed(r, -c.pid);
    c.pidfd = open_pidfd(c.pid);
    children.push_back(c);
    // Who is rank r, for tools and tests (a forked rank's command line is its title, cut
    // to the launcher's own length): logs/rank<r>.pid, removed with the logs of a rerun.
    try {
      write_file_atomic(options.run_dir / layout::rank_pid(r), std::to_string(c.pid) + "\n", Durability::kDeferred);
    } catch (const Error&) {
      // The log of this rank is there; a full disk is the rank's to report.
    }
  }
  return children;
}

// Waits for the ranks until they all exit, one fails (then the others a while to settle), an
// interrupt or the deadline; stops what still runs, its process groups too.
void wait_children(std::vector<Child>& children, const LaunchOptions& options, Clock::time_point start,
                   LaunchResult& result) {
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
    if (const int sig = launcher_internal::pending_interrupt()) {
      result.status = LaunchResult::Status::kInterrupted;
      result.interrupt_signal = sig;
      break;
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
}

// Each child's outcome (its exit, error report and last collective), and for a failed rank the
// stragglers' diagnosis and its log's tail.
void record_outcomes(const std::vector<Child>& children, const LaunchOptions& options, int64_t now_us,
                     LaunchResult& result) {
  std::map<int, std::vector<CommRecord>> ledgers;
  for (const auto& c : children) {
    RankOutcome o;
    o.rank = c.rank;
    o.pid = c.pid;
    o.log = c.log;
    o.seconds = std::chrono::duration<double>(c.end - c.start).count();
    o.started_by = c.rank < 0 ? "template" : c.forked ? "fork_server" : "exec";
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
}

// Under a template: a command that exited 0 must have run every rank (each reports its exit
// through the store), and the ranks' error reports in a shared run directory are its outcome's.
void check_templated_ranks(const LaunchOptions& options, compat::Store& hosted_store, int64_t now_us,
                           LaunchResult& result) {
  if (result.ok()) {
    std::vector<int> silent;
    for (int r = 0; r < options.world_size; ++r) {
      if (!hosted_store.check({"mih/exit/rank" + std::to_string(r)})) silent.push_back(r);
    }
    if (!silent.empty()) {
      std::string list = join(silent, ", ");
      result.status = LaunchResult::Status::kRankFailed;
      result.failed_rank = -1;
      result.diagnosis = mih::internal::str("the launcher command exited 0, but rank(s) [", list, "] of ",
                                            options.world_size,
                                            " never reported completion: the template must start world_size(",
                                            options.world_size, ") ranks of '{cmd}' with their rank variables");
    }
  }
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

}  // namespace

LaunchResult launch(const LaunchOptions& options) {
  const bool templated = !options.command_template.empty();
  check_launch_options(options, templated);
  RunDirLock lock(options.run_dir);
  prepare_run_dir(options.run_dir);
  Env base = rank_base_env(options, templated);
  // The TCPStore the ranks meet at, when the launcher hosts it; kept alive until the end.
  std::optional<compat::Store> hosted_store = meeting_point(options, templated, base);
  base[kLauncherPidVar] = std::to_string(::getpid());
  base[kExpectedWorldSizeVar] = std::to_string(options.world_size);
  for (const auto& [k, v] : options.extra_env) base[k] = v;

  LaunchResult result;
  result.timeout = options.timeout;
  const auto start = Clock::now();
  std::vector<Child> children = start_children(options, templated, base);
  wait_children(children, options, start, result);
  result.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  const int64_t now_us = wall_clock_us();
  record_outcomes(children, options, now_us, result);
  if (templated) check_templated_ranks(options, *hosted_store, now_us, result);
  return result;
}

}  // namespace mih
