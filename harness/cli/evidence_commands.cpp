// The commands over specs, matrices and evidence: `mih list`, `mih matrix`, `mih run` (one
// case), `mih compare`, `mih report`, `mih export` and `mih inspect`.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/base/error.h"
#include "harness/contract/evidence_layout.h"
#include "harness/base/files.h"
#include "harness/base/json_fields.h"
#include "harness/cases/case_runner.h"
#include "harness/runtime/worker.h"
#include "harness/cases/hf_interop.h"
#include "harness/cases/memo.h"
#include "harness/cli/commands.h"
#include "harness/compare/compare.h"
#include "harness/contract/contract.h"
#include "harness/evidence/report.h"
#include "harness/runtime/cli_support.h"
#include "harness/runtime/launcher.h"
#include "harness/spec/case_matrix.h"
#include "harness/spec/model_spec.h"
#include "harness/base/strings.h"

namespace mih::cli {
namespace {

// The case `name` of `matrix`; a case the matrix rejected is named with the reason.
const spec::Case& case_named(const spec::CaseMatrix& matrix, const std::string& name) {
  for (const auto& r : matrix.rejected) {
    MIH_CHECK(r.name != name, "case '", name, "' of matrix '", matrix.name, "' cannot run spec '", matrix.spec,
              "': ", r.reason, " (`mih matrix --spec ", matrix.spec, " --matrix ", matrix.name, "` lists the cases)");
  }
  return matrix.at(name);
}

}  // namespace

CommandRun setup_export(CLI::App& sub, const Invocation&) {
  struct Flags {
    std::string spec = "llama";
    cases::HfExportOptions o;
  };
  auto f = std::make_shared<Flags>();
  sub.add_option("--spec", f->spec, "registered spec (see `mih list`)")->capture_default_str();
  sub.add_option("--out", f->o.out, "output directory (created)")->required();
  sub.add_option("--dtype", f->o.dtype, "float32, float64 or bfloat16 (the weights' dtype)")->capture_default_str();
  sub.add_option("--seed", f->o.seed, "parameter init seed")->capture_default_str();
  sub.add_option("--init-from", f->o.init_from,
                 "take the weights from this Hugging Face checkpoint directory (through the key map) instead of the "
                 "seed's initialization")
      ->check(cli::non_empty_path());
  sub.add_option("--max-shard-size", f->o.max_shard_bytes,
                 "bytes of weights per file; above it model-0000i-of-0000n.safetensors and the index")
      ->check(at_least(1))
      ->capture_default_str();
  return [f] {
    const spec::ModelSpec s = spec::SpecRegistry::instance().get(f->spec);
    const cases::HfExportResult r = cases::export_hf(s, f->o);
    std::string files;
    for (const auto& w : r.weight_files) files += w + ", ";
    std::printf("mih export: spec %s (%s) -> %s: config.json (%s), %s%zu tensors under their Hugging Face keys; "
                "batch.safetensors, reference.safetensors (%sloss %.6f), mih_export.json\n",
                f->spec.c_str(), f->o.dtype.c_str(), f->o.out.c_str(), s.checkpoint.hf.model_type.c_str(),
                files.c_str(), r.tensors, r.logits ? "logits, " : "", r.loss);
    for (const auto& [fqn, alias] : r.aliases) {
      std::printf("mih export: '%s' is '%s' (a declared tie): written once, under the key(s) of '%s'\n", alias.c_str(),
                  fqn.c_str(), fqn.c_str());
    }
    return 0;
  };
}

CommandRun setup_inspect(CLI::App& sub, const Invocation&) {
  struct Flags {
    std::string spec = "llama";
    bool as_json = false;
    cases::HfInspectOptions o;
  };
  auto f = std::make_shared<Flags>();
  sub.add_option("--spec", f->spec, "registered spec (see `mih list`)")->capture_default_str();
  sub.add_option("--hf-dir", f->o.checkpoint, "local Hugging Face checkpoint directory (config.json, safetensors)")
      ->required();
  sub.add_option("--out", f->o.out, "evidence directory for the inventory (default mih-evidence/inspect/<spec>)");
  sub.add_option("--dtype", f->o.dtype, "the dtype the port loads the weights in")->capture_default_str();
  sub.add_flag("--json", f->as_json, "print the structure diff as JSON");
  return [f] {
    const spec::ModelSpec s = spec::SpecRegistry::instance().get(f->spec);
    if (f->o.out.empty()) f->o.out = std::filesystem::path(layout::kDefaultEvidenceRoot) / layout::kInspectDir / f->spec;
    const cases::HfInspectResult r = cases::inspect_hf(s, f->o);
    if (f->as_json) {
      std::printf("%s\n", r.diff.dump(2).c_str());
      return r.differences == 0 ? 0 : 1;
    }
    const auto& d = r.diff;
    std::printf("mih inspect: spec %s vs %s: %zu of %zu tensors match, %zu in the checkpoint; config %s; %zu "
                "difference%s\n",
                f->spec.c_str(), d["checkpoint"].get<std::string>().c_str(), r.matched,
                d["expected_tensors"].get<size_t>(), d["checkpoint_tensors"].get<size_t>(),
                !d["config_compared"].get<bool>()          ? "not compared (the spec declares no Hugging Face config)"
                : d["config_differences"].empty()          ? "agrees"
                                                           : "differs",
                r.differences, r.differences == 1 ? "" : "s");
    // A checkpoint may list 65,536 unexpected tensors: the terminal gets the first kShown
    // differences, structure_diff.json (and --json) every one.
    constexpr size_t kShown = 50;
    std::vector<std::string> lines;
    auto add = [&](const std::string& line) {
      if (lines.size() < kShown) lines.push_back(line);
    };
    for (const auto& m : d["missing_keys"]) {
      add("missing key     " + m["key"].get<std::string>() + " (from " + m["fqn"].get<std::string>() + ", shape " +
          m["shape"].dump() + ")");
    }
    for (const auto& u : d["unexpected_keys"]) {
      add("unexpected key  " + u["key"].get<std::string>() + " (shape " + u["shape"].dump() + ", " +
          u["file"].get<std::string>() + "): no parameter maps to it and it is not inference-only");
    }
    for (const auto& k : {"shape_mismatches", "dtype_differences"}) {
      for (const auto& m : d[k]) {
        add(std::string(std::string(k) == "shape_mismatches" ? "shape          " : "dtype          ") + " " +
            m["key"].get<std::string>() + " (from " + m["fqn"].get<std::string>() + "): " + m["why"].get<std::string>());
      }
    }
    for (const auto& c : d["config_differences"]) {
      add("config field    " + c["field"].get<std::string>() + ": " + c["why"].get<std::string>());
    }
    for (const auto& line : lines) std::printf("  %s\n", line.c_str());
    if (r.differences > lines.size()) {
      std::printf("  ... and %zu more differences: every one in %s (or --json)\n", r.differences - lines.size(),
                  (f->o.out / layout::kStructureDiff).c_str());
    }
    for (const auto& w : d["config_warnings"]) {
      std::printf("  warning: config field %s: %s\n", w["field"].get<std::string>().c_str(), w["why"].get<std::string>().c_str());
    }
    std::printf("inventory: %s (candidate.json, reference.json, structure_diff.json, fingerprints.sha256)%s\n",
                (f->o.out / layout::kInventoryDir).c_str(), r.differences == 0 ? "; state DISCOVERED" : "");
    return r.differences == 0 ? 0 : 1;
  };
}

CommandRun setup_matrix(CLI::App& sub, const Invocation&) {
  struct Flags {
    std::string spec = "llama", source = "cpu-smoke";
    bool as_json = false;
  };
  auto f = std::make_shared<Flags>();
  sub.add_option("--spec", f->spec, "registered spec (see `mih list`)")->capture_default_str();
  sub.add_option("--preset,--matrix", f->source, "preset (cpu-smoke, cpu-smoke-variants, cpu-smoke-documents, cpu-precision, cpu-full, gpu-smoke; @<dtype>[,seed=N] sets the lane) or JSON matrix file")
      ->capture_default_str();
  sub.add_flag("--json", f->as_json, "print the resolved matrix as JSON");
  return [f] {
    const spec::CaseMatrix m = spec::resolve_matrix_source(spec::SpecRegistry::instance().get(f->spec), f->source);
    std::printf("%s", f->as_json ? (m.to_json().dump(2) + "\n").c_str() : m.table().c_str());
    for (const auto& c : m.cases) {
      if (const std::string w = cases::local_launch_warning(f->spec, c); !w.empty()) std::fprintf(stderr, "%s\n", w.c_str());
    }
    // The references, noise twin and controls mih adds check nothing the matrix asked for.
    if (m.listed.empty()) {
      std::string rejected = join(m.rejected, "; ", [](const auto& r) { return r.name + " (" + r.reason + ")"; });
      std::fprintf(stderr, "mih matrix: invalid_spec error: matrix '%s' lists no case spec '%s' can run; rejected: %s; "
                   "change the cases or max_world_size\n", m.name.c_str(), f->spec.c_str(), rejected.c_str());
      return exit_status(Code::kInvalidSpec);
    }
    return 0;
  };
}

CommandRun setup_list(CLI::App&, const Invocation&) {
  return [] {
    std::printf("specs:\n");
    for (const auto& name : spec::SpecRegistry::instance().names()) {
      std::printf("  %-10s %s\n", name.c_str(), spec::SpecRegistry::instance().get(name).description.c_str());
    }
    std::printf("presets:\n");
    for (const auto& name : spec::preset_names()) std::printf("  %s\n", name.c_str());
    return 0;
  };
}

CommandRun setup_compare(CLI::App& sub, const Invocation&) {
  struct Flags {
    std::filesystem::path reference, candidate;
    CompareOptions options;
  };
  auto f = std::make_shared<Flags>();
  sub.add_option("reference", f->reference, "reference evidence directory")->required();
  sub.add_option("candidate", f->candidate, "evidence directory to check")->required();
  CLI::Option* tolerance =
      sub.add_option("--tolerance", f->options.tolerance,
                     "relative tolerance (a finite number >= 0; default: this mih's cross-topology tolerance for the "
                     "candidate's dtype: float64 1e-10, float32 1e-3, bfloat16 5e-2)")
          ->check(at_least(0.0));
  sub.add_option("--from-step", f->options.first_step, "compare steps from this one (a resume)")
      ->capture_default_str()
      ->check(integer_in(0, std::numeric_limits<int64_t>::max()));
  return [f, tolerance] {
    // Nothing is compared that the contract does not describe: a foreign writer's evidence is
    // welcome, a damaged or edited file is refused before it is read.
    for (const auto* side : {&f->reference, &f->candidate}) {
      std::error_code ec;
      MIH_CHECK_CODE(std::filesystem::exists(*side / layout::kEnvironment, ec) ||
                         std::filesystem::exists(*side / layout::kCaseRecord, ec),
                     Code::kFailedPrecondition, "evidence directory ", side->string(), " has no ", layout::kEnvironment,
                     " and no ", layout::kCaseRecord, ": it is not a case directory; give <root>/<spec>/<case>");
      const contract::Validation v = contract::require_valid_case_dir(
          *side, "compare only evidence that does: rerun its case, or fix the writer that produced it");
      std::printf("%s: %s, written by %s (%d files, %d values valid)\n", side == &f->reference ? "reference" : "candidate",
                  side->string().c_str(), v.writer.c_str(), v.files, v.values);
    }
    if (tolerance->count() == 0) {
      // The candidate's dtype (config.resolved.json, else environment.json's case) picks this
      // mih's default; evidence never sets a tolerance itself.
      std::string dtype;
      for (const auto& [file, pointer] : {std::pair<const char*, const char*>{layout::kConfigResolved, "/dtype"},
                                          {layout::kEnvironment, "/case/config/dtype"}}) {
        if (!dtype.empty() || !std::filesystem::exists(f->candidate / file)) continue;
        const nlohmann::json j = read_json_file(f->candidate / file);
        const nlohmann::json::json_pointer at(pointer);
        if (j.contains(at) && j[at].is_string()) dtype = j[at].get<std::string>();
      }
      const spec::Tolerances defaults;
      const auto it = defaults.cross_topology.find(dtype.empty() ? "float64" : dtype);
      MIH_CHECK_CODE(it != defaults.cross_topology.end(), Code::kFailedPrecondition, "evidence ",
                     f->candidate.string(), " is of dtype '", dtype, "', which has no default tolerance here: pass --tolerance");
      f->options.tolerance = it->second;
      std::printf("tolerance %g (%s's cross-topology default; --tolerance sets another)\n", it->second,
                  dtype.empty() ? "float64" : dtype.c_str());
    }
    const Comparison c = compare_evidence(f->reference, f->candidate, f->options);
    std::printf("%s\n", c.summary().c_str());
    return c.passed() ? 0 : 1;
  };
}

CommandRun setup_validate(CLI::App& sub, const Invocation&) {
  auto dirs = std::make_shared<std::vector<std::filesystem::path>>();
  sub.add_option("dir", *dirs, "case directories (<root>/<spec>/<case>) or run roots")->required()->check(cli::non_empty_path());
  return [dirs] {
    namespace fs = std::filesystem;
    std::vector<fs::path> cases;
    for (const fs::path& dir : *dirs) {
      std::error_code ec;
      MIH_CHECK_CODE(fs::is_directory(dir, ec), Code::kFailedPrecondition, dir.string(), " is not a directory");
      const std::vector<fs::path> found = contract::case_dirs(dir);
      MIH_CHECK_CODE(!found.empty(), Code::kFailedPrecondition, dir.string(),
                     " is no case directory (case_run.json or environment.json in it) and holds none, as a spec's "
                     "directory (<spec>/<case>/) or a run root (<root>/<spec>/<case>/) does");
      cases.insert(cases.end(), found.begin(), found.end());
    }
    int invalid = 0;
    for (const fs::path& dir : cases) {
      // A case that never started training (its record says so) has no session files.
      const contract::Validation v = contract::validate_case_dir(dir, contract::case_trained(dir));
      if (v.ok()) {
        std::printf("valid    %s: %s; %d files, %d values\n", dir.string().c_str(),
                    v.writer.empty() ? "no session files (the case did not train)" : ("written by " + v.writer).c_str(),
                    v.files, v.values);
      } else {
        ++invalid;
        std::printf("INVALID  %s%s:%s\n", dir.string().c_str(), v.writer.empty() ? "" : (" (written by " + v.writer + ")").c_str(),
                    contract::summary(v, 10).c_str());
      }
    }
    std::printf("%zu case director%s, %d not following %s version %d\n", cases.size(), cases.size() == 1 ? "y" : "ies",
                invalid, contract::kName, contract::kVersion);
    return invalid == 0 ? 0 : exit_status(Code::kFailedPrecondition);
  };
}

namespace {

// `mih run`'s flags; those that are the request's own fields are bound to it.
struct RunCommandFlags {
  std::string spec, case_name, matrix = "cpu-smoke";
  std::filesystem::path init_from;
  CaseRequest request;
  cases::CaseRunOptions options;
  bool prepare = false;
};

void add_run_options(CLI::App& sub, RunCommandFlags& f) {
  sub.add_option("--spec", f.spec, "registered spec (see `mih list`)")->required();
  sub.add_option("--case", f.case_name, "case name (see `mih matrix`)")->required();
  sub.add_option("--preset,--matrix", f.matrix, "preset or JSON matrix file")->capture_default_str();
  sub.add_option("--evidence-root", f.options.evidence_root, "evidence goes to <root>/<spec>/<case> (relative: to the current directory)")
      ->capture_default_str();
  add_seconds(sub, "--timeout", f.request.case_timeout, "how long the whole case may take", 1.0);
  add_seconds(sub, "--collective-timeout", f.request.collective_timeout,
              "how long one collective may wait before its rank fails (an infrastructure failure; default: --timeout)");
  sub.add_option("--training-backend", f.request.training_backend, "training backend (MIH_REGISTER_TRAINING_BACKEND)")
      ->capture_default_str();
  sub.add_option("--fault", f.request.fault,
                 "inject a fault of the catalog (F01-F44, docs/fault-catalog.md) in the case's ranks (their --fault; "
                 "an exported MIH_FAULT is ignored)");
  sub.add_option("--init-from", f.init_from,
                 "initialize the port from this local Hugging Face checkpoint directory (through the spec's key map; "
                 "checked before any rank starts; it is the source checkpoint too) instead of the spec's "
                 "checkpoint.init_from or the seed's initialization; its files' SHA-256 are part of the case's "
                 "fingerprint")
      ->check(cli::non_empty_path());
  sub.add_flag("--prepare", f.prepare,
               "only write <root>/<spec>/<case>/run/case.json and print the rank command of each phase, for an "
               "external launcher (torchrun, srun, mpirun)");
}

// The request's spec, matrix, case and checkpoint to initialize from. The matrix is resolved
// here, once; the ranks read the case from run/case.json.
void resolve_request(RunCommandFlags& f) {
  const spec::ModelSpec& s = spec::SpecRegistry::instance().get(f.spec);
  const spec::CaseMatrix matrix = spec::resolve_matrix_source(s, f.matrix);
  CaseRequest& q = f.request;
  q.spec = s.name;
  q.matrix = MatrixSource::parse(f.matrix);
  q.c = case_named(matrix, f.case_name);
  // A checkpoint to initialize from (--init-from, else the spec's) is checked here first: a
  // URL, an LFS pointer, a missing shard, a key or shape that does not fit fails before any
  // rank starts. Its digest tells this run from another's.
  if (f.init_from.empty()) f.init_from = s.checkpoint.init_from;
  if (!f.init_from.empty()) {
    const cases::InitSource checked = cases::check_init_from(s, f.init_from);
    q.init_from = checked.dir.string();
    q.init_from_sha256 = checked.sha256;
  }
}

// --prepare: the case file, and each phase's rank command for an external launcher.
int prepare_only(const RunCommandFlags& f) {
  const CaseRequest& q = f.request;
  const std::filesystem::path dir = cases::prepare_case(q, f.options);
  std::printf("%s/%s: case file %s\n", f.spec.c_str(), f.case_name.c_str(), (dir / layout::kCaseRequest).c_str());
  // The request's timeouts and fault travel on each rank's command line, as a local launch
  // gives them: the collective timeout (0: the case's), the rank's own watchdog, --fault.
  for (const CasePhase& phase : case_phases(q.c)) {
    std::printf("%s (%d rank%s): mih %s\n", phase.name.c_str(), phase.world_size, phase.world_size == 1 ? "" : "s",
                cases::case_rank_shell_line(cases::case_rank_options(q, dir, phase.name), dir, phase.name).c_str());
  }
  std::printf("each rank needs its rendezvous in its environment: RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT "
              "(torchrun and docs/gpu-nightly.md's srun lines set them), or MIH_STORE_FILE for ranks of one host\n");
  return 0;
}

// Says how the case ended (what kind of failure, when it is not a verdict) and returns the
// exit status.
int case_exit_status(const RunCommandFlags& f, const cases::CaseRunResult& r) {
  std::printf("%s/%s: %s (%s) in %.1f s\nevidence: %s\n", f.spec.c_str(), f.case_name.c_str(),
              std::string(outcome_name(r.outcome)).c_str(), r.state.c_str(), r.seconds, r.evidence.c_str());
  if (r.outcome == Outcome::kInterrupted) {
    std::fprintf(stderr, "mih: %s; the case is recorded as interrupted and relaunched by the next run\n",
                 r.error.c_str());
    return 128 + interrupt_signal();
  }
  switch (classify(r.outcome)) {
    case OutcomeClass::kVerdict:
    case OutcomeClass::kConformanceFailure:
      break;
    case OutcomeClass::kBadInput:
      std::fprintf(stderr, "mih: bad input (not a conformance verdict): %s\n", r.error.c_str());
      break;
    case OutcomeClass::kInfrastructure:
      std::fprintf(stderr, "mih: infrastructure failure (not a conformance verdict):\n%s\n", r.error.c_str());
      break;
    case OutcomeClass::kEnvironment:
      std::fprintf(stderr,
                   r.outcome == Outcome::kNotRun ? "mih: the case could not run (not a conformance verdict):\n%s\n"
                                                 : "mih: environment failure (not a conformance verdict):\n%s\n",
                   r.error.c_str());
      break;
  }
  if (const Code code = outcome_code(r.outcome, r.code); code != Code::kOk) return exit_status(code);
  if (!r.error.empty()) std::fprintf(stderr, "mih: the case FAILED: %s\n", r.error.c_str());
  return r.state == "FAILED" ? 1 : 0;
}

}  // namespace

CommandRun setup_run(CLI::App& sub, const Invocation&) {
  auto f = std::make_shared<RunCommandFlags>();
  f->request.training_backend = "trainer";
  // Relative to where mih runs, like every default of mih (never nested under a build/ of its own).
  f->options.evidence_root = std::filesystem::path(layout::kDefaultEvidenceRoot) / layout::kManualDir;
  add_run_options(sub, *f);
  return [f] {
    resolve_request(*f);
    // prepare_case and run_case give the request the fingerprint `mih test` computes
    // (case_fingerprint), so a later `mih test` on this root reuses this run.
    if (f->prepare) return prepare_only(*f);
    install_interrupt_handlers();  // SIGINT/SIGTERM: the ranks stopped, the case recorded as interrupted
    return case_exit_status(*f, cases::run_case(f->request, f->options));
  };
}

CommandRun setup_report(CLI::App& sub, const Invocation&) {
  struct Flags {
    std::string root, format = "md", out;
  };
  auto f = std::make_shared<Flags>();
  sub.add_option("root", f->root, "run root (holds results.jsonl)")->required();
  sub.add_option("--format", f->format, "md, junit or html")
      ->capture_default_str()
      ->check(CLI::IsMember({"md", "junit", "html"}));
  sub.add_option("-o,--output", f->out, "file to write (default: standard output)");
  return [f] {
    const std::string text = render_report(read_run_results(f->root), parse_report_format(f->format));
    if (f->out.empty()) {
      std::fwrite(text.data(), 1, text.size(), stdout);
    } else {
      write_file_atomic(f->out, text);
      std::printf("report: %s\n", f->out.c_str());
    }
    return 0;
  };
}

}  // namespace mih::cli
