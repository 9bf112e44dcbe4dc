// Runs the `mih` binary as a user would and checks exit statuses, messages and evidence.
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <map>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <cstdio>
#include <sstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "harness/base/files.h"
#include "harness/base/json_fields.h"
#include "harness/compat/collectives.h"
#include "harness/runtime/launcher.h"
#include "harness/runtime/worker.h"
#include "tests/support/mih_cli.h"
#include "tests/support/temp_dir.h"

namespace mih {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

using testing::CliRun;

// Runs `mih <args>` through the shell (args are shell words), in directory `cwd` when given.
CliRun mih(const std::string& args, const std::filesystem::path& cwd = {}) { return testing::run_mih(args, cwd); }

TEST(CliUsageTest, UsageErrorsExit2AndNameTheProblem) {
  struct Case {
    const char* args;
    const char* says;
  };
  for (const Case& c : {Case{"", "a command is required; valid: [selftest, launch, export, inspect, golden, scaffold, matrix, list, compare, validate, run, submit, test, check, report, reach, faults, warm, worker]"},
                        Case{"selftset", "unknown command 'selftset'; valid: [selftest, launch, export, inspect, golden, scaffold, matrix, list, compare, validate, run, submit, test, check, report, reach, faults, warm, worker]"},
                        Case{"selftest -n 0", "must be >= 1, got '0'"},
                        Case{"selftest --collective-timeout 0.0001", "must be >= 0.001"},
                        Case{"selftest --bogus", "--bogus"},
                        Case{"test --bogus-flag", "unknown option '--bogus-flag'"},
                        Case{"test --gtest-filter=Nope", "unknown option '--gtest-filter=Nope'"},
                        Case{"test --gtest_filtr=Llama/*", "unknown GoogleTest flag '--gtest_filtr=Llama/*'"},
                        Case{"test --case-timeout abc", "expected a finite number, got 'abc'"},
                        Case{"test --case-timeout nan", "expected a finite number, got 'nan'"},
                        Case{"run --spec llama --case Tp2 --timeout 1e400", "'1e400' is out of the range of a double"},
                        Case{"export --spec llama", "--out is required"},
                        Case{"worker --run-dir /tmp nosuchtask", "unknown worker task 'nosuchtask'; valid: [case, ping, selftest, state]"}}) {
    CliRun run = mih(c.args);
    EXPECT_EQ(run.status, 2) << "mih " << c.args << "\n" << run.output;
    EXPECT_THAT(run.output, HasSubstr(c.says)) << "mih " << c.args;
  }
}

TEST(CliUsageTest, HelpAndVersionExit0) {
  for (const char* args :
       {"--help", "selftest --help", "launch --help", "export --help", "scaffold --help", "matrix --help", "list --help", "compare --help", "run --help", "worker --help",
        "worker selftest --help", "test --help", "check --help"}) {
    CliRun run = mih(args);
    EXPECT_EQ(run.status, 0) << args << "\n" << run.output;
    EXPECT_THAT(run.output, HasSubstr("Exit status: 0 ok")) << args;
  }
  CliRun version = mih("--version");
  EXPECT_EQ(version.status, 0);
  EXPECT_THAT(version.output, ::testing::ContainsRegex("mih 0\\.2\\.0 \\(build [0-9a-f]{12}; libtorch "));
}

TEST(CliInputTest, ExportNamesAnUnknownSpecOrCheckpoint) {
  const std::string out = " --out " + testing::temp_dir("cli_export").string();
  CliRun model = mih("export --spec gpt3" + out);
  EXPECT_EQ(model.status, exit_status(Code::kInvalidSpec)) << model.output;
  EXPECT_THAT(model.output, HasSubstr("unknown spec 'gpt3'; registered: gpt2, llama,"));
  CliRun init = mih("export --spec llama --init-from /nonexistent" + out);
  EXPECT_EQ(init.status, exit_status(Code::kFailedPrecondition)) << init.output;
  EXPECT_THAT(init.output, HasSubstr("checkpoint directory /nonexistent does not exist"));
}

// The text of a file, "" when it cannot be read.
std::string text_of(const std::filesystem::path& path) {
  std::string text;
  return read_file(path, &text) ? text : std::string();
}

TEST(CliScaffoldTest, ABadNameIsAUsageErrorThatSaysWhatIsAllowed) {
  const std::string out = " --out " + testing::temp_dir("cli_scaffold_names").string() + "/p";
  for (const char* name : {"My-Port", "MyPort", "1port", "gpt__x", "port_", "'a b'", "''",
                           "a_name_that_is_much_too_long_for_a_port_of_any_kind_x"}) {
    CliRun run = mih(std::string("scaffold --name ") + name + out);
    EXPECT_EQ(run.status, 2) << name << "\n" << run.output;
    EXPECT_THAT(run.output, AllOf(HasSubstr("--name"), HasSubstr("is not a port name: a port name is a lower-case "
                                                                 "C++ identifier: a letter a-z, then letters a-z")))
        << name;
  }
  for (const char* name : {"class", "mih", "std", "torch", "linux", "errno", "signal"}) {
    CliRun run = mih(std::string("scaffold --name ") + name + out);
    EXPECT_EQ(run.status, 2) << name << "\n" << run.output;
    EXPECT_THAT(run.output, HasSubstr("is a C++ keyword or a namespace the project already uses")) << name;
  }
  CliRun missing = mih("scaffold --name tiny");
  EXPECT_EQ(missing.status, 2) << missing.output;
  EXPECT_THAT(missing.output, HasSubstr("--out is required"));
  EXPECT_FALSE(std::filesystem::exists(testing::temp_dir("cli_scaffold_names") / "p")) << "nothing is written";
}

TEST(CliScaffoldTest, WritesTheProjectAndNeverOverwritesWhatItDidNotWrite) {
  namespace fs = std::filesystem;
  const fs::path dir = testing::temp_dir("cli_scaffold");
  const fs::path templates = fs::path(MIH_TEST_SOURCE_DIR) / ".." / ".." / "harness" / "cli" / "scaffold" / "gpt2";
  const std::vector<std::string> files = {"CMakeLists.txt", "README.md", "model.h", "spec.cpp"};

  // --name my_port writes the templates verbatim; another name replaces my_port and MyPort.
  CliRun verbatim = mih("scaffold --name my_port --out " + (dir / "verbatim").string());
  ASSERT_EQ(verbatim.status, 0) << verbatim.output;
  for (const auto& f : files) {
    EXPECT_TRUE(text_of(dir / "verbatim" / f) == text_of(templates / f)) << f << " differs from its template in " << templates;
  }
  CliRun fresh = mih("scaffold --name gpt2_tiny --out " + (dir / "new" / "gpt2_tiny").string());
  ASSERT_EQ(fresh.status, 0) << fresh.output;
  EXPECT_THAT(fresh.output, AllOf(HasSubstr("mih scaffold: wrote port 'gpt2_tiny' (template gpt2) in " + (dir / "new/gpt2_tiny").string() +
                                            ": CMakeLists.txt, README.md, model.h, spec.cpp, mih_scaffold.json"),
                                  HasSubstr("cmake --build " + (dir / "new/gpt2_tiny").string() + "/build")));
  const fs::path p = dir / "new" / "gpt2_tiny";
  for (const auto& f : files) {
    const std::string text = text_of(p / f);
    EXPECT_FALSE(text.empty()) << f;
    EXPECT_THAT(text, AllOf(Not(HasSubstr("my_port")), Not(HasSubstr("MyPort")))) << f;
  }
  EXPECT_THAT(text_of(p / "spec.cpp"), AllOf(HasSubstr("MIH_CONFORMANCE_SUITES(Gpt2Tiny, \"gpt2_tiny\", \"cpu-smoke\");"),
                                             HasSubstr("namespace gpt2_tiny {")));
  EXPECT_THAT(text_of(p / "CMakeLists.txt"), HasSubstr("mih_add_conformance_suite(gpt2_tiny_conformance SPECS spec.cpp"));
  const nlohmann::json record = nlohmann::json::parse(text_of(p / "mih_scaffold.json"));
  EXPECT_EQ(record["name"], "gpt2_tiny");
  EXPECT_EQ(record["template"], "gpt2");
  EXPECT_EQ(record["files"].size(), files.size());

  // An unedited scaffold is mih's to rewrite; an edited file is never overwritten.
  CliRun again = mih("scaffold --name gpt2_tiny --out " + p.string());
  EXPECT_EQ(again.status, 0) << again.output;
  EXPECT_THAT(again.output, HasSubstr("rewrote port 'gpt2_tiny'"));
  write_file_atomic(p / "spec.cpp", text_of(p / "spec.cpp") + "// my edit\n");
  write_file_atomic(p / "notes.txt", "mine\n");
  CliRun edited = mih("scaffold --name gpt2_tiny --out " + p.string());
  EXPECT_EQ(edited.status, exit_status(Code::kFailedPrecondition)) << edited.output;
  EXPECT_THAT(edited.output, HasSubstr("'spec.cpp' in " + p.string() + " was edited since mih wrote it; mih never "
                                       "overwrites an edit"));
  EXPECT_THAT(text_of(p / "spec.cpp"), HasSubstr("// my edit"));

  // A folder mih did not write, a file, and a folder that cannot be made: exit 12, nothing written.
  write_file_atomic(dir / "foreign" / "train.py", "print('mine')\n");
  CliRun foreign = mih("scaffold --name gpt2_tiny --out " + (dir / "foreign").string());
  EXPECT_EQ(foreign.status, exit_status(Code::kFailedPrecondition)) << foreign.output;
  EXPECT_THAT(foreign.output, HasSubstr("holds files and no mih_scaffold.json of an earlier `mih scaffold`, so mih did "
                                        "not write it; give a new or empty directory (nothing was written)"));
  EXPECT_FALSE(fs::exists(dir / "foreign" / "model.h"));
  EXPECT_EQ(text_of(dir / "foreign" / "train.py"), "print('mine')\n");
  CliRun file = mih("scaffold --name gpt2_tiny --out " + (dir / "foreign" / "train.py").string());
  EXPECT_EQ(file.status, exit_status(Code::kFailedPrecondition)) << file.output;
  EXPECT_THAT(file.output, HasSubstr("train.py is a file, not a directory"));
  // Under /sys nothing can be made (as root too); a read-only folder where permissions apply.
  CliRun unwritable = mih("scaffold --name gpt2_tiny --out /sys/mih-scaffold-test/p");
  EXPECT_EQ(unwritable.status, exit_status(Code::kFailedPrecondition)) << unwritable.output;
  EXPECT_THAT(unwritable.output, AllOf(HasSubstr("cannot create --out /sys/mih-scaffold-test/p: "),
                                       HasSubstr("give a directory you can write")));
  if (::geteuid() != 0) {
    fs::create_directories(dir / "read-only");
    fs::permissions(dir / "read-only", fs::perms::owner_read | fs::perms::owner_exec);
    CliRun read_only = mih("scaffold --name gpt2_tiny --out " + (dir / "read-only").string());
    EXPECT_EQ(read_only.status, exit_status(Code::kFailedPrecondition)) << read_only.output;
    EXPECT_THAT(read_only.output, HasSubstr("cannot write into --out"));
    fs::permissions(dir / "read-only", fs::perms::owner_all);
  }
}

// `--template llama` writes the Llama-style port (its templates verbatim for my_port; the name
// replaced otherwise; the record names the template); an unknown template is a usage error
// naming the templates, and nothing is written. (The project builds and passes its matrix:
// ctest scaffold_project.)
TEST(CliScaffoldTest, TheLlamaTemplateIsWrittenOnRequest) {
  namespace fs = std::filesystem;
  const fs::path dir = testing::temp_dir("cli_scaffold_llama");
  const fs::path templates = fs::path(MIH_TEST_SOURCE_DIR) / ".." / ".." / "harness" / "cli" / "scaffold" / "llama";
  CliRun verbatim = mih("scaffold --name my_port --template llama --out " + (dir / "verbatim").string());
  ASSERT_EQ(verbatim.status, 0) << verbatim.output;
  EXPECT_THAT(verbatim.output, HasSubstr("wrote port 'my_port' (template llama) in "));
  for (const char* f : {"CMakeLists.txt", "README.md", "model.h", "spec.cpp"}) {
    EXPECT_TRUE(text_of(dir / "verbatim" / f) == text_of(templates / f)) << f << " differs from its template in " << templates;
  }
  CliRun named = mih("scaffold --name qwen_tiny --template llama --out " + (dir / "qwen_tiny").string());
  ASSERT_EQ(named.status, 0) << named.output;
  EXPECT_THAT(text_of(dir / "qwen_tiny" / "model.h"), AllOf(HasSubstr("namespace qwen_tiny {"),
                                                            HasSubstr("class AttentionImpl"), HasSubstr(".heads(")));
  EXPECT_THAT(text_of(dir / "qwen_tiny" / "spec.cpp"),
              AllOf(HasSubstr("\"LlamaForCausalLM\""), HasSubstr("s.pipeline_layers = o.num_hidden_layers;"),
                    HasSubstr("MIH_CONFORMANCE_SUITES(QwenTiny, \"qwen_tiny\", \"cpu-smoke\");")));
  EXPECT_EQ(nlohmann::json::parse(text_of(dir / "qwen_tiny" / "mih_scaffold.json"))["template"], "llama");
  CliRun unknown = mih("scaffold --name tiny --template mistral --out " + (dir / "unknown").string());
  EXPECT_EQ(unknown.status, 2) << unknown.output;
  EXPECT_THAT(unknown.output, AllOf(HasSubstr("--template"), HasSubstr("mistral"), HasSubstr("gpt2"), HasSubstr("llama")));
  EXPECT_FALSE(fs::exists(dir / "unknown"));
}

// The README's quickstart shows exactly what `mih scaffold` writes: its file listing is the
// scaffold's files, and its build commands are the ones mih scaffold prints for --out my_port.
TEST(CliScaffoldTest, TheReadmeQuickstartShowsTheScaffoldsFilesAndCommands) {
  namespace fs = std::filesystem;
  const std::string readme = text_of(fs::path(MIH_TEST_SOURCE_DIR) / ".." / ".." / "README.md");
  const size_t quickstart = readme.find("## A model author's quickstart");
  ASSERT_NE(quickstart, std::string::npos);
  const std::string section = readme.substr(quickstart, readme.find("\n## ", quickstart + 1) - quickstart);
  ASSERT_NE(section.find("<prefix>/bin/mih scaffold --name my_port --out my_port\n"), std::string::npos);
  // The listing: "my_port/" then one "  <file>  <what>" line per file.
  const size_t tree = section.find("\nmy_port/\n");
  ASSERT_NE(tree, std::string::npos) << "no file listing 'my_port/' in the quickstart";
  std::set<std::string> listed;
  std::istringstream lines(section.substr(tree + 10, section.find("```", tree) - tree - 10));
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("  ", 0) == 0) listed.insert(line.substr(2, line.find(' ', 2) - 2));
  }
  const fs::path dir = testing::temp_dir("cli_scaffold_readme");
  CliRun run = mih("scaffold --name my_port --out my_port", dir);
  ASSERT_EQ(run.status, 0) << run.output;
  std::set<std::string> written;
  for (const auto& entry : fs::directory_iterator(dir / "my_port")) written.insert(entry.path().filename().string());
  EXPECT_EQ(listed, written) << "the quickstart's listing vs the files mih scaffold writes";
  for (const char* command : {"cmake -S my_port -B my_port/build -DCMAKE_PREFIX_PATH=<prefix>\n",
                              "cmake --build my_port/build\n", "ctest --test-dir my_port/build --output-on-failure\n"}) {
    EXPECT_NE(section.find(std::string("\n") + command), std::string::npos) << "the quickstart lacks: " << command;
    EXPECT_THAT(run.output, HasSubstr(std::string("  ") + command)) << "mih scaffold does not print: " << command;
  }
}

