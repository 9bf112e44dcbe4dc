// `mih scaffold --name NAME --out DIR [--template gpt2|llama]`: a new port's project from the
// templates compiled into the binary (scaffold.h), and the commands to build and test it.
#include "harness/cli/scaffold.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <memory>
#include <set>
#include <string>
#include <system_error>

#include <nlohmann/json.hpp>

#include "harness/base/error.h"
#include "harness/base/files.h"
#include "harness/base/owned_files.h"
#include "harness/base/sha256.h"
#include "harness/base/json_fields.h"
#include "harness/base/version.h"
#include "harness/cli/commands.h"
#include "harness/runtime/cli_support.h"
#include "harness/runtime/launcher.h"
#include "harness/base/strings.h"

namespace mih::cli {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr size_t kMaxNameLength = 48;

// Names a port cannot take: C++ keywords (C++20) and namespaces the generated code or the
// libraries it links already use.
const std::set<std::string>& reserved_names() {
  static const std::set<std::string> names = {
      "alignas", "alignof", "and", "and_eq", "asm", "auto", "bitand", "bitor", "bool", "break", "case", "catch",
      "char", "char8_t", "char16_t", "char32_t", "class", "compl", "concept", "const", "consteval", "constexpr",
      "constinit", "const_cast", "continue", "co_await", "co_return", "co_yield", "decltype", "default", "delete",
      "do", "double", "dynamic_cast", "else", "enum", "explicit", "export", "extern", "false", "float", "for",
      "friend", "goto", "if", "inline", "int", "long", "mutable", "namespace", "new", "noexcept", "not", "not_eq",
      "nullptr", "operator", "or", "or_eq", "private", "protected", "public", "register", "reinterpret_cast",
      "requires", "return", "short", "signed", "sizeof", "static", "static_assert", "static_cast", "struct",
      "switch", "template", "this", "thread_local", "throw", "true", "try", "typedef", "typeid", "typename",
      "union", "unsigned", "using", "virtual", "void", "volatile", "wchar_t", "while", "xor", "xor_eq",
      // namespaces of the libraries a conformance binary links, and main
      "std", "mih", "torch", "at", "c10", "c10d", "caffe2", "gloo", "testing", "nlohmann", "main",
      // macros the compiler predefines, and C library names the generated code's headers
      // declare at global scope or as macros (the name becomes a namespace)
      "linux", "unix", "i386", "errno", "signal", "assert", "stdin", "stdout", "stderr", "environ", "exit",
      "abort", "printf", "time", "clock", "select", "poll", "read", "write", "open", "close", "pipe", "fork",
      "kill", "sleep", "div", "abs", "index", "rand", "random", "isnan", "isinf", "math"};
  return names;
}

// Every occurrence of `from` in `text` replaced by `to`.
std::string replace_all(std::string text, const std::string& from, const std::string& to) {
  for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size())) {
    text.replace(at, from.size(), to);
  }
  return text;
}

// The prefix mih is installed in, when this binary is an installed `mih` (<prefix>/bin/mih
// beside <prefix>/lib*/cmake/mih/mihConfig.cmake); "" for a binary of a build tree.
fs::path installed_prefix() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return {};
  // <prefix>/bin/mih, or the core binary the `mih` front runs, <prefix>/libexec/mih/mih-core.
  const fs::path dir = exe.parent_path();
  const fs::path prefix = dir.filename() == "mih" && dir.parent_path().filename() == "libexec"
                              ? dir.parent_path().parent_path()
                              : dir.parent_path();
  for (const char* libdir : {"lib", "lib64", "lib/x86_64-linux-gnu", "lib/aarch64-linux-gnu"}) {
    if (fs::exists(prefix / libdir / "cmake" / "mih" / "mihConfig.cmake", ec)) return prefix;
  }
  return {};
}

// The files of template `template_name`, their paths relative to the project ("model.h").
std::vector<EmbeddedFile> template_files(const std::string& template_name) {
  const std::vector<std::string> names = scaffold_template_names();
  MIH_CHECK(std::find(names.begin(), names.end(), template_name) != names.end(), "scaffold: --template '",
            template_name, "' is not a template; the templates are ", join(names, ", "));
  const std::string folder = template_name + "/";
  std::vector<EmbeddedFile> files;
  for (const auto& file : scaffold_templates()) {
    if (std::string(file.path).rfind(folder, 0) == 0) files.push_back({file.path + folder.size(), file.text});
  }
  return files;
}

}  // namespace

std::vector<std::string> scaffold_template_names() { return {"gpt2", "llama"}; }

std::string scaffold_name_problem(const std::string& name) {
  const std::string rule =
      "a port name is a lower-case C++ identifier: a letter a-z, then letters a-z, digits and single '_', not "
      "ending in '_', at most " + std::to_string(kMaxNameLength) + " characters (it names the C++ namespace, the "
      "spec, the CMake project and the binary NAME_conformance), e.g. 'gpt2_tiny'";
  const bool chars_ok = std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
  });
  if (name.empty() || !(name[0] >= 'a' && name[0] <= 'z') || !chars_ok || name.find("__") != std::string::npos ||
      name.back() == '_' || name.size() > kMaxNameLength) {
    return "'" + name + "' is not a port name: " + rule;
  }
  if (reserved_names().count(name)) {
    return "'" + name + "' is a C++ keyword or a namespace the project already uses (std, mih, torch, at, c10, "
           "testing, ...), or a name the compiler or the C library already gives a meaning (linux, errno, "
           "signal, ...); choose another name, e.g. '" + name + "_port'";
  }
  return "";
}

