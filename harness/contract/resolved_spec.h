// spec.resolved.json read typed (schemas/evidence/v1/spec.resolved.schema.json), the parts a
// comparison and the verdicts read: the spec's name, its tolerances, and what it declares to
// be checked (modalities, state invariants, module parity cases). Validated against the
// contract's schema once where the file is read.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace mih::contract {

/// tolerances: relative-error tolerances by profile and dtype, and the lanes' calibration.
struct ResolvedTolerances {
  std::map<std::string, double> same_topology, cross_topology;  ///< dtype -> tolerance
  /// Only for a spec whose gradient accumulation is not linear in the micro-batches.
  std::optional<std::map<std::string, double>> grad_accumulation;
  /// Why gradient accumulation is not comparable; absent: comparable (no reason declared).
  std::optional<std::string> grad_accumulation_reason;
  double noise_k = 0, noise_k_update = 0, noise_floor_eps = 0, noise_oracle_factor = 0;
  /// The profile named ("same_topology", "cross_topology", "grad_accumulation"); nullptr when
  /// the spec declares none of that name.
  const std::map<std::string, double>* profile(const std::string& name) const;
};

/// modalities[]: a declared modality, the batch field that carries it and its parameters.
struct DeclaredModality {
  std::string field;
  std::vector<std::string> parameters;
};

/// invariants[]: a declared state invariant and its phase (structure, materialization,
/// checkpoint, runtime).
struct DeclaredInvariant {
  std::string name;
  std::string phase;
};

/// module_parity_cases[]: a declared module parity case and its relative-error tolerances
/// (output and aux_loss; the gradients).
struct DeclaredParityCase {
  std::string name;
  double tolerance = 0;
  double grad_tolerance = 0;
};

struct ResolvedSpec {
  std::string name;
  ResolvedTolerances tolerances;
  std::vector<DeclaredModality> modalities;           ///< empty: the spec declares none
  std::vector<DeclaredInvariant> invariants;          ///< empty: the spec declares none
  std::vector<DeclaredParityCase> module_parity_cases;  ///< empty: the spec declares none
  /// Globs of 1-D parameters whose weight decay is intended (ModelSpec::decayed_1d); empty:
  /// the spec declares none.
  std::vector<std::string> decayed_1d;
};

/// spec.resolved.json (`spec`, the parsed file; `file` names it in a refusal).
/// Throws: mih::Error{kFailedPrecondition} naming the file and the field for a value the
///   schema refuses (a missing or mistyped field).
ResolvedSpec resolved_spec(const nlohmann::json& spec, const std::string& file);

}  // namespace mih::contract
