// `mih selftest` and `mih launch`: N ranks of a worker task under mih's launcher (or a
// command template such as srun's), with the run's record and evidence listed at the end.
#include <algorithm>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "harness/base/error.h"
#include "harness/contract/evidence_layout.h"
#include "harness/base/files.h"
#include "harness/cli/commands.h"
#include "harness/compat/collectives.h"
#include "harness/runtime/cli_support.h"
#include "harness/runtime/launcher.h"
#include "harness/base/json_fields.h"
#include "harness/base/parallel_config.h"
#include "harness/runtime/selftest.h"
#include "harness/runtime/worker.h"
#include "harness/warm/warm.h"
#include "harness/base/strings.h"

namespace mih::cli {
namespace {

std::string utc_now(const char* format) {
  std::time_t now = std::time(nullptr);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), format, std::gmtime(&now));
  return stamp;
}

// Options shared by every subcommand that launches ranks.
struct LaunchFlags {
  int world_size = 2;
  std::string pg_backend = "gloo";
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  std::chrono::milliseconds collective_timeout{std::chrono::seconds(60)};
  std::chrono::milliseconds rendezvous_timeout{std::chrono::seconds(60)};
  int threads_per_rank = 1;
  std::string launcher_template;
  std::string rendezvous = "file";
  std::filesystem::path evidence_root = layout::kDefaultEvidenceRoot;
  std::string run_id;

  void add_to(CLI::App& app) {
    app.add_option("-n,--world-size", world_size, "number of ranks")->check(at_least(1))->capture_default_str();
    app.add_option("--pg-backend", pg_backend, "process-group backend")
        ->check(CLI::IsMember({"gloo", "nccl"}))
        ->capture_default_str();
    add_seconds(app, "--timeout", timeout, "how long the whole run may take (rank start-up included); then every rank is stopped");
    add_seconds(app, "--collective-timeout", collective_timeout, "how long one collective may take");
    add_seconds(app, "--rendezvous-timeout", rendezvous_timeout, "how long a rank waits for the others to start");
    app.add_option("--threads-per-rank", threads_per_rank, "intra-op threads of torch and BLAS in each rank")
        ->check(at_least(1))
        ->capture_default_str();
    app.add_option("--rendezvous", rendezvous,
                   "local runs: 'file' (FileStore in the run dir, no ports) or 'tcp' (TCPStore hosted by mih)")
        ->check(CLI::IsMember({"file", "tcp"}))
        ->capture_default_str();
    app.add_option("--launcher", launcher_template,
                   "command template that starts the ranks itself, with {cmd} for the rank command, e.g. "
                   "\"srun -N2 --ntasks-per-node=8 {cmd}\" (mih hosts the TCPStore they meet at)");
    app.add_option("--evidence-root", evidence_root, "where run directories are created (relative to the current "
                                                     "directory)")
        ->capture_default_str();
    app.add_option("--run-id", run_id, "name of this run's directory (default: UTC time and pid)")
        ->check(CLI::Validator(
            [](std::string& v) -> std::string {
              const bool safe = !v.empty() && v != "." && v != ".." && v.size() <= 128 &&
                                v.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-") ==
                                    std::string::npos;
              return safe ? "" : "a run id is one directory name under --evidence-root (letters, digits, '.', '_', "
                                 "'-'; at most 128), not a path: got '" + v + "'";
            },
            "NAME"));
  }

  std::filesystem::path run_dir(const std::string& what) {
    if (run_id.empty()) run_id = utc_now("%Y%m%dT%H%M%SZ") + "-" + std::to_string(::getpid());
    return evidence_root / run_id / what;
  }

  WorkerOptions worker_options(const std::filesystem::path& run_dir) const {
    WorkerOptions o;
    o.run_dir = std::filesystem::absolute(run_dir);
    o.pg_backend = compat::parse_backend(pg_backend);
    MIH_CHECK_CODE(compat::backend_available(o.pg_backend), Code::kUnimplemented, "process-group backend '", pg_backend,
                   "' is not available in this build (", version_text(), ")");
    o.collective_timeout = collective_timeout;
    o.rendezvous_timeout = rendezvous_timeout;
    if (launcher_template.empty()) o.gloo_hostname = "127.0.0.1";
    o.determinism.intra_op_threads = threads_per_rank;
    return o;
  }