// A conformance run without --evidence-root writes mih-evidence/<run id> under the directory
// it runs in: run from a build folder, <build>/mih-evidence, never <build>/build/mih-evidence.
TEST(CliConformanceTest, EvidenceGoesUnderTheDirectoryItRunsIn) {
  namespace fs = std::filesystem;
  const fs::path build = testing::temp_dir("cli_evidence_default") / "build";
  fs::create_directories(build);
  ::unsetenv("MIH_EVIDENCE_ROOT");  // the default, whatever the caller's environment says
  CliRun run = mih("test --no-progress --gtest_filter='Llama/*.*/Reference' --gtest_brief=1", build);
  ASSERT_EQ(run.status, 0) << run.output;
  EXPECT_FALSE(fs::exists(build / "build")) << "the evidence nested under a build/ of its own";
  std::vector<fs::path> runs;
  if (fs::is_directory(build / "mih-evidence")) {
    for (const auto& entry : fs::directory_iterator(build / "mih-evidence")) runs.push_back(entry.path());
  }
  ASSERT_EQ(runs.size(), 1u) << "expected one run under " << build / "mih-evidence";
  EXPECT_TRUE(fs::exists(runs[0] / "llama" / "Reference" / "integration_state.json")) << runs[0];
  EXPECT_TRUE(fs::exists(runs[0] / "results.jsonl")) << runs[0];
}

