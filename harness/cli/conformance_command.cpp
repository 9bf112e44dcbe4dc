// `mih test`, `mih check` and `mih faults`, and the main() of every conformance binary: the
// conformance run's own flags (CLI11; --gtest_* flags go to GoogleTest), the results writer
// (results.jsonl), the ctest case list with its labels from the suite table, and the run's
// exit status.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <variant>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "harness/contract/case_record.h"
#include "harness/base/error.h"
#include "harness/contract/evidence_layout.h"
#include "harness/base/fault.h"
#include "harness/base/files.h"
#include "harness/base/json_fields.h"
#include "harness/cases/faults.h"
#include "harness/cases/foreign_check.h"
#include "harness/cases/golden.h"
#include "harness/cases/hf_interop.h"
#include "harness/cases/conformance_run.h"
#include "harness/cases/memo.h"
#include "harness/cases/registrations.h"
#include "harness/cases/shard.h"
#include "harness/cli/check_arguments.h"
#include "harness/cli/cli.h"
#include "harness/cli/commands.h"
#include "harness/compare/verdicts.h"
#include "harness/contract/contract.h"
#include "harness/evidence/evidence_store.h"
#include "harness/spec/model_spec.h"
#include "harness/runtime/cli_support.h"
#include "harness/runtime/launcher.h"
#include "harness/runtime/fork_server.h"
#include "harness/runtime/selftest.h"
#include "harness/runtime/worker.h"
#include "harness/base/strings.h"
#include "suites/suite_table.h"

