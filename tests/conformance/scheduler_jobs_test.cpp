// The SLURM job states a verify-only run of a `mih submit` night reads (cases/scheduler_jobs.h):
// scontrol and sacct lines, the jobs of one case, and which states are infrastructure outcomes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/contract/case_request.h"
#include "harness/base/error.h"
#include "harness/contract/evidence_layout.h"
#include "harness/base/files.h"
#include "harness/evidence/scheduler_jobs.h"
#include "tests/support/temp_dir.h"

namespace mih {
namespace {

TEST(SchedulerJobsTest, ParsesScontrolAndSacctLines) {
  const auto states = parse_job_states(
      "JobId=2 JobName=mih:llama/Tp2Sp:train UserId=root(0) JobState=CANCELLED Reason=None ExitCode=0:15 Partition=debug\n"
      "slurm_load_jobs error: Invalid job id specified\n"
      "3|TIMEOUT|0:0\n"
      "3.batch|CANCELLED|0:15\n"
      "4|CANCELLED by 0|0:0\n"
      "JobID|State|ExitCode\n");
  ASSERT_EQ(states.size(), 3u);
  EXPECT_EQ(states.at("2"), std::make_pair(std::string("CANCELLED"), std::string("0:15")));
  EXPECT_EQ(states.at("3"), std::make_pair(std::string("TIMEOUT"), std::string("0:0")));  // not its step's
  EXPECT_EQ(states.at("4").first, "CANCELLED");
}

TEST(SchedulerJobsTest, JobsOfOneCaseWithStatesAndLogs) {
  const auto root = mih::testing::temp_dir("scheduler_jobs");
  write_file_atomic(root / layout::submit_jobs("llama"),
                    nlohmann::json({{"llama/Reference:train", "1"}, {"llama/Tp2Sp:train", "2"},
                                    {"llama/Tp2SpX:train", "5"}, {"llama:verify", "3"}})
                        .dump());
  write_file_atomic(root / layout::submit_states("llama"), "1|COMPLETED|0:0\n2|CANCELLED by 0|0:0\n");
  const auto jobs = submitted_jobs(root, "llama", "Tp2Sp");
  ASSERT_EQ(jobs.size(), 1u);  // not Tp2SpX's, not the verify job
  EXPECT_EQ(jobs[0].id, "2");
  EXPECT_EQ(jobs[0].state, "CANCELLED");
  EXPECT_EQ(jobs[0].log, root / layout::submit_log("llama", "Tp2Sp.train", "2"));
  EXPECT_TRUE(submitted_jobs(root, "llama", "DpShard2").empty());
  EXPECT_TRUE(submitted_jobs(root, "moe", "Tp2Sp").empty());
  write_file_atomic(root / layout::submit_jobs("llama"), "{\"llama/Tp2Sp:train\": \"2; rm -rf /\"}");
  EXPECT_THROW(submitted_jobs(root, "llama", "Tp2Sp"), Error);
}

TEST(SchedulerJobsTest, WhichStatesAreInfrastructure) {
  EXPECT_FALSE(job_is_infrastructure("COMPLETED", "0:0", true));
  for (const char* state : {"CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED"}) {
    EXPECT_TRUE(job_is_infrastructure(state, "0:0", true)) << state;  // partial evidence is never judged
  }
  EXPECT_FALSE(job_is_infrastructure("FAILED", "17:0", true));  // a rank raised in the model: its evidence says so
  EXPECT_FALSE(job_is_infrastructure("FAILED", "1:0", true));
  EXPECT_TRUE(job_is_infrastructure("FAILED", "15:0", true));  // a peer lost
  EXPECT_TRUE(job_is_infrastructure("FAILED", "14:0", true));  // a collective past its timeout
  EXPECT_TRUE(job_is_infrastructure("FAILED", "16:0", true));  // a rank crashed
  EXPECT_TRUE(job_is_infrastructure("FAILED", "0:9", true));   // killed by a signal
  EXPECT_TRUE(job_is_infrastructure("FAILED", "137:0", true));  // srun: a task SIGKILLed (128 + 9)
  EXPECT_TRUE(job_is_infrastructure("FAILED", "143:0", true));  // SIGTERM
  EXPECT_FALSE(job_is_infrastructure("FAILED", "128:0", true));
  EXPECT_FALSE(job_is_infrastructure("FAILED", "200:0", true));
  EXPECT_FALSE(job_is_infrastructure("FAILED", "1370:0", true));
  EXPECT_TRUE(job_is_infrastructure("FAILED", "1:0", false));
  EXPECT_FALSE(job_is_infrastructure("", "", true));  // forgotten by the scheduler, its ranks all ended: judged
  EXPECT_TRUE(job_is_infrastructure("", "", false));  // forgotten, and its run did not end (issue 53)
}

// Issue 53 item 10: what the case's own records say decides whether a night's case completed,
// never what the scheduler remembers. A resume on 2 then 1 rank, its job forgotten (no
// accounting, past MinJobAge): judged once every rank of both phases wrote its end, an
// infrastructure outcome naming the rank that did not; a requeued run is one whatever its job.
TEST(SchedulerJobsTest, ACaseWhoseRanksDidNotEndIsInfrastructureWhateverTheScheduler) {
  const auto root = mih::testing::temp_dir("scheduler_jobs_ended");
  const auto dir = layout::case_dir(root, "llama", "ResumeDpShard2ToReference");
  CaseRequest q;
  q.spec = "llama";
  q.c.name = "ResumeDpShard2ToReference";
  q.c.kind = spec::CaseKind::kCrossResume;
  q.c.group = "cross_resume";
  q.c.save_config = ParallelConfig{};
  q.c.save_config->dp_shard = 2;
  q.c.resume_at = 2;
  q.matrix = MatrixSource::parse("cpu-smoke");
  q.training_backend = "trainer";
  q.fingerprint = "0123456789abcdef";
  write_file_atomic(dir / layout::kCaseRequest, nlohmann::json(q).dump());
  write_file_atomic(dir / layout::kEnvironment, nlohmann::json({{"variables", {{"SLURM_JOB_ID", "7"}}}}).dump());
  write_file_atomic(root / layout::submit_jobs("llama"),
                    nlohmann::json({{"llama/ResumeDpShard2ToReference:save", "7"},
                                    {"llama/ResumeDpShard2ToReference:load", "8"}}).dump());
  write_file_atomic(root / layout::submit_states("llama"), "7|COMPLETED|0:0\n");  // 8: forgotten
  for (const auto& [phase, rank] : std::vector<std::pair<std::string, int>>{{"save", 0}, {"save", 1}, {"load", 0}}) {
    write_file_atomic(dir / layout::run_phase_dir(phase) / layout::timing_rank(rank), "{}");
  }
  EXPECT_FALSE(infrastructure_job(root, "llama", "ResumeDpShard2ToReference", dir).has_value());
  std::filesystem::remove(dir / layout::run_phase_dir("save") / layout::timing_rank(1));
  const auto cancelled = infrastructure_job(root, "llama", "ResumeDpShard2ToReference", dir);
  ASSERT_TRUE(cancelled.has_value()) << "a rank that never reached its end: judged from partial evidence";
  EXPECT_EQ(cancelled->id, "8");
  EXPECT_THAT(describe_job_failure(*cancelled),
              ::testing::AllOf(::testing::HasSubstr("has no state the scheduler still knows"),
                               ::testing::HasSubstr("rank 1 of its save phase never reached its end")));
  write_file_atomic(dir / layout::run_phase_dir("save") / layout::timing_rank(1), "{}");
  write_file_atomic(root / layout::submit_states("llama"), "7|COMPLETED|0:0\n8|COMPLETED|0:0\n");
  EXPECT_FALSE(infrastructure_job(root, "llama", "ResumeDpShard2ToReference", dir).has_value());
  write_file_atomic(dir / layout::kEnvironment,
                    nlohmann::json({{"variables", {{"SLURM_JOB_ID", "8"}, {"SLURM_RESTART_COUNT", "1"}}}}).dump());
  const auto requeued = infrastructure_job(root, "llama", "ResumeDpShard2ToReference", dir);
  ASSERT_TRUE(requeued.has_value()) << "a requeued run over the first one's evidence";
  EXPECT_THAT(describe_job_failure(*requeued), ::testing::HasSubstr("SLURM requeued the job that ran it"));
}

}  // namespace
}  // namespace mih
