// `mih` subcommands: argument parsing with CLI11, then the runtime does the work.
#include "harness/cli/cli.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "harness/base/error.h"
#include "harness/base/files.h"
#include "harness/compat/collectives.h"
#include "harness/runtime/cli_support.h"
#include "harness/runtime/device_mesh.h"
#include "harness/runtime/launcher.h"
#include "harness/runtime/selftest.h"
#include "harness/runtime/worker.h"
#include "harness/cli/case_runner.h"
#include "harness/compare/compare.h"
#include "harness/evidence/report.h"
#include "harness/spec/case_matrix.h"
#include "reference_models/export_command.h"

namespace mih {
namespace {

std::string utc_now(const char* format) {
  std::time_t now = std::time(nullptr);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), format, std::gmtime(&now));
  return stamp;
}

std::string version_text() {
  return internal::str("mih 0.1.0 (libtorch ", compat::torch_version(), "; backends:",
                       compat::backend_available(compat::BackendKind::kGloo) ? " gloo" : "",
                       compat::backend_available(compat::BackendKind::kNccl) ? " nccl" : "", ")");
}

// Seconds on the command line, milliseconds inside; at least 1 ms (at_least(0.001) checks).
std::chrono::milliseconds to_ms(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(std::ceil(seconds * 1000)));
}

// Options shared by every subcommand that launches ranks.
struct LaunchFlags {
  int world_size = 2;
  std::string backend = "gloo";
  double timeout_s = 300;
  double collective_timeout_s = 60;
  double rendezvous_timeout_s = 60;
  int threads_per_rank = 1;
  std::string launcher_template;
  std::string rendezvous = "file";
  std::filesystem::path evidence_root = "mih-evidence";
  std::string run_id;

  void add_to(CLI::App& app) {
    app.add_option("-n,--world-size", world_size, "number of ranks")->check(cli::at_least(1))->capture_default_str();
    app.add_option("--backend", backend, "process-group backend")
        ->check(CLI::IsMember({"gloo", "nccl"}))
        ->capture_default_str();
    app.add_option("--timeout", timeout_s,
                   "seconds the whole run may take (rank start-up included); then every rank is stopped")
        ->check(cli::at_least(0.001))
        ->capture_default_str();
    app.add_option("--collective-timeout", collective_timeout_s, "seconds one collective may take")
        ->check(cli::at_least(0.001))
        ->capture_default_str();
    app.add_option("--rendezvous-timeout", rendezvous_timeout_s, "seconds a rank waits for the others to start")
        ->check(cli::at_least(0.001))
        ->capture_default_str();
    app.add_option("--threads-per-rank", threads_per_rank, "intra-op threads of torch and BLAS in each rank")
        ->check(cli::at_least(1))
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
    app.add_option("--run-id", run_id, "name of this run's directory (default: UTC time and pid)");
  }

  std::filesystem::path run_dir(const std::string& what) {
    if (run_id.empty()) run_id = utc_now("%Y%m%dT%H%M%SZ") + "-" + std::to_string(::getpid());
    return evidence_root / run_id / what;
  }

  WorkerOptions worker_options(const std::filesystem::path& run_dir) const {
    WorkerOptions o;
    o.run_dir = std::filesystem::absolute(run_dir);
    o.backend = compat::parse_backend(backend);
    MIH_CHECK_CODE(compat::backend_available(o.backend), Code::kUnimplemented, "backend '", backend,
                   "' is not available in this build (", version_text(), ")");
    o.collective_timeout = to_ms(collective_timeout_s);
    o.rendezvous_timeout = to_ms(rendezvous_timeout_s);
    if (launcher_template.empty()) o.gloo_hostname = "127.0.0.1";
    o.determinism.intra_op_threads = threads_per_rank;
    return o;
  }

  LaunchOptions launch_options(std::vector<std::string> command, const std::filesystem::path& run_dir) const {
    LaunchOptions o;
    o.world_size = world_size;
    o.command = std::move(command);
    o.run_dir = run_dir;
    o.timeout = to_ms(timeout_s);
    o.threads_per_rank = threads_per_rank;
    o.command_template = launcher_template;
    o.rendezvous = rendezvous == "tcp" ? RendezvousKind::kTcp : RendezvousKind::kFile;
    return o;
  }
};