  LaunchOptions launch_options(std::vector<std::string> command, const std::filesystem::path& run_dir) const {
    LaunchOptions o;
    o.world_size = world_size;
    o.command = std::move(command);
    o.run_dir = run_dir;
    o.timeout = timeout;
    o.threads_per_rank = threads_per_rank;
    o.command_template = launcher_template;
    o.rendezvous = rendezvous == "tcp" ? RendezvousKind::kTcp : RendezvousKind::kFile;
    o.extra_env["MIH_FAULT"] = "";  // mih launch injects no fault, whatever the shell exported
    return o;
  }
};

// Writes run_dir/run.json: what was run, where and by what, and how it ended.
void write_run_record(const std::filesystem::path& run_dir, const Invocation& inv, const std::string& run_id,
                      const std::string& started, const LaunchResult& result) {
  std::vector<std::string> command(inv.argv, inv.argv + inv.argc);
  char host[256] = {0};
  ::gethostname(host, sizeof(host) - 1);
  nlohmann::json record = {{"command", command},       {"run_id", run_id},
                           {"started_utc", started},   {"host", host},
                           {"mih", version_text()},    {"torch_version", compat::torch_version()},
                           {"launch", result}};
  write_file_atomic(run_dir / layout::kLaunchRecord, record.dump(2) + "\n");
}

// "evidence: <dir> (run.json, logs/, comm/, selftest.json)", listing what exists.
void print_evidence(const std::filesystem::path& run_dir, double seconds) {
  std::string items;
  for (const char* name : {layout::kLaunchRecord, layout::kLogsDir, layout::kCommDir, layout::kErrorsDir, layout::kSelftest}) {
    if (!std::filesystem::exists(run_dir / name)) continue;
    items += (items.empty() ? "" : ", ") + std::string(name) +
             (std::filesystem::is_directory(run_dir / name) ? "/" : "");
  }
  std::printf("\nevidence: %s (%s); %.2f s\n", run_dir.string().c_str(), items.c_str(), seconds);
}

int run_selftest(LaunchFlags flags, const std::string& mesh_text, const SelftestOptions& selftest,
                 const Invocation& inv) {
  const ParallelConfig mesh =
      mesh_text.empty() ? ParallelConfig::spread(flags.world_size) : ParallelConfig::parse_mesh(mesh_text);
  mesh.validate_mesh(flags.world_size);  // before any rank starts
  MIH_CHECK(!selftest.dtypes.empty(), "selftest: --dtypes is empty; give at least one of float32, float64, "
                                      "bfloat16, int64");
  const std::string started = utc_now("%Y-%m-%dT%H:%M:%SZ");
  std::filesystem::path run_dir = flags.run_dir("selftest");
  std::string dtypes = join(selftest.dtypes, ",");
  std::vector<std::string> task_args = {"--repeats", std::to_string(selftest.repeats), "--dtypes", dtypes};
  if (mesh.world_size() > 1) task_args.insert(task_args.end(), {"--mesh", mesh.mesh_str()});
  LaunchOptions launch_options =
      flags.launch_options(worker_command("selftest", flags.worker_options(run_dir), task_args), run_dir);
  std::printf("mih selftest: %d rank(s), mesh %s, process-group backend %s, run dir %s\n", flags.world_size,
              mesh.world_size() > 1 ? mesh.mesh_str().c_str() : "of one rank", flags.pg_backend.c_str(),
              run_dir.string().c_str());
  std::fflush(stdout);
  LaunchResult result = launch(launch_options);
  write_run_record(run_dir, inv, flags.run_id, started, result);

  std::string text;
  bool have_table = read_file(run_dir / layout::kSelftest, &text);
  bool checks_ok = false;
  if (have_table) {
    nlohmann::json summary = parse_json_strict(text, (run_dir / layout::kSelftest).string());
    checks_ok = summary.at("ok").get<bool>();
    std::printf("\n%s", format_selftest_table(summary).c_str());
  }
  if (!result.ok() && !(have_table && !checks_ok)) {
    std::fprintf(stderr, "\n%s", result.report().c_str());
  }
  print_evidence(run_dir, result.seconds);
  if (have_table && !checks_ok) return 1;
  return result.ok() ? 0 : exit_status(result.code());
}

