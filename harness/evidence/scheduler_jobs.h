// The SLURM jobs of a night: those `mih submit` recorded (<root>/.mih-submit/<spec>/jobs.json,
// harness/cli/submit_command.cpp) and the states its final job read from the scheduler
// (states.txt: `scontrol show job -o` or `sacct -P` lines), which a verify-only run
// (harness/cases/memo.cpp) and the report (report_read.cpp) turn into infrastructure outcomes.
#pragma once

#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace mih {

/// One job of a case, as the night recorded it.
struct SubmittedJob {
  std::string name;       ///< "llama/Tp2Sp:train"
  std::string id;         ///< SLURM's job id
  std::string state;      ///< "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT" ...; "" when states.txt lacks it
  std::string exit_code;  ///< "0:15" (status:signal), "" when unknown
  std::filesystem::path log;  ///< <root>/.mih-submit/<spec>/<case>.<phase>.<id>.log
  /// Why the case's own records do not say its run ended (infrastructure_job fills it in:
  /// "rank 1 of its train phase never reached its end ...", a SLURM requeue); "" when they do,
  /// or when the job left no evidence.
  std::string incomplete;
};

/// Job id -> (state, exit code) from the text of `scontrol show job -o` lines ("JobId=2 ...
/// JobState=CANCELLED ... ExitCode=0:15") and/or `sacct -n -P -o JobID,State,ExitCode` lines
/// ("2|CANCELLED by 0|0:15"; steps such as "2.batch" are left out). Other lines are ignored.
std::map<std::string, std::pair<std::string, std::string>> parse_job_states(const std::string& text);

/// The jobs of case `case_name` of spec `spec` that `mih submit` recorded under `root`, with
/// their states; empty when the case was not submitted by mih submit.
/// Throws: mih::Error{kFailedPrecondition} naming the file when jobs.json is not mih submit's.
std::vector<SubmittedJob> submitted_jobs(const std::filesystem::path& root, const std::string& spec,
                                         const std::string& case_name);

/// Whether a job that ended in `state` with `exit_code` ("status:signal") gives its case an
/// infrastructure outcome: every state but COMPLETED, except where the case's own records say
/// its run ended (`ended`: every rank wrote its end of every phase, or the session recorded
/// the model's failure) and the job FAILED with a status that is not a transport's (a rank
/// that raised in the model exits with its error's status, which the evidence records and the
/// suites judge), or the scheduler no longer knows the job (""). Evidence of a run that did not
/// end is never judged, whatever the scheduler remembers (issue 53). A signal (the exit code's
/// signal, or a status of 128 + the signal, as srun reports a task it killed), or the status
/// of a timeout (14), a lost peer (15) or a crashed rank (16), is the infrastructure's.
bool job_is_infrastructure(const std::string& state, const std::string& exit_code, bool ended);

/// "SLURM job 2 (llama/Tp2Sp:train) ended CANCELLED (exit 0:15); its log: <path>. Rerun `mih
/// submit` on this root: it resubmits what did not complete".
std::string describe_job_failure(const SubmittedJob& job);

/// The first job of case <spec>/<case> under `root` that gives it an infrastructure outcome
/// (job_is_infrastructure, with whether the records in the case's evidence directory `dir` say
/// its run ended), or null; every job of a case whose run SLURM requeued into the same
/// directory does (environment.json's SLURM_RESTART_COUNT), whatever its state.
std::optional<SubmittedJob> infrastructure_job(const std::filesystem::path& root, const std::string& spec,
                                               const std::string& case_name, const std::filesystem::path& dir);

}  // namespace mih