// Writes run_dir/run.json: what was run, where and by what, and how it ended.
void write_run_record(const std::filesystem::path& run_dir, int argc, char** argv, const std::string& run_id,
                      const std::string& started, const LaunchResult& result) {
  std::vector<std::string> command(argv, argv + argc);
  char host[256] = {0};
  ::gethostname(host, sizeof(host) - 1);
  nlohmann::json record = {{"command", command},       {"run_id", run_id},
                           {"started_utc", started},   {"host", host},
                           {"mih", version_text()},    {"torch_version", compat::torch_version()},
                           {"launch", result}};
  write_file_atomic(run_dir / "run.json", record.dump(2) + "\n");
}

// "evidence: <dir> (run.json, logs/, comm/, selftest.json)", listing what exists.
void print_evidence(const std::filesystem::path& run_dir, double seconds) {
  std::string items;
  for (const char* name : {"run.json", "logs", "comm", "errors", "selftest.json"}) {
    if (!std::filesystem::exists(run_dir / name)) continue;
    items += (items.empty() ? "" : ", ") + std::string(name) +
             (std::filesystem::is_directory(run_dir / name) ? "/" : "");
  }
  std::printf("\nevidence: %s (%s); %.2f s\n", run_dir.string().c_str(), items.c_str(), seconds);
}