TEST(CliMatrixTest, PrintsTheResolvedCasesAndRejectsBadInput) {
  CliRun list = mih("list");
  EXPECT_EQ(list.status, 0) << list.output;
  EXPECT_THAT(list.output, AllOf(HasSubstr("llama"), HasSubstr("moe"), HasSubstr("vlm"), HasSubstr("cpu-smoke"),
                                 HasSubstr("cpu-full")));
  CliRun smoke = mih("matrix --spec moe --preset cpu-smoke");
  EXPECT_EQ(smoke.status, 0) << smoke.output;
  // moe: the cases of every spec (Tp4 above its 2 KV heads among them), its 8 expert-parallel
  // ones, the EP=1 controls DpShard4 and Cp4Zz, and the pipelined ones (Pp2 with one
  // micro-batch, compared numerically).
  EXPECT_THAT(smoke.output, AllOf(HasSubstr("matrix cpu-smoke for spec moe: 34 cases, 0 rejected"),
                                  HasSubstr("Reference"), HasSubstr("DpShard2Tp2Sp"),
                                  HasSubstr("ResumeDpShard2ToTp2"), HasSubstr("(vs Tp2)"),
                                  HasSubstr("dp_shard4_ep2 float64 (vs Reference; EP=1 control DpShard4)"),
                                  HasSubstr("expert_parallel"),
                                  HasSubstr("dp_shard4 float64 (vs Reference; the EP=1 control of DpShard4Ep2)")));
  CliRun dense = mih("matrix --spec llama --preset cpu-smoke");
  EXPECT_THAT(dense.output, HasSubstr("rejected DpShard2Ep2: ep=2 shards routed experts, and spec 'llama' has none"));
  CliRun full = mih("matrix --spec llama --preset cpu-full --json");
  EXPECT_EQ(full.status, 0) << full.output;
  const nlohmann::json j = nlohmann::json::parse(full.output);
  EXPECT_EQ(j["spec"], "llama");
  EXPECT_FALSE(j["cases"].empty());
  const std::string dir = testing::temp_dir("cli_matrix").string();
  write_file_atomic(dir + "/bad.json", "{\"cases\": [{\"tp\": 2, \"bogus\": 1}]}");
  CliRun bad = mih("matrix --spec llama --matrix " + dir + "/bad.json");
  EXPECT_EQ(bad.status, exit_status(Code::kInvalidSpec)) << bad.output;
  EXPECT_THAT(bad.output, AllOf(HasSubstr("case 0"), HasSubstr("'bogus'")));
  write_file_atomic(dir + "/broken.json", "{\"cases\": [");
  CliRun broken = mih("matrix --spec llama --matrix " + dir + "/broken.json");
  EXPECT_EQ(broken.status, exit_status(Code::kInvalidSpec)) << broken.output;
  EXPECT_THAT(broken.output, HasSubstr("broken.json is not JSON"));
  CliRun preset = mih("matrix --spec llama --preset gpu-full");
  EXPECT_EQ(preset.status, exit_status(Code::kInvalidSpec)) << preset.output;
  EXPECT_THAT(preset.output,
              HasSubstr("unknown preset 'gpu-full'; presets: cpu-smoke, cpu-smoke-variants, cpu-smoke-documents, cpu-precision, cpu-full, "
                       "gpu-smoke"));
  CliRun spec = mih("matrix --spec gpt3");
  EXPECT_EQ(spec.status, exit_status(Code::kInvalidSpec)) << spec.output;
  EXPECT_THAT(spec.output, HasSubstr("unknown spec 'gpt3'; registered: gpt2, llama, llama_bias, llama_deep, llama_docs, llama_dropout, llama_epochs, llama_epochs_long, llama_swa, llama_tied, llama_unobserved, llama_unsharded_root, mla, mla_docs, moe, moe_deep, moe_qwen, qwen3, qwen3_docs, vlm, vlm_frozen_vision, vlm_mixed"));
}