int run_launch(LaunchFlags flags, const std::string& task, const std::vector<std::string>& task_args, int repeat,
               const Invocation& inv) {
  const auto& tasks = worker_tasks();
  const bool known = std::any_of(tasks.begin(), tasks.end(), [&](const auto& row) { return row.first == task; });
  MIH_CHECK(known, "unknown worker task '", task, "'; valid: [",
            join(tasks, ", ", [](const auto& row) { return row.first; }), "]");
  // --repeat K: K launches in a row from this one process (launch<k>/ each), e.g. to measure
  // what a launch costs once the parent is up, or that nothing of one launch reaches the next.
  int status = 0;
  for (int k = 1; k <= repeat && status == 0; ++k) {
    const std::string started = utc_now("%Y-%m-%dT%H:%M:%SZ");
    std::filesystem::path run_dir = flags.run_dir(task);
    if (repeat > 1) run_dir /= "launch" + std::to_string(k);
    LaunchOptions launch_options =
        flags.launch_options(worker_command(task, flags.worker_options(run_dir), task_args), run_dir);
    LaunchResult result = launch(launch_options);
    write_run_record(run_dir, inv, flags.run_id, started, result);
    std::fprintf(result.ok() ? stdout : stderr, "%s", result.report().c_str());
    print_evidence(run_dir, result.seconds);
    status = result.ok() ? 0 : exit_status(result.code());
  }
  return status;
}

}  // namespace

CommandRun setup_selftest(CLI::App& sub, const Invocation& inv) {
  auto flags = std::make_shared<LaunchFlags>();
  flags->world_size = 4;
  auto mesh_text = std::make_shared<std::string>();
  auto selftest = std::make_shared<SelftestOptions>();
  flags->add_to(sub);
  sub.add_option("--mesh", *mesh_text,
                 "mesh degrees, e.g. dp_shard=2,tp=2 (axes pp, dp_replicate, dp_shard, cp, tp, outer to inner; product = world size; "
                 "ep=N carves expert parallelism out of dp_shard x cp and must divide dp_shard * cp; default: the world size's prime factors spread over tp, cp, dp_shard, dp_replicate)");
  sub.add_option("--repeats", selftest->repeats, "calls per (axis, op, dtype); the median time is shown")
      ->check(at_least(1))
      ->capture_default_str();
  sub.add_option("--dtypes", selftest->dtypes, "dtypes to test (float32 float64 bfloat16 int64 float16 int32 ...)")
      ->delimiter(',')
      ->capture_default_str();
  return [=] { return run_selftest(*flags, *mesh_text, *selftest, inv); };
}

CommandRun setup_launch(CLI::App& sub, const Invocation& inv) {
  auto flags = std::make_shared<LaunchFlags>();
  auto task = std::make_shared<std::string>();
  flags->add_to(sub);
  auto repeat = std::make_shared<int>(1);
  sub.add_option("--repeat", *repeat, "launch the run this many times in a row (run directories launch1, launch2, ...)")
      ->check(at_least(1))
      ->capture_default_str();
  sub.add_option("task", *task, "worker task to run on every rank")->required();
  sub.prefix_command();
  CLI::App* app = &sub;
  return [=] { return run_launch(*flags, *task, app->remaining(), *repeat, inv); };
}

CommandRun setup_warm(CLI::App& sub, const Invocation&) {
  auto action = std::make_shared<std::string>("status");
  sub.add_option("action", *action, "status: list this user's warm servers; stop: stop them (running commands finish)")
      ->check(CLI::IsMember({"status", "stop"}))
      ->capture_default_str();
  return [action] { return warm::warm_command({*action}); };
}

}  // namespace mih::cli
