// The case matrix (DESIGN.md section 8): which parallel configurations a conformance run
// trains a spec under, resolved from a preset ("cpu-smoke", "cpu-full") or a JSON matrix file
// (suites/matrices/gpu-nightly.json is the GPU example). Every case is compared with the
// reference (world size 1, float64 on CPU); a resume case is compared with its uninterrupted
// twin. A case the spec's topology cannot take (tp neither dividing the KV heads nor a multiple
// of them, a sequence cp cannot split, a global batch dp x micro-batches cannot split, more
// ranks than the preset allows) is rejected with the arithmetic, never silently dropped.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/contract/case_request.h"
#include "harness/spec/model_spec.h"

namespace mih::spec {

/// The names of a reduced-precision lane's world-size-1 reference and of its noise twin
/// (resolve_matrix adds both to a matrix whose dtype is not float64).
inline constexpr const char* kLaneReference = "LaneReference";
inline constexpr const char* kNoiseTwin = "NoiseTwin";


/// A case the matrix asked for and the spec cannot take, and why (with the arithmetic).
struct RejectedCase {
  std::string name;
  std::string reason;
};

struct CaseMatrix {
  std::string name;  ///< the preset or the file's "name"
  std::string spec;
  std::vector<Case> cases;  ///< the reference first
  std::vector<RejectedCase> rejected;
  /// The names of the cases the matrix's "cases" list asks for that the spec can take, in
  /// list order: what a run is asked to check. The cases resolve_matrix adds beside them (the
  /// Reference, LaneReference and NoiseTwin, a resume's uninterrupted twin, an EP=1 control)
  /// are not listed unless the list names them too; a run checks them only beside a listed one.
  std::vector<std::string> listed;

  /// Whether `name` is one of `listed`.
  bool is_listed(const std::string& name) const;

  /// The case named `name`. Throws: mih::Error{kInvalidSpec} listing the names.
  const Case& at(const std::string& name) const;
  /// {"name", "spec", "cases", "rejected": [{"name", "reason"}], "listed": [names]}.
  nlohmann::json to_json() const;
  /// The table `mih matrix` prints: one line per case (name, kind, world size, config,
  /// compared with; in a matrix with a case off the CPU also each case's device and process-
  /// group backend, "on cuda (nccl)"), then the rejected cases with their reasons, and a last
  /// line when no listed case remains.
  std::string table() const;
};

/// The names of the built-in presets: cpu-smoke (CI, <= 4 ranks), cpu-smoke-variants,
/// cpu-smoke-documents (packed documents: cp contiguous and zigzag, sp), cpu-precision (a float32 lane), cpu-full, gpu-smoke (world size 1 on one GPU, NCCL; the
/// float64 Reference on the CPU).
std::vector<std::string> preset_names();
/// The JSON of a built-in preset. Throws: mih::Error{kInvalidSpec} for an unknown name,
/// listing the presets.
nlohmann::json preset_json(const std::string& name);

/// Resolves a matrix (a preset's JSON or a file's) for `spec`:
///   {"name", "dtype": "float64", "seed": 0, "device": "cpu", "pg_backend": "gloo", "steps": 3,
///    "max_world_size": 4, "reference": true,
///    "cases": [{"dp_shard": 2, ...ParallelConfig fields},
///              {"kind": "resume", "config": {...}, "resume_at": 2},
///              {"kind": "cross_resume", "save": {...}, "load": {...}, "resume_at": 2}]}
/// The reference is always world size 1, float64, on CPU. A matrix of another dtype (a
/// reduced-precision lane) also gets kLaneReference (world size 1, that dtype, the matrix's
/// device) and kNoiseTwin (the same with ParallelConfig::noise_twin), both compared with the
/// Reference; its other cases are compared with kLaneReference. "dtype" defaults to float64
/// (the oracle lane, like the float64 presets): a reduced lane is asked for by name. "seed"
/// (default 0) is every case's parameter-init seed, the Reference's included. Cases the
/// spec's topology cannot take go to `rejected` with the arithmetic; the names of the listed
/// cases it can take go to `listed`.
/// Throws: mih::Error{kInvalidSpec} naming the case index and field for malformed JSON (an
///   unknown field or kind, a degree < 1, a resume without resume_at in (0, steps)).
CaseMatrix resolve_matrix(const ModelSpec& spec, const nlohmann::json& matrix);
/// resolve_matrix of a preset name or, when the source names a readable file, of its JSON.
/// A lane suffix "@<dtype>[,seed=N]" ("cpu-smoke@bfloat16,seed=2") sets the matrix's dtype and
/// seed (the resolved matrix is named by the whole source).
/// Throws: as resolve_matrix; kInvalidSpec naming the file for unparsable JSON, and for a
///   lane suffix with an unknown dtype or setting or a seed that is no integer.
CaseMatrix resolve_matrix_source(const ModelSpec& spec, const std::string& source);
/// The same for a parsed source (MatrixSource::parse, contract/case_request.h).
CaseMatrix resolve_matrix_source(const ModelSpec& spec, const MatrixSource& source);
/// resolve_matrix_source of a base without its lane: `lane`'s dtype and seed override the
/// matrix's fields. Throws: as resolve_matrix_source.
CaseMatrix resolve_matrix_base(const ModelSpec& spec, const std::string& preset_or_path, const Lane& lane = {});

/// Why `config` cannot run `spec` on at most `max_world_size` ranks with a global batch of
/// `global_batch` rows, or "" when it can: tp must divide every spec.tp_divides and divide
/// spec.num_key_value_heads or be a multiple of them (replicated KV heads), cp must
/// split spec.seq_len into cp (contiguous) or 2 * cp (zigzag) chunks, the global batch must
/// split over dp_replicate * dp_shard * micro_batches.
std::string topology_problem(const ModelSpec& spec, const ParallelConfig& config, int64_t global_batch,
                             int max_world_size);

}  // namespace mih::spec