// Reads a JSONL file's lines.
std::vector<nlohmann::json> jsonl(const std::filesystem::path& path) {
  std::string text;
  EXPECT_TRUE(read_file(path, &text)) << path;
  std::vector<nlohmann::json> out;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

TEST(CliRunTest, RunsACaseAndACrossTopologyResumeLeavingTheirEvidence) {
  const std::filesystem::path root = testing::temp_dir("cli_run");
  CliRun train = mih("run --spec llama --case DpShard2 --evidence-root " + root.string());
  ASSERT_EQ(train.status, 0) << train.output;
  EXPECT_THAT(train.output, AllOf(HasSubstr("llama/DpShard2: ran (STRUCTURE_VALIDATED)"), HasSubstr("evidence: ")));
  const auto metrics = jsonl(root / "llama/DpShard2/cases/runtime/metrics.jsonl");
  ASSERT_EQ(metrics.size(), 3u);
  EXPECT_EQ(metrics[2]["step"], 2);
  for (const char* f : {"check/findings.json", "probes/rank0.jsonl", "cases/runtime/performance_rank1.jsonl",
                        "run/train/comm/ledger_rank1.jsonl", "run/train/logs/rank0.log"}) {
    EXPECT_TRUE(std::filesystem::exists(root / "llama/DpShard2" / f)) << f;
  }
  CliRun resume = mih("run --spec llama --case ResumeDpShard2ToTp2 --evidence-root " + root.string());
  ASSERT_EQ(resume.status, 0) << resume.output;
  const std::filesystem::path dir = root / "llama/ResumeDpShard2ToTp2";
  EXPECT_EQ(jsonl(dir / "before_save/cases/runtime/metrics.jsonl").size(), 2u);
  const auto after = jsonl(dir / "cases/runtime/metrics.jsonl");
  ASSERT_EQ(after.size(), 1u);
  EXPECT_EQ(after[0]["step"], 2);  // continues from the saved step
  EXPECT_TRUE(std::filesystem::exists(dir / "checkpoint/index.json"));
  EXPECT_TRUE(std::filesystem::exists(dir / "checkpoint/load_rank1.json"));
  CliRun unknown = mih("run --spec llama --case Tp8 --evidence-root " + root.string());
  EXPECT_EQ(unknown.status, exit_status(Code::kInvalidSpec)) << unknown.output;
  EXPECT_THAT(unknown.output, HasSubstr("matrix 'cpu-smoke' has no case 'Tp8'; cases: Reference, DpShard2"));
  CliRun unwritable = mih("run --spec llama --case DpShard2 --evidence-root /proc/mih-no");
  EXPECT_EQ(unwritable.status, exit_status(Code::kFailedPrecondition)) << unwritable.output;
}

// The matrix is resolved once, by the parent: each case's ranks read run/case.json. A matrix
// file deleted as soon as the first case file exists (the parent has started, no rank has
// read anything yet) breaks neither the ranks of that case nor the later case's launch.
TEST(CliRunTest, RanksReadTheCaseFileTheMatrixFileIsReadOnce) {
  const std::filesystem::path root = testing::temp_dir("cli_case_file");
  const std::filesystem::path matrix = root / "matrix.json";
  write_file_atomic(matrix, R"({"name": "once", "dtype": "float64", "cases": [{"dp_shard": 2}]})");
  const std::string mih_path = (self_executable().parent_path() / "mih").string();
  const std::string script =
      shell_quote(mih_path) + " test --no-progress --evidence-root " + shell_quote((root / "ev").string()) +
      " --matrix " + shell_quote(matrix.string()) + " --gtest_filter='Llama/*.*/DpShard2' --gtest_brief=1 > " +
      shell_quote((root / "out.log").string()) + " 2>&1 & pid=$!; for i in $(seq 1 3000); do [ -f " +
      shell_quote((root / "ev/llama/Reference/run/case.json").string()) + " ] && break; sleep 0.01; done; rm -f " +
      shell_quote(matrix.string()) + "; wait $pid";
  const int raw = std::system(("bash -c " + shell_quote(script)).c_str());
  std::string log;
  read_file(root / "out.log", &log);
  ASSERT_TRUE(WIFEXITED(raw) && WEXITSTATUS(raw) == 0) << log;
  EXPECT_FALSE(std::filesystem::exists(matrix));
  for (const char* c : {"Reference", "DpShard2"}) {
    std::string text;
    ASSERT_TRUE(read_file(root / "ev/llama" / c / "run/case.json", &text)) << c;
    const auto file = nlohmann::json::parse(text);
    EXPECT_EQ(file["case"]["name"], c);
    EXPECT_EQ(jsonl(root / "ev/llama" / c / "cases/runtime/metrics.jsonl").size(), 3u) << c;
  }
  // The external-launcher path: `mih run --prepare` writes the case file, ranks started by
  // another launcher (here mih's own `launch`, as torchrun would) read it, verify-only asserts.
  const std::filesystem::path ext = root / "external";
  CliRun ref = mih("run --spec llama --case Reference --evidence-root " + ext.string());
  ASSERT_EQ(ref.status, 0) << ref.output;
  CliRun prepared = mih("run --prepare --spec llama --case DpShard2 --evidence-root " + ext.string());
  ASSERT_EQ(prepared.status, 0) << prepared.output;
  EXPECT_THAT(prepared.output, HasSubstr("train (2 ranks): mih worker --run-dir "));
  EXPECT_FALSE(std::filesystem::exists(ext / "llama/DpShard2/cases")) << "--prepare launches nothing";
  CliRun ranks = mih("launch -n 2 --evidence-root " + (root / "runs").string() + " case --evidence " +
                     (ext / "llama/DpShard2").string() + " --phase train");
  ASSERT_EQ(ranks.status, 0) << ranks.output;
  CliRun verified = mih("check " + (ext / "llama/DpShard2").string() + " --gtest_brief=1");
  EXPECT_EQ(verified.status, 0) << verified.output;
  // A phase the case does not have (a train case has no save) is refused, naming the phases.
  CliRun save = mih("launch -n 2 --evidence-root " + (root / "runs").string() + " case --evidence " +
                    (ext / "llama/DpShard2").string() + " --phase save");
  EXPECT_EQ(save.status, exit_status(Code::kInvalidSpec)) << save.output;
  EXPECT_THAT(save.output, HasSubstr("case 'DpShard2' (train) has the one phase train, not 'save'"));
  // A rank of a case without a case file says what is missing.
  const std::filesystem::path lone = root / "lone";
  CliRun orphan = mih("launch -n 1 --evidence-root " + (root / "runs").string() + " case --evidence " + lone.string());
  EXPECT_EQ(orphan.status, exit_status(Code::kFailedPrecondition)) << orphan.output;
  EXPECT_THAT(orphan.output, HasSubstr("run/case.json is missing"));
}

// A case's rank command is written once (cases::case_rank_arguments): the line `mih run --prepare`
// prints for torchrun is the one `mih submit`'s srun starts, word for word (they were written
// apart and had drifted: submit quoted every path, prepare none).
TEST(CliRunTest, PrepareAndSubmitStartARankWithTheSameCommand) {
  const std::filesystem::path root = testing::temp_dir("cli_rank_command");
  CliRun prepared = mih("run --prepare --spec llama --case DpShard2 --evidence-root " + root.string());
  ASSERT_EQ(prepared.status, 0) << prepared.output;
  const std::string marker = "train (2 ranks): mih ";
  const size_t at = prepared.output.find(marker);
  ASSERT_NE(at, std::string::npos) << prepared.output;
  const size_t from = at + marker.size();
  const std::string line = prepared.output.substr(from, prepared.output.find('\n', from) - from);
  EXPECT_THAT(line, HasSubstr("worker --run-dir " + (root / "llama/DpShard2/run/train").string()));
  CliRun submitted = mih("submit --dry-run --spec llama --cases DpShard2 --evidence-root " + root.string());
  ASSERT_EQ(submitted.status, 0) << submitted.output;
  EXPECT_THAT(submitted.output, HasSubstr("' " + line + "\n")) << "prepare printed: " << line;
}

TEST(CliCompareTest, ACaseMatchesTheReferenceAndATamperedParameterIsNamed) {
  const std::filesystem::path root = testing::temp_dir("cli_compare");
  for (const char* c : {"Reference", "Tp2Sp"}) {
    CliRun run = mih(std::string("run --spec llama --case ") + c + " --evidence-root " + root.string());
    ASSERT_EQ(run.status, 0) << run.output;
  }
  const std::string ref = (root / "llama/Reference").string(), tp = (root / "llama/Tp2Sp").string();
  CliRun match = mih("compare " + ref + " " + tp);
  EXPECT_EQ(match.status, 0) << match.output;
  EXPECT_THAT(match.output, HasSubstr("match: "));
  // The same run with norm.weight's gradient changed in one element at step 1.
  const std::filesystem::path bad = root / "tampered";
  std::filesystem::copy(root / "llama/Tp2Sp", bad, std::filesystem::copy_options::recursive);
  std::string text, out;
  ASSERT_TRUE(read_file(bad / "probes/rank0.jsonl", &text));
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    nlohmann::json j = nlohmann::json::parse(line);
    if (j["step"] == 1 && j["stage"] == "grad_before_clip") {
      auto& v = j["tensors"]["norm.weight"]["values"];
      v[3] = v[3].get<double>() + 1e-6;
    }
    out += j.dump() + "\n";
  }
  write_file_atomic(bad / "probes/rank0.jsonl", out);
  CliRun diverged = mih("compare " + ref + " " + bad.string());
  EXPECT_EQ(diverged.status, 1) << diverged.output;
  EXPECT_THAT(diverged.output, AllOf(HasSubstr("first divergence: parameter 'norm.weight' at step 1, stage grad_before_clip"),
                                     HasSubstr("> tolerance 1e-10"), HasSubstr("probes/rank0.jsonl")));
  // A candidate that records fewer tensors, or a stage fewer, does not pass: both sides must
  // hold the same quantities (on 3b2f82b this copy compared as a match).
  const std::filesystem::path fewer = root / "fewer";
  std::filesystem::copy(root / "llama/Tp2Sp", fewer, std::filesystem::copy_options::recursive);
  std::string dropped;
  ASSERT_TRUE(read_file(fewer / "probes/rank0.jsonl", &text));
  std::istringstream all_lines(text);
  for (std::string line; std::getline(all_lines, line);) {
    nlohmann::json j = nlohmann::json::parse(line);
    j["tensors"].erase("norm.weight");
    if (!(j["step"] == 2 && j["stage"] == "after_optimizer")) dropped += j.dump() + "\n";
  }
  write_file_atomic(fewer / "probes/rank0.jsonl", dropped);
  CliRun lacking = mih("compare " + ref + " " + fewer.string());
  EXPECT_EQ(lacking.status, 1) << lacking.output;
  EXPECT_THAT(lacking.output, HasSubstr("parameter 'norm.weight' at step 0, stage model_before: recorded by the reference, "
                                        "missing from the candidate"));
  CliRun reversed = mih("compare " + fewer.string() + " " + ref);
  EXPECT_EQ(reversed.status, 1) << reversed.output;
  EXPECT_THAT(reversed.output, HasSubstr("recorded by the candidate, missing from the reference"));
  CliRun missing = mih("compare " + ref + " " + root.string());
  EXPECT_EQ(missing.status, exit_status(Code::kFailedPrecondition)) << missing.output;
  EXPECT_THAT(missing.output, HasSubstr("has no environment.json and no case_run.json: it is not a case directory"));
}

