// worker_main: parses the worker command line, sets up the rank (parent-death signal,
// determinism, watchdog) and runs the task; the task registry.
#include "harness/runtime/worker.h"

#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <charconv>
#include <condition_variable>
#include <optional>
#include <cstdio>
#include <ctime>
#include <map>
#include <mutex>
#include <thread>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "harness/base/error.h"
#include "harness/contract/evidence_layout.h"
#include "harness/base/fault.h"
#include "harness/base/files.h"
#include "harness/runtime/cli_support.h"
#include "harness/runtime/fork_server.h"
#include "harness/runtime/launcher.h"
#include "harness/runtime/rendezvous.h"
#include "harness/runtime/selftest.h"

namespace mih {
namespace {

// A duration as the command line gives it: seconds, exact to the millisecond ("1.5").
std::string seconds(std::chrono::milliseconds d) {
  const int64_t ms = d.count();
  std::string out = std::to_string(ms / 1000);
  if (ms % 1000 != 0) {
    char frac[8];
    std::snprintf(frac, sizeof frac, ".%03d", static_cast<int>(ms % 1000));
    out += frac;
  }
  return out;
}

struct TaskEntry {
  std::string help;
  std::vector<TaskOption> options;
  WorkerTask task;
};

std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}

std::map<std::string, TaskEntry>& registry() {
  static std::map<std::string, TaskEntry> tasks;
  return tasks;
}

// Built-in tasks live in this library; registering them from a static initializer in a
// static archive would be dropped by the linker, so they are registered on first use.
void ensure_builtin_tasks() {
  static std::once_flag once;
  std::call_once(once, [] {
    register_worker_task("selftest", "every collective on every mesh axis, checked against expected values",
                         selftest_task_options(), run_selftest_task);
    register_worker_task("ping", "join the rendezvous and all-reduce one tensor over the world (launch cost)", {},
                         run_ping_task);
    register_worker_task("state",
                         "write run_dir/state_rank<r>.json, the process state a rank starts with (environment, fds, "
                         "signals, threads, RNG); --mutate 1 then changes it all",
                         {{"mutate", "1: change the process state after recording it", "0"}}, run_state_task);
  });
}

std::filesystem::path error_file(const std::filesystem::path& run_dir, int rank) {
  return run_dir / (rank >= 0 ? layout::rank_error(rank) : std::string(layout::kRankUnknownError));
}

// Reports `e` and ends the process: destructors could block (a group whose peer died).
[[noreturn]] void fail_worker(const std::filesystem::path& run_dir, int rank, int world_size, const Error& e) {
  nlohmann::json j{{"rank", rank},
                   {"world_size", world_size},
                   {"code", std::string(code_name(e.code()))},
                   {"exit_status", exit_status(e.code())},
                   {"message", e.message()},
                   {"context", e.context()}};
  try {
    write_file_atomic(error_file(run_dir, rank), j.dump(2) + "\n");
  } catch (const std::exception& write_error) {
    std::fprintf(stderr, "mih worker: could not record the error: %s\n", write_error.what());
  }
  // Under torchrun: its agent quotes this file as the rank's root cause (torch.distributed.
  // elastic's error-file format), instead of "error_file: <N/A>".
  if (const char* elastic = std::getenv("TORCHELASTIC_ERROR_FILE"); elastic && *elastic) {
    // torchrun's summary prints the traceback field, not the message: both say it all.
    std::string trace = internal::str("mih::Error[", code_name(e.code()), "]: ", e.message());
    for (const auto& c : e.context()) trace += "\n  " + c;
    const nlohmann::json reply{
        {"message",
         {{"message", internal::str("mih::Error[", code_name(e.code()), "]: ", e.what())},
          {"extraInfo", {{"py_callstack", trace}, {"timestamp", std::to_string(std::time(nullptr))}}}}}};
    try {
      write_file_atomic(elastic, reply.dump() + "\n");
    } catch (const std::exception& write_error) {
      std::fprintf(stderr, "mih worker: could not write TORCHELASTIC_ERROR_FILE: %s\n", write_error.what());
    }
  }
  std::string who = rank >= 0 ? internal::str("rank ", rank, "/", world_size) : std::string("(rank unknown)");
  const char* fault_in_effect = std::getenv("MIH_FAULT");
  std::fprintf(stderr, "mih worker %s: %s error: %s%s%s%s\n", who.c_str(), std::string(code_name(e.code())).c_str(),
               e.what(), fault_in_effect && *fault_in_effect ? "\n  (fault " : "",
               fault_in_effect && *fault_in_effect ? fault_in_effect : "",
               fault_in_effect && *fault_in_effect ? " in effect on this rank)" : "");
  end_process(exit_status(e.code()));
}

// Calls `fn` every `period` on a thread of its own until destroyed (the worker-side case
// watchdog, and the watch on a launcher that hosts the store). Inactive for a period <= 0.
class Ticker {
 public:
  Ticker(std::chrono::milliseconds period, std::function<void()> fn) {
    if (period.count() <= 0) return;
    thread_ = std::thread([this, period, fn = std::move(fn)] {
      std::unique_lock<std::mutex> lock(mutex_);
      while (!cv_.wait_for(lock, period, [this] { return cancelled_; })) fn();
    });
  }
  ~Ticker() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      cancelled_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool cancelled_ = false;
  std::thread thread_;
};

// A launcher that started N ranks tells each (MIH_EXPECTED_WORLD_SIZE); a template that runs
// the command without rank variables would otherwise give N single-rank worlds.
void check_expected_world(const World& world, const Env& env) {
  const std::string* expected = find_env(env, kExpectedWorldSizeVar);
  if (!expected || *expected == std::to_string(world.world_size)) return;
  MIH_THROW(Code::kInvalidSpec, "the launcher started a run of ", *expected, " ranks, but this process sees ",
            world.describe(),
            world.source == LaunchSource::kSingleProcess
                ? ": no rank variables are set; the launcher template must start the ranks through srun, mpirun or "
                  "torchrun (or set RANK and WORLD_SIZE)"
                : "; make the launcher template start exactly that many ranks");
}

// "<host>:<port>" of kLauncherStoreVar, as a TCPStore client.
compat::Store connect_launcher_store(const std::string& address, std::chrono::milliseconds timeout) {
  auto colon = address.rfind(':');
  int port = 0;
  if (colon != std::string::npos) {
    auto [end, ec] = std::from_chars(address.data() + colon + 1, address.data() + address.size(), port);
    if (ec != std::errc() || end != address.data() + address.size()) port = 0;
  }
  MIH_CHECK(port > 0 && port < 65536, kLauncherStoreVar, "='", address, "': expected <host>:<port>");
  compat::TcpStoreOptions o;
  o.host = address.substr(0, colon);
  o.port = static_cast<uint16_t>(port);
  o.timeout = timeout;
  return compat::make_tcp_store(o);
}

// Dies with the launcher: without this a SIGKILLed launcher would leave its ranks running.
void follow_launcher(const Env& env) {
  const std::string* pid = find_env(env, kLauncherPidVar);
  if (!pid) return;
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (std::to_string(::getppid()) != *pid) std::_Exit(exit_status(Code::kAborted));  // died before prctl
}

}  // namespace

