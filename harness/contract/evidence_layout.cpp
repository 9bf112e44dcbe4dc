// The evidence layout's path functions (see evidence_layout.h).
#include "harness/contract/evidence_layout.h"

#include <cstdio>

namespace mih::layout {
namespace {

std::string numbered(const std::string& prefix, int64_t n, const char* extension) {
  return prefix + std::to_string(n) + extension;
}

}  // namespace

std::filesystem::path case_dir(const std::filesystem::path& root, const std::string& spec, const std::string& case_name) {
  return root / spec / case_name;
}

std::filesystem::path case_lock(const std::filesystem::path& root, const std::string& spec, const std::string& case_name) {
  return root / spec / ("." + case_name + ".lock");
}

std::string before_save(const std::string& relative) { return std::string(kBeforeSave) + "/" + relative; }

std::string run_phase_dir(const std::string& phase) { return std::string(kRunDir) + "/" + phase; }
std::string timing_rank(int rank) { return numbered(kTimingRankPrefix, rank, ".json"); }
std::string fault_rank(int rank) { return numbered(kFaultRankPrefix, rank, ".json"); }
std::string init_from_failed_rank(int rank) { return numbered(kInitFromFailedPrefix, rank, ".json"); }

std::string invariants(const std::string& phase) {
  return std::string(kCheckDir) + "/" + kInvariantsPrefix + phase + ".json";
}

std::string checkpoint_event(const std::string& event, int rank) {
  return std::string(kCheckpointDir) + "/" + numbered(event + "_rank", rank, ".json");
}

std::string performance_rank(int rank) { return std::string(kRuntimeDir) + "/" + numbered("performance_rank", rank, ".jsonl"); }

namespace {
std::string runtime_step(const char* name, int64_t step) {
  return std::string(kRuntimeDir) + "/" + numbered(std::string(name) + "_step", step, ".json");
}
}  // namespace

std::string shared_state_step(int64_t step) { return runtime_step("shared_state", step); }
std::string modality_gradients_step(int64_t step) { return runtime_step("modality_gradients", step); }
std::string optimizer_layout_step(int64_t step) { return runtime_step("optimizer_layout", step); }
std::string replicas_step(int64_t step) { return runtime_step("replicas", step); }
std::string gradient_replicas_step(int64_t step) { return runtime_step("gradient_replicas", step); }
std::string submit_dir(const std::string& spec) { return std::string(kSubmitDir) + "/" + spec; }
std::string submit_jobs(const std::string& spec) { return submit_dir(spec) + "/jobs.json"; }
std::string submit_states(const std::string& spec) { return submit_dir(spec) + "/states.txt"; }
std::string submit_script(const std::string& spec, const std::string& job) { return submit_dir(spec) + "/" + job + ".sbatch"; }
std::string submit_log(const std::string& spec, const std::string& job, const std::string& id) {
  return submit_dir(spec) + "/" + job + "." + id + ".log";
}
std::string gradient_presence_step(int64_t step) { return runtime_step("gradient_presence", step); }
std::string tp_partial_gradients_step(int64_t step) { return runtime_step("tp_partial_gradients", step); }
std::string gradient_reductions_step(int64_t step) { return runtime_step("gradient_reductions", step); }
std::string invariants_step(int64_t step) { return runtime_step("invariants", step); }
std::string comm_expected_step(int64_t step) { return runtime_step("comm_expected", step); }

std::string rank_log(int rank) { return std::string(kLogsDir) + "/" + numbered(kRankPrefix, rank, ".log"); }
std::string rank_pid(int rank) { return std::string(kLogsDir) + "/" + numbered(kRankPrefix, rank, ".pid"); }
std::string rank_error(int rank) { return std::string(kErrorsDir) + "/" + numbered(kRankPrefix, rank, ".json"); }
std::string ledger_rank(int rank) { return std::string(kCommDir) + "/" + numbered(kLedgerPrefix, rank, ".jsonl"); }
std::string selftest_state_rank(int rank) { return numbered("state_rank", rank, ".json"); }

std::string checkpoint_rank_file(int rank) {
  char name[32];
  std::snprintf(name, sizeof(name), "rank%05d.safetensors", rank);
  return name;
}

std::string hf_shard(size_t i, size_t n) {
  char name[64];
  std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", i, n);
  return name;
}

std::string fault_matrix(const std::string& spec) { return std::string(kMatricesDir) + "/" + spec + ".json"; }
std::string twins_test_log(const std::string& spec) { return "mih_test_" + spec + ".log"; }
std::string contrast_test_log(int round) { return round ? numbered("mih_test_", round, ".log") : std::string(kTestLog); }

}  // namespace mih::layout