TEST(CliInputTest, BadInputIsRejectedBeforeAnyRankStarts) {
  const std::string root = "--evidence-root " + testing::temp_dir("cli_bad").string();
  CliRun mesh = mih("selftest -n 4 --mesh tp=3 " + root);
  EXPECT_EQ(mesh.status, exit_status(Code::kInvalidSpec)) << mesh.output;
  EXPECT_THAT(mesh.output, HasSubstr("dp_replicate(1) * dp_shard(1) * cp(1) * tp(3) = 3 != world_size(4)"));
  CliRun axis = mih("selftest -n 2 --mesh dp=2 " + root);
  EXPECT_THAT(axis.output, HasSubstr("'dp' is a combined axis"));
  CliRun task = mih("launch -n 2 nosuchtask " + root);
  EXPECT_EQ(task.status, exit_status(Code::kInvalidSpec)) << task.output;
  EXPECT_THAT(task.output, HasSubstr("unknown worker task 'nosuchtask'"));
  CliRun dir = mih("selftest -n 2 --evidence-root /proc/mih-no");
  EXPECT_EQ(dir.status, exit_status(Code::kFailedPrecondition)) << dir.output;
  EXPECT_THAT(dir.output, HasSubstr("choose a writable run/evidence directory"));
  EXPECT_EQ(mih("selftest -n 2 --dtypes '' " + root).status, exit_status(Code::kInvalidSpec));
  if (!compat::backend_available(compat::BackendKind::kNccl)) {
    CliRun nccl = mih("selftest -n 1 --pg-backend nccl " + root);
    EXPECT_EQ(nccl.status, exit_status(Code::kUnimplemented)) << nccl.output;
    EXPECT_THAT(nccl.output, HasSubstr("process-group backend 'nccl' is not available in this build"));
  }
}

TEST(CliSelftestTest, TwoRanksPassAndLeaveEvidence) {
  auto root = testing::temp_dir("cli_selftest");
  CliRun run = mih("selftest -n 2 --repeats 1 --run-id r1 --evidence-root " + root.string());
  ASSERT_EQ(run.status, 0) << run.output;
  EXPECT_THAT(run.output, AllOf(HasSubstr("mesh tp=2"), HasSubstr("all checks passed")));
  auto dir = root / "r1" / "selftest";
  std::string text;
  ASSERT_TRUE(read_file(dir / "run.json", &text));
  auto record = nlohmann::json::parse(text);
  EXPECT_EQ(record["launch"]["status"], "ok");
  EXPECT_EQ(record["run_id"], "r1");
  ASSERT_TRUE(read_file(dir / "selftest.json", &text));
  EXPECT_TRUE(nlohmann::json::parse(text)["ok"].get<bool>());
  EXPECT_TRUE(std::filesystem::exists(dir / "comm" / "ledger_rank1.jsonl"));
}

TEST(CliSelftestTest, LauncherTemplateThatStartsNoRankFails) {
  auto root = testing::temp_dir("cli_template");
  CliRun run = mih("selftest -n 2 --launcher 'echo {cmd}' --evidence-root " + root.string());
  EXPECT_EQ(run.status, exit_status(Code::kAborted)) << run.output;
  EXPECT_THAT(run.output, HasSubstr("never reported completion"));
  EXPECT_THAT(run.output, ::testing::Not(HasSubstr("selftest.json")));
}


