// ParallelConfig: one parallel configuration of a case, the only place the mesh degrees and
// the per-case knobs live (the parent resolves it once and writes it to run/case.json; every
// rank, DeviceMesh, ParallelContext, Trainer and the evidence readers use that one value).
// Torch-free (in mih::base so that torch-free layers, compare and evidence, can read it).
//
// The mesh dims are data: kMeshDims lists them outer to inner (TorchTitan's ParallelDims
// order) with their names, the ParallelConfig field holding the degree and the case-name
// part. How to add one: a field `int ep = 1;` below and a row in kMeshDims (then its groups
// in device_mesh.h's kMeshAxes); parsing, JSON, names, validation and the layout follow.
#pragma once

#include <array>
#include <cstdint>
#include <iosfwd>
#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

#include "harness/base/pipeline_schedule.h"

namespace mih {

/// Which tokens each cp rank holds: contiguous chunks, or zigzag (rank r holds chunks r and
/// 2 * cp - 1 - r of 2 * cp, load-balanced for causal attention).
enum class CpLayout { kContiguous, kZigzag };
/// "contiguous" or "zigzag".
std::string cp_layout_name(CpLayout layout);
/// Throws: mih::Error{kInvalidSpec} listing the valid names.
CpLayout parse_cp_layout(std::string_view name);

/// dtype of a case's parameters and compute; float64 is the oracle lane. harness/runtime/
/// dtypes.h converts to c10::ScalarType.
enum class DType { kFloat32, kFloat64, kBFloat16, kFloat16 };
/// "float32", "float64", "bfloat16", "float16" (PyTorch's Python names).
std::string dtype_name(DType dtype);
/// Throws: mih::Error{kInvalidSpec} listing the valid names.
DType parse_dtype_name(std::string_view name);

struct ParallelConfig;

/// One dim of the device mesh, outer to inner.
/// rank = (((pp_rank * dp_replicate + dp_replicate_rank) * dp_shard + dp_shard_rank) * cp + cp_rank) * tp
///        + tp_rank.
struct MeshDim {
  std::string_view name;          ///< "dp_shard": JSON field, --mesh axis, ledger axis
  int ParallelConfig::*degree;    ///< the field of ParallelConfig holding the degree
  std::string_view case_part;     ///< part of a ParallelConfig::name(): "dp_shard" -> "dp_shard2"
  /// The batch or the sequence is split along it, so every parameter's gradient is summed
  /// over it (its gradient domain); tp is not (only tp-partial gradients are summed over tp),
  /// nor pp (each pp rank holds other layers; only a parameter tied across stages is summed
  /// over its pp ranks).
  bool data_parallel;
};

/// One parallel configuration: mesh degrees (1 disables an axis) and the knobs of the run.
struct ParallelConfig {
  /// Pipeline parallel (outermost, TorchTitan's ParallelDims order): pp ranks hold
  /// consecutive stages of the model's decoder layers (pipeline_schedule.h), activations and
  /// their gradients pass between them point to point. 1 disables it.
  int pp = 1;
  int dp_replicate = 1;  ///< replicas (DDP / the replicate dim of HSDP)
  int dp_shard = 1;      ///< FSDP: parameters sharded on dim 0 over dp_shard
  int cp = 1;            ///< context parallel: the sequence dim is sharded over cp
  int tp = 1;            ///< tensor parallel (and sequence-parallel regions)
  /// Expert parallel (TorchTitan's ParallelDims): not a mesh dim of its own, its ranks are
  /// carved out of dp_shard x cp, so ep divides dp_shard * cp and the world stays
  /// dp_replicate * dp_shard * cp * tp. Routed experts are sharded over ep (E / ep per rank),
  /// FSDP-sharded over the rest of dp_shard x cp (edp = dp_shard * cp / ep ranks), and their
  /// gradients reduced over edp and dp_replicate only. 1 disables it.
  int ep = 1;
  /// Shard the activations between tensor-parallel regions on the sequence dim (tp > 1).
  bool sequence_parallel = false;
  /// Which tokens each cp rank holds. Only meaningful when cp > 1.
  CpLayout cp_layout = CpLayout::kContiguous;
  /// Recompute each activation-checkpoint region the model declares (a decoder layer) in
  /// backward instead of keeping its activations.
  bool activation_checkpointing = false;
  /// Micro-batches per step (gradient accumulation; under pp the micro-batches the schedule
  /// pipelines); divides the local batch.
  int micro_batches = 1;
  /// Virtual pipeline stages per pp rank (interleaved 1F1B: rank r holds stages r, r + pp,
  /// ...). 1: one stage per pp rank.
  int vpp = 1;
  /// The pipeline schedule when pp * vpp > 1. JSON "pp_schedule": "gpipe", "1f1b",
  /// "interleaved_1f1b"; absent: interleaved_1f1b when vpp > 1, else 1f1b.
  mih::pp::ScheduleKind pp_schedule = mih::pp::ScheduleKind::k1F1B;
  /// The precision lane: float64 (the oracle) and float32 train and compute in that dtype;
  /// bfloat16 and float16 compute the forward under autocast with float32 master weights,
  /// gradients, reductions and optimizer states (ParallelContext::master_dtype).
  DType dtype = DType::kFloat32;
  /// The noise twin of a reduced-precision lane (DESIGN.md section 7): every linear layer of
  /// degree 1 sums each of its three contractions in two halves (the forward's over the input
  /// features, the input gradient's over the output features, the weight and bias gradients'
  /// over the tokens), mathematically equivalent reduction orders that round differently, so
  /// the run measures the lane's rounding noise in the forward and in the gradients.
  bool noise_twin = false;
  /// Seed of parameter init and of the run.
  uint64_t seed = 0;

