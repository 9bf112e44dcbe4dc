// The evidence contract (docs/evidence.md): the versioned description of every file a case
// directory holds, as a manifest (schemas/evidence/v1/contract.json: path pattern, format,
// schema) and one JSON Schema (draft-07) per JSON file or per JSONL line. The schemas are
// compiled into the binary (what a check applies comes from the binary, never from the
// evidence) and installed with the package for other writers (share/mih/schemas/evidence/v1).
// mih's session stamps environment.json with the contract and its writer; `mih check` and
// `mih compare` validate a case directory before they trust it and name the writer. No torch.
#pragma once

#include <cstddef>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace mih::contract {

inline constexpr char kName[] = "mih-evidence";
inline constexpr int kVersion = 1;
/// The key of environment.json's stamp: {"contract": kName, "version": kVersion, "writer": ...}.
inline constexpr char kStampKey[] = "evidence_contract";
/// A writer's own files, which the contract does not describe, go under this directory of a
/// case directory (any format; never read by a check).
inline constexpr char kExtraDir[] = "extra";

/// The stamp a writer puts in environment.json under kStampKey. `writer` names the program and
/// its version ("mih 0.9.0 (session)", "mih-torch 0.9.0 (python)").
nlohmann::json stamp(const std::string& writer);

/// One way a case directory breaks the contract.
struct Problem {
  std::string file;     ///< relative to the case directory ("check/findings.json")
  std::string field;    ///< where in the file: "errors[0].code", "line 3: loss"; "" for the whole file
  std::string message;  ///< what is wrong ("missing required property 'code'")
  /// "check/findings.json: field errors[0].code: ..." (the file and field first, as a user
  /// looks for them).
  std::string text() const;
};

struct Validation {
  /// environment.json's stamp's writer, or "" when it has none.
  std::string writer;
  /// Files examined (every regular file of the directory and of its nested phases).
  int files = 0;
  /// JSON values validated against a schema (a JSONL file counts its lines).
  int values = 0;
  std::vector<Problem> problems;
  bool ok() const { return problems.empty(); }
};

/// Validates the case directory `dir` (and its nested before_save/) against the compiled
/// contract: every regular file must be named by a manifest entry (a writer's own files go
/// under extra/), every JSON file and JSONL line must parse (bounded: harness/base/json_fields.h)
/// and validate against its schema, a CSV must have the declared header and as many fields on
/// each row, environment.json must carry the stamp of this contract's name and version (exist,
/// when `require_stamp`: a case that never started training has none). A symlink, or more
/// than 200000 files, is a problem, never followed or walked. Stops after `max_problems`
/// problems. Never throws for the directory's contents.
/// Throws: mih::Error{kFailedPrecondition} if `dir` is not a directory.
Validation validate_case_dir(const std::filesystem::path& dir, bool require_stamp = true, size_t max_problems = 20);

/// The case directories of `evidence` (a directory holding case_run.json or environment.json;
/// below `evidence`, never a symlink): itself when it is one, else those among its children (a spec's directory)
/// and grandchildren (a run root, <root>/<spec>/<case>), sorted. Empty when it holds none.
std::vector<std::filesystem::path> case_dirs(const std::filesystem::path& evidence);

/// Whether the case in `dir` trained, so that a session's files are expected: false only when
/// its case_run.json records an outcome without a verdict (a case that never started training);
/// true without a record or when the record cannot be read (the contract then says why).
bool case_trained(const std::filesystem::path& dir);

/// validate_case_dir(dir, case_trained(dir)) before a check or a comparison reads `dir`.
/// Returns the validation (its writer). `advice` ends the message ("rerun the case, ...").
/// Throws: mih::Error{kFailedPrecondition} naming the contract, the writer and the first
///   problems (file and field), or when `dir` is not a directory.
Validation require_valid_case_dir(const std::filesystem::path& dir, const std::string& advice);

/// Validates `value` against the schema of the manifest entry that names `relative` (a JSONL
/// file's schema is that of one line). Returns the problems (file = relative; field as above,
/// prefixed "line <n>: " when `line` > 0).
/// Throws: mih::Error{kInvalidSpec} if no entry with a schema names `relative`.
std::vector<Problem> validate_value(const std::string& relative, const nlohmann::json& value, int line = 0);

/// The compiled contract: the manifest ("contract.json") and every schema, by file name.
const std::map<std::string, std::string_view>& compiled_files();

/// The one-line summary for a refusal: the first problems' text, each on its own line,
/// and how many more.
std::string summary(const Validation& v, size_t max_lines = 5);

}  // namespace mih::contract