std::vector<std::string> WorkerOptions::to_args() const {
  std::vector<std::string> args = {
      "--run-dir", run_dir.string(),
      "--pg-backend", std::string(compat::backend_name(pg_backend)),
      "--collective-timeout", seconds(collective_timeout),
      "--rendezvous-timeout", seconds(rendezvous_timeout),
      "--threads", std::to_string(determinism.intra_op_threads),
      "--seed", std::to_string(determinism.seed)};
  if (case_timeout.count() > 0) {
    args.insert(args.end(), {"--case-timeout", seconds(case_timeout)});
  }
  if (!gloo_hostname.empty()) args.insert(args.end(), {"--gloo-host", gloo_hostname});
  if (!fault.empty()) args.insert(args.end(), {"--fault", fault});
  if (!determinism.deterministic_algorithms) args.push_back("--no-deterministic");
  return args;
}

WorkerContext::WorkerContext(World world, WorkerOptions options, std::map<std::string, std::string> task_options,
                             Env env)
    : world_(std::move(world)),
      options_(std::move(options)),
      task_options_(std::move(task_options)),
      env_(std::move(env)),
      ledger_(std::make_shared<CommLedger>(options_.run_dir / layout::ledger_rank(world_.rank))) {}

const std::string& WorkerContext::option(const std::string& name) const {
  auto it = task_options_.find(name);
  MIH_INTERNAL_ASSERT(it != task_options_.end(), "the task reads option '--", name, "' it did not declare");
  return it->second;
}

