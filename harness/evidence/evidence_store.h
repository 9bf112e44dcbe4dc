// The evidence store: one case directory that checks, probes and the runner write into
// (DESIGN.md section 6). Every file write is atomic (temp file, fsync, rename: a reader or a
// crash never leaves half a file; the files a session rewrites at every step skip the fsync,
// case_run.json's digests vouch for them), JSONL appends are whole lines, and no path may
// escape the directory. The integration state machine lives in integration_state.json.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/base/files.h"
#include "harness/contract/integration_state.h"

namespace mih {

class EvidenceDir {
 public:
  /// Opens `root`, creating it, and removes temp files left by writers that died mid-write
  /// (a "<name>.tmp.<pid>" whose process is gone), so the directory holds only whole files.
  /// Throws: mih::Error{kFailedPrecondition} naming the path, the OS error and the fix if it
  ///   cannot be created or written.
  explicit EvidenceDir(std::filesystem::path root);

  /// Opens an existing `root` only to read it (mih compare, mih check): nothing is created,
  /// written or removed there.
  /// Throws: mih::Error{kFailedPrecondition} naming the path if it is not a directory.
  static EvidenceDir open_existing(const std::filesystem::path& root);

  const std::filesystem::path& root() const { return root_; }

  /// `relative` inside the directory.
  /// Throws: mih::Error{kInvalidSpec} for an empty or absolute path, a ".." component, or a
  ///   path that leaves the directory through a symlink.
  std::filesystem::path resolve(std::string_view relative) const;

  /// Writes `j` (indented) to `relative` atomically; parent folders are created. kDeferred
  /// skips the fsync (see Durability): for the files a session writes at every step.
  /// Throws: as resolve; kFailedPrecondition on an I/O error.
  void write_json(std::string_view relative, const nlohmann::json& j,
                  Durability durability = Durability::kFsync) const;
  void write_text(std::string_view relative, std::string_view text) const;
  /// Appends `j` as one line (compact JSON + "\n") with a single O_APPEND write, so
  /// concurrent appenders and a crash leave only whole lines.
  void append_jsonl(std::string_view relative, const nlohmann::json& j) const;
  /// The lines of a JSONL file.
  /// Throws: kFailedPrecondition naming the file (and line) when it cannot be read, a line is
  ///   not JSON or the last line has no newline (truncated or edited evidence).
  std::vector<nlohmann::json> read_jsonl(std::string_view relative) const;
  /// Reads a JSON file. Throws: kFailedPrecondition if missing; kInvalidSpec if not JSON.
  nlohmann::json read_json(std::string_view relative) const;

 private:
  struct ReadOnly {};
  EvidenceDir(std::filesystem::path root, ReadOnly) : root_(std::move(root)) {}
  std::filesystem::path root_;
};

/// The state machine over `dir`/integration_state.json ({schema_version, state,
/// previous_state, evidence: sorted unique paths, reason}).
class IntegrationStateMachine {
 public:
  explicit IntegrationStateMachine(const EvidenceDir& dir) : dir_(&dir) {}

  /// The current state, or nullopt-like: returns false when no state exists yet.
  /// Throws: mih::Error{kFailedPrecondition} as contract::parse_integration_state for a file
  ///   that is not the integration state mih writes.
  bool current(IntegrationState* state) const;
  /// The whole record of integration_state.json (which must exist).
  /// Throws: as current.
  contract::IntegrationStateRecord record() const;
  /// Moves to `next`: only the next gate (DISCOVERED first, from nothing), or a terminal
  /// state from any non-terminal one; `evidence` paths are added, `reason` recorded.
  /// Throws: mih::Error{kFailedPrecondition} naming both states for a skip, a step back, or
  ///   any move out of a terminal state (use a new evidence directory).
  void update(IntegrationState next, const std::vector<std::string>& evidence, const std::string& reason = "");
  /// Restart-safe: does nothing if the state is already at or past `target`; otherwise
  /// advances gate by gate. Throws: as update when the state is terminal.
  void advance_if_before(IntegrationState target, const std::vector<std::string>& evidence);
  /// Sets FAILED (or BLOCKED) with the reason, from any non-terminal state.
  void fail(const std::string& reason, const std::vector<std::string>& evidence, bool blocked = false);

 private:
  const EvidenceDir* dir_;
};

/// What the machine and build are: host, CPU, compiler, the MIH_* and launcher variables
/// (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, SLURM_*, OMPI_COMM_WORLD_*), git revision and
/// dirty flag of `source_dir` (when it is a git checkout), plus `extra` (torch version and
/// build flags, backend, CUDA and driver: what the caller knows).
nlohmann::json capture_environment(const std::filesystem::path& source_dir, const nlohmann::json& extra = {});

}  // namespace mih
