// The launcher with real rank processes (this test binary re-executed as workers): a rank
// that exits 3, one killed by SIGSEGV, one that never enters a collective, one stuck in
// recv past the case timeout, one that never joins the rendezvous, a killed launcher; each
// is reported with the right rank and cause, and no process survives. Also the happy paths:
// file and TCP rendezvous, a command template (a fake srun) and torchrun-style external mode.
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <fstream>
#include <thread>

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "harness/base/error.h"
#include "harness/base/files.h"
#include "harness/runtime/launcher.h"
#include "harness/runtime/worker.h"
#include "tests/support/temp_dir.h"

namespace mih {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// ---- Worker tasks run by the rank processes ------------------------------------------------

DeviceMesh world_mesh(WorkerContext& ctx) {
  ParallelConfig dims;
  dims.dp_shard = ctx.world().world_size;
  return ctx.build_mesh(dims);
}

MIH_WORKER_TASK(test_exit3, "rank 1 exits 3; the others wait for it in a barrier") {
  DeviceMesh mesh = world_mesh(ctx);
  if (ctx.world().rank == 1) return 3;
  mesh.comm(MeshAxis::kWorld).barrier("waits_for_rank1");
  return 0;
}

MIH_WORKER_TASK(test_segv, "rank 2 prints a line and raises SIGSEGV") {
  DeviceMesh mesh = world_mesh(ctx);
  if (ctx.world().rank == 2) {
    std::printf("rank 2 about to crash\n");
    std::fflush(stdout);
    std::raise(SIGSEGV);
  }
  mesh.comm(MeshAxis::kWorld).barrier("waits_for_rank2");
  return 0;
}

MIH_WORKER_TASK(test_skip_collective, "rank 1 sleeps instead of entering the all_reduce") {
  DeviceMesh mesh = world_mesh(ctx);
  if (ctx.world().rank == 1) std::this_thread::sleep_for(std::chrono::minutes(10));
  at::Tensor t = at::ones({8});
  mesh.comm(MeshAxis::kWorld).all_reduce(t, ReduceOp::kSum, "grad_sync");
  return 0;
}

MIH_WORKER_TASK(test_stuck_in_recv, "rank 1 waits in recv for a send that never comes; the others in a barrier") {
  DeviceMesh mesh = world_mesh(ctx);
  Communicator& world = mesh.comm(MeshAxis::kWorld);
  if (ctx.world().rank == 1) {
    at::Tensor t = at::empty({4});
    world.recv(t, /*src=*/0, /*tag=*/7, "never_sent");
  }
  world.barrier("after_recv");
  return 0;
}

MIH_WORKER_TASK(test_never_joins, "rank 2 never reaches the rendezvous") {
  if (ctx.world().rank == 2) std::this_thread::sleep_for(std::chrono::minutes(10));
  DeviceMesh mesh = world_mesh(ctx);
  return 0;
}

MIH_WORKER_TASK(test_sleeper, "writes its pid to run_dir/pids/<rank> and sleeps") {
  write_file_atomic(ctx.run_dir() / "pids" / std::to_string(ctx.world().rank), std::to_string(::getpid()));
  std::this_thread::sleep_for(std::chrono::minutes(10));
  return 0;
}

MIH_WORKER_TASK(test_nested_launcher, "launches 2 test_sleeper ranks itself and waits for them",
                {"template", "launcher template for the inner ranks ('' = local)", ""}) {
  write_file_atomic(ctx.run_dir() / "launcher_pid", std::to_string(::getpid()));
  WorkerOptions o;
  o.run_dir = ctx.run_dir() / "inner";
  o.gloo_hostname = "127.0.0.1";
  LaunchOptions lo;
  lo.world_size = 2;
  lo.run_dir = o.run_dir;
  lo.command = worker_command("test_sleeper", o);
  lo.command_template = ctx.option("template");
  lo.extra_env = {{"MASTER_ADDR", "127.0.0.1"}};
  lo.timeout = std::chrono::minutes(5);
  launch(lo);
  return 0;
}

// ---- Helpers -------------------------------------------------------------------------------

std::filesystem::path fresh_run_dir(const std::string& name) { return testing::temp_dir("launcher/" + name); }

LaunchOptions options_for(const std::string& task, const std::string& name, int world_size,
                          std::chrono::milliseconds collective_timeout = std::chrono::seconds(30)) {
  WorkerOptions w;
  w.run_dir = fresh_run_dir(name);
  w.collective_timeout = collective_timeout;
  w.rendezvous_timeout = std::chrono::seconds(30);
  w.gloo_hostname = "127.0.0.1";
  LaunchOptions o;
  o.world_size = world_size;
  o.run_dir = w.run_dir;
  o.command = worker_command(task, w);
  o.timeout = std::chrono::seconds(60);
  o.grace = std::chrono::seconds(2);
  return o;
}

bool process_exists(pid_t pid) { return ::kill(pid, 0) == 0 || errno != ESRCH; }

::testing::AssertionResult NoRankSurvives(const LaunchResult& result) {
  for (const auto& r : result.ranks) {
    if (r.pid > 0 && process_exists(r.pid)) {
      return ::testing::AssertionFailure() << "rank " << r.rank << " (pid " << r.pid << ") is still alive";
    }
  }
  return ::testing::AssertionSuccess();
}

const RankOutcome& outcome(const LaunchResult& result, int rank) { return result.ranks.at(static_cast<size_t>(rank)); }

std::filesystem::path script(const char* name) { return std::filesystem::path(MIH_TEST_SOURCE_DIR) / name; }

// ---- Failures ------------------------------------------------------------------------------

TEST(LauncherCrashTest, RankThatExits3IsReportedAndTheOthersStopped) {
  LaunchResult r = launch(options_for("test_exit3", "exit3", 4));
  ASSERT_EQ(r.status, LaunchResult::Status::kRankFailed) << r.report();
  EXPECT_EQ(r.failed_rank, 1) << r.report();
  EXPECT_EQ(outcome(r, 1).state, RankOutcome::State::kExited);
  EXPECT_EQ(outcome(r, 1).exit_code, 3);
  EXPECT_EQ(r.code(), Code::kAborted);
  EXPECT_THAT(r.report(), HasSubstr("run failed: rank 1/4 exited with code 3"));
  for (int rank : {0, 2, 3}) EXPECT_FALSE(outcome(r, rank).ok()) << "rank " << rank << " cannot finish its barrier";
  EXPECT_LT(r.seconds, 30);
  EXPECT_TRUE(NoRankSurvives(r));
}

TEST(LauncherCrashTest, RankKilledBySigsegvIsReportedWithItsLogTail) {
  LaunchResult r = launch(options_for("test_segv", "segv", 4));
  ASSERT_EQ(r.status, LaunchResult::Status::kRankFailed) << r.report();
  EXPECT_EQ(r.failed_rank, 2) << r.report();
  EXPECT_EQ(outcome(r, 2).state, RankOutcome::State::kSignaled);
  EXPECT_EQ(outcome(r, 2).signal, SIGSEGV);
  EXPECT_THAT(r.report(), AllOf(HasSubstr("rank 2/4 killed by SIGSEGV"), HasSubstr("rank 2 about to crash")));
  EXPECT_TRUE(NoRankSurvives(r));
}

TEST(LauncherTimeoutTest, RankThatNeverEntersTheCollectiveIsNamedWhenTheOthersTimeOut) {
  LaunchResult r = launch(options_for("test_skip_collective", "skip", 4, std::chrono::milliseconds(2000)));
  ASSERT_EQ(r.status, LaunchResult::Status::kRankFailed) << r.report();
  EXPECT_NE(r.failed_rank, 1) << r.report();
  const RankOutcome& cause = outcome(r, r.failed_rank);
  EXPECT_EQ(cause.error_code, "deadline_exceeded") << r.report();
  EXPECT_THAT(cause.error_message, AllOf(HasSubstr("all_reduce on group 'world' (global ranks [0, 1, 2, 3]"),
                                         HasSubstr("did not complete within 2000 ms"), HasSubstr("grad_sync")));
  EXPECT_EQ(outcome(r, 1).state, RankOutcome::State::kStopped);
  EXPECT_THAT(r.diagnosis, AllOf(HasSubstr("rank(s) [1] never entered call #2 on axis 'world'"),
                                 HasSubstr("all_reduce.sum from grad_sync")));
  EXPECT_THAT(r.report(), HasSubstr("likely cause: rank(s) [1] never entered"));
  EXPECT_THAT(outcome(r, 1).last_activity, HasSubstr("last completed barrier"));
  EXPECT_LT(r.seconds, 30);
  EXPECT_TRUE(NoRankSurvives(r));
}

TEST(LauncherTimeoutTest, CaseTimeoutReportsWhatEachStuckRankWasDoing) {
  LaunchOptions o = options_for("test_stuck_in_recv", "hang", 4, std::chrono::minutes(5));
  // Long enough for 4 ranks to start and reach their collectives on 2 loaded cores.
  o.timeout = std::chrono::seconds(10);
  auto start = std::chrono::steady_clock::now();
  LaunchResult r = launch(o);
  double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_EQ(r.status, LaunchResult::Status::kTimedOut) << r.report();
  EXPECT_EQ(r.code(), Code::kDeadlineExceeded);
  EXPECT_LT(waited, 10 + 2 + 3) << "timeout + grace + slack";
  EXPECT_THAT(r.report(), HasSubstr("run timed out after 10.00 s; ranks still running were stopped: [0, 1, 2, 3]"));
  EXPECT_THAT(outcome(r, 1).last_activity, AllOf(HasSubstr("inside recv on axis 'world'"), HasSubstr("never_sent")));
  for (int rank : {0, 2, 3}) {
    EXPECT_THAT(outcome(r, rank).last_activity, HasSubstr("inside barrier on axis 'world'")) << "rank " << rank;
  }
  EXPECT_TRUE(NoRankSurvives(r));
}

TEST(LauncherTimeoutTest, RankThatNeverJoinsIsNamedByTheRendezvous) {
  LaunchOptions o = options_for("test_never_joins", "never_joins", 4);
  o.command = [] {
    WorkerOptions w;
    w.run_dir = fresh_run_dir("never_joins");
    // Longer than the start-up skew of 4 ranks on 2 loaded cores, so only rank 2 is late.
    w.rendezvous_timeout = std::chrono::milliseconds(8000);
    w.gloo_hostname = "127.0.0.1";
    return worker_command("test_never_joins", w);
  }();
  LaunchResult r = launch(o);
  ASSERT_EQ(r.status, LaunchResult::Status::kRankFailed) << r.report();
  EXPECT_NE(r.failed_rank, 2);
  const RankOutcome& cause = outcome(r, r.failed_rank);
  EXPECT_EQ(cause.error_code, "deadline_exceeded");
  EXPECT_THAT(cause.error_message,
              AllOf(HasSubstr("rendezvous 'run' timed out after 8000 ms: rank(s) [2] of 4 never joined"),
                    HasSubstr("joined: [0, 1, 3]")));
  EXPECT_EQ(outcome(r, 2).state, RankOutcome::State::kStopped);
  EXPECT_LT(r.seconds, 30);
  EXPECT_TRUE(NoRankSurvives(r));
}

// SIGKILL a launcher (run as a rank of this test's own launch): its ranks must die with it,
// not linger. Local ranks die by PR_SET_PDEATHSIG; ranks a template started (here through
// a fake srun) notice that the store the launcher hosted is gone, within about a second.
void ExpectRanksDieWithAKilledLauncher(const std::string& name, const std::string& inner_template) {
  WorkerOptions w;
  w.run_dir = fresh_run_dir(name);
  LaunchOptions o = options_for("test_nested_launcher", name, 1);
  o.run_dir = w.run_dir;
  o.command = worker_command("test_nested_launcher", w, {"--template", inner_template});
  const auto dir = o.run_dir;
  std::thread killer([dir] {
    for (int i = 0; i < 600; ++i) {
      std::string pid;
      if (read_file(dir / "launcher_pid", &pid) && std::filesystem::exists(dir / "inner" / "pids" / "1") &&
          std::filesystem::exists(dir / "inner" / "pids" / "0")) {
        ::kill(std::stoi(pid), SIGKILL);
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });
  LaunchResult r = launch(o);
  killer.join();
  ASSERT_EQ(r.status, LaunchResult::Status::kRankFailed) << r.report();
  EXPECT_EQ(outcome(r, 0).signal, SIGKILL);
  std::vector<pid_t> inner;
  for (int rank : {0, 1}) {
    std::string pid;
    ASSERT_TRUE(read_file(dir / "inner" / "pids" / std::to_string(rank), &pid));
    inner.push_back(std::stoi(pid));
  }
  for (int i = 0; i < 250 && (process_exists(inner[0]) || process_exists(inner[1])); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_FALSE(process_exists(inner[0])) << "pid " << inner[0];
  EXPECT_FALSE(process_exists(inner[1])) << "pid " << inner[1];
}

TEST(LauncherCrashTest, RanksDieWithAKilledLauncher) { ExpectRanksDieWithAKilledLauncher("nested", ""); }

TEST(LauncherCrashTest, TemplateRanksDieWithAKilledLauncher) {
  ExpectRanksDieWithAKilledLauncher("nested_template", script("fake_launcher.sh").string() + " srun 2 {cmd}");
}

// Without mih's launcher (torchrun, srun) the worker's own watchdog ends a rank past its
// case timeout, saying what it was doing.
TEST(LauncherCrashTest, WorkerWatchdogEndsARankPastItsCaseTimeout) {
  WorkerOptions w;
  w.run_dir = fresh_run_dir("watchdog");
  w.case_timeout = std::chrono::milliseconds(1500);
  LaunchOptions o = options_for("test_sleeper", "watchdog", 1);
  o.run_dir = w.run_dir;
  o.command = worker_command("test_sleeper", w);
  LaunchResult r = launch(o);
  ASSERT_EQ(r.status, LaunchResult::Status::kRankFailed) << r.report();
  EXPECT_EQ(outcome(r, 0).error_code, "deadline_exceeded");
  EXPECT_THAT(outcome(r, 0).error_message,
              HasSubstr("case timeout: rank 0 still running after 1500 ms, outside any collective"));
  EXPECT_LT(r.seconds, 15);
}

TEST(LauncherTest, RejectsBadOptionsBeforeStartingAnything) {
  LaunchOptions o = options_for("ping", "bad", 2);
  o.command_template = "srun -n 2";
  EXPECT_THAT([&] { launch(o); }, ::testing::ThrowsMessage<Error>(HasSubstr("has no '{cmd}' placeholder")));
  o = options_for("ping", "bad", 0);
  EXPECT_THAT([&] { launch(o); }, ::testing::ThrowsMessage<Error>(HasSubstr("world_size must be >= 1")));
  o = options_for("ping", "bad", 1);
  o.command = {"/nonexistent/mih-worker"};
  EXPECT_THAT([&] { launch(o); }, ::testing::ThrowsMessage<Error>(HasSubstr("cannot start rank 0")));
}

// ---- Happy paths ---------------------------------------------------------------------------

TEST(LauncherTest, FileRendezvousRunsEveryRank) {
  LaunchResult r = launch(options_for("ping", "file", 4));
  ASSERT_TRUE(r.ok()) << r.report();
  for (const auto& rank : r.ranks) EXPECT_TRUE(rank.ok());
  EXPECT_THAT(r.report(), HasSubstr("all 4 rank(s) exited 0"));
  EXPECT_TRUE(std::filesystem::exists(r.ranks[3].log));
  EXPECT_TRUE(NoRankSurvives(r));
}

TEST(LauncherTest, TcpRendezvousHostedByTheLauncher) {
  LaunchOptions o = options_for("ping", "tcp", 3);
  o.rendezvous = RendezvousKind::kTcp;
  LaunchResult r = launch(o);
  EXPECT_TRUE(r.ok()) << r.report();
}

TEST(LauncherTest, CommandTemplateStartsRanksUnderAFakeSrun) {
  LaunchOptions o = options_for("ping", "template", 3);
  o.command_template = script("fake_launcher.sh").string() + " srun 3 {cmd}";
  o.extra_env = {{"MASTER_ADDR", "127.0.0.1"}};
  LaunchResult r = launch(o);
  ASSERT_TRUE(r.ok()) << r.report() << tail_lines(r.ranks.front().log, 30);
  ASSERT_EQ(r.ranks.size(), 1u);
  EXPECT_EQ(r.ranks.front().rank, -1);
}

TEST(LauncherTest, CommandTemplateReportsARankThatFailed) {
  LaunchOptions o = options_for("test_exit3", "template_fail", 2, std::chrono::milliseconds(3000));
  o.command_template = script("fake_launcher.sh").string() + " srun 2 {cmd}";
  o.extra_env = {{"MASTER_ADDR", "127.0.0.1"}};
  LaunchResult r = launch(o);
  ASSERT_EQ(r.status, LaunchResult::Status::kRankFailed) << r.report();
  EXPECT_THAT(r.report(), HasSubstr("launcher command exited with code"));
}

TEST(LauncherTest, TemplateThatStartsNoRankFails) {
  LaunchOptions o = options_for("ping", "template_none", 2);
  o.command_template = "echo {cmd}";
  LaunchResult r = launch(o);
  ASSERT_EQ(r.status, LaunchResult::Status::kRankFailed) << r.report();
  EXPECT_THAT(r.diagnosis, HasSubstr("exited 0, but rank(s) [0, 1] of 2 never reported completion"));
}

TEST(LauncherTest, TemplateWithoutRankVariablesIsNamed) {
  LaunchOptions o = options_for("ping", "template_no_vars", 2);
  o.command_template = "{cmd}";  // one process, no rank variables
  LaunchResult r = launch(o);
  ASSERT_EQ(r.status, LaunchResult::Status::kRankFailed) << r.report();
  std::string text;
  ASSERT_TRUE(read_file(o.run_dir / "logs" / "launcher.log", &text));
  EXPECT_THAT(text, HasSubstr("the launcher started a run of 2 ranks, but this process sees rank 0 of 1"));
  EXPECT_THAT(text, HasSubstr("no rank variables are set"));
}

TEST(LauncherTest, RunDirectoryInUseIsRefused) {
  LaunchOptions first = options_for("test_sleeper", "busy", 1);
  first.timeout = std::chrono::seconds(20);
  std::thread running([&] { launch(first); });
  for (int i = 0; i < 400 && !std::filesystem::exists(first.run_dir / "pids" / "0"); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  LaunchOptions second = first;
  EXPECT_THAT([&] { launch(second); }, ::testing::ThrowsMessage<Error>(AllOf(
                                           HasSubstr("is in use by another launch (pid "), HasSubstr("--run-id"))));
  std::string pid;
  ASSERT_TRUE(read_file(first.run_dir / "pids" / "0", &pid));
  ::kill(std::stoi(pid), SIGKILL);  // end the first launch early
  running.join();
}

TEST(ShellQuoteTest, QuotesOnlyWhatNeedsIt) {
  EXPECT_EQ(shell_quote("abc/def-1.2=x"), "abc/def-1.2=x");
  EXPECT_EQ(shell_quote("a b"), "'a b'");
  EXPECT_EQ(shell_quote("it's"), "'it'\\''s'");
  EXPECT_EQ(shell_quote(""), "''");
}

}  // namespace
}  // namespace mih