// The suite table decides where each suite is instantiated: no test of the main job is a
// skip, and each suite runs exactly on the cases it has something to check on.
TEST(CliConformanceTest, SuitesAreInstantiatedOnlyWhereTheyApply) {
  CliRun list = mih("test --no-progress --gtest_list_tests");
  ASSERT_EQ(list.status, 0) << list.output;
  std::map<std::string, std::set<std::string>> cases_of;  // "Llama/FsdpUnits" -> cases
  std::map<std::string, int> tests_of;                    // "Llama/FsdpUnits" -> TEST_Ps x cases
  std::istringstream lines(list.output);
  std::string suite;
  for (std::string line; std::getline(lines, line);) {
    if (line.empty() || line[0] == '[') continue;
    if (line[0] != ' ') {
      suite = line.substr(0, line.find('.'));
      continue;
    }
    const std::string test = line.substr(2, line.find(' ', 2) - 2);
    cases_of[suite].insert(test.substr(test.rfind('/') + 1));
    ++tests_of[suite];
  }
  int total = 0;
  for (const auto& [s, n] : tests_of) total += n;
  // 44 cases: 12 of cpu-smoke per reference spec, 4 of cpu-smoke-variants for llama_tied and
  // llama_bias. On the 30 cases of before: 972 tests before the check records, then 939: the tp
  // and cp input checks only where tp > 1 or cp > 1 with a cp-replicated field (vlm),
  // ReplicaConsistency only where a piece is replicated (tp, cp or dp_replicate > 1), the
  // undeclared-state test on every case, the shared-state event tests only with declared state
  // (no AC test of its own), the source keys on llama and moe, two new tests on every case
  // (the valid-token and normalizer recount, weight decay on 1-D parameters).
  // Then 1595 on 48 cases: vlm_frozen_vision on the variants lane (4 cases), the undeclared-
  // frozen test on every case, FrozenParameters (2 tests) on the frozen spec, GradientSync on
  // every case of more than one rank, TensorParallelGradients where tp > 1.
  // Then 1999 on 60 cases: llama_dropout on every cpu-smoke case (its masks match the one-rank
  // run's now). Then 2241 on 67 cases: moe's six expert-parallel cases and the EP=1 control
  // DpShard4 (the ep cases are rejected on the dense specs). Then 2375: GradientPresence (2
  // tests) on every case. Then 2977 on 82 cases: each axis
  // alone (DpReplicate2 and DpShard2Cp2 on every cpu-smoke spec), moe's DpReplicate2DpShard2Ep2,
  // Cp4ZzEp2 and its control Cp4Zz, llama_unsharded_root on the variants lane, and
  // PipelineOutputs on every case: every reduction path a mesh of 4 ranks can take. Then 3245
  // on 90 cases: MatchesOriginal (4 tests) on the Reference of llama, moe, moe_qwen and gpt2
  // (their goldens of the original model), and moe_qwen (138 tests) and gpt2 (122) on the
  // variants lane, the ports of the config-invariant faults. Then 4119 on 115 cases: the pp
  // cases of cpu-smoke on llama and moe (Pp2Mb4, Pp2DpShard2Mb2, Pp2Tp2SpMb2, Pp2AcMb4, the resumes
  // from pp2 into dp_shard2 and back, the twin Pp2), llama_tied's Pp2Mb2 (its tie across the
  // stages a replica pair), llama_deep (four layers) on the variants lane with Pp2Vpp2Mb4 and
  // Pp4Mb4, and PipelineSchedule on every pipelined case. Then 4234: Structure's alias test on
  // every case (issue 52). Then 4646 on 126 cases: tp above the 2 KV heads, Tp4 on llama,
  // llama_dropout, moe and vlm (152 tests) and Tp4Sp on the variants lane's 7 specs (260); Pp2,
  // listed now, was already there as a resume's twin. Then 5507 on 148 cases: qwen3, the
  // Qwen3-style port, on every cpu-smoke case (861 tests on 22 cases). Then 5511: the vlm, now
  // transformers' LLaVA, has its golden (MatchesOriginal's 4 tests on its Reference). Then
  // 5807: packed documents masked by document_ids, llama_docs (146 tests) and qwen3_docs (150)
  // on the cpu-smoke-documents lane (Reference, Cp2, Cp2Zz, Tp2Sp; goldens of their own). Then
  // 5953: llama_swa (146), a sliding window of 8 over the same documents, on that lane.
  // With mla (142, specs/matrices/mla.json), 6095. Then 6656 (issue 57, optimizers):
  // ResumeDpShard2SgdCosine with its twin DpShard2SgdCosine and ReferenceSgdCosine on the 5
  // cpu-smoke specs (538), the variants lane's Tp2 now Tp2Sgd with ReferenceSgd on its 7 specs
  // (197), Resume's learning-rate test on the 18 resumes of before; cpu-smoke's Cp2ZzTp2 (192)
  // moved to cpu-full. Then 6503: DpReplicate2DpShard2 (153) moved to cpu-full too, but on moe,
  // where it stays the EP=1 control of DpReplicate2DpShard2Ep2. Then 6765: llama_epochs (262 tests
  // on 7 cases, specs/matrices/llama_epochs.json), whose data loader has epochs: its 3 resumes
  // with DataLoaderState (2 tests each), their twins DpShard2, DpReplicate2 and Single. Then 6769:
  // its golden (MatchesOriginal's 4 tests on its Reference, the step at the schedule's step-0 lr).
  // Then 6911: mla_docs (142 tests), MLA over the packed documents, on the documents lane.
  EXPECT_EQ(total, 6911) << list.output;
  EXPECT_EQ(cases_of["VlmFrozenVision/FrozenParameters"],
            (std::set<std::string>{"Reference", "DpShard2", "Tp2Sgd", "ReferenceSgd", "Tp2Sp", "Tp4Sp"}));
  EXPECT_EQ(cases_of.count("Llama/FrozenParameters"), 0u);
  // The cases without pp (the specs whose port builds no pipeline stages run only these).
  const std::set<std::string> flat = {"Reference",     "DpShard2",      "DpReplicate2", "Tp2",      "Tp2Sp",
                                      "Tp4",           "Cp2Zz",         "DpShard2Cp2",  "DpShard2Tp2Sp",
                                      "DpShard2Ac",   "DpShard2Mb2",
                                      "ResumeDpShard2", "ResumeDpShard2ToTp2", "ResumeDpShard2SgdCosine",
                                      "DpShard2SgdCosine", "ReferenceSgdCosine"};
  const std::set<std::string> pipelined = {"Pp2Mb4", "Pp2DpShard2Mb2", "Pp2Tp2SpMb2", "Pp2AcMb4", "ResumeDpShard2ToPp2",
                                           "Pp2"};
  std::set<std::string> all = flat;
  all.insert(pipelined.begin(), pipelined.end());
  all.insert("ResumePp2ToDpShard2");
  std::set<std::string> compared = all, flat_compared = flat;
  for (const char* ref : {"Reference", "ReferenceSgdCosine"}) {  // compared with nothing
    compared.erase(ref);
    flat_compared.erase(ref);
  }
  EXPECT_EQ(cases_of["Llama/Structure"], all);
  EXPECT_EQ(cases_of["Llama/CommVolume"], all);
  EXPECT_EQ(cases_of["Llama/GradientPresence"], all);
  EXPECT_EQ(cases_of["Llama/FsdpUnits"], (std::set<std::string>{"DpShard2", "DpShard2Cp2", "DpShard2Tp2Sp",
                                                                "DpShard2Ac", "DpShard2Mb2",
                                                                "ResumeDpShard2", "Pp2DpShard2Mb2", "ResumePp2ToDpShard2",
                                                                "DpShard2SgdCosine", "ResumeDpShard2SgdCosine"}));
  EXPECT_EQ(cases_of["Llama/PipelineSchedule"], pipelined);
  EXPECT_EQ(cases_of.count("Vlm/PipelineSchedule"), 0u);  // the vlm builds no stages
  // Every case of a spec whose pipeline cuts rows out of documents (every reference spec).
  EXPECT_EQ(cases_of["Llama/PipelineOutputs"], all);
  EXPECT_EQ(cases_of["Llama/ModuleParity"], (std::set<std::string>{"Reference"}));
  EXPECT_EQ(cases_of["Llama/GradientSync"], compared);
  EXPECT_EQ(cases_of["Llama/TensorParallelGradients"],
            (std::set<std::string>{"Tp2Sp", "DpShard2Tp2Sp", "ResumeDpShard2ToTp2", "Tp2", "Tp4", "Pp2Tp2SpMb2"}));
  EXPECT_EQ(cases_of["Llama/Resume"], (std::set<std::string>{"ResumeDpShard2", "ResumeDpShard2ToTp2", "ResumePp2ToDpShard2",
                                                             "ResumeDpShard2ToPp2", "ResumeDpShard2SgdCosine"}));
  EXPECT_EQ(cases_of["Llama/CheckpointRoundTrip"], cases_of["Llama/Resume"]);
  EXPECT_EQ(cases_of["Llama/ActivationCheckpointEquivalence"], (std::set<std::string>{"DpShard2Ac", "Pp2AcMb4"}));
  EXPECT_EQ(cases_of["Llama/ReplicaConsistency"],
            (std::set<std::string>{"DpReplicate2", "Tp2Sp", "Cp2Zz", "DpShard2Cp2", "DpShard2Tp2Sp",
                                   "ResumeDpShard2ToTp2", "Tp2", "Tp4", "Pp2Tp2SpMb2"}));
  // A tie across the first and the last pipeline stage: its two copies are replicas.
  EXPECT_EQ(cases_of["LlamaTied/ReplicaConsistency"], (std::set<std::string>{"Tp2Sgd", "Tp2Sp", "Tp4Sp", "Pp2Mb2"}));
  EXPECT_EQ(cases_of["Llama/TensorParallelInputs"],
            (std::set<std::string>{"Tp2Sp", "DpShard2Tp2Sp", "ResumeDpShard2ToTp2", "Tp2", "Tp4", "Pp2Tp2SpMb2"}));
  EXPECT_EQ(cases_of.count("Llama/CpReplicatedInputs"), 0u);  // llama has no cp-replicated field
  EXPECT_EQ(cases_of["Vlm/CpReplicatedInputs"], (std::set<std::string>{"Cp2Zz", "DpShard2Cp2"}));  // pixel_values
  // document_ids, whole on every cp rank; the documents' own original model on the Reference.
  EXPECT_EQ(cases_of["LlamaDocs/CpReplicatedInputs"], (std::set<std::string>{"Cp2", "Cp2Zz"}));
  EXPECT_EQ(cases_of["Qwen3Docs/MatchesOriginal"], (std::set<std::string>{"Reference"}));
  EXPECT_EQ(cases_of["Llama/SourceCheckpoint"], all);
  EXPECT_EQ(cases_of.count("Vlm/SourceCheckpoint"), 0u);  // no source listing for the vlm
  EXPECT_EQ(cases_of.count("Llama/TiedParameters"), 0u);  // only llama_tied declares a tie
  EXPECT_EQ(cases_of["LlamaTied/TiedParameters"],
            (std::set<std::string>{"Reference", "DpShard2", "Tp2Sgd", "ReferenceSgd", "Tp2Sp", "Tp4Sp", "Pp2Mb2"}));
  // Dropout is refused under pp (its masks are not drawn stage-wise): llama_dropout declares no
  // pipeline layers.
  EXPECT_EQ(cases_of["LlamaDropout/Structure"], flat);
  EXPECT_EQ(cases_of["LlamaDropout/NumericParity"], flat_compared);
  EXPECT_EQ(cases_of["Llama/UndeclaredSharedState"], all);
  EXPECT_EQ(cases_of["Llama/InputIdentity"], compared);
  EXPECT_EQ(cases_of["Llama/NumericParity"], compared);
  // moe declares gradient accumulation not comparable (with its reason): no parity there.
  // Its expert-parallel cases and their EP=1 control are moe's alone.
  std::set<std::string> moe_parity = compared;
  for (const char* mb : {"DpShard2Mb2", "Pp2Mb4", "Pp2DpShard2Mb2", "Pp2Tp2SpMb2", "Pp2AcMb4"}) moe_parity.erase(mb);
  moe_parity.insert({"DpShard2Ep2", "DpShard2Ep2Ac", "DpShard2Tp2Ep2Sp", "DpShard4", "DpShard4Ep2",
                     "DpReplicate2DpShard2", "DpReplicate2DpShard2Ep2", "Cp4ZzEp2", "Cp4Zz",
                     "ResumeDpShard2Ep2ToDpShard2", "ResumeDpShard2ToDpShard2Ep2"});
  EXPECT_EQ(cases_of["Moe/NumericParity"], moe_parity);
  // Only the vlm declares a modality.
  EXPECT_EQ(cases_of.count("Llama/ModalityGradients"), 0u);
  EXPECT_EQ(cases_of.count("Moe/ModalityGradients"), 0u);
  EXPECT_EQ(cases_of["Vlm/ModalityGradients"], flat);
  // The ctest labels come from the same table.
  CliRun labels = mih("test --mih-list-cases");
  ASSERT_EQ(labels.status, 0) << labels.output;
  EXPECT_THAT(labels.output, HasSubstr("Llama llama Reference conformance,llama,reference,Structure,OptimizerLayout,"
                                       "DataContract,PipelineOutputs,CheckpointCoverage,SourceCheckpoint,SharedState,"
                                       "UndeclaredSharedState,StateInvariants,ModuleParity,MatchesOriginal,GradientPresence,CommVolume\n"));
  EXPECT_THAT(labels.output, HasSubstr("Vlm vlm DpShard2Ac conformance,vlm,activation_checkpoint,dp_shard,ac,"));
}

