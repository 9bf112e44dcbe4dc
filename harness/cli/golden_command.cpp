// `mih golden`: the golden of a spec's export (docs/golden.md) in one command: `mih export
// --dtype float64` into <out>/export, then the golden producer (golden/mih_golden.py, installed
// under <prefix>/share/mih/golden) run by a Python with torch, writing <out>/golden.json and
// <out>/golden.safetensors, which `mih test --golden <out>` (or the spec's golden.dir) checks
// the port against. Like `mih export`, it never overwrites a file it did not write: <out>'s
// mih_golden.json lists each file the last `mih golden` wrote there with its SHA-256.
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/base/error.h"
#include "harness/contract/evidence_layout.h"
#include "harness/base/files.h"
#include "harness/base/json_fields.h"
#include "harness/base/owned_files.h"
#include "harness/base/safe_open.h"
#include "harness/base/version.h"
#include "harness/cases/hf_interop.h"
#include "harness/cli/commands.h"
#include "harness/runtime/cli_support.h"
#include "harness/spec/model_spec.h"

extern char** environ;

namespace mih::cli {
namespace fs = std::filesystem;

namespace {

// Where the producer is: MIH_GOLDEN_PRODUCER, the source tree this binary was built from, or
// an installed package's share/mih/golden beside this binary's bin/ or libexec/mih/.
fs::path find_producer() {
  if (const char* env = std::getenv("MIH_GOLDEN_PRODUCER"); env && *env) return env;
  std::vector<fs::path> candidates;
#ifdef MIH_GOLDEN_SOURCE_DIR
  candidates.push_back(fs::path(MIH_GOLDEN_SOURCE_DIR) / "mih_golden.py");
#endif
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    candidates.push_back(exe.parent_path() / ".." / "share" / "mih" / "golden" / "mih_golden.py");
    candidates.push_back(exe.parent_path() / ".." / ".." / "share" / "mih" / "golden" / "mih_golden.py");
  }
  for (const auto& c : candidates) {
    if (fs::is_regular_file(c, ec)) return fs::weakly_canonical(c, ec);
  }
  std::string tried;
  for (const auto& c : candidates) tried += "\n  " + c.lexically_normal().string();
  MIH_THROW(Code::kFailedPrecondition, "mih golden: the golden producer mih_golden.py is not where this mih looks:",
            tried, "\ngive it with --producer PATH or MIH_GOLDEN_PRODUCER (<prefix>/share/mih/golden/mih_golden.py "
            "of an installed mih)");
}

// Runs argv (argv[0] looked up in PATH), its output to ours; returns its exit status.
int run_child(const std::vector<std::string>& args, bool quiet = false);

// The Python to run the producer with: --python, MIH_PYTHON, else the first of python3 (in
// PATH) and /usr/bin/python3 (Debian's, where python3-torch installs torch) that has torch.
std::string find_python(const std::string& given) {
  if (!given.empty()) return given;
  if (const char* env = std::getenv("MIH_PYTHON"); env && *env) return env;
  for (const char* candidate : {"python3", "/usr/bin/python3"}) {
    try {
      if (run_child({candidate, "-c", "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is None)"},
                    /*quiet=*/true) == 0) {
        return candidate;
      }
    } catch (const Error&) {
      // not there: the next one
    }
  }
  return "python3";  // the producer then says it has no torch (exit 12)
}

int run_child(const std::vector<std::string>& args, bool quiet) {
  std::vector<char*> argv;
  std::vector<std::string> copy = args;
  for (auto& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (quiet) {
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
  }
  const int rc = ::posix_spawnp(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  MIH_CHECK_CODE(rc == 0, Code::kFailedPrecondition, "mih golden: cannot start '", args[0], "': ", std::strerror(rc),
                 "; give a Python with torch with --python (Debian: apt-get install python3-torch)");
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    MIH_CHECK_CODE(errno == EINTR, Code::kInternal, "mih golden: waitpid: ", std::strerror(errno));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

constexpr char kGoldenRecord[] = "mih_golden.json";

// The entries of `out` the golden would replace or leave beside its own: all but export/
// (which `mih export` checks against its own record) and the record itself.
std::vector<std::string> golden_entries(const fs::path& out) {
  std::vector<std::string> paths;
  std::error_code ec;
  for (auto it = fs::directory_iterator(out, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name != layout::kExportDir && name != kGoldenRecord) paths.push_back(name);
  }
  return paths;
}

// Refuses an <out> holding anything an earlier `mih golden` did not write there as it wrote
// it (a golden.json of the user's, `--out /`), before anything is written; then removes the
// earlier golden's own files, so that what is there after the producer is this run's.
void claim_golden_dir(const fs::path& out) {
  const std::vector<std::string> paths = golden_entries(out);
  if (paths.empty()) return;
  check_owned(out, kGoldenRecord, paths, "golden");
  for (const std::string& p : paths) {
    std::error_code ec;
    fs::remove(out / p, ec);
    MIH_CHECK_CODE(!ec, Code::kFailedPrecondition, "golden: cannot remove the earlier golden's ", (out / p).string(),
                   ": ", ec.message());
  }
}

// The producer exited 0: it must have written golden.json (a JSON object) and its tensors
// file, as regular files; then the record of what this golden wrote.
void check_and_record_golden(const fs::path& out, const std::string& producer) {
  const auto is_file = [](const fs::path& p) {
    std::error_code ec;
    return fs::is_regular_file(fs::symlink_status(p, ec)) && fs::file_size(p, ec) > 0 && !ec;
  };
  const fs::path manifest = out / layout::kGoldenManifest;
  std::string text, missing;
  if (!is_file(manifest) || !read_file(manifest, &text) || !parse_json_lenient(text).is_object()) {
    missing = "golden.json (a JSON object)";
  }
  if (!is_file(out / layout::kGoldenTensors)) missing += std::string(missing.empty() ? "" : " and ") + layout::kGoldenTensors;
  MIH_CHECK_CODE(missing.empty(), Code::kFailedPrecondition, "golden: the producer (", producer,
                 ") exited 0: expected it to write golden.json and golden.safetensors into ", out.string(),
                 ", got no ", missing, "; give --producer the mih_golden.py of this mih and --python a Python with "
                 "torch (no golden was recorded)");
  nlohmann::json record = {{"written_by", "mih " + std::string(harness_version())}, {"files", nlohmann::json::object()}};
  for (const std::string& p : golden_entries(out)) {
    if (is_file(out / p)) record["files"][p] = sha256_of_file(out / p);
  }
  write_file_atomic(out / kGoldenRecord, record.dump(2) + "\n");
}

}  // namespace

CommandRun setup_golden(CLI::App& sub, const Invocation&) {
  struct Flags {
    std::string spec = "llama", impl = "builtin", python, producer, plugin;
    cases::HfExportOptions o;
    bool no_noise_twin = false;
  };
  auto f = std::make_shared<Flags>();
  sub.add_option("--spec", f->spec, "registered spec (see `mih list`)")->capture_default_str();
  sub.add_option("--out", f->o.out, "the golden directory: export/ (the float64 export), golden.json, golden.safetensors")
      ->required()
      ->check(cli::non_empty_path());
  CLI::Option* impl = sub.add_option("--impl", f->impl,
                 "builtin: the producer's own PyTorch Llama, Qwen3, Mixtral/Qwen2-MoE/Qwen3-MoE, GPT-2 and LLaVA (any "
                 "Python with torch); transformers: Hugging Face transformers' from_pretrained of the export, any "
                 "architecture it has (needs a --python with transformers, such as the scripts' venv; what mih's "
                 "build and CI compare the reference specs with)")
      ->check(CLI::IsMember({"builtin", "transformers"}))
      ->capture_default_str();
  sub.add_option("--plugin", f->plugin,
                 "your own original for an architecture mih has no builtin for: a Python file defining NAME, VERSION "
                 "and forward(config, weights, batch, ops) on golden/mih_golden_api.py (docs/golden.md); its name, "
                 "version and SHA-256 go into golden.json")
      ->check(CLI::ExistingFile)
      ->excludes(impl);
  sub.add_option("--seed", f->o.seed, "parameter init seed (the Reference case's: a matrix's seed)")->capture_default_str();
  sub.add_option("--init-from", f->o.init_from,
                 "take the weights from this Hugging Face checkpoint directory (through the key map), as a run with "
                 "--init-from does")
      ->check(cli::non_empty_path());
  sub.add_option("--python", f->python,
                 "the Python that runs the producer (default: MIH_PYTHON, else python3 or /usr/bin/python3, the first "
                 "with torch)");
  sub.add_option("--producer", f->producer,
                 "mih_golden.py to run (default: MIH_GOLDEN_PRODUCER, the source tree this mih was built from, or "
                 "<prefix>/share/mih/golden)");
  sub.add_flag("--no-noise-twin", f->no_noise_twin,
               "builtin: skip the second run in other reduction orders (the noise the tolerances are calibrated from)");
  return [f] {
    const spec::ModelSpec s = spec::SpecRegistry::instance().get(f->spec);
    const fs::path out = fs::absolute(f->o.out).lexically_normal();
    cases::HfExportOptions o = f->o;
    o.out = out / layout::kExportDir;
    o.dtype = "float64";
    // <out> may sit in a directory others can write (/shared): a link of theirs, or a directory
    // of theirs on the way, would send the golden elsewhere (issue 53).
    make_secure_directory(out, "give another --out");
    claim_golden_dir(out);
    const cases::HfExportResult r = cases::export_hf(s, o);
    std::printf("mih golden: exported spec %s (float64, seed %llu) to %s: loss %.17g\n", f->spec.c_str(),
                static_cast<unsigned long long>(o.seed), o.out.c_str(), r.loss);
    std::fflush(stdout);
    const fs::path producer = f->producer.empty() ? find_producer() : fs::path(f->producer);
    const std::string python = find_python(f->python);
    std::vector<std::string> args = {python, producer.string(), "--export", o.out.string(), "--out", out.string()};
    if (f->plugin.empty()) {
      args.insert(args.end(), {"--impl", f->impl});
    } else {
      args.insert(args.end(), {"--impl", "plugin", "--plugin", fs::absolute(f->plugin).lexically_normal().string()});
    }
    if (f->no_noise_twin) args.push_back("--no-noise-twin");
    const int rc = run_child(args);
    if (rc != 0) {
      std::fprintf(stderr, "mih golden: the producer (%s %s) exited %d\n", python.c_str(), producer.c_str(), rc);
      return rc == 2 || (rc >= 11 && rc <= 17) ? rc : exit_status(Code::kInternal);
    }
    check_and_record_golden(out, python + " " + producer.string());
    std::printf("mih golden: %s; compare the port with it: `mih test --only-spec %s --golden %s`\n",
                (out / layout::kGoldenManifest).c_str(), f->spec.c_str(), out.c_str());
    return 0;
  };
}

}  // namespace mih::cli
