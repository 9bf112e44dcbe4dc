// `mih`: the command table (commands.h) parsed with CLI11, then the layers below do the work.
#include "harness/cli/cli.h"

#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "harness/base/error.h"
#include "harness/base/version.h"
#include "harness/cli/commands.h"
#include "harness/compat/collectives.h"
#include "harness/runtime/cli_support.h"
#include "harness/runtime/worker.h"

namespace mih {
namespace cli {

std::string version_text() {
  return internal::str("mih ", harness_version(), " (build ", build_id().substr(0, 12), "; libtorch ",
                       compat::torch_version(), "; process-group backends:",
                       compat::backend_available(compat::BackendKind::kGloo) ? " gloo" : "",
                       compat::backend_available(compat::BackendKind::kNccl) ? " nccl" : "", ")");
}

namespace {

// Processes: the collectives self-test, any worker task's launch.
std::vector<Command> launch_rows() {
  return {
    {"selftest",
     "Launch N ranks, build the device mesh, run every collective (all_reduce sum/avg/max/min, all_gather, "
     "reduce_scatter sum/avg, broadcast, all_to_all, send/recv, barrier) on every mesh axis with float32, "
     "float64, bfloat16 and int64 tensors, check each value against an independent computation, and print "
     "a table (axis x op: ok, time). Under torchrun/srun instead: "
     "`torchrun --nproc-per-node=4 mih worker --run-dir DIR selftest --mesh cp=2,tp=2`.",
     setup_selftest},
    {"launch",
     "Launch N ranks of a worker task (see `mih worker --help` for the tasks) and report how each rank ended; "
     "arguments after the task name go to the task.",
     setup_launch},
  };
}

// A port against Hugging Face checkpoints and the original architecture, and a new port's project.
std::vector<Command> port_rows() {
  return {
    {"export",
     "Write a registered spec's initial weights as a Hugging Face checkpoint directory: config.json (the "
     "architecture's fields), model.safetensors (sharded with the index above --max-shard-size) under the "
     "key map's external names, the first global batch (batch.safetensors), the reference logits and loss "
     "(reference.safetensors) and mih_export.json, so an outside tool can load the port's weights and check "
     "its numbers.",
     setup_export},
    {"inspect",
     "Compare a local Hugging Face checkpoint directory with what a spec's port loads: every key through the "
     "key map (missing, unexpected, shape with a likely transpose named, dtype) and the config fields the spec "
     "declares. Writes inventory/{candidate,reference,structure_diff}.json and fingerprints.sha256 under --out; "
     "never downloads. Exit 0 only when nothing differs (the state becomes DISCOVERED), 1 otherwise.",
     setup_inspect},
    {"golden",
     "Write the golden of a spec (docs/golden.md): export it in float64 into --out/export, then run the golden "
     "producer (mih_golden.py, any Python with torch) on the export: the ORIGINAL architecture's loss, logits, "
     "hidden states, gradients and parameters after one step (golden.json, golden.safetensors), which `mih test "
     "--golden DIR` compares the port's reference with (MatchesOriginal). --impl builtin (default: the producer's "
     "own Llama, Qwen3, Mixtral/Qwen2-MoE/Qwen3-MoE, GPT-2), transformers (Hugging Face's from_pretrained, any "
     "architecture it has), or --plugin FILE (your own).",
     setup_golden},
    {"scaffold",
     "Write a new port's project into --out: a small working port on the harness layers (model.h, a tiny "
     "GPT-2-style decoder), its spec with every part filled and commented (spec.cpp), a CMakeLists.txt with "
     "find_package(mih) and its conformance binary, and a README; it builds and passes its cpu-smoke matrix as "
     "written. --out must be new, empty or an unedited earlier scaffold: mih never overwrites a file it did "
     "not write.",
     setup_scaffold},
  };
}

// What a spec would run, and evidence read: compared, validated against the contract.
std::vector<Command> reading_rows() {
  return {
    {"matrix",
     "Print the cases a conformance run would train a spec under, resolved from a preset or a JSON matrix file, "
     "without running them; cases the spec's topology cannot take are listed with the arithmetic.",
     setup_matrix},
    {"list", "List the registered specs and the case-matrix presets.", setup_list},
    {"compare",
     "Compare a case's evidence with a reference's (or last night's with tonight's): the inputs of every step, "
     "loss, grad norms, lr, and every watched tensor at every stage. Prints the first divergence (parameter, "
     "step, stage, errors, tolerance, file to open); exit 1 when any quantity diverges. Both directories must follow the "
     "evidence contract (docs/evidence.md; each side's writer is printed first): one that does not is refused, "
     "naming the file and field (exit 12).",
     setup_compare},
    {"validate",
     "mih validate <dir>...: check evidence against the evidence contract (docs/evidence.md; the schemas this mih "
     "compiled, installed in share/mih/schemas): each case directory, or every case directory of a run root. "
     "Prints each one's writer and counts, or its problems naming the file and field; exit 12 when any does not "
     "follow the contract. What a writer other than mih's session runs before `mih check` and `mih compare`.",
     setup_validate},
  };
}

// The conformance run: one case, a matrix under SLURM or here, its evidence checked, reported,
// its reduction paths; the fault catalog.
std::vector<Command> conformance_rows() {
  return {
    {"run",
     "Run one case of a matrix (its ranks as processes, a runtime validation session writing the evidence) and "
     "print where its evidence is and its state. Exit 1 when the case FAILED a check.",
     setup_run},
    {"submit",
     "Submit a spec's matrix to SLURM as batch jobs: one per case phase, whose ranks srun starts, each case "
     "after its reference and a resume's load after its save, and a final job after all of them (whatever "
     "their outcome) running `mih test --verify-only` and writing report.md, report.html and junit.xml. "
     "--dry-run prints the scripts and the dependency graph. Site settings come from --site FILE.",
     setup_submit},
    {"test",
     "Run the conformance suites of the linked specs: each case launched once, every suite asserting on its "
     "evidence. `mih test --help` lists the options (--evidence-root, --matrix, --verify-only, --case-timeout, "
     "...); --gtest_* flags go to GoogleTest (e.g. --gtest_filter='Llama/*.*/Tp2Sp').",
     setup_test, /*pass_through=*/true},
    {"check",
     "mih check <evidence> [--gtest_* ...]: assert the conformance suites on existing evidence without "
     "launching anything or writing into it: a case directory (<root>/<spec>/<case>) or a whole "
     "run root (the tests its results.jsonl records its run ran). Exit 1 when a suite fails, 12 when evidence is "
     "missing, of another run, or disagrees with the spec, tolerances, case or fault this mih compiled.",
     setup_check, /*pass_through=*/true},
    {"report",
     "Write the report of a conformance run: md (suites x cases tables and failures), junit (XML for CI) or "
     "html (tables, loss and grad-norm curves per case as inline SVG), each headed by the diagnosis across the "
     "matrix when a case failed (the features that separate failing from passing cases, a pair to rerun).",
     setup_report},
    {"reach",
     "mih reach <root> [--require-all]: which reduction paths of the runtime (how a gradient or loss term is "
     "summed across ranks: dense or expert, whole or an FSDP shard, over which axis) the run's cases took, from "
     "their evidence, and the smallest mesh that takes each one no case took. --require-all: exit 1 when a path "
     "the run's largest mesh could take was taken by no case, 12 when cases of the run have no evidence.",
     setup_reach},
    {"faults",
     "Run the fault catalog (docs/fault-catalog.md, F01-F44): each fault on the case where it manifests and its "
     "fault-free twin; report the suites that caught it, the finding codes, the first divergence, and the diagnosis "
     "across its contrast cases, which must name the catalog's feature (exit 1 otherwise). Options: "
     "--fault ID (repeatable), --json FILE, --out DIR (default mih-faults in the current directory), --case-timeout S, --list. "
     "Exit 0 when every fault is detected by the expected suite and every twin passes.",
     setup_faults},
  };
}

}  // namespace

const std::vector<Command>& commands() {
  static const std::vector<Command> table = [] {
    std::vector<Command> rows;
    for (auto family : {launch_rows, port_rows, reading_rows, conformance_rows}) {
      for (Command& c : family()) rows.push_back(std::move(c));
    }
    rows.push_back({"warm",
                    "mih warm [status|stop]: list or stop this user's warm servers. The `mih` command forks each "
                    "command from a server that has libtorch loaded already (started on first use, gone after "
                    "MIH_WARM_IDLE seconds idle, default 120); MIH_WARM=0 execs every command instead.",
                    setup_warm});
    return rows;
  }();
  return table;
}

}  // namespace cli

int cli_main(int argc, char** argv) {
  if (argc > 1 && std::string_view(argv[1]) == "worker") return worker_main(argc - 1, argv + 1);

  CLI::App app{
      "mih: model-integration conformance harness. Runs short real training steps of a model across parallel "
      "configurations on real c10d process groups and checks every declared invariant.",
      "mih"};
  app.set_version_flag("--version", cli::version_text());
  app.footer(exit_status_legend());
  const cli::Invocation inv{argc, argv};
  std::vector<std::pair<CLI::App*, cli::CommandRun>> runs;
  for (const auto& command : cli::commands()) {
    CLI::App* sub = app.add_subcommand(command.name, command.help);
    // A pass-through command parses its own options, --help included (which lists them).
    if (command.pass_through) sub->prefix_command()->set_help_flag();
    runs.emplace_back(sub, command.setup(*sub, inv));
  }
  app.add_subcommand("worker",
                     "Run one rank of a task; what launchers start (mih's own, or torchrun/srun/mpirun). "
                     "`mih worker --help` lists its options and tasks.")
      ->prefix_command();
  cli::name_unknown_subcommands(app);

  if (auto status = cli::parse_or_exit(app, argc, argv, "command")) return *status;
  try {
    for (auto& [sub, run] : runs) {
      if (sub->parsed()) return run();
    }
  } catch (...) {
    return cli::report_current_exception("mih");
  }
  return 0;
}

}  // namespace mih
