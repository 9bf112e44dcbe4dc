// The collective selftest behind `mih selftest`: every collective on every mesh axis with
// float32, float64, bfloat16 and int64 tensors, each result checked against values every
// rank computes independently (in float64) from the other ranks' known inputs.
#pragma once

#include <string>
#include <vector>

#include <c10/core/Device.h>
#include <nlohmann/json_fwd.hpp>

#include "harness/runtime/device_mesh.h"
#include "harness/runtime/worker.h"

namespace mih {

/// What the selftest runs.
struct SelftestOptions {
  /// dtype names (see dtypes.h).
  std::vector<std::string> dtypes = {"float32", "float64", "bfloat16", "int64"};
  /// Per-rank payload shape [rows, cols]; all_to_all uses 1-3 rows per peer.
  int64_t rows = 4;
  int64_t cols = 64;
  /// Calls per (axis, op, dtype); each is checked, the median is reported.
  int repeats = 3;
  /// Where the tensors live (CUDA for NCCL). Expected values are computed on the CPU.
  c10::Device device = c10::Device(c10::DeviceType::CPU);
};

/// One (axis, op, dtype) check on one rank.
struct SelftestCheck {
  std::string axis;
  std::string op;     ///< "all_reduce.sum", "all_gather", "reduce_scatter.avg", "send_recv", ...
  std::string dtype;  ///< "-" for barrier
  int group_size = 1;
  bool applicable = true;  ///< false: send_recv on a 1-rank axis
  bool ok = true;
  double max_abs_error = 0;  ///< of the worst repeat
  double tolerance = 0;      ///< 0 for data movement (bit exact)
  std::string detail;        ///< on failure: first bad index, expected and actual
  double median_us = 0;      ///< per call, microseconds
};

void to_json(nlohmann::json& j, const SelftestCheck& c);
void from_json(const nlohmann::json& j, SelftestCheck& c);

/// The ops of the selftest, in table order.
const std::vector<std::string>& selftest_ops();

/// Runs every op on every axis of `mesh` for every dtype; returns this rank's checks.
/// A wrong value is a failed check, not an exception.
/// Throws: mih::Error from the Communicator when a collective fails in transport (the
///   groups are unusable after that).
std::vector<SelftestCheck> run_collective_selftest(DeviceMesh& mesh, const SelftestOptions& options);

/// Merges every rank's checks into one summary: per (axis, op) ok, the slowest rank's
/// median time, and the list of failures with their rank.
nlohmann::json summarize_selftest(const std::vector<std::vector<SelftestCheck>>& per_rank, const DeviceMesh& mesh,
                                  const SelftestOptions& options);

/// The summary as the table `mih selftest` prints (axis x op: ok/FAIL and time).
std::string format_selftest_table(const nlohmann::json& summary);

/// Options of the "selftest" task: --mesh, --repeats, --dtypes (comma-separated).
std::vector<TaskOption> selftest_task_options();

/// Worker task "selftest". Rank 0 gathers all
/// ranks' checks through the store, writes run_dir/selftest.json and prints the table;
/// returns 1 on rank 0 if any check failed.
int run_selftest_task(WorkerContext& ctx);

/// Worker task "ping": joins the rendezvous, builds the world group and all-reduces one
/// tensor (the fixed cost of a launch, for bench/).
int run_ping_task(WorkerContext& ctx);

/// Worker task "state": writes run_dir/state_rank<r>.json, what a rank inherits from how it
/// was started: its environment, open fds (by kind and path), blocked signals and signals
/// not at their default, threads, intra-op and BLAS threads, the default generator's first
/// draws, a process-wide counter of task runs, cwd and umask. With --mutate 1 it then
/// changes all of them, so that a later rank of the same fork server would show any leak.
int run_state_task(WorkerContext& ctx);

/// What run_state_task records of this process (its "rank" and "task_runs" aside), as JSON.
nlohmann::json process_state();

/// `mih-core __process-state FILE [--mutate]`: writes process_state() of this command process
/// to FILE (with "command_runs", a process-wide counter), then with --mutate changes what it
/// recorded, as the state task does. A test hook (tests/cli/warm.py) for the warm server: a
/// command it forks must start in an exec'd command's state. Returns the exit status.
int run_process_state_command(int argc, char** argv);

}  // namespace mih