int64_t WorkerContext::int_option(const std::string& name) const {
  const std::string& value = option(name);
  int64_t out = 0;
  auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), out);
  MIH_CHECK(ec == std::errc() && end == value.data() + value.size() && !value.empty(), "task option '--", name,
            "': expected an integer, got '", value, "'");
  return out;
}

compat::Store& WorkerContext::store() {
  if (!store_) {
    compat::Store store = connect_store(world_, env_, options_.rendezvous_timeout);
    join(store, world_.rank, world_.world_size, options_.rendezvous_timeout);
    store_ = std::move(store);
  }
  return *store_;
}

DeviceMesh WorkerContext::build_mesh(const ParallelConfig& dims, const std::string& name) {
  MeshOptions o;
  o.name = name;
  o.ledger = ledger();
  o.group.backend = options_.pg_backend;
  o.group.timeout = options_.collective_timeout;
  // An explicit bind address (local runs: loopback) wins over an inherited interface.
  if (const std::string* ifname = find_env(env_, "GLOO_SOCKET_IFNAME"); ifname && options_.gloo_hostname.empty()) {
    o.group.gloo_interface = *ifname;
  }
  o.group.gloo_hostname = options_.gloo_hostname;
  o.group.device_index = world_.local_rank;
  return DeviceMesh(dims, store(), world_.rank, world_.world_size, o);
}

c10::Device WorkerContext::device() const {
  if (options_.pg_backend == compat::BackendKind::kNccl) {
    return c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(world_.local_rank));
  }
  return c10::Device(c10::DeviceType::CPU);
}

void register_worker_task(const std::string& name, const std::string& help, std::vector<TaskOption> options,
                          WorkerTask task) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  bool inserted = registry().emplace(name, TaskEntry{help, std::move(options), std::move(task)}).second;
  MIH_INTERNAL_ASSERT(inserted, "worker task '", name, "' is registered twice");
}

std::vector<std::pair<std::string, std::string>> worker_tasks() {
  ensure_builtin_tasks();
  std::lock_guard<std::mutex> lock(registry_mutex());
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& [name, entry] : registry()) out.emplace_back(name, entry.help);
  return out;
}

std::filesystem::path self_executable() {
  std::error_code ec;
  auto path = std::filesystem::read_symlink("/proc/self/exe", ec);
  MIH_CHECK_CODE(!ec, Code::kFailedPrecondition, "cannot resolve /proc/self/exe: ", ec.message());
  return path;
}

std::vector<std::string> worker_command(const std::string& task, const WorkerOptions& options,
                                        const std::vector<std::string>& task_args) {
  std::vector<std::string> cmd = {self_executable().string(), "worker"};
  auto args = options.to_args();
  cmd.insert(cmd.end(), args.begin(), args.end());
  cmd.push_back(task);
  cmd.insert(cmd.end(), task_args.begin(), task_args.end());
  return cmd;
}

