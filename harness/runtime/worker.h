// The worker side of a multi-rank run:
//   <binary> worker [worker options] <task> [task options]
// Every mih binary (the `mih` CLI and each test binary) can act as a worker; the launcher
// re-executes it once per rank. A task is a named function run on every rank, with its own
// declared options (shown by `<binary> worker <task> --help`).
//
// How to add a task: in a translation unit linked directly into the binary,
//   MIH_WORKER_TASK(hello, "all-reduce one tensor over the world", {{"value", "what to sum", "1"}}) {
//     DeviceMesh mesh = ctx.build_mesh(ParallelConfig::parse_mesh("dp_shard=2"));
//     auto t = at::full({1}, std::stod(ctx.option("value")));
//     mesh.comm(MeshAxis::kWorld).all_reduce(t);
//     return 0;
//   }
// and launch it with LaunchOptions::command = worker_command("hello", options, {"--value", "2"}).
#pragma once

#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <c10/core/Device.h>

#include "harness/compat/collectives.h"
#include "harness/compat/store.h"
#include "harness/runtime/comm_ledger.h"
#include "harness/runtime/determinism.h"
#include "harness/runtime/device_mesh.h"
#include "harness/runtime/world.h"

namespace mih {

/// Options every worker takes on its command line (the launcher writes them).
struct WorkerOptions {
  /// Run directory: comm/ledger_rank<r>.jsonl, errors/rank<r>.json and the task's files.
  std::filesystem::path run_dir = ".";
  /// The process-group backend of every group (--pg-backend gloo|nccl).
  compat::BackendKind pg_backend = compat::BackendKind::kGloo;
  /// Timeout of each collective and of group creation.
  std::chrono::milliseconds collective_timeout{std::chrono::seconds(60)};
  /// How long a rank waits for the others to reach the store.
  std::chrono::milliseconds rendezvous_timeout{std::chrono::seconds(60)};
  /// Worker-side watchdog for runs without mih's launcher (torchrun, srun): after this
  /// long the rank prints what it was doing and exits with kDeadlineExceeded. 0 = off.
  std::chrono::milliseconds case_timeout{0};
  /// Gloo: host/address to bind ("127.0.0.1" for local runs, whatever GLOO_SOCKET_IFNAME
  /// says); empty = GLOO_SOCKET_IFNAME if set, else the machine's hostname.
  std::string gloo_hostname;
  /// The catalog fault this rank injects (--fault F03: only mih test/run/faults --fault set
  /// it); "" none. An MIH_FAULT in the rank's environment is ignored (and said so), so an
  /// exported variable never turns a run into a faulty one.
  std::string fault;
  DeterminismOptions determinism;

  /// The command-line form, parsed back by worker_main.
  std::vector<std::string> to_args() const;
};

/// What a task gets: the world, the options, its own arguments, and lazily created
/// runtime pieces (store, ledger, meshes).
class WorkerContext {
 public:
  /// Throws: mih::Error{kFailedPrecondition} if the ledger cannot be created in run_dir.
  WorkerContext(World world, WorkerOptions options, std::map<std::string, std::string> task_options, Env env);

  const World& world() const { return world_; }
  const WorkerOptions& options() const { return options_; }
  /// The value of task option `name` (its default when not given).
  /// Throws: mih::Error{kInternal} if the task did not declare `name`.
  const std::string& option(const std::string& name) const;
  /// option(name) as an integer.
  /// Throws: mih::Error{kInvalidSpec} if the value is not an integer.
  int64_t int_option(const std::string& name) const;
  const std::filesystem::path& run_dir() const { return options_.run_dir; }

  /// The run's store, connected and joined by every rank on first use.
  /// Throws: as connect_store and join.
  compat::Store& store();
  /// This rank's comm ledger (run_dir/comm/ledger_rank<r>.jsonl, opened at construction).
  const std::shared_ptr<CommLedger>& ledger() const { return ledger_; }
  /// Builds a mesh of `config`'s degrees over the world with this worker's backend and timeouts.
  /// Throws: as DeviceMesh.
  DeviceMesh build_mesh(const ParallelConfig& config, const std::string& name = "mesh");
  /// Where this rank's tensors live: cuda:<local rank> with NCCL, else the CPU.
  c10::Device device() const;

 private:
  World world_;
  WorkerOptions options_;
  std::map<std::string, std::string> task_options_;
  Env env_;
  std::optional<compat::Store> store_;
  std::shared_ptr<CommLedger> ledger_;
};

/// A task: returns the worker's exit status (0 = success); throws mih::Error on failure.
using WorkerTask = std::function<int(WorkerContext&)>;

/// An option a task declares: `--<name> <value>` on the command line, a string.
struct TaskOption {
  std::string name;
  std::string help;
  std::string default_value;
};

/// Registers `task` under `name` with its options.
/// Throws: mih::Error{kInternal} if the name is taken.
void register_worker_task(const std::string& name, const std::string& help, std::vector<TaskOption> options,
                          WorkerTask task);

/// Names and help lines of the registered tasks (built-ins included).
std::vector<std::pair<std::string, std::string>> worker_tasks();

/// Returns {"<this executable>", "worker", <options.to_args()>..., task, task_args...}.
std::vector<std::string> worker_command(const std::string& task, const WorkerOptions& options,
                                        const std::vector<std::string>& task_args = {});

/// Runs `worker ...` (argv[0] is "worker"). Returns only for --help and usage errors (the
/// exit status); otherwise ends the process itself, without static destructors (libtorch's
/// teardown is slow, and a group whose peer died can block in it): with the task's status,
/// or on failure with exit_status(code) after writing run_dir/errors/rank<r>.json (code,
/// message, context) and printing the error.
int worker_main(int argc, char** argv);

/// Returns the absolute path of the running executable (/proc/self/exe).
std::filesystem::path self_executable();

namespace internal {
struct WorkerTaskRegistrar {
  WorkerTaskRegistrar(const char* name, const char* help, std::vector<TaskOption> options, WorkerTask task) {
    register_worker_task(name, help, std::move(options), std::move(task));
  }
};
}  // namespace internal

}  // namespace mih

/// Defines and registers a worker task; the body sees `mih::WorkerContext& ctx` and returns
/// an exit status. The optional third argument lists its TaskOptions. Only in a TU linked
/// directly into the binary (a static archive would drop the registration).
#define MIH_WORKER_TASK(name, help, ...)                                             \
  static int mih_worker_task_##name(::mih::WorkerContext& ctx);                      \
  static const ::mih::internal::WorkerTaskRegistrar mih_worker_task_registrar_##name( \
      #name, help, std::vector<::mih::TaskOption>{__VA_ARGS__}, mih_worker_task_##name); \
  static int mih_worker_task_##name([[maybe_unused]] ::mih::WorkerContext& ctx)