namespace mih {
namespace cli {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string run_id() {
  char stamp[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", std::localtime(&now));
  return std::string(stamp) + "-" + std::to_string(::getpid());
}

// For ctest registration (cmake/MihConformance.cmake): one line per case of every selected
// registration, "<prefix> <spec> <case> <label,label,...>". Labels: conformance, the spec, the
// case's group, its mesh axes of degree > 1 and knobs (sp, ac, mb), and the suites the suite
// table applies to it.
void print_cases() {
  for (const auto& r : cases::registrations()) {
    if (!cases::selected(r)) continue;
    const spec::ModelSpec& s = spec::SpecRegistry::instance().get(r.spec);
    for (const spec::Case* runnable : cases::runnable_cases(r)) {
      const spec::Case& c = *runnable;
      const ParallelConfig& k = c.config;
      std::vector<std::string> labels = {"conformance", r.spec, c.group};
      for (const auto& d : kMeshDims) {
        if (k.*d.degree > 1) labels.emplace_back(d.name);
      }
      if (k.ep > 1 || (c.save_config && c.save_config->ep > 1)) labels.push_back("ep");
      if (k.sequence_parallel) labels.push_back("sp");
      if (k.activation_checkpointing) labels.push_back("ac");
      if (k.micro_batches > 1) labels.push_back("mb");
      for (const auto& row : conformance::suite_table()) {
        if (row.applies({s, c})) labels.push_back(row.name);
      }
      std::string joined = join(labels, ",");
      std::printf("%s %s %s %s\n", r.prefix.c_str(), r.spec.c_str(), c.name.c_str(), joined.c_str());
    }
  }
}

// The GoogleTest filter of the run: the last --gtest_filter, else GTEST_FILTER, else "*".
std::string gtest_filter_of(const std::vector<std::string>& gtest_flags) {
  std::string filter;
  for (const auto& f : gtest_flags) {
    if (f.rfind("--gtest_filter=", 0) == 0) filter = f.substr(15);
  }
  if (filter.empty()) {
    const char* env = std::getenv("GTEST_FILTER");
    filter = env && *env ? env : "*";
  }
  return filter;
}

// The conformance run's own flags; what CLI11 does not know goes to GoogleTest when it is a
// --gtest_* flag and is a usage error otherwise.
// The flags that are not one field of cases::RunOptions (those are bound to it directly).
struct RunFlags {
  std::string evidence_root, fault, dtype, shard;
  int64_t seed = -1;
  std::vector<std::string> prefixes, fault_cases, goldens;
  bool no_progress = false, list_cases = false;
};

// Where the evidence goes, the matrix and its lane (dtype, seed, noise multiple).
void add_matrix_options(CLI::App& app, RunFlags* f, cases::RunOptions* o) {
  app.add_option("--evidence-root", f->evidence_root,
                 "where the run's evidence goes (default: MIH_EVIDENCE_ROOT, else mih-evidence/<run id> in the current "
                 "directory)");
  app.add_option("--matrix", o->matrix, "preset (cpu-smoke, cpu-smoke-variants, cpu-smoke-documents, cpu-precision, cpu-full, gpu-smoke; @<dtype>[,seed=N] sets the lane) or JSON matrix file; overrides every spec's");
  app.add_option("--dtype", f->dtype,
                 "the precision lane: float64, float32 or bfloat16 (sets every matrix's dtype, over its own @<dtype>; a reduced lane "
                 "compares each case with its own reference at tolerances calibrated from a noise twin)")
      ->check(CLI::IsMember({"float64", "float32", "bfloat16", "float16"}));
  app.add_option("--seed", f->seed, "parameter-init seed of every case, the reference's included (sets every matrix's seed, over its own seed=N)")
      ->check(CLI::Range(int64_t{0}, (int64_t{1} << 53) - 1));
  app.add_option("--noise-k", o->noise_k,
                 "reduced lanes: the multiple of the measured noise each tolerance is (default: the spec's noise_k)")
      ->check(CLI::NonNegativeNumber);
}

// A run over evidence produced elsewhere, and what of it may differ from this mih's.
void add_verify_only_options(CLI::App& app, cases::RunOptions* o) {
  app.add_flag("--verify-only", o->verify_only, "assert on evidence produced elsewhere; launch nothing");
  app.add_flag("--allow-edited-evidence", o->allow_edited_evidence,
               "verify-only and check: check evidence whose files differ from the SHA-256 digests its case_run.json "
               "records (else exit 12)");
  app.add_flag("--allow-other-version", o->allow_other_version,
               "verify-only and check: check evidence that another harness version wrote (environment.json's "
               "versions.mih; else exit 12)");
}

// Where the weights start from, and the goldens of the original model compared with.
void add_source_options(CLI::App& app, RunFlags* f, cases::RunOptions* o) {
  app.add_option("--init-from", o->init_from,
                 "every case of the run's one spec (select it with --only-spec), its reference included, starts from "
                 "this local Hugging Face checkpoint directory (through the key map; checked before any case "
                 "starts; its files' SHA-256 join each case's fingerprint; it is the source checkpoint too), "
                 "instead of the spec's checkpoint.init_from or the seed's weights")
      ->check(cli::non_empty_path());
  auto* golden = app.add_option("--golden", f->goldens,
                 "a golden of the original model (`mih golden` writes one; docs/golden.md) the spec its golden.json "
                 "names is compared with (MatchesOriginal on its Reference), instead of the spec's golden.dir; "
                 "checked before any case starts (repeatable)")
      ->check(cli::non_empty_path());
  app.add_flag("--no-golden", o->no_golden,
               "read no golden of the original model, not even a spec's golden.dir: MatchesOriginal is not "
               "instantiated and every other suite runs; the run's last line and its report say \"MatchesOriginal "
               "not run: --no-golden\" (without it, a golden that is missing stops the run before any case, exit 12)")
      ->excludes(golden);
}

// A share of the cases (--shard), and a fault of the catalog on some of them.
void add_shard_and_fault_options(CLI::App& app, RunFlags* f) {
  app.add_option("--shard", f->shard,
                 "i/N: test only share i of N of the cases the filter selects (the same split in every job given the "
                 "same binary, matrix and filter; the cases they compare with run where needed); `mih test "
                 "--verify-only` over the shared root then reports the whole matrix")
      ->check(CLI::Validator(
          [](std::string& v) {
            try {
              (void)cases::parse_shard(v);
              return std::string();
            } catch (const Error& e) {
              // CLI11 names the option before the message.
              const std::string m = e.message();
              return m.rfind("--shard ", 0) == 0 ? m.substr(8) : m;
            }
          },
          "i/N"));
  app.add_option("--fault", f->fault, "fault of the catalog (F01-F44) the --fault-cases run with")
      ->check(CLI::Validator([](std::string& v) { return v.empty() ? std::string("an empty fault name") : std::string(); },
                             "FAULT"));
  app.add_option("--fault-cases", f->fault_cases, "the cases that run with --fault")->delimiter(',');
}

// The GoogleTest flags among what CLI11 did not know, or 2 (said) for anything else: an
// unknown option, or a --gtest_* flag GoogleTest does not have.
std::variant<std::vector<std::string>, int> gtest_flags_of(const std::vector<std::string>& extras) {
  std::vector<std::string> gtest;
  for (const auto& extra : extras) {
    if (extra.rfind("--gtest_", 0) != 0) {
      std::fprintf(stderr,
                   "mih test: unknown option '%s'; the options are listed by `mih test --help`, and GoogleTest's "
                   "are --gtest_* (e.g. --gtest_filter='Llama/*.*/Tp2Sp')\n",
                   extra.c_str());
      return 2;
    }
    // GoogleTest prints its help and runs nothing for a flag it does not know: a misspelt one
    // is a usage error here, naming it.
    static const std::set<std::string> kGtestFlags = {
        "also_run_disabled_tests", "break_on_failure", "brief", "catch_exceptions", "color", "death_test_style",
        "death_test_use_fork", "fail_fast", "filter", "flagfile", "help", "internal_run_death_test", "list_tests",
        "output", "print_time", "print_utf8", "random_seed", "recreate_environments_when_repeating", "repeat",
        "show_internal_stack_frames", "shuffle", "stack_trace_depth", "stream_result_to", "throw_on_failure"};
    const std::string name = extra.substr(8, extra.find('=') == std::string::npos ? std::string::npos : extra.find('=') - 8);
    if (!kGtestFlags.count(name)) {
      std::fprintf(stderr, "mih test: unknown GoogleTest flag '%s'; GoogleTest's flags are listed by --gtest_help\n",
                   extra.c_str());
      return 2;
    }
    gtest.push_back(extra);
  }
  return gtest;
}

// Parses `args` into the run options; returns the GoogleTest flags, or the exit status of a
// usage error or --help.
std::variant<std::vector<std::string>, int> parse_run_flags(const std::vector<std::string>& args, RunFlags* f,
                                                            cases::RunOptions* o) {
  CLI::App app{"Runs the conformance suites of the specs linked into this binary: each case launched once "
               "(its ranks as processes), every suite asserting on its evidence; --gtest_* flags go to "
               "GoogleTest. Exit status: see the footer.",
               "mih test"};
  app.footer(exit_status_legend());
  add_matrix_options(app, f, o);
  add_verify_only_options(app, o);
  add_seconds(app, "--case-timeout", o->case_timeout, "how long one case may take (all its launches)");
  add_seconds(app, "--collective-timeout", o->collective_timeout,
              "how long one collective may wait before its rank fails (an infrastructure failure; default: the "
              "case timeout)");
  app.add_option("--prefixes", f->prefixes, "only these MIH_CONFORMANCE_SUITES registrations")->delimiter(',');
  app.add_option("--only-spec", o->only_spec, "only this spec's cases");
  add_source_options(app, f, o);
  app.add_flag("--no-progress", f->no_progress, "no progress lines on stderr");
  app.add_flag("--mih-list-cases", f->list_cases, "print the cases and their ctest labels, then exit");
  add_shard_and_fault_options(app, f);
  app.allow_extras(true);
  std::vector<std::string> argv_s = {"mih test"};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::Success& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 2;
  }
  return gtest_flags_of(app.remaining());
}

// Runs the conformance tests: the flags in `args` (with what `mih check` derived from the
// evidence: `read_only`, the tests its run recorded) become the run's options, then the run
// (cases::ConformanceRun) resolves, runs and says the exit status.
int run_tests(const std::vector<std::string>& args, bool read_only, std::vector<std::string> recorded_tests) {
  RunFlags f;
  cases::RunOptions o;
  auto parsed = parse_run_flags(args, &f, &o);
  if (const int* status = std::get_if<int>(&parsed)) return *status;
  const std::vector<std::string> gtest_flags = std::get<std::vector<std::string>>(parsed);
  MIH_CHECK(cases::duplicate_prefixes().empty(), "MIH_CONFORMANCE_SUITES prefix '", cases::duplicate_prefixes().front(),
            "' is registered twice; give each registration its own prefix");
  o.read_only = read_only;
  o.recorded_tests = std::move(recorded_tests);
  if (!f.dtype.empty()) o.lane.dtype = with_context("--dtype", [&] { return parse_dtype_name(f.dtype); });
  if (f.seed >= 0) o.lane.seed = static_cast<uint64_t>(f.seed);
  o.progress = !f.no_progress;
  o.golden_dirs.assign(f.goldens.begin(), f.goldens.end());
  if (!o.only_spec.empty()) static_cast<void>(spec::SpecRegistry::instance().get(o.only_spec));  // unknown: exit 11
  for (const auto& x : f.prefixes) {
    MIH_CHECK(cases::find_registration(x) != nullptr, "--prefixes: no MIH_CONFORMANCE_SUITES registration '", x,
              "' is linked");
    o.prefixes.insert(x);
  }
  if (!f.shard.empty()) {
    const cases::Shard shard = cases::parse_shard(f.shard);
    o.shard_index = shard.index;
    o.shard_count = shard.count;
  }
  if (!f.fault.empty()) o.fault = fault::name(fault::parse(f.fault));
  o.fault_cases.insert(f.fault_cases.begin(), f.fault_cases.end());
  if (f.evidence_root.empty()) {
    const char* env = std::getenv("MIH_EVIDENCE_ROOT");
    // Relative to the working directory: a conformance binary run from its build folder
    // writes <build>/mih-evidence, not <build>/build/mih-evidence.
    o.evidence_root = env && *env ? fs::path(env) : fs::path(layout::kDefaultEvidenceRoot) / run_id();
  } else {
    o.evidence_root = f.evidence_root;
  }
  o.evidence_root = fs::absolute(o.evidence_root);
  cases::ConformanceRun run(std::move(o));
  if (f.list_cases) {
    // ctest's registration lists every case: a share of them would leave the rest unregistered.
    MIH_CHECK(run.options().shard_count == 0, "--mih-list-cases lists every case for ctest; --shard takes a share "
              "of a run's tests (list a share with --gtest_list_tests --shard i/N)");
    print_cases();
    return 0;
  }
  bool listing = false;
  for (const auto& a : gtest_flags) listing = listing || a.rfind("--gtest_list_tests", 0) == 0;
  // Where the goldens are compared: a MatchesOriginal test the suite table applies and the
  // filter selects.
  const std::string filter = gtest_filter_of(gtest_flags);
  run.prepare(listing, [&](const std::string& spec_name) {
    for (const auto& r : cases::registrations()) {
      if (!cases::selected(r) || r.spec != spec_name) continue;
      const spec::ModelSpec s = cases::spec_of_run(spec_name);
      for (const spec::Case* c : cases::runnable_cases(r)) {
        if (!conformance::suite_row("MatchesOriginal").applies({s, *c})) continue;
        for (const char* test : {"LossAndLogitsMatchOriginal", "HiddenStatesMatchOriginal", "GradientsMatchOriginal",
                                 "StepMatchesOriginal"}) {
          if (cases::filter_selects(filter, r.prefix + "/MatchesOriginal." + test + "/" + c->name)) return true;
        }
      }
    }
    return false;
  });
  return run.execute(gtest_flags);
}

}  // namespace

int run_conformance_tests(const std::vector<std::string>& args) {
  std::vector<std::string> all;
  if (!args.empty() && args[0] == "--check") {
    MIH_CHECK(args.size() >= 2, "mih check needs an evidence directory");
    // Another writer's evidence (docs/evidence.md): the suites of measured evidence, at this
    // mih's tolerances, since no spec compiled in describes it.
    if (!cases::foreign_case_dirs(args[1]).empty()) {
      return cases::check_foreign_evidence(args[1], std::vector<std::string>(args.begin() + 2, args.end()),
                                           conformance::declared_reads());
    }
    // A check judges the evidence and writes nothing into it (its verdict: the output and the
    // exit status; --gtest_output=json:FILE for a machine-readable copy).
    std::string filter;
    std::vector<std::string> recorded;
    for (auto& a : check_arguments(args[1], &filter, &recorded)) all.push_back(a);
    for (size_t i = 2; i < args.size(); ++i) all.push_back(args[i]);
    all.push_back("--gtest_filter=" + filter);
    return run_tests(all, /*read_only=*/true, std::move(recorded));
  }
  return run_tests(args, /*read_only=*/false, {});
}

CommandRun setup_test(CLI::App& sub, const Invocation&) {
  return [&sub] { return run_conformance_tests(sub.remaining()); };
}

CommandRun setup_check(CLI::App& sub, const Invocation&) {
  return [&sub] {
    const std::vector<std::string> rest = sub.remaining();
    if (!rest.empty() && (rest[0] == "-h" || rest[0] == "--help")) {
      std::printf("%s\nUsage: mih check <evidence> [mih test options] [--gtest_* ...]\n"
                  "The options of `mih test --help` apply (without --verify-only, which check implies).\n\n%s\n",
                  sub.get_description().c_str(), exit_status_legend().c_str());
      return 0;
    }
    if (rest.empty() || rest[0].rfind("-", 0) == 0) {
      std::fprintf(stderr, "mih check: give the evidence to check first: a case directory or a run root\n");
      return 2;
    }
    std::vector<std::string> args = {"--check"};
    args.insert(args.end(), rest.begin(), rest.end());
    return run_conformance_tests(args);
  };
}

CommandRun setup_faults(CLI::App& sub, const Invocation&) {
  auto o = std::make_shared<cases::FaultsOptions>();
  auto quiet = std::make_shared<bool>(false);
  sub.add_option("--fault", o->only, "only these faults (F01 ... F44; repeat or comma-separate)")->delimiter(',');
  sub.add_option("--json", o->json_out, "write the detection matrix as JSON here (default: <out>/faults.json)");
  auto out_given = sub.add_option("--out", o->out, "evidence folder: fault-free/ (the twins), <ID>/ per fault "
                                                    "(default mih-faults, mih-faults-<dtype> in a reduced lane, in the current directory)");
  sub.add_option("--dtype", o->dtype,
                 "the precision lane: float64 (the oracle), float32 or bfloat16 (each case against the lane's reference "
                 "at tolerances calibrated from its noise twin)")
      ->check(CLI::IsMember({"float64", "float32", "bfloat16"}))
      ->capture_default_str();
  add_seconds(sub, "--case-timeout", o->case_timeout, "how long one case may take");
  sub.add_flag("--list", o->list, "print the catalog and exit");
  sub.add_flag("--no-progress", *quiet, "no progress lines on stderr");
  return [o, quiet, out_given] {
    o->progress = !*quiet;
    if (out_given->count() == 0 && o->dtype != "float64") o->out = "mih-faults-" + o->dtype;
    return cases::run_faults(*o);
  };
}

}  // namespace cli

