// The SLURM jobs of a night submitted by `mih submit` (scheduler_jobs.h).
#include "harness/evidence/scheduler_jobs.h"

#include <algorithm>

#include <sstream>

#include <nlohmann/json.hpp>

#include "harness/base/error.h"
#include "harness/contract/evidence_layout.h"
#include "harness/base/files.h"
#include "harness/base/json_fields.h"
#include "harness/evidence/case_completion_internal.h"

namespace mih {
namespace fs = std::filesystem;
using nlohmann::json;

std::map<std::string, std::pair<std::string, std::string>> parse_job_states(const std::string& text) {
  std::map<std::string, std::pair<std::string, std::string>> out;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.size() > 65536) continue;
    if (line.rfind("JobId=", 0) == 0) {
      std::map<std::string, std::string> fields;
      std::istringstream words(line);
      for (std::string w; words >> w;) {
        const size_t eq = w.find('=');
        if (eq != std::string::npos) fields.emplace(w.substr(0, eq), w.substr(eq + 1));
      }
      if (!fields["JobId"].empty()) out[fields["JobId"]] = {fields["JobState"], fields["ExitCode"]};
      continue;
    }
    const size_t a = line.find('|'), b = a == std::string::npos ? a : line.find('|', a + 1);
    if (b == std::string::npos) continue;
    const std::string id = line.substr(0, a);
    if (id.empty() || id.find_first_not_of("0123456789") != std::string::npos) continue;  // "2.batch", a header
    std::string state = line.substr(a + 1, b - a - 1);
    state = state.substr(0, state.find(' '));  // "CANCELLED by 0"
    std::string code = line.substr(b + 1);
    code = code.substr(0, code.find('|'));
    out[id] = {state, code};
  }
  return out;
}

std::vector<SubmittedJob> submitted_jobs(const fs::path& root, const std::string& spec, const std::string& case_name) {
  std::vector<SubmittedJob> out;
  const fs::path jobs_file = root / layout::submit_jobs(spec);
  std::error_code ec;
  if (!fs::exists(jobs_file, ec)) return out;
  const json jobs = read_json_file(jobs_file);
  MIH_CHECK_CODE(jobs.is_object(), Code::kFailedPrecondition, "mih submit's record ", jobs_file.string(),
                 " is not a JSON object of job names and ids");
  std::map<std::string, std::pair<std::string, std::string>> states;
  std::string text;
  if (read_file(root / layout::submit_states(spec), &text)) states = parse_job_states(text);
  const std::string prefix = spec + "/" + case_name + ":";
  for (const auto& [name, id] : jobs.items()) {
    if (name.rfind(prefix, 0) != 0) continue;
    MIH_CHECK_CODE(id.is_string() && !id.get<std::string>().empty() &&
                       id.get<std::string>().find_first_not_of("0123456789") == std::string::npos,
                   Code::kFailedPrecondition, "mih submit's record ", jobs_file.string(), ": job '", name,
                   "' has no SLURM job id");
    SubmittedJob j;
    j.name = name;
    j.id = id.get<std::string>();
    const auto it = states.find(j.id);
    if (it != states.end()) j.state = it->second.first, j.exit_code = it->second.second;
    j.log = root / layout::submit_log(spec, case_name + "." + name.substr(prefix.size()), j.id);
    out.push_back(std::move(j));
  }
  return out;
}

bool job_is_infrastructure(const std::string& state, const std::string& exit_code, bool ended) {
  if (state == "COMPLETED") return false;
  if (state.empty()) return !ended;
  if (state != "FAILED" || !ended) return true;
  // FAILED with evidence: the model's failure unless a signal or a transport's status ended it.
  const size_t colon = exit_code.find(':');
  const std::string status = exit_code.substr(0, colon), signal = colon == std::string::npos ? "" : exit_code.substr(colon + 1);
  if (!signal.empty() && signal != "0") return true;
  // A shell's or srun's status for a task a signal killed: 128 + the signal (137: SIGKILL).
  if (status.size() == 3 && std::all_of(status.begin(), status.end(), [](char ch) { return ch >= '0' && ch <= '9'; })) {
    const int n = std::stoi(status);
    if (n > 128 && n <= 128 + 64) return true;
  }
  for (const Code c : {Code::kDeadlineExceeded, Code::kUnavailable, Code::kAborted}) {
    if (status == std::to_string(exit_status(c))) return true;
  }
  return false;
}

std::string describe_job_failure(const SubmittedJob& j) {
  return "SLURM job " + j.id + " (" + j.name + ") " +
         (!j.state.empty() ? "ended " + j.state + " (exit " + (j.exit_code.empty() ? "?" : j.exit_code) + ")"
          : j.incomplete.empty() ? std::string("has no state the scheduler still knows, and left no evidence")
                                 : std::string("has no state the scheduler still knows")) +
         (j.incomplete.empty() ? std::string() : "; its case did not complete: " + j.incomplete) + "; its log: " + j.log.string() + ". Rerun `mih submit` on this root: it resubmits what did not complete";
}

std::optional<SubmittedJob> infrastructure_job(const fs::path& root, const std::string& spec,
                                               const std::string& case_name, const fs::path& dir) {
  std::vector<SubmittedJob> jobs = submitted_jobs(root, spec, case_name);
  if (jobs.empty()) return std::nullopt;
  std::error_code ec;
  // What the case's own records say, not the scheduler's memory, decides whether it completed:
  // a job the scheduler forgot, or one it requeued over the same directory, left a run that
  // did not end (issue 53).
  const bool has_evidence = fs::exists(dir / layout::kEnvironment, ec);
  const std::string not_ended = has_evidence ? why_run_not_ended(dir) : "";
  const bool requeued = has_evidence && !why_requeued(dir).empty();
  for (SubmittedJob& j : jobs) {
    if (requeued || job_is_infrastructure(j.state, j.exit_code, has_evidence && not_ended.empty())) {
      j.incomplete = not_ended;
      return j;
    }
  }
  return std::nullopt;
}

}  // namespace mih
