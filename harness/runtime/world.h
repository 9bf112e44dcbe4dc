// Who this process is in a multi-rank run: rank, world size, local rank and local world size,
// read from the variables of the launcher that started it (torchrun, SLURM srun, Open MPI
// mpirun, or mih's own local launcher, which sets torchrun's).
#pragma once

#include <map>
#include <string>
#include <string_view>

namespace mih {

/// Environment variables as name -> value. Taken by value so tests need no setenv.
using Env = std::map<std::string, std::string>;

/// Returns the variables of this process (environ).
Env process_env();

/// Returns env[name] or nullptr.
const std::string* find_env(const Env& env, std::string_view name);

/// The launcher whose variables described the world.
enum class LaunchSource {
  kSingleProcess,  ///< none set: rank 0 of 1
  kTorchrun,       ///< RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE (mih's launcher too)
  kSlurm,          ///< SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID (+ tasks per node)
  kOpenMpi,        ///< OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE
};

/// Returns "single-process", "torchrun", "slurm" or "openmpi".
std::string_view launch_source_name(LaunchSource source);

/// This process's place in the world.
struct World {
  int rank = 0;
  int world_size = 1;
  /// Rank among the processes of this host; selects the CUDA device.
  int local_rank = 0;
  int local_world_size = 1;
  /// Rendezvous address from MASTER_ADDR / MASTER_PORT; empty / 0 when not set.
  std::string master_addr;
  int master_port = 0;
  LaunchSource source = LaunchSource::kSingleProcess;
  /// The launcher's identity of the run: torchrun's TORCHELASTIC_RUN_ID, SLURM's
  /// "<SLURM_JOB_ID>.<SLURM_STEP_ID>", Open MPI's job id; empty under mih's own launcher.
  std::string run_id;

  /// Reads the world from `env`. Precedence: torchrun variables (the innermost launcher,
  /// e.g. `srun torchrun ...`), then Open MPI, then SLURM. A launcher's variables must be
  /// complete (RANK without WORLD_SIZE is an error; LOCAL_RANK and LOCAL_WORLD_SIZE come
  /// as a pair and default to RANK / WORLD_SIZE on one host; MASTER_ADDR and MASTER_PORT
  /// come as a pair). When RANK is set and SLURM_NTASKS or OMPI_COMM_WORLD_SIZE equals
  /// WORLD_SIZE (one outer task per rank), their ranks must agree.
  /// Throws: mih::Error{kInvalidSpec} naming the missing, malformed, out-of-range or
  ///   contradictory variables and their values.
  static World from_env(const Env& env);

  /// "rank 1 of 4 (local 1 of 4) from torchrun variables".
  std::string describe() const;
};

}  // namespace mih