// The integration state goes all the way only on proof: MATRIX_PASSED when every test of the
// case passed and the spec's module parity holds (its ModuleParity tests, here not in the run
// as under ctest, judged on the Reference's evidence); FAILED naming the tests when one
// failed; unchanged when a filter left some out.
TEST(CliConformanceTest, ACaseIsMatrixPassedOnlyWhenItsTestsAndTheModuleParityPassed) {
  const std::filesystem::path root = testing::temp_dir("cli_states");
  const std::string r = " --no-progress --evidence-root " + root.string();
  auto state = [&](const std::string& c) {
    return read_json_file(root / "llama" / c / "integration_state.json").value("state", "");
  };
  CliRun part = mih("test" + r + " --gtest_filter='Llama/Structure.*/Tp2'");
  ASSERT_EQ(part.status, 0) << part.output;
  EXPECT_EQ(state("Tp2"), "STRUCTURE_VALIDATED") << "a filter left tests of the case out";
  CliRun all = mih("test" + r + " --gtest_filter='Llama/*.*/Tp2'");  // what ctest runs for the case
  ASSERT_EQ(all.status, 0) << all.output;
  EXPECT_EQ(state("Tp2"), "MATRIX_PASSED");
  const nlohmann::json tp2 = read_json_file(root / "llama/Tp2/integration_state.json");
  EXPECT_EQ(tp2["previous_state"], "MODULE_PARITY_PASSED");
  // A fault in the case's ranks: the failed tests are named in the state's reason.
  const std::filesystem::path faulty = testing::temp_dir("cli_states_fault");
  CliRun fault = mih("test --no-progress --evidence-root " + faulty.string() +
                     " --fault F09 --fault-cases Tp2 --gtest_filter='Llama/*.*/Tp2:Llama/ModuleParity.*'");
  EXPECT_EQ(fault.status, 1) << fault.output;
  const nlohmann::json failed = read_json_file(faulty / "llama/Tp2/integration_state.json");
  EXPECT_EQ(failed["state"], "FAILED");
  EXPECT_THAT(failed.value("reason", ""), HasSubstr("tests failed: NumericParity."));
}

// A run that checks nothing is an error that says what exists, never a green; a case the
// spec's topology rejects is named with its arithmetic before anything launches.
TEST(CliConformanceTest, NothingSelectedOrNothingRunnableIsAnError) {
  const std::filesystem::path root = testing::temp_dir("cli_nothing");
  const std::string r = " --no-progress --evidence-root " + (root / "ev").string();
  CliRun none = mih("test" + r + " --gtest_filter='Nope/*'");
  EXPECT_EQ(none.status, exit_status(Code::kInvalidSpec)) << none.output;
  EXPECT_THAT(none.output, AllOf(HasSubstr("the run selected no test (--gtest_filter=Nope/*)"),
                                 HasSubstr("Llama (spec llama, matrix cpu-smoke): Reference, DpShard2"),
                                 HasSubstr("e.g. --gtest_filter='Llama/*.*/DpShard2'")));
  const std::filesystem::path tp3 = root / "tp3.json";
  write_file_atomic(tp3, R"({"name": "tp3", "dtype": "float64", "reference": false, "cases": [{"tp": 3}]})");
  CliRun nothing = mih("test --prefixes Llama --matrix " + tp3.string() + r);
  EXPECT_EQ(nothing.status, exit_status(Code::kInvalidSpec)) << nothing.output;
  EXPECT_THAT(nothing.output, AllOf(HasSubstr("matrix 'tp3' lists no case spec 'llama' (Llama) can run; rejected: Tp3 (tp=3 "
                                              "does not divide 4"),
                                    HasSubstr("`mih matrix --spec llama --matrix")));
  const std::filesystem::path with_ref = root / "tp3_ref.json";
  write_file_atomic(with_ref, R"({"name": "tp3r", "dtype": "float64", "cases": [{"tp": 3}]})");
  CliRun filtered = mih("test --prefixes Llama --matrix " + with_ref.string() + r + " --gtest_filter='Llama/*.*/Tp3'");
  EXPECT_EQ(filtered.status, exit_status(Code::kInvalidSpec)) << filtered.output;
  // Its only parallel case rejected, the reference alone is not a run either.
  EXPECT_THAT(filtered.output, HasSubstr("matrix 'tp3r' lists no case spec 'llama' (Llama) can run; rejected: Tp3 (tp=3 "
                                         "does not divide 4"));
  CliRun run = mih("run --spec llama --case Tp3 --matrix " + with_ref.string() + " --evidence-root " + root.string());
  EXPECT_EQ(run.status, exit_status(Code::kInvalidSpec)) << run.output;
  EXPECT_THAT(run.output, HasSubstr("case 'Tp3' of matrix 'tp3r' cannot run spec 'llama': tp=3 does not divide 4"));
  EXPECT_FALSE(std::filesystem::exists(root / "llama")) << "nothing launched";
}

