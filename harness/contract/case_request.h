// The case as a type (issue 36): spec::Case, one case of a resolved matrix, and CaseRequest,
// what the parent resolves once and writes once as run/case.json for every rank of the case to
// read (mih::layout::kCaseRequest). Strict JSON both ways: to_json writes every field,
// from_json requires each one mih always writes and rejects any other (a typo, an edit, a
// file of another tool), naming it. Torch-free, so that the verdicts (harness/compare) read
// the case typed, never through `.value(key, default)`.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <iosfwd>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "harness/base/parallel_config.h"

namespace mih::spec {

/// What a case does. kTrain covers one-axis, combined, activation-checkpoint and
/// gradient-accumulation cases (the config says which).
enum class CaseKind { kReference, kTrain, kResume, kCrossResume };
std::string case_kind_name(CaseKind kind);
/// Throws: mih::Error{kInvalidSpec} for another name, listing the valid ones.
CaseKind parse_case_kind(const std::string& name);

struct Case {
  /// GoogleTest parameter name: "Reference", "DpShard2", "Tp2Sp", "Cp2ZzTp2",
  /// "ResumeDpShard2", "ResumeDpShard2ToTp2".
  std::string name;
  CaseKind kind = CaseKind::kTrain;
  /// "reference", "axis", "combined", "pipeline", "activation_checkpoint",
  /// "grad_accumulation", "resume", "cross_resume".
  std::string group;
  /// The config it trains under (for a resume: after the load).
  ParallelConfig config;
  /// Resume cases: the config of the first run, which trains resume_at steps and saves.
  std::optional<ParallelConfig> save_config;
  int64_t resume_at = 0;
  /// Steps in all (a resume: resume_at before the save, the rest after the load).
  int64_t steps = 3;
  /// The name of the case its numbers are compared with ("Reference", or a resume's
  /// uninterrupted twin, named like a train case of `config`).
  std::string compare_to;
  /// The case's changes to the spec's TrainerOptions (spec/case_trainer.h: "optimizer",
  /// "momentum", "warmup_steps", "decay_steps", "min_lr", "max_grad_norm"); an empty object
  /// when it trains as the spec says. Its cases are named with a suffix ("Sgd", "SgdCosine").
  nlohmann::json trainer = nlohmann::json::object();
  /// "cpu" or "cuda"; the process-group backend, "gloo" or "nccl".
  std::string device = "cpu";
  std::string pg_backend = "gloo";

  int world_size() const { return config.world_size(); }
};

/// Every field; from_json reads what to_json wrote (run/case.json) and rejects unknown
/// fields. Throws: mih::Error{kInvalidSpec} naming the field.
void to_json(nlohmann::json& j, const Case& c);
void from_json(const nlohmann::json& j, Case& c);
/// GoogleTest: "DpShard2 (dp_shard2 float64, 2 ranks)".
void PrintTo(const Case& c, std::ostream* os);

}  // namespace mih::spec

namespace mih {

/// A precision lane: the dtype and parameter-init seed that override every case of a matrix
/// (`--dtype`, `--seed`, or a matrix source's suffix "@bfloat16,seed=2"). Empty: the matrix's.
struct Lane {
  std::optional<DType> dtype;
  std::optional<uint64_t> seed;  ///< in [0, 2^53): JSON numbers are doubles
  bool empty() const { return !dtype && !seed; }
  /// "bfloat16,seed=2", "float32", "seed=3"; "" when empty.
  std::string text() const;
  /// The matrix fields it overrides: {"dtype": "bfloat16", "seed": 2} ({} when empty).
  nlohmann::json overrides() const;
  /// `over`'s settings where it has them, this lane's elsewhere (a flag over a suffix).
  Lane merged_with(const Lane& over) const;
  bool operator==(const Lane&) const = default;
};

/// Parses a lane's text ("bfloat16,seed=2"; a bare word is the dtype).
/// Throws: mih::Error{kInvalidSpec} naming `where` for an empty lane, an unknown setting or
///   dtype, a setting given twice, or a seed that is no integer in [0, 2^53).
Lane parse_lane(std::string_view text, const std::string& where);

/// Where a case matrix comes from: a preset name or a JSON matrix file, and a lane.
/// Its text is "<base>" or "<base>@<lane>" ("cpu-smoke@bfloat16,seed=2"), which names the
/// resolved matrix, the memo of its cases and case_run.json's "matrix".
struct MatrixSource {
  std::string base;  ///< a preset ("cpu-smoke") or a path to a JSON matrix file
  Lane lane;
  std::string text() const { return lane.empty() ? base : base + "@" + lane.text(); }
  bool operator==(const MatrixSource&) const = default;
  /// Splits `source` at its last '@' when what follows is a lane ("cpu-smoke@bfloat16"); a
  /// source whose text after the last '@' has other characters than letters, digits, '=', ','
  /// and '_' (a path "/data/a@b/m.json") is a base without a lane.
  /// Throws: as parse_lane, naming the source.
  static MatrixSource parse(const std::string& source);
};

/// As its text (a JSON string); from_json parses it (throws as MatrixSource::parse).
void to_json(nlohmann::json& j, const MatrixSource& m);
void from_json(const nlohmann::json& j, MatrixSource& m);

/// What every rank of a case reads from <case dir>/run/case.json (written by the parent,
/// cases::prepare_case, before any rank starts; an external launcher's ranks read the same).
struct CaseRequest {
  std::string spec;  ///< the spec's registry name ("llama")
  spec::Case c;      ///< the resolved case
  /// The matrix source it was resolved from ("cpu-smoke", "cpu-smoke@bfloat16,seed=2", a
  /// JSON file): recorded, never read again.
  MatrixSource matrix;
  std::string training_backend;  ///< "trainer", "plain", ... (harness/session/backend.h)
  std::string fault;             ///< a catalog fault the ranks inject ("F03"), or ""
  /// Absolute path of the checkpoint directory the ranks initialize from; "" for none.
  std::string init_from;
  /// Its checkpoint_digest when the parent checked it; every rank checks the files against it.
  std::string init_from_sha256;
  /// How long the case may take, all its launches together; then every rank is stopped and
  /// the case is a transport failure. > 0.
  std::chrono::milliseconds case_timeout{std::chrono::minutes(5)};
  /// How long one collective may wait before its rank fails (an infrastructure failure, never
  /// a verdict). 0: case_timeout, so a hung rank is reported by the launcher's timeout.
  std::chrono::milliseconds collective_timeout{0};
  /// What produces the case's evidence, as a short hex digest over this binary and every field
  /// above (cases::case_fingerprint): evidence is reused only under the same one. "" until the
  /// parent computes it (cases::run_case does when the caller has not).
  std::string fingerprint;
};
/// Every field (the timeouts as integers "case_timeout_ms", "collective_timeout_ms"). from_json
/// requires spec, case, matrix, training_backend, fault, the timeouts and fingerprint;
/// init_from and init_from_sha256 may be absent ("" each: the seed's initialization).
/// Throws: mih::Error{kFailedPrecondition} naming a missing, mistyped or malformed field (the
///   case, the matrix source, a timeout that is no integer, a case timeout <= 0 or a negative
///   collective timeout); kInvalidSpec for an unknown field.
void to_json(nlohmann::json& j, const CaseRequest& r);
void from_json(const nlohmann::json& j, CaseRequest& r);
/// Reads `file` (a run/case.json). Throws: mih::Error{kFailedPrecondition} naming the file
/// when it is missing, not a JSON object, or not a request from_json reads (every error).
CaseRequest read_case_request(const std::filesystem::path& file);

}  // namespace mih
