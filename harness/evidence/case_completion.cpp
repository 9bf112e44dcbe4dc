// What a case directory's own records say of its run (case_completion_internal.h).
#include "harness/evidence/case_completion_internal.h"

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/contract/case_record.h"
#include "harness/contract/case_request.h"
#include "harness/base/error.h"
#include "harness/contract/evidence_layout.h"
#include "harness/base/json_fields.h"
#include "harness/evidence/evidence_store.h"

namespace mih {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

bool terminal(const std::string& state) { return state == "FAILED" || state == "BLOCKED"; }

// The "state" case_run.json recorded, or "" without a readable record.
std::string recorded_state(const fs::path& dir) {
  std::error_code ec;
  if (!fs::exists(dir / layout::kCaseRecord, ec)) return "";
  try {
    return read_case_record(dir / layout::kCaseRecord).state;
  } catch (const Error&) {
    return "";
  }
}

// environment.json's "variables" (the launcher's and scheduler's variables of rank 0), or {}.
json environment_variables(const fs::path& file) {
  std::error_code ec;
  if (!fs::exists(file, ec)) return json::object();
  try {
    const json env = read_json_file(file);
    if (env.is_object() && env.contains("variables") && env["variables"].is_object()) return env["variables"];
  } catch (const Error&) {
  }
  return json::object();
}

std::string string_of(const json& j, const char* key) {
  return j.is_object() && j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : std::string();
}

}  // namespace

CaseState read_case_state(const fs::path& dir) {
  CaseState out;
  const std::string recorded = recorded_state(dir);
  std::error_code ec;
  const bool has_file = fs::exists(dir / layout::kIntegrationState, ec);
  if (has_file) {
    const EvidenceDir evidence = EvidenceDir::open_existing(dir);
    const contract::IntegrationStateRecord record = IntegrationStateMachine(evidence).record();
    out.state = state_name(record.state);
    out.reason = record.reason ? *record.reason : std::string();  // a file that gives no reason
  }
  if (terminal(recorded) && out.state != recorded) {
    out.disagreement = std::string(layout::kCaseRecord) + " records that its run left the case " + recorded + ", while " +
                       layout::kIntegrationState + (has_file ? " says " + out.state : std::string(" is missing")) +
                       " (a state a run left FAILED or BLOCKED stays so)";
    out.state = recorded;
    out.reason.clear();
  } else if (!has_file && !recorded.empty() && recorded != "NONE") {
    out.disagreement = std::string(layout::kIntegrationState) + " is missing, though its run left the case " + recorded +
                       " (" + layout::kCaseRecord + ")";
    out.state = recorded;
  }
  return out;
}

bool launched_by_case_runner(const fs::path& dir) {
  std::error_code ec;
  const fs::path env_file = dir / layout::kEnvironment;
  if (!fs::exists(env_file, ec)) return false;
  json env;
  try {
    env = read_json_file(env_file);
  } catch (const Error&) {
    return false;  // the contract's validation names it
  }
  if (string_of(env, "launcher") != "mih") return false;
  // <case>/run/<phase>/store: only the case runner puts a launch's run directory in the case's.
  // The schema's optional "variables": without them (or the store's) the runner did not launch it.
  const fs::path store(string_of(environment_variables(env_file), "MIH_STORE_FILE"));
  const fs::path phase_dir = store.parent_path(), run_dir = phase_dir.parent_path();
  fs::path case_dir = fs::absolute(dir, ec).lexically_normal();
  if (case_dir.filename().empty()) case_dir = case_dir.parent_path();
  return store.filename() == layout::kStore && run_dir.filename() == layout::kRunDir &&
         run_dir.parent_path().filename() == case_dir.filename();
}

std::string why_requeued(const fs::path& dir) {
  for (const std::string& relative : {std::string(layout::kEnvironment), layout::before_save(layout::kEnvironment)}) {
    const std::string restarts = string_of(environment_variables(dir / relative), "SLURM_RESTART_COUNT");
    if (!restarts.empty() && restarts != "0") {
      return "SLURM requeued the job that ran it (" + relative + ": SLURM_RESTART_COUNT=" + restarts.substr(0, 20) +
             "): a second run was written over the first in the same case directory";
    }
  }
  return "";
}

std::string why_run_not_ended(const fs::path& dir) {
  if (std::string requeued = why_requeued(dir); !requeued.empty()) return requeued;
  CaseRequest request;
  try {
    request = read_case_request(dir / layout::kCaseRequest);
  } catch (const Error& e) {
    return std::string("its ") + layout::kCaseRequest + " cannot be read (" + e.message() + ")";
  }
  try {
    const CaseState state = read_case_state(dir);
    if (state.state == "FAILED" && !state.reason.empty() && state.disagreement.empty()) return "";
  } catch (const Error&) {
    // Judged by the ranks' records alone.
  }
  std::error_code ec;
  for (const auto& [phase, world_size] : case_phases(request.c)) {
    for (int64_t r = 0; r < world_size; ++r) {
      const fs::path timing = dir / layout::run_phase_dir(phase) / layout::timing_rank(static_cast<int>(r));
      if (!fs::exists(timing, ec)) {
        return "rank " + std::to_string(r) + " of its " + phase + " phase never reached its end (" +
               (fs::path(layout::run_phase_dir(phase)) / layout::timing_rank(static_cast<int>(r))).string() +
               " is missing): the run stopped mid-case";
      }
    }
  }
  return "";
}

}  // namespace mih
