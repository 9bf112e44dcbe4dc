// Launcher environment parsing for World::from_env.
#include "harness/runtime/world.h"

#include <charconv>
#include <optional>
#include <sstream>
#include <vector>

#include "harness/base/error.h"

extern char** environ;

namespace mih {
namespace {

std::optional<int> parse_int(const Env& env, std::string_view name) {
  const std::string* value = find_env(env, name);
  if (!value) return std::nullopt;
  int out = 0;
  auto [end, ec] = std::from_chars(value->data(), value->data() + value->size(), out);
  MIH_CHECK(ec == std::errc() && end == value->data() + value->size() && !value->empty(),
            "environment variable ", name, "='", *value, "' is not an integer");
  return out;
}

// Names the variables of `names` that are set and those that are not, for "partial" errors.
void require_all_or_none(const Env& env, const std::vector<std::string_view>& names, const char* launcher) {
  std::vector<std::string_view> set, unset;
  for (auto n : names) (find_env(env, n) ? set : unset).push_back(n);
  if (set.empty() || unset.empty()) return;
  std::ostringstream msg;
  msg << "incomplete " << launcher << " environment: ";
  for (size_t i = 0; i < set.size(); ++i) msg << (i ? ", " : "") << set[i] << "='" << *find_env(env, set[i]) << "'";
  msg << (set.size() == 1 ? " is" : " are") << " set but ";
  for (size_t i = 0; i < unset.size(); ++i) msg << (i ? ", " : "") << unset[i];
  msg << (unset.size() == 1 ? " is" : " are") << " not; set all of them or none";
  MIH_THROW(Code::kInvalidSpec, msg.str());
}

void check_ranges(const World& w, std::string_view rank_var, std::string_view size_var,
                  std::string_view local_rank_var, std::string_view local_size_var) {
  MIH_CHECK(w.world_size >= 1, size_var, "=", w.world_size, ": expected a world size >= 1");
  MIH_CHECK(w.rank >= 0 && w.rank < w.world_size, rank_var, "=", w.rank, ": expected a rank in [0, ",
            size_var, "=", w.world_size, ")");
  MIH_CHECK(w.local_world_size >= 1 && w.local_world_size <= w.world_size, local_size_var, "=",
            w.local_world_size, ": expected a local world size in [1, ", size_var, "=", w.world_size, "]");
  MIH_CHECK(w.local_rank >= 0 && w.local_rank < w.local_world_size, local_rank_var, "=", w.local_rank,
            ": expected a local rank in [0, ", local_size_var, "=", w.local_world_size, ")");
}

// SLURM_TASKS_PER_NODE looks like "2(x3),1": 2 tasks on each of 3 nodes, then 1.
std::optional<int> slurm_tasks_on_node(const std::string& spec, int node_id) {
  std::istringstream in(spec);
  std::string item;
  int node = 0;
  while (std::getline(in, item, ',')) {
    int tasks = 0, repeat = 1;
    auto paren = item.find("(x");
    try {
      tasks = std::stoi(item.substr(0, paren));
      if (paren != std::string::npos) repeat = std::stoi(item.substr(paren + 2));
    } catch (const std::exception&) {
      return std::nullopt;
    }
    if (node_id < node + repeat) return tasks;
    node += repeat;
  }
  return std::nullopt;
}

World torchrun_world(const Env& env) {
  require_all_or_none(env, {"RANK", "WORLD_SIZE"}, "torchrun");
  require_all_or_none(env, {"LOCAL_RANK", "LOCAL_WORLD_SIZE"}, "torchrun");
  World w;
  w.source = LaunchSource::kTorchrun;
  w.rank = *parse_int(env, "RANK");
  w.world_size = *parse_int(env, "WORLD_SIZE");
  w.local_rank = parse_int(env, "LOCAL_RANK").value_or(w.rank);
  w.local_world_size = parse_int(env, "LOCAL_WORLD_SIZE").value_or(w.world_size);
  check_ranges(w, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE");
  return w;
}

World openmpi_world(const Env& env) {
  require_all_or_none(env, {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
                      "Open MPI");
  World w;
  w.source = LaunchSource::kOpenMpi;
  w.rank = *parse_int(env, "OMPI_COMM_WORLD_RANK");
  w.world_size = *parse_int(env, "OMPI_COMM_WORLD_SIZE");
  w.local_rank = *parse_int(env, "OMPI_COMM_WORLD_LOCAL_RANK");
  w.local_world_size = parse_int(env, "OMPI_COMM_WORLD_LOCAL_SIZE").value_or(w.world_size);
  check_ranges(w, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
               "OMPI_COMM_WORLD_LOCAL_SIZE");
  return w;
}

World slurm_world(const Env& env) {
  require_all_or_none(env, {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"}, "SLURM");
  World w;
  w.source = LaunchSource::kSlurm;
  w.rank = *parse_int(env, "SLURM_PROCID");
  w.world_size = *parse_int(env, "SLURM_NTASKS");
  w.local_rank = *parse_int(env, "SLURM_LOCALID");
  const std::string* per_node = find_env(env, "SLURM_STEP_TASKS_PER_NODE");
  if (!per_node) per_node = find_env(env, "SLURM_TASKS_PER_NODE");
  auto node_id = parse_int(env, "SLURM_NODEID");
  if (per_node && node_id) {
    auto tasks = slurm_tasks_on_node(*per_node, *node_id);
    MIH_CHECK(tasks.has_value(), "SLURM_TASKS_PER_NODE='", *per_node, "' has no entry for SLURM_NODEID=",
              *node_id, "; expected a list like '2(x3),1'");
    w.local_world_size = *tasks;
  } else if (auto n = parse_int(env, "SLURM_NTASKS_PER_NODE")) {
    w.local_world_size = *n;
  } else {
    MIH_THROW(Code::kInvalidSpec,
              "incomplete SLURM environment: SLURM_PROCID is set but neither SLURM_TASKS_PER_NODE with "
              "SLURM_NODEID nor SLURM_NTASKS_PER_NODE is; run the workers through srun");
  }
  check_ranges(w, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_TASKS_PER_NODE");
  return w;
}

// An outer launcher that started one task per rank and a torchrun-style RANK must agree.
void check_agrees(const Env& env, const World& w, std::string_view rank_var, std::string_view size_var) {
  auto size = parse_int(env, size_var);
  auto rank = parse_int(env, rank_var);
  if (!size || !rank || *size != w.world_size) return;
  MIH_CHECK(*rank == w.rank, "contradictory launcher environment: RANK=", w.rank, " but ", rank_var, "=",
            *rank, " with WORLD_SIZE=", w.world_size, " = ", size_var, "=", *size,
            "; unset one launcher's variables or make them agree");
}

}  // namespace

Env process_env() {
  Env env;
  for (char** e = environ; e && *e; ++e) {
    std::string_view entry(*e);
    auto eq = entry.find('=');
    if (eq == std::string_view::npos) continue;
    env.emplace(std::string(entry.substr(0, eq)), std::string(entry.substr(eq + 1)));
  }
  return env;
}

const std::string* find_env(const Env& env, std::string_view name) {
  auto it = env.find(std::string(name));
  return it == env.end() ? nullptr : &it->second;
}

std::string_view launch_source_name(LaunchSource source) {
  switch (source) {
    case LaunchSource::kSingleProcess: return "single-process";
    case LaunchSource::kTorchrun: return "torchrun";
    case LaunchSource::kSlurm: return "slurm";
    case LaunchSource::kOpenMpi: return "openmpi";
  }
  return "unknown";
}

World World::from_env(const Env& env) {
  World w;
  if (find_env(env, "RANK") || find_env(env, "WORLD_SIZE")) {
    w = torchrun_world(env);
    check_agrees(env, w, "SLURM_PROCID", "SLURM_NTASKS");
    check_agrees(env, w, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE");
  } else if (find_env(env, "OMPI_COMM_WORLD_RANK") || find_env(env, "OMPI_COMM_WORLD_SIZE")) {
    w = openmpi_world(env);
  } else if (find_env(env, "SLURM_PROCID")) {
    w = slurm_world(env);
  } else {
    require_all_or_none(env, {"LOCAL_RANK", "LOCAL_WORLD_SIZE"}, "torchrun");
    MIH_CHECK(!find_env(env, "LOCAL_RANK"), "LOCAL_RANK='", *find_env(env, "LOCAL_RANK"),
              "' is set without RANK and WORLD_SIZE; set RANK and WORLD_SIZE too");
  }
  if (const std::string* id = find_env(env, "TORCHELASTIC_RUN_ID")) {
    w.run_id = *id;
  } else if (const std::string* job = find_env(env, "SLURM_JOB_ID")) {
    const std::string* step = find_env(env, "SLURM_STEP_ID");
    w.run_id = *job + (step ? "." + *step : "");
  } else if (const std::string* job = find_env(env, "OMPI_MCA_ess_base_jobid")) {
    w.run_id = *job;
  }
  require_all_or_none(env, {"MASTER_ADDR", "MASTER_PORT"}, "rendezvous");
  if (const std::string* addr = find_env(env, "MASTER_ADDR")) {
    w.master_addr = *addr;
    w.master_port = *parse_int(env, "MASTER_PORT");
    MIH_CHECK(w.master_port > 0 && w.master_port < 65536, "MASTER_PORT=", w.master_port,
              ": expected a TCP port in [1, 65535]");
  }
  return w;
}

std::string World::describe() const {
  return internal::str("rank ", rank, " of ", world_size, " (local ", local_rank, " of ", local_world_size,
                       ") from ", launch_source_name(source),
                       source == LaunchSource::kSingleProcess ? "" : " variables");
}

}  // namespace mih