namespace {

// The worker's own options (before the task's name), into `options` and the two flags.
void add_worker_options(CLI::App& app, WorkerOptions& options, std::string& pg_backend, bool& no_deterministic) {
  app.footer(exit_status_legend());
  app.add_option("--run-dir", options.run_dir,
                 "run directory: comm/ledger_rank<r>.jsonl, errors/rank<r>.json and the task's files; give it "
                 "explicitly (shared by the ranks under torchrun/srun)")
      ->capture_default_str();
  app.add_option("--pg-backend", pg_backend, "process-group backend")
      ->check(CLI::IsMember({"gloo", "nccl"}))
      ->capture_default_str();
  cli::add_seconds(app, "--collective-timeout", options.collective_timeout, "timeout of each collective");
  cli::add_seconds(app, "--rendezvous-timeout", options.rendezvous_timeout, "how long to wait for the other ranks");
  cli::add_seconds(app, "--case-timeout", options.case_timeout, "watchdog: the rank ends itself after this long; 0 = off",
                   0.0);
  app.add_option("--gloo-host", options.gloo_hostname,
                 "Gloo bind address, e.g. 127.0.0.1 (default: GLOO_SOCKET_IFNAME or the hostname)");
  app.add_option("--fault", options.fault,
                 "inject this fault of the catalog (F01-F44; mih test/run/faults pass it); MIH_FAULT is ignored");
  app.add_option("--threads", options.determinism.intra_op_threads, "intra-op threads (torch and BLAS)")
      ->check(cli::at_least(1))
      ->capture_default_str();
  app.add_option("--seed", options.determinism.seed, "seed of every generator")->capture_default_str();
  app.add_flag("--no-deterministic", no_deterministic, "do not force deterministic algorithms");
}

// One subcommand per task, with the options the task declared (their values into `values`).
void add_task_subcommands(CLI::App& app, const std::map<std::string, TaskEntry>& tasks,
                          std::map<std::string, std::map<std::string, std::string>>& values) {
  for (const auto& [name, entry] : tasks) {
    CLI::App* sub = app.add_subcommand(name, entry.help);
    sub->fallthrough();  // worker options may follow the task name
    for (const TaskOption& o : entry.options) {
      std::string& value = values[name][o.name];
      value = o.default_value;
      sub->add_option("--" + o.name, value, o.help)->capture_default_str();
    }
  }
}

// The fault switch, from --fault only: an MIH_FAULT inherited from a shell or a launcher
// (torchrun) would make a model look broken. Returns 2 for a --fault that names no fault.
std::optional<int> set_fault_switch(WorkerOptions& options) {
  if (const char* ambient = std::getenv("MIH_FAULT"); ambient && *ambient && ambient != options.fault) {
    std::fprintf(stderr, "mih worker: ignoring MIH_FAULT=%s from the environment: a fault is injected only by "
                 "mih test/run/faults --fault\n", ambient);
  }
  ::unsetenv("MIH_FAULT");
  fault::Fault injected = fault::Fault::kNone;
  if (!options.fault.empty()) {
    try {
      injected = fault::parse(options.fault);
    } catch (const Error& e) {
      std::fprintf(stderr, "mih worker: --fault: %s\n", e.message().c_str());
      return 2;
    }
    options.fault = fault::name(injected);
    ::setenv("MIH_FAULT", options.fault.c_str(), 1);
  }
  // Set explicitly, for the rest of the process: a fault point evaluated before this line
  // (a static initializer) must not have fixed the switch from the environment.
  static std::optional<fault::ScopedFault> switch_for_process;
  switch_for_process.emplace(injected);
  return std::nullopt;
}

// Runs the task on this rank under its watchdogs and ends the process with its status; an
// error ends it through fail_worker, its report naming the task and the rank.
[[noreturn]] void run_task(const std::map<std::string, TaskEntry>& tasks, const std::string& task_name, const World& world,
                           const WorkerOptions& options, const std::map<std::string, std::string>& values,
                           const Env& env) {
  const bool hosted = find_env(env, kStoreHostedVar) && *find_env(env, kStoreHostedVar) == "1";
  const std::string where = internal::str("while running worker task '", task_name, "' on rank ", world.rank, "/",
                                          world.world_size);
  try {
    const WorkerTask& task = tasks.at(task_name).task;
    apply_determinism(options.determinism);
    WorkerContext ctx(world, options, values, env);
    // The launcher hosts the rendezvous store: meet the others now, so that a template that
    // starts too few ranks fails at the rendezvous, naming the missing ones.
    if (hosted) ctx.store();
    // Template mode: report the exit to the launcher's store, and stop if it goes away.
    std::optional<compat::Store> launcher_store;
    std::optional<Ticker> launcher_watch;
    if (const std::string* address = find_env(env, kLauncherStoreVar)) {
      launcher_store = connect_launcher_store(*address, options.rendezvous_timeout);
      launcher_watch.emplace(std::chrono::seconds(1), [watch = *launcher_store, &options, &world]() mutable {
        try {
          watch.check({"mih/launcher"});
        } catch (const Error& e) {
          fail_worker(options.run_dir, world.rank, world.world_size,
                      Error(Code::kAborted, internal::str("the launcher that hosts the store ", watch.description(),
                                                          " is gone; rank ", world.rank,
                                                          " stops instead of running on without it (", e.message(),
                                                          ")")));
        }
      });
    }
    Ticker watchdog(options.case_timeout, [&] {
      auto activity = ctx.ledger()->in_flight();
      std::string doing = activity ? describe_last_activity({*activity}, wall_clock_us()) : "outside any collective";
      fail_worker(options.run_dir, world.rank, world.world_size,
                  Error(Code::kDeadlineExceeded,
                        internal::str("case timeout: rank ", world.rank, " still running after ",
                                      options.case_timeout.count(), " ms, ", doing)));
    });
    int status = task(ctx);
    launcher_watch.reset();
    if (launcher_store) launcher_store->set("mih/exit/rank" + std::to_string(world.rank), std::to_string(status));
    // Skip libtorch's static teardown: it takes long enough that peers of a rank that
    // returned non-zero would fail on its closed sockets before it is seen to exit, and
    // every file the worker writes is already complete (atomic writes, unbuffered ledger).
    end_process(status);
  } catch (Error& e) {
    e.add_context(where);
    fail_worker(options.run_dir, world.rank, world.world_size, e);
  } catch (const std::exception& e) {
    Error wrapped(Code::kInternal, e.what());
    wrapped.add_context(where);
    fail_worker(options.run_dir, world.rank, world.world_size, wrapped);
  }
}

}  // namespace

