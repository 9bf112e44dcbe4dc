// check/structure.json's parameter table read typed (schemas/evidence/v1/check.structure.schema.json):
// one ParameterRow per parameter as rank 0 holds it, validated against the contract's schema once
// where the file is read. The fields the schema requires are plain members; the optional ones
// are std::optional, each with the meaning its absence has (a writer that does not record it).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace mih::contract {

/// fsdp_rows: this rank's rows of dim 0 of the padded tensor.
struct FsdpRows {
  int64_t offset = 0, size = 0;
  int64_t chunk = 0;  ///< rows of each rank's (padded) shard
};

struct ParameterRow {
  std::string fqn;
  bool requires_grad = true;
  std::vector<int64_t> local_shape;
  std::string dtype;
  std::map<std::string, std::string> placements;  ///< axis -> "Replicate()", "Shard(0)", ...
  /// The logical shape, elements per dim; absent: not recorded (Structure cannot judge the
  /// local shape against the placements).
  std::optional<std::vector<int64_t>> global_shape;
  /// Other FQNs of the same tensor (a declared tie); empty: none recorded.
  std::vector<std::string> aliases;
  /// Device of the local tensor ("cpu", "cuda:0"); absent: not recorded.
  std::optional<std::string> device;
  /// This rank's tp piece of the padded shape; the own-trainer session writes none.
  std::optional<std::vector<int64_t>> tp_local_shape;
  /// The axes its gradient contributions are summed over; absent: none recorded.
  std::optional<std::vector<std::string>> grad_domain;
  /// "EXPERT" or "DENSE"; absent (a writer before expert parallelism): DENSE (expert()).
  std::optional<std::string> gradient_kind;
  /// The FSDP unit holding it; absent (the own-trainer session outside every unit): none.
  std::optional<std::string> fsdp_unit;
  /// Only under pp: the pipeline ranks holding a copy, and whether this copy is the counted one.
  std::optional<std::vector<int64_t>> pp_ranks;
  std::optional<bool> pp_counted;
  /// Only for an FSDP-sharded parameter: its rows, and the axis FSDP shards over (absent, a
  /// writer before expert parallelism: dp_shard; fsdp_axis()).
  std::optional<FsdpRows> fsdp_rows;
  std::optional<std::string> fsdp_axis;

  bool expert() const { return gradient_kind && *gradient_kind == "EXPERT"; }
  std::string fsdp_axis_or_dp_shard() const { return fsdp_axis ? *fsdp_axis : "dp_shard"; }
  /// Whether rank 0 holds it and counts it: without pp every parameter; under pp those of
  /// its stages (0 among pp_ranks), a parameter tied across stages by its counted copy
  /// (pp_counted absent: counted).
  bool on_rank0() const;
};

/// The parameter table of structure.json (`structure`, the parsed file; `file` names it in a
/// refusal), in the file's order.
/// Throws: mih::Error{kFailedPrecondition} naming the file and the field for a value the
///   schema refuses (a missing or mistyped field).
std::vector<ParameterRow> structure_parameters(const nlohmann::json& structure, const std::string& file);

}  // namespace mih::contract