// The conformance runner end to end: one case's suites (its reference launched too), the
// results, verify-only on the same root, the reports, and each kind of bad input with its
// exit status.
TEST(CliConformanceTest, SuitesOnOneCaseThenCheckReportAndBadInputs) {
  const std::filesystem::path root = testing::temp_dir("cli_conformance");
  const std::string r = " --evidence-root " + root.string();
  CliRun run = mih("test" + r + " --gtest_filter='Llama/*.*/Tp2Sp' --gtest_brief=1");
  ASSERT_EQ(run.status, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("llama/Reference: launching 1 rank(s)"));
  EXPECT_THAT(run.output, HasSubstr("llama/Tp2Sp: launching 2 rank(s)"));
  auto results = jsonl(root / "results.jsonl");
  // The process's start line (the tests it will run) first, its end line last.
  ASSERT_GE(results.size(), 2u);
  EXPECT_EQ(results.front()["run"]["event"], "start");
  EXPECT_EQ(results.front()["run"]["tests"].size(), 38u);
  EXPECT_EQ(results.back()["run"]["event"], "end");
  EXPECT_EQ(results.back()["run"]["completed"], 38);
  results = std::vector<nlohmann::json>(results.begin() + 1, results.end() - 1);
  // The TEST_Ps of the suites the suite table applies to Tp2Sp (llama declares no modality;
  // no FSDP, resume or activation checkpointing here), and nothing skipped.
  ASSERT_EQ(results.size(), 38u);  // 31, then the gradient-sync, tp-partial and undeclared-frozen tests, then GradientPresence's two, then PipelineOutputs, then Structure's aliases
  std::set<std::string> suites;
  for (const auto& line : results) {
    EXPECT_EQ(line["status"], "passed") << line.dump();
    suites.insert(line["suite"].get<std::string>());
  }
  EXPECT_EQ(suites, (std::set<std::string>{"CheckpointCoverage", "CommVolume", "DataContract", "InputIdentity",
                                           "NumericParity", "OptimizerLayout", "ReplicaConsistency", "SharedState",
                                           "SourceCheckpoint", "StateInvariants", "Structure", "UndeclaredSharedState",
                                           "TensorParallelInputs", "GradientSync", "TensorParallelGradients",
                                           "GradientPresence",
                                           "PipelineOutputs"}));
  // Every Structure test says what it examined: the check's findings ("structure examined 19
  // parameters") or, for the tests judged from the parameter table (b6bd347), the file verdict's
  // ("examined the local shapes of 19 parameters ...", "examined 19 parameters: all float64 ...").
  for (const auto& line : results) {
    if (line["suite"] == "Structure") {
      EXPECT_THAT(line.value("examined", ""), HasSubstr("examined"));
      EXPECT_THAT(line.value("examined", ""), HasSubstr("19 parameters"));
    }
  }
  // Tp2Sp's tests all passed, and the spec's module parity holds on the Reference's evidence
  // (its ModuleParity tests did not run here, as under ctest): MATRIX_PASSED, agreeing with
  // exit 0. The Reference's own tests did not run: it keeps its state.
  EXPECT_EQ(read_json_file(root / "llama/Tp2Sp/integration_state.json")["state"], "MATRIX_PASSED");
  EXPECT_EQ(read_json_file(root / "llama/Reference/integration_state.json")["state"], "STRUCTURE_VALIDATED");

  // Verify-only: the same suites on the evidence, nothing launched.
  CliRun check = mih("check " + (root / "llama/Tp2Sp").string());
  EXPECT_EQ(check.status, 0) << check.output;
  EXPECT_THAT(check.output, Not(HasSubstr("launching")));
  EXPECT_THAT(check.output, HasSubstr("(verify-only)"));

  for (const char* format : {"md", "junit", "html"}) {
    const std::filesystem::path out = root / (std::string("report.") + format);
    CliRun report = mih("report " + root.string() + " --format " + format + " -o " + out.string());
    EXPECT_EQ(report.status, 0) << report.output;
    EXPECT_TRUE(std::filesystem::exists(out)) << out;
  }
  const std::string schema = std::string(MIH_TEST_SOURCE_DIR) + "/../evidence/junit.xsd";
  EXPECT_EQ(std::system(("xmllint --noout --schema " + schema + " " + (root / "report.junit").string() + " 2>/dev/null").c_str()), 0);

  // A case directory that holds another case: evidence of another run.
  std::filesystem::copy(root / "llama/Tp2Sp", root / "llama/Cp2Zz", std::filesystem::copy_options::recursive);
  CliRun foreign = mih("test --verify-only" + r + " --gtest_filter='Llama/*.*/Cp2Zz' --gtest_brief=1");
  EXPECT_EQ(foreign.status, exit_status(Code::kFailedPrecondition)) << foreign.output;
  EXPECT_THAT(foreign.output, HasSubstr("holds case 'Tp2Sp', not 'Cp2Zz'"));
  // A missing evidence file.
  std::filesystem::remove(root / "llama/Tp2Sp/check/findings.json");
  CliRun missing = mih("check " + (root / "llama/Tp2Sp").string() + " --gtest_brief=1");
  EXPECT_EQ(missing.status, exit_status(Code::kFailedPrecondition)) << missing.output;
  EXPECT_THAT(missing.output, HasSubstr("check/findings.json is missing"));
  // No evidence for a case in verify-only.
  CliRun absent = mih("test --verify-only" + r + " --gtest_filter='Vlm/*.*/Tp2' --gtest_brief=1");
  EXPECT_EQ(absent.status, exit_status(Code::kFailedPrecondition)) << absent.output;
  EXPECT_THAT(absent.output, HasSubstr("verify-only: no evidence for case vlm/"));
  // An unknown preset and a malformed matrix file: bad input before any test runs.
  CliRun preset = mih("test --matrix gpu-full" + r);
  EXPECT_EQ(preset.status, exit_status(Code::kInvalidSpec)) << preset.output;
  EXPECT_THAT(preset.output, HasSubstr("unknown preset 'gpu-full'"));
  const std::filesystem::path bad = root / "bad_matrix.json";
  write_file_atomic(bad, "{\"name\": \"x\", \"cases\": [{\"dp_shard\": 2,}]}");
  CliRun malformed = mih("test --matrix " + bad.string() + r);
  EXPECT_EQ(malformed.status, exit_status(Code::kInvalidSpec)) << malformed.output;
  EXPECT_THAT(malformed.output, HasSubstr(bad.string()));
  CliRun unknown_case = mih("run --spec gpt3 --case Reference" + r);
  EXPECT_EQ(unknown_case.status, exit_status(Code::kInvalidSpec)) << unknown_case.output;
  EXPECT_THAT(unknown_case.output, HasSubstr("unknown spec 'gpt3'"));
  CliRun no_results = mih("report " + (root / "llama").string());
  EXPECT_EQ(no_results.status, exit_status(Code::kFailedPrecondition)) << no_results.output;
  EXPECT_THAT(no_results.output, HasSubstr("results.jsonl"));
  // Fault injection: an unknown fault, and a fault without the cases it goes into.
  for (const auto& [command, says] : std::vector<std::pair<std::string, std::string>>{
           {"test --fault F99 --fault-cases Tp2Sp" + r, "unknown fault 'F99'"},
           {"test --fault F03" + r, "--fault and --fault-cases go together"},
           {"faults --fault F99 --out " + (root / "faults").string(), "unknown fault 'F99'"},
           // A case with its own trainer runs in float64 only: a reduced lane that keeps none of
           // the selected faults would check nothing.
           {"faults --fault F40 --dtype float32 --out " + (root / "faults").string(),
            "F40 train with a case's own trainer, which runs in the float64 lane only"},
           // An empty selection would run nothing and exit 0.
           {"faults --fault '' --out " + (root / "faults").string(), "--fault '' names no fault"}}) {
    CliRun bad_fault = mih(command);
    EXPECT_EQ(bad_fault.status, exit_status(Code::kInvalidSpec)) << command << "\n" << bad_fault.output;
    EXPECT_THAT(bad_fault.output, HasSubstr(says)) << command;
  }
}

}  // namespace
}  // namespace mih