int worker_main(int argc, char** argv) {
  ensure_builtin_tasks();
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // a killed rank still leaves its last lines
  Env env = process_env();
  follow_launcher(env);

  WorkerOptions options;
  std::string pg_backend = "gloo";
  bool no_deterministic = false;
  CLI::App app{"Runs one rank of a multi-rank task. Started by mih's launcher, or by torchrun, srun or mpirun "
               "(the rank comes from their environment variables).\nUsage: worker [options] <task> [task options]",
               // The core binary is run as `mih` (the front on the PATH): say so.
               (self_executable().filename() == "mih-core" ? std::string("mih")
                                                           : self_executable().filename().string()) + " worker"};
  add_worker_options(app, options, pg_backend, no_deterministic);
  std::map<std::string, TaskEntry> tasks;
  {
    std::lock_guard<std::mutex> lock(registry_mutex());
    tasks = registry();
  }
  std::map<std::string, std::map<std::string, std::string>> values;
  add_task_subcommands(app, tasks, values);
  cli::name_unknown_subcommands(app);
  if (auto status = cli::parse_or_exit(app, argc, argv, "worker task")) return *status;
  const std::string task_name = app.get_subcommands().front()->get_name();
  options.pg_backend = compat::parse_backend(pg_backend);
  options.determinism.deterministic_algorithms = !no_deterministic;
  if (const std::optional<int> bad_fault = set_fault_switch(options)) return *bad_fault;

  World world;
  try {
    world = World::from_env(env);
    check_expected_world(world, env);
  } catch (const Error& e) {
    fail_worker(options.run_dir, -1, 0, e);
  }
  if (!options.fault.empty()) {
    std::fprintf(stderr, "mih worker rank %d/%d: FAULT %s IN EFFECT (--fault): this rank runs the catalog's bug, not "
                 "the port\n", world.rank, world.world_size, options.fault.c_str());
  }
  run_task(tasks, task_name, world, options, values[task_name], env);
}

}  // namespace mih