int run_selftest(LaunchFlags flags, const std::string& mesh_text, const SelftestOptions& selftest, int argc,
                 char** argv) {
  ParallelDims dims = mesh_text.empty() ? ParallelDims::spread(flags.world_size) : ParallelDims::parse(mesh_text);
  dims.validate(flags.world_size);  // before any rank starts
  MIH_CHECK(!selftest.dtypes.empty(), "selftest: --dtypes is empty; give at least one of float32, float64, "
                                      "bfloat16, int64");
  const std::string started = utc_now("%Y-%m-%dT%H:%M:%SZ");
  std::filesystem::path run_dir = flags.run_dir("selftest");
  std::string dtypes;
  for (const auto& d : selftest.dtypes) dtypes += (dtypes.empty() ? "" : ",") + d;
  std::vector<std::string> task_args = {"--repeats", std::to_string(selftest.repeats), "--dtypes", dtypes};
  if (dims.product() > 1) task_args.insert(task_args.end(), {"--mesh", dims.str()});
  LaunchOptions launch_options =
      flags.launch_options(worker_command("selftest", flags.worker_options(run_dir), task_args), run_dir);
  std::printf("mih selftest: %d rank(s), mesh %s, backend %s, run dir %s\n", flags.world_size,
              dims.product() > 1 ? dims.str().c_str() : "of one rank", flags.backend.c_str(), run_dir.string().c_str());
  std::fflush(stdout);
  LaunchResult result = launch(launch_options);
  write_run_record(run_dir, argc, argv, flags.run_id, started, result);

  std::string text;
  bool have_table = read_file(run_dir / "selftest.json", &text);
  bool checks_ok = false;
  if (have_table) {
    nlohmann::json summary = nlohmann::json::parse(text);
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

int run_launch(LaunchFlags flags, const std::string& task, const std::vector<std::string>& task_args, int argc,
               char** argv) {
  std::string valid;
  bool known = false;
  for (const auto& [name, help] : worker_tasks()) {
    known = known || name == task;
    valid += (valid.empty() ? "" : ", ") + name;
  }
  MIH_CHECK(known, "unknown worker task '", task, "'; valid: [", valid, "]");
  const std::string started = utc_now("%Y-%m-%dT%H:%M:%SZ");
  std::filesystem::path run_dir = flags.run_dir(task);
  LaunchOptions launch_options =
      flags.launch_options(worker_command(task, flags.worker_options(run_dir), task_args), run_dir);
  LaunchResult result = launch(launch_options);
  write_run_record(run_dir, argc, argv, flags.run_id, started, result);
  std::fprintf(result.ok() ? stdout : stderr, "%s", result.report().c_str());
  print_evidence(run_dir, result.seconds);
  return result.ok() ? 0 : exit_status(result.code());
}

ConformanceRunner g_conformance_runner = nullptr;
ConformanceRunner g_faults_runner = nullptr;

int run_conformance(const std::vector<std::string>& args) {
  MIH_CHECK_CODE(g_conformance_runner != nullptr, Code::kUnimplemented,
                 "this binary links no conformance suites (suites/ and a spec with MIH_CONFORMANCE_SUITES); use the "
                 "mih command or a binary made by mih_add_conformance_suite");
  return g_conformance_runner(args);
}

}  // namespace

void set_conformance_runner(ConformanceRunner runner) { g_conformance_runner = runner; }
void set_faults_runner(ConformanceRunner runner) { g_faults_runner = runner; }

int cli_main(int argc, char** argv) {
  if (argc > 1 && std::string_view(argv[1]) == "worker") return worker_main(argc - 1, argv + 1);

  CLI::App app{
      "mih: model-integration conformance harness. Runs short real training steps of a model across parallel "
      "configurations on real c10d process groups and checks every declared invariant.",
      "mih"};
  app.set_version_flag("--version", version_text());
  app.footer(exit_status_legend());

  LaunchFlags selftest_flags;
  selftest_flags.world_size = 4;
  std::string mesh_text;
  SelftestOptions selftest;
  CLI::App* selftest_cmd = app.add_subcommand(
      "selftest",
      "Launch N ranks, build the device mesh, run every collective (all_reduce sum/avg/max/min, all_gather, "
      "reduce_scatter sum/avg, broadcast, all_to_all, send/recv, barrier) on every mesh axis with float32, "
      "float64, bfloat16 and int64 tensors, check each value against an independent computation, and print "
      "a table (axis x op: ok, time). Under torchrun/srun instead: "
      "`torchrun --nproc-per-node=4 mih worker --run-dir DIR selftest --mesh cp=2,tp=2`.");
  selftest_flags.add_to(*selftest_cmd);
  selftest_cmd->add_option("--mesh", mesh_text,
                           "mesh degrees, e.g. dp_shard=2,tp=2 (axes dp_replicate, dp_shard, cp, tp; product = world "
                           "size; default: the world size's prime factors spread over tp, cp, dp_shard, "
                           "dp_replicate)");
  selftest_cmd->add_option("--repeats", selftest.repeats, "calls per (axis, op, dtype); the median time is shown")
      ->check(cli::at_least(1))
      ->capture_default_str();
  selftest_cmd->add_option("--dtypes", selftest.dtypes, "dtypes to test (float32 float64 bfloat16 int64 float16 int32 ...)")
      ->delimiter(',')
      ->capture_default_str();

  LaunchFlags launch_flags;
  std::string task;
  CLI::App* launch_cmd = app.add_subcommand(
      "launch",
      "Launch N ranks of a worker task (see `mih worker --help` for the tasks) and report how each rank ended; "
      "arguments after the task name go to the task.");
  launch_flags.add_to(*launch_cmd);
  launch_cmd->add_option("task", task, "worker task to run on every rank")->required();
  launch_cmd->prefix_command();

  std::string export_model = "llama", export_dtype = "float32";
  std::filesystem::path export_out, export_corpus = "/usr/share/common-licenses";
  int64_t export_seq = 64, export_batch = 2;
  uint64_t export_seed = 0;
  CLI::App* export_cmd = app.add_subcommand(
      "export",
      "Write a reference model's initial weights under Hugging Face key names (model.safetensors), its first "
      "global batch (batch.safetensors), the reference logits and loss (reference.safetensors) and config.json, "
      "so an outside tool can load the port's weights and check its numbers.");
  export_cmd->add_option("--spec", export_model, "reference model: llama, moe or vlm")->capture_default_str();
  export_cmd->add_option("--out", export_out, "output directory (created)")->required();
  export_cmd->add_option("--corpus", export_corpus, "text corpus directory")->capture_default_str();
  export_cmd->add_option("--seq", export_seq, "sequence length")->check(cli::at_least(1))->capture_default_str();
  export_cmd->add_option("--batch", export_batch, "global batch")->check(cli::at_least(1))->capture_default_str();
  export_cmd->add_option("--dtype", export_dtype, "float32 or float64")->capture_default_str();
  export_cmd->add_option("--seed", export_seed, "parameter init and data seed")->capture_default_str();

  std::string matrix_spec = "llama", matrix_source = "cpu-smoke";
  bool matrix_as_json = false;
  CLI::App* matrix_cmd = app.add_subcommand(
      "matrix",
      "Print the cases a conformance run would train a spec under, resolved from a preset or a JSON matrix file, "
      "without running them; cases the spec's topology cannot take are listed with the arithmetic.");
  matrix_cmd->add_option("--spec", matrix_spec, "registered spec (see `mih list`)")->capture_default_str();
  matrix_cmd->add_option("--preset,--matrix", matrix_source, "preset (cpu-smoke, cpu-full) or JSON matrix file")
      ->capture_default_str();
  matrix_cmd->add_flag("--json", matrix_as_json, "print the resolved matrix as JSON");
  CLI::App* list_cmd = app.add_subcommand("list", "List the registered specs and the case-matrix presets.");

  std::filesystem::path compare_reference, compare_candidate;
  CompareOptions compare_options;
  CLI::App* compare_cmd = app.add_subcommand(
      "compare",
      "Compare a case's evidence with a reference's (or last night's with tonight's): the inputs of every step, "
      "loss, grad norms, lr, and every watched tensor at every stage. Prints the first divergence (parameter, step, "
      "stage, errors, tolerance, file to open); exit 1 when any quantity diverges.");
  compare_cmd->add_option("reference", compare_reference, "reference evidence directory")->required();
  compare_cmd->add_option("candidate", compare_candidate, "evidence directory to check")->required();
  compare_cmd->add_option("--tolerance", compare_options.tolerance, "relative tolerance")->capture_default_str();
  compare_cmd->add_option("--from-step", compare_options.first_step, "compare steps from this one (a resume)")
      ->capture_default_str();

  CaseRunOptions run_options;
  run_options.evidence_root = "build/mih-evidence/manual";
  double run_timeout_s = 300;
  CLI::App* run_cmd = app.add_subcommand(
      "run",
      "Run one case of a matrix (its ranks as processes, a runtime validation session writing the evidence) and "
      "print where its evidence is and its state. Exit 1 when the case FAILED a check.");
  run_cmd->add_option("--spec", run_options.spec, "registered spec (see `mih list`)")->required();
  run_cmd->add_option("--case", run_options.case_name, "case name (see `mih matrix`)")->required();
  run_cmd->add_option("--preset,--matrix", run_options.matrix, "preset or JSON matrix file")->capture_default_str();
  run_cmd->add_option("--evidence-root", run_options.evidence_root, "evidence goes to <root>/<spec>/<case>")
      ->capture_default_str();
  run_cmd->add_option("--timeout", run_timeout_s, "seconds the whole case may take")
      ->check(cli::at_least(1.0))
      ->capture_default_str();

  run_cmd->add_option("--backend", run_options.backend, "training backend (MIH_REGISTER_BACKEND)")->capture_default_str();
  run_cmd->add_option("--fault", run_options.fault,
                      "inject a fault of the catalog (F01-F22, FAULTS.md) in the case's ranks (MIH_FAULT)");

  CLI::App* test_cmd = app.add_subcommand(
      "test",
      "Run the conformance suites of the linked specs: each case launched once, every suite asserting on its "
      "evidence. Options: --evidence-root DIR (default build/mih-evidence/<run id>), --matrix PRESET|FILE, "
      "--verify-only (assert on evidence produced elsewhere, launch nothing), --case-timeout S, --no-progress, "
      "and any --gtest_* flag (e.g. --gtest_filter='Llama/*.*/Tp2Sp').");
  test_cmd->prefix_command();
  CLI::App* check_cmd = app.add_subcommand(
      "check",
      "mih check <evidence> [--gtest_* ...]: assert the conformance suites on existing evidence without "
      "launching anything: a case directory (<root>/<spec>/<case>) or a whole run root. Exit 1 when a suite "
      "fails, 12 when evidence is missing or of another run.");
  check_cmd->prefix_command();

  std::string report_root, report_format = "md", report_out;
  CLI::App* report_cmd = app.add_subcommand(
      "report",
      "Write the report of a conformance run: md (suites x cases tables and failures), junit (XML for CI) or "
      "html (tables, loss and grad-norm curves per case as inline SVG).");
  report_cmd->add_option("root", report_root, "run root (holds results.jsonl)")->required();
  report_cmd->add_option("--format", report_format, "md, junit or html")->capture_default_str();
  report_cmd->add_option("-o,--output", report_out, "file to write (default: standard output)");

  CLI::App* faults_cmd = app.add_subcommand(
      "faults",
      "Run the fault catalog (FAULTS.md F01-F22): each fault on the case where it manifests and its fault-free "
      "twin; report the suites that caught it, the finding codes, the first divergence. Options: --fault ID "
      "(repeatable), --json FILE, --out DIR (default build/mih-faults), --case-timeout S, --list. Exit 0 when every "
      "fault is detected by the suite FAULTS.md names and every twin passes.");
  faults_cmd->prefix_command();

  app.add_subcommand("worker",
                     "Run one rank of a task; what launchers start (mih's own, or torchrun/srun/mpirun). "
                     "`mih worker --help` lists its options and tasks.")
      ->prefix_command();
  cli::name_unknown_subcommands(app);

  if (auto status = cli::parse_or_exit(app, argc, argv, "command")) return *status;
  try {
    if (selftest_cmd->parsed()) return run_selftest(selftest_flags, mesh_text, selftest, argc, argv);
    if (launch_cmd->parsed()) return run_launch(launch_flags, task, launch_cmd->remaining(), argc, argv);
    if (matrix_cmd->parsed()) {
      const spec::CaseMatrix m = spec::resolve_matrix_source(spec::SpecRegistry::instance().get(matrix_spec), matrix_source);
      std::printf("%s", matrix_as_json ? (m.to_json().dump(2) + "\n").c_str() : m.table().c_str());
      return 0;
    }
    if (compare_cmd->parsed()) {
      const Comparison c = compare_evidence(compare_reference, compare_candidate, compare_options);
      std::printf("%s\n", c.summary().c_str());
      return c.passed() ? 0 : 1;
    }
    if (run_cmd->parsed()) {
      run_options.timeout = std::chrono::milliseconds(static_cast<int64_t>(run_timeout_s * 1000));
      const CaseRunResult r = run_case(run_options);
      std::printf("%s/%s: %s (%s) in %.1f s\nevidence: %s\n", run_options.spec.c_str(), run_options.case_name.c_str(),
                  r.outcome.c_str(), r.state.c_str(), r.seconds, r.evidence.c_str());
      if (r.outcome == "transport_failure") {
        std::fprintf(stderr, "mih: infrastructure failure (not a conformance verdict):\n%s\n", r.error.c_str());
        return exit_status(r.code == Code::kOk ? Code::kAborted : r.code);
      }
      if (!r.error.empty()) std::fprintf(stderr, "mih: the case FAILED: %s\n", r.error.c_str());
      return r.state == "FAILED" ? 1 : 0;
    }
    if (test_cmd->parsed()) return run_conformance(test_cmd->remaining());
    if (faults_cmd->parsed()) {
      MIH_CHECK_CODE(g_faults_runner != nullptr, Code::kUnimplemented,
                     "mih faults: this binary does not link the conformance suites (suites/faults.cpp)");
      return g_faults_runner(faults_cmd->remaining());
    }
    if (check_cmd->parsed()) {
      const std::vector<std::string> rest = check_cmd->remaining();
      if (rest.empty() || rest[0].rfind("-", 0) == 0) {
        std::fprintf(stderr, "mih check: give the evidence to check first: a case directory or a run root\n");
        return 2;
      }
      std::vector<std::string> args = {"--check"};
      args.insert(args.end(), rest.begin(), rest.end());
      return run_conformance(args);
    }
    if (report_cmd->parsed()) {
      const std::string text = render_report(read_run_results(report_root), parse_report_format(report_format));
      if (report_out.empty()) {
        std::fwrite(text.data(), 1, text.size(), stdout);
      } else {
        write_file_atomic(report_out, text);
        std::printf("report: %s\n", report_out.c_str());
      }
      return 0;
    }
    if (list_cmd->parsed()) {
      std::printf("specs:\n");
      for (const auto& name : spec::SpecRegistry::instance().names()) {
        std::printf("  %-10s %s\n", name.c_str(), spec::SpecRegistry::instance().get(name).description.c_str());
      }
      std::printf("presets:\n");
      for (const auto& name : spec::preset_names()) std::printf("  %s\n", name.c_str());
      return 0;
    }
    if (export_cmd->parsed()) {
      return models::export_command(export_model, export_out, export_corpus, export_seq, export_batch, export_dtype,
                                    export_seed);
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "mih: %s error: %s\n", std::string(code_name(e.code())).c_str(), e.what());
    return exit_status(e.code());
  }
  return 0;
}

}  // namespace mih