namespace {
// What a rank forked by the fork server runs: `<binary> worker ...`.
int forked_rank_main(int argc, char** argv) { return conformance_main(argc, argv, false); }
}  // namespace

namespace {
// Whether argv runs the suites (a conformance or GoogleTest flag; no argument when
// `tests_by_default`) rather than a subcommand, --help or --version.
bool runs_tests(int argc, char** argv, bool tests_by_default) {
  if (argc <= 1) return tests_by_default;
  const std::string a = argv[1];
  return !a.empty() && a[0] == '-' && a != "--help" && a != "-h" && a != "--version";
}
}  // namespace

bool catches_interrupts(int argc, char** argv, bool tests_by_default) {
  const std::string command = argc > 1 ? argv[1] : "";
  return runs_tests(argc, argv, tests_by_default) || command == "test" || command == "check" || command == "run";
}

int conformance_main(int argc, char** argv, bool tests_by_default) {
  // First, before anything can be interrupted (issue 52): a command that stops on SIGINT or
  // SIGTERM with 128 + the signal catches it from here on, also when its caller ignored it,
  // so an interrupt during loading or listing ends it the same way as one during a case.
  const bool catches = catches_interrupts(argc, argv, tests_by_default);
  if (catches) install_interrupt_handlers();
  // A write past RLIMIT_FSIZE (`ulimit -f`) then fails with EFBIG, which its writer reports
  // (exit 12, naming the file), instead of SIGXFSZ killing the command or rank (153) mid-line.
  std::signal(SIGXFSZ, SIG_IGN);
  if (argc > 1 && std::strcmp(argv[1], "worker") == 0) return worker_main(argc - 1, argv + 1);
  if (argc > 1 && std::strcmp(argv[1], "__process-state") == 0) return run_process_state_command(argc, argv);
  // A subcommand, --help or --version is the CLI; a conformance or GoogleTest flag runs the
  // suites; no argument runs them in a conformance binary and prints the help in `mih`.
  const bool tests = runs_tests(argc, argv, tests_by_default);
  // Before anything else runs, for the commands that launch local ranks: the fork server is
  // a copy of this process as exec left it (it ignores SIGINT and SIGTERM itself, and gives
  // its ranks the default dispositions).
  const std::string command = argc > 1 ? argv[1] : "";
  if (tests || command == "test" || command == "launch" || command == "selftest" || command == "run" ||
      command == "faults") {
    start_fork_server(argc, argv, forked_rank_main);
  }
  int status = 0;
  if (!tests) {
    status = cli_main(argc, argv);
  } else {
    try {
      status = cli::run_conformance_tests(std::vector<std::string>(argv + 1, argv + argc));
    } catch (...) {
      status = cli::report_current_exception("mih");
    }
  }
  // An interrupt caught where nothing stopped on it (before the first case, or while the
  // command was ending) still ends the command as interrupted.
  if (const int sig = catches ? interrupt_signal() : 0; sig != 0 && status != 128 + sig) {
    std::fprintf(stderr, "mih: interrupted by %s (the command's own status was %d)\n",
                 sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "a signal", status);
    return 128 + sig;
  }
  return status;
}

}  // namespace mih
