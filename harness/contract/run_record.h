// A run root's run.json read typed (ConformanceRun writes it: the matrix, each registration,
// each --init-from source): one validation where the file is read, a field of another type a
// named refusal, never a default. `mih check` derives a rerun's arguments from it.
#pragma once

#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace mih::contract {

/// One entry of run.json's "registrations": a spec registered under a test prefix.
struct RunRegistration {
  std::string prefix;            ///< the GoogleTest prefix ("Llama")
  std::string spec;              ///< the spec's registry name ("llama")
  std::string matrix;            ///< the matrix the registration ran (a name or a file)
  std::string training_backend;  ///< "trainer", "own_trainer", ...
};

/// One entry of run.json's "init_from": the checkpoint a spec's cases started from.
struct RunInitSource {
  std::string dir;     ///< the checkpoint's directory as given to --init-from
  std::string sha256;  ///< its digest when the run checked it
};

/// run.json. mih writes all three fields; each is optional so that a record a tool wrote with
/// fewer (a hand-made root) is read for what it holds: nullopt means the field is absent.
struct RunRecord {
  std::optional<std::string> matrix;
  std::optional<std::vector<RunRegistration>> registrations;
  std::optional<std::map<std::string, RunInitSource>> init_from;  ///< by spec
};

/// Reads `value` (run.json's content) as a RunRecord; `file` names it in a refusal.
/// Throws: mih::Error{kFailedPrecondition} "<file>: 'registrations' must be an array, got 3;
///   it is not the run.json `mih test` writes: ..." for a record that is no object, a field of
///   another type, a registration without its four strings or an init source without its dir
///   and sha256 strings.
RunRecord parse_run_record(const nlohmann::json& value, const std::string& file);

/// parse_run_record of the file `file`.
/// Throws: mih::Error{kFailedPrecondition} as parse_run_record, or for a file that cannot be read;
///   kInvalidSpec for one that is not JSON (read_json_file).
RunRecord read_run_record(const std::filesystem::path& file);

}  // namespace mih::contract