  /// The product of the mesh degrees.
  int world_size() const;
  /// Whether the model is split into pipeline stages (pp * vpp > 1).
  bool pipelined() const { return pp * vpp > 1; }
  /// The pipeline of one step: {pp, vpp, micro_batches}.
  mih::pp::PipelineShape pipeline_shape() const { return {pp, vpp, micro_batches}; }
  /// "pp2_dp_shard2_cp2zz_tp2_ep2_vpp2_gpipe_sp_ac_mb2_nt": the case-name part ("single"
  /// when all are 1; "gpipe" for that schedule, 1F1B and interleaved 1F1B being implied).
  std::string name() const;
  /// The mesh degrees only: "dp_shard=2,tp=2,ep=2" (degree-1 axes omitted; "1" if all are).
  std::string mesh_str() const;
  /// Whether the mesh degrees (and ep) equal `other`'s (the knobs may differ).
  bool same_mesh(const ParallelConfig& other) const;

  /// The mesh degrees of "dp_shard=2,tp=2" (axes not named stay 1; whitespace ignored; "ep=2"
  /// sets ep), the knobs at their defaults.
  /// Throws: mih::Error{kInvalidSpec} for an unknown axis (listing the valid ones), a
  ///   repeated axis, or a degree that is not an integer >= 1.
  static ParallelConfig parse_mesh(std::string_view text);
  /// A mesh for `world_size` that exercises as many axes as it can: prime factors, smallest
  /// first, go to tp, cp, dp_shard, dp_replicate in turn (4 -> cp=2,tp=2). For the selftest.
  static ParallelConfig spread(int world_size);

  /// Throws: mih::Error{kInvalidSpec} with the arithmetic if a degree is < 1 or their product
  ///   differs from `world_size` ("dp_replicate(1) * dp_shard(2) * cp(1) * tp(3) = 6 !=
  ///   world_size(4)"), or if ep does not divide dp_shard * cp ("ep(4) does not divide
  ///   dp_shard(2) * cp(1) = 2").
  void validate_mesh(int world_size) const;
  /// validate_mesh, and: micro_batches >= 1, sequence_parallel only with tp > 1, a schedule
  /// that fits pp, vpp and micro_batches (pp::validate), no ep with pp (not supported yet).
  /// Throws: mih::Error{kInvalidSpec} naming the config.
  void validate(int world_size) const;

  bool operator==(const ParallelConfig&) const = default;
};

/// The mesh dims, outer to inner.
inline constexpr std::array<MeshDim, 5> kMeshDims = {{
    {"pp", &ParallelConfig::pp, "pp", false},
    {"dp_replicate", &ParallelConfig::dp_replicate, "dp_replicate", true},
    {"dp_shard", &ParallelConfig::dp_shard, "dp_shard", true},
    {"cp", &ParallelConfig::cp, "cp", true},
    {"tp", &ParallelConfig::tp, "tp", false},
}};

/// Every field (the mesh dims, the knobs, and "name" on output); from_json rejects unknown
/// fields, non-integer or < 1 degrees, and values of the wrong JSON type, naming the field.
void to_json(nlohmann::json& j, const ParallelConfig& c);
void from_json(const nlohmann::json& j, ParallelConfig& c);
/// GoogleTest: the name and the dtype ("dp_shard2_tp2_sp float64").
void PrintTo(const ParallelConfig& c, std::ostream* os);
std::ostream& operator<<(std::ostream& out, const ParallelConfig& c);

}  // namespace mih