std::string scaffold_prefix(const std::string& name) {
  std::string out;
  bool up = true;
  for (char c : name) {
    if (c == '_') {
      up = true;
      continue;
    }
    out += up && c >= 'a' && c <= 'z' ? static_cast<char>(c - 'a' + 'A') : c;
    up = false;
  }
  return out;
}

ScaffoldResult write_scaffold(const std::string& name, const fs::path& out, const std::string& template_name) {
  const std::string problem = scaffold_name_problem(name);
  MIH_CHECK(problem.empty(), "scaffold: --name ", problem);
  const std::vector<EmbeddedFile> templates = template_files(template_name);
  ScaffoldResult result;
  result.dir = fs::absolute(out).lexically_normal();
  if (result.dir.filename().empty()) result.dir = result.dir.parent_path();
  std::error_code ec;
  result.replaced = fs::exists(result.dir / kScaffoldRecord, ec);
  // An earlier scaffold is rewritten only where each file mih would replace is still as mih
  // wrote it; other files in the folder (a build folder, notes) are left alone.
  std::vector<std::string> paths;
  for (const auto& file : templates) paths.push_back(file.path);
  check_owned(result.dir, kScaffoldRecord, paths, "scaffold");
  fs::create_directories(result.dir, ec);
  MIH_CHECK_CODE(!ec, Code::kFailedPrecondition, "scaffold: cannot create --out ", result.dir.string(), ": ",
                 ec.message(), "; give a directory you can write");
  MIH_CHECK_CODE(::access(result.dir.c_str(), W_OK) == 0, Code::kFailedPrecondition, "scaffold: cannot write into --out ",
                 result.dir.string(), ": ", std::error_code(errno, std::generic_category()).message(),
                 "; give a directory you can write (nothing was written)");
  json record = {{"name", name},
                 {"template", template_name},
                 {"written_by", "mih " + std::string(harness_version())},
                 {"files", json::object()}};
  const std::string prefix = scaffold_prefix(name);
  for (const auto& file : templates) {
    const std::string text = replace_all(replace_all(file.text, "MyPort", prefix), "my_port", name);
    write_file_atomic(result.dir / file.path, text);
    record["files"][file.path] = sha256_hex(text);
    result.files.push_back(file.path);
  }
  write_file_atomic(result.dir / kScaffoldRecord, record.dump(2) + "\n");
  result.files.push_back(kScaffoldRecord);
  return result;
}

CommandRun setup_scaffold(CLI::App& sub, const Invocation&) {
  struct Flags {
    std::string name;
    std::string out;
    std::string template_name = "gpt2";
  };
  auto f = std::make_shared<Flags>();
  sub.add_option("--name", f->name,
                 "the port's name: a lower-case C++ identifier (letters a-z, digits, single '_'), e.g. gpt2_tiny")
      ->required()
      ->check(CLI::Validator([](std::string& v) { return scaffold_name_problem(v); }, "NAME"));
  sub.add_option("--out", f->out,
                 "the project's directory: created; or empty; or an earlier scaffold none of whose files was edited")
      ->required()
      ->check(CLI::Validator([](std::string& v) { return v.empty() ? std::string("an empty path") : std::string(); },
                             "DIR"));
  sub.add_option("--template", f->template_name,
                 "the port to start from: gpt2 (default: a tiny GPT-2-style decoder) or llama (a Llama-style one: "
                 "grouped-query attention, rotary, RMSNorm, SwiGLU, pipeline stages)")
      ->check(CLI::IsMember(scaffold_template_names()));
  return [f] {
    const ScaffoldResult r = write_scaffold(f->name, f->out, f->template_name);
    std::string files = join(r.files, ", ");
    std::printf("mih scaffold: %s port '%s' (template %s) in %s: %s\n", r.replaced ? "rewrote" : "wrote",
                f->name.c_str(), f->template_name.c_str(), r.dir.c_str(), files.c_str());
    // The commands as the README's quickstart shows them: the folder as given, the prefix of
    // this installed mih (or the placeholder, from a build tree).
    std::string dir = f->out;
    while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
    const fs::path prefix = installed_prefix();
    const std::string q = shell_quote(dir), p = prefix.empty() ? "<prefix>" : shell_quote(prefix.string());
    std::printf("build it and run its conformance matrix (cpu-smoke):\n"
                "  cmake -S %s -B %s/build -DCMAKE_PREFIX_PATH=%s\n"
                "  cmake --build %s/build\n"
                "  ctest --test-dir %s/build --output-on-failure\n",
                q.c_str(), q.c_str(), p.c_str(), q.c_str(), q.c_str());
    if (prefix.empty()) {
      std::printf("<prefix>: where mih is installed; this mih is not an installed one (`cmake --install <mih build> "
                  "--prefix <prefix>` installs it)\n");
    }
    return 0;
  };
}

}  // namespace mih::cli
