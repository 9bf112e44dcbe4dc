// `mih scaffold` (internal to harness/cli): writes a new model author's project, a small
// working port and its spec, from the templates in harness/cli/scaffold/ (compiled into the
// binary by cmake/MihEmbedFiles.cmake, so the installed `mih` and every conformance binary
// can write it).
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "harness/contract/evidence_layout.h"

namespace mih::cli {

/// A file compiled into the binary: its path relative to its folder, and its bytes.
struct EmbeddedFile {
  const char* path;
  const char* text;
};

/// The templates of harness/cli/scaffold/, "<template>/<file>", written for the port name
/// "my_port" (C++ prefix "MyPort"): the scaffold of `--name my_port --template T` is T's files
/// verbatim.
const std::vector<EmbeddedFile>& scaffold_templates();

/// The templates `mih scaffold --template` takes, the default first: "gpt2" (a tiny GPT-2-style
/// decoder) and "llama" (a Llama-style one: grouped-query attention, rotary, RMSNorm, SwiGLU,
/// pipeline stages).
std::vector<std::string> scaffold_template_names();

/// The file mih writes last into a scaffolded project: the name and each file's SHA-256, so a
/// later scaffold into the same folder replaces only files that are still as mih wrote them.
inline constexpr const char* kScaffoldRecord = layout::kScaffoldRecord;

/// "" when `name` can name a port, else why not (for --name's validator): a lower-case C++
/// identifier, [a-z][a-z0-9_]*, with no "__", not ending in "_", at most 48 characters, and
/// neither a C++ keyword nor a namespace the project already uses (std, mih, torch, at, c10,
/// testing, ...). It names the C++ namespace, the spec, the CMake project and the binary
/// `<name>_conformance`.
std::string scaffold_name_problem(const std::string& name);

/// "gpt2_tiny" -> "Gpt2Tiny": the test prefix of MIH_CONFORMANCE_SUITES.
std::string scaffold_prefix(const std::string& name);

/// What write_scaffold did.
struct ScaffoldResult {
  /// The folder, absolute.
  std::filesystem::path dir;
  /// The files written, relative to `dir`, the record last.
  std::vector<std::string> files;
  /// An earlier scaffold's unedited files were replaced.
  bool replaced = false;
};

/// Writes the project for port `name` into `out` (created with its parents): each file of
/// template `template_name` (one of scaffold_template_names()) with "my_port" and "MyPort"
/// replaced by `name` and scaffold_prefix(name), then the record (which names the template).
/// `out` must be new, empty, or an earlier scaffold whose files are all as mih wrote them;
/// anything else in it (a build folder, your own files) is left alone.
/// Throws: mih::Error{kInvalidSpec} for a bad name (scaffold_name_problem) or template;
///   mih::Error{kFailedPrecondition}, naming the path, when `out` is a file, holds files and no
///   record, holds a file the record does not list where a template goes, holds a listed
///   file that was edited since, or cannot be created or written (nothing is written then,
///   except when a write fails part way).
ScaffoldResult write_scaffold(const std::string& name, const std::filesystem::path& out,
                              const std::string& template_name = "gpt2");

}  // namespace mih::cli
