// The verdicts of the conformance suites (suites/, DESIGN.md sections 3 and 7): each reads a
// case's evidence directory (and its reference's) and says pass, fail (with a message that
// names the first offender, the step and stage, the errors, the tolerance and the file to
// open) or skip (the invariant does not apply to the case). The suites' TEST_Ps are thin
// wrappers over these, so the verdicts are tested directly on real evidence with one file
// broken (tests/compare). No torch: a verify-only run reads evidence produced elsewhere.
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/contract/evidence_layout.h"
#include "harness/compare/compare.h"
#include "harness/contract/case_request.h"
#include "harness/contract/findings_file.h"
#include "harness/base/parallel_config.h"

namespace mih::verdicts {

/// Read-only view of one case's evidence directory (the layout of harness/session/session.h,
/// plus case_run.json and checkpoint/roundtrip_<event>.json written by the case runner).
/// Files are read once and cached.
class CaseEvidence {
 public:
  /// Throws: mih::Error{kFailedPrecondition} naming the directory when it does not exist.
  explicit CaseEvidence(std::filesystem::path dir);
  const std::filesystem::path& dir() const { return dir_; }
  bool has(const std::string& relative) const;
  /// Throws: mih::Error{kFailedPrecondition} naming the file and the directory ("the case did
  ///   not finish, or this directory belongs to another run") when missing; kInvalidSpec when
  ///   it is not JSON.
  const nlohmann::json& json(const std::string& relative) const;
  /// Every line of a JSONL file. Throws: as json().
  const std::vector<nlohmann::json>& jsonl(const std::string& relative) const;
  /// check/findings.json read typed (contract::findings_file: the findings, every field
  /// required, and the record of the checks that ran).
  /// Throws: as json(); mih::Error{kFailedPrecondition} naming the file and the field the
  ///   contract's schema refuses (a finding without severity, ...), never a default.
  contract::FindingsFile findings() const {
    return contract::findings_file(json(layout::kFindings), layout::kFindings, (dir_ / layout::kFindings).string());
  }
  /// The parallel config the case ran under (config.resolved.json, whose other fields are
  /// the trainer's options and the world size).
  /// Throws: as json(); kInvalidSpec naming the file when its config is malformed.
  const ParallelConfig& config() const;
  /// environment.json's "case": the spec::Case the runner launched, read strictly (every
  /// field to_json writes, no other), never field by field with defaults.
  /// Throws: mih::Error{kFailedPrecondition} naming the file and the field when it is
  ///   missing, mistyped or unknown (not mih's evidence, or edited).
  const spec::Case& resolved_case() const;
  /// The registry name of the spec the case ran (spec.resolved.json "name").
  /// Throws: mih::Error{kFailedPrecondition} naming the file when it is not an object with a
  ///   string "name" (not mih's evidence, or edited).
  std::string spec_name() const;

 private:
  std::filesystem::path dir_;
  mutable std::map<std::string, nlohmann::json> json_;
  mutable std::map<std::string, std::vector<nlohmann::json>> jsonl_;
  mutable std::optional<ParallelConfig> config_;
  mutable std::optional<spec::Case> case_;
};

struct Verdict {
  enum class Status { kPass, kFail, kSkip };
  Status status = Status::kPass;
  std::string message;

  static Verdict pass(std::string message = "") { return {Status::kPass, std::move(message)}; }
  static Verdict fail(std::string message) { return {Status::kFail, std::move(message)}; }
  static Verdict skip(std::string why) { return {Status::kSkip, std::move(why)}; }
  bool passed() const { return status == Status::kPass; }
};

/// Fails when findings.json holds an error finding whose code is one of `codes`, listing each
/// (code, owner, message, remediation) and the file to open; and when the check that emits
/// one of the codes (codes::check_of) has no run record in findings.json "checks", or
/// examined nothing ("check X did not run on this case"). A pass says what each examined.
Verdict no_error_findings(const CaseEvidence& ev, const std::vector<std::string>& codes);

/// The relative tolerance of a case against its comparison target: the spec's
/// (spec.resolved.json "tolerances") for the case's dtype, "same_topology" for a resume
/// against its twin and "cross_topology" otherwise; a grad-accumulation case uses
/// "grad_accumulation" when the spec declares it (a model whose loss is not linear in the
/// micro-batches, e.g. a per-micro-batch MoE load-balancing loss).
double case_tolerance(const CaseEvidence& ev);

/// Why the case's numbers are not comparable with its reference, or "": a grad-accumulation
/// case of a spec that declares grad_accumulation_reason without a grad_accumulation
/// tolerance.
std::string not_comparable_reason(const CaseEvidence& ev);

/// Which quantities of compare_evidence a NumericParity-style verdict asserts.
enum class Quantity { kInput, kLoss, kGradNorms, kLr, kTensors };

/// Compares the case with `reference` (compare_evidence, from step `first_step`) and fails
/// on the first divergence of kind `quantity`, with its message and the number of others.
/// With a `calibration` each quantity has its calibrated tolerance (`tolerance` is unused),
/// every message reports error / noise, and (`record`) the whole comparison is written to
/// the candidate's compare/calibration.json (calibration_evidence). A spec's reason why
/// gradient accumulation is not comparable (not_comparable_reason) skips it only when the two
/// runs split the batch into different numbers of micro-batches.
/// Throws: as compare_evidence; kFailedPrecondition when calibration.json cannot be written.
Verdict parity(const CaseEvidence& reference, const CaseEvidence& candidate, Quantity quantity, double tolerance,
               int64_t first_step = 0, const Calibration* calibration = nullptr, bool record = true);

/// Whether `candidate` is a case of a reduced-precision lane (its dtype is not float64), whose
/// parity is judged at calibrated tolerances.
bool calibrated_lane(const CaseEvidence& candidate);

/// The calibration of `candidate`'s lane: the noise of every quantity between
/// `lane_reference` and `noise_twin` (compare_evidence), with the settings of the candidate's
/// spec.resolved.json (tolerances noise_k, noise_k_update, noise_floor_eps and, for a
/// candidate compared with the float64 Reference, noise_oracle_factor); k_override >= 0
/// replaces noise_k and noise_k_update (e.g. 0 to show that an uncalibrated tolerance fails a
/// correct port).
/// Throws: as compare_evidence; kInvalidSpec when the spec declares none of these settings
///   (evidence of an older harness), or the two are not cases of the candidate's dtype.
Calibration lane_calibration(const CaseEvidence& lane_reference, const CaseEvidence& noise_twin,
                             const CaseEvidence& candidate, double k_override = -1);

/// The evidence of a calibrated comparison (compare/calibration.json): the lane's dtype,
/// epsilon, k and floor, and per quantity (kind, name, step, stage) its error, noise,
/// tolerance, error / noise and error / tolerance; the largest error / tolerance and where.
nlohmann::json calibration_evidence(const Calibration& calibration, const Comparison& comparison);

/// Where a failed test of `suite` on case `ev` puts the fault (the `blamed` of `mih faults`):
/// the localization a parity verdict's `message` opens with ("localized to '<place>': ...");
/// else the place the suite examines: "data" (InputIdentity, DataContract, the tp/cp input
/// suites), "checkpoint" (the checkpoint suites, Resume, a checkpoint-phase invariant),
/// "optimizer" (OptimizerLayout, FrozenParameters), "grad_sync" (GradientSync, the tp
/// gradient suite, CommVolume); else the module of the first error finding's owner (the
/// module of a parameter, or the producer a shared-state finding names).
Localization blame(const CaseEvidence& ev, const std::string& suite, const std::string& message);

/// FsdpUnits: skip unless dp_shard > 1; every sharded parameter (structure.json) belongs to
/// a unit of fsdp_units.json, every unit's parameters exist and hold one dtype and mesh.
Verdict fsdp_units_cover_parameters(const CaseEvidence& ev);

/// Whether fsdp_units_cover_parameters has something to examine on `ev`: "" when dp_shard > 1,
/// else why not.
std::string fsdp_units_examinable(const CaseEvidence& ev);

/// Rank 0's shape of a tensor of `global_shape` under `placements` (axis -> "Replicate()",
/// "Shard(<dim>)", "Shard(<dim>, partitions=<n>)") over the mesh axes' `degrees`, into `*shape`:
/// cut by every axis but the FSDP ones (dp_shard, edp) first, then by those (mih's order, and
/// FSDP2's over a tensor-parallel piece), each cut rank 0's chunk of torch.chunk
/// (ceil(n / degree) elements; with partitions, that of each partition). Returns "" or why the
/// placements cannot be applied (an unknown axis or placement, a dim the tensor lacks).
std::string expected_rank0_shape(const std::vector<int64_t>& global_shape,
                                 const std::map<std::string, std::string>& placements,
                                 const std::map<std::string, int64_t>& degrees, std::vector<int64_t>* shape);

/// Structure, from check/structure.json and config.resolved.json (any writer): every row's
/// local_shape is expected_rank0_shape of its global_shape and placements; a row without
/// global_shape fails (it cannot be judged). A pass says how many it examined.
/// Throws: mih::Error{kFailedPrecondition} naming the file and field the schema refuses.
Verdict local_shapes_match_placements(const CaseEvidence& ev);

/// Whether some row of check/structure.json records its global_shape: "" when one does, else why
/// local_shapes_match_placements has nothing to examine.
std::string structure_examinable(const CaseEvidence& ev);

/// The parameters' dtype in a lane (config.resolved.json "dtype"): the master weights' float32
/// under autocast (bfloat16, float16), else the lane's own (ParallelContext::param_dtype).
std::string master_dtype_name(const std::string& lane);

/// Structure (any writer): every row's dtype is master_dtype_name of the case's lane, and the
/// rows that record a device name one device. A pass says what it examined.
/// Throws: as local_shapes_match_placements.
Verdict dtypes_as_configured(const CaseEvidence& ev);

/// Whether the case holds an optimizer layout record (check/optimizer_layout_initial.json,
/// cases/runtime/optimizer_layout_step<k>.json, checkpoint/optimizer_layout_after_load.json):
/// "" when it does, else what is missing.
std::string optimizer_layout_examinable(const CaseEvidence& ev);

/// OptimizerLayout (any writer), in every optimizer layout record against check/structure.json:
/// every trainable parameter is listed in a group, and none more often than the rows it has
/// (a parameter pp stages share: once per stage); every listed name is a parameter. Entries
/// "<not a live parameter ...>" are HoldsTheLiveShards' (in-process only).
/// Throws: mih::Error{kFailedPrecondition} naming the file and field the schema refuses.
Verdict optimizer_groups_cover_trainable(const CaseEvidence& ev);

/// OptimizerLayout (any writer): no group lists a parameter whose row says requires_grad false.
/// Throws: as optimizer_groups_cover_trainable.
Verdict optimizer_holds_no_frozen(const CaseEvidence& ev);

/// OptimizerLayout (any writer): no group of weight decay > 0 lists a 1-D parameter (a norm
/// scale or a bias) that none of config.resolved.json's no_weight_decay globs nor the decayed_1d
/// globs of spec.resolved.json (mih's) or config.resolved.json (another writer's) names (a list
/// absent: none).
/// Throws: as optimizer_groups_cover_trainable; kFailedPrecondition when a list is no list of
///   strings.
Verdict no_decay_on_norms_or_biases(const CaseEvidence& ev);

/// OptimizerLayout (any writer): every optimizer state tensor a layout record lists ("state":
/// FQN -> name -> local shape) has its parameter's local_shape; fails when no record holds any
/// state (nothing examined).
/// Throws: as optimizer_groups_cover_trainable.
Verdict optimizer_state_shapes_match(const CaseEvidence& ev);

/// InputIdentity: every step's global input hash (metrics input_hash, data/input_identity)
/// equals the reference's, naming the first field whose hash differs.
Verdict same_inputs_as_reference(const CaseEvidence& reference, const CaseEvidence& candidate);

/// CheckpointRoundTrip: skip unless the case loads a checkpoint; every tensor's SHA-256
/// after the load (checkpoint/roundtrip_load.json) equals its hash at the save
/// (before_save/checkpoint/roundtrip_save.json), bit for bit, and the step counter continues.
Verdict checkpoint_round_trip(const CaseEvidence& ev);

/// CheckpointRoundTrip's judge, for a case of any writer that captured a save and its load:
/// every tensor of before_save/checkpoint/roundtrip_save.json equals the one of
/// checkpoint/roundtrip_load.json (sha256 and shape), none is only on one side, the step
/// counter continues, and the save captured some tensor. A pass says how many it examined.
/// Throws: mih::Error{kFailedPrecondition} naming the file and field when either file is
///   missing or its schema refuses it.
Verdict restored_what_was_saved(const CaseEvidence& ev);

/// ReplicaConsistency on the digests a writer recorded of every rank's copy of every parameter
/// after the optimizer (cases/runtime/replicas_step<k>.json with digests, read by
/// contract::replica_steps): every rank holding a piece (the same box; every rank without boxes)
/// holds the same bytes, at every step; fails when no piece is held by two ranks.
/// Throws: mih::Error{kFailedPrecondition} naming the file and field where the records break
///   their schema or the case (contract::replica_steps).
Verdict replica_digests_agree(const CaseEvidence& ev);

/// Whether some parameter piece of `ev`'s replicas_step<k>.json digests is held by two ranks
/// or more: "" when one is, else why ReplicaConsistency has nothing to examine.
std::string replica_digests_compared(const CaseEvidence& ev);

/// GradientSync on the digests a writer recorded of every rank's gradient pieces after its
/// synchronization (cases/runtime/gradient_replicas_step<k>.json): every rank holding a piece
/// holds the same bytes and some rank holding a trainable parameter's piece has its gradient;
/// over every axis of degree > 1 some gradient is declared reduced over (check/structure.json
/// grad_domain), rank 0's reducing collectives moved at least the bytes of its pieces declared
/// reduced over it. Throws: as replica_digests_agree.
Verdict gradient_digests_agree(const CaseEvidence& ev);

/// Whether gradient_digests_agree has something to examine on `ev`: "" when some gradient piece
/// is held by two ranks or some axis of degree > 1 has gradients declared reduced over it, else
/// why not (a 1-rank run).
std::string gradient_digests_examinable(const CaseEvidence& ev);

/// Resume: the metrics after the load start at resume_at and are contiguous.
Verdict resume_continues_step_count(const CaseEvidence& ev);

/// DataLoaderState: the sample-id ledger of the whole run (a resume's save phase's metrics
/// rows, then its load phase's: "samples" [[epoch, index], ...] and "data_loader", the loader's
/// state after the step, whose "epoch_samples" is N): a row for every step of the run, the
/// loader's "samples_served" after each step equal to the samples the ledger lists up to it, no
/// sample served twice in an epoch, every index in [0, N), and every epoch before the last one
/// served whole. Fails naming the sample,
/// the two steps and the file; and when a row has no ledger. A pass says how many samples, steps
/// and epochs it examined.
/// Throws: as CaseEvidence::jsonl; kFailedPrecondition when a metrics row is malformed.
Verdict samples_once_per_epoch(const CaseEvidence& ev);

/// DataLoaderState: from `first_step` (the resume_at), `ev`'s metrics have every step `twin`'s
/// have, and each served the samples the uninterrupted `twin` served at that step and left the
/// loader in the same state ("samples" and "data_loader" equal). Fails naming the first step that differs, both ledgers
/// and states. Throws: as samples_once_per_epoch.
Verdict ledger_matches_uninterrupted_run(const CaseEvidence& twin, const CaseEvidence& ev, int64_t first_step);

/// ModalityGradients: skip when the spec declares no modality; else no MIH-MODAL error and a
/// modality_gradients_step<k>.json for every step.
Verdict modality_gradients(const CaseEvidence& ev);

/// StateInvariants: every invariants_<phase>.json entry passed, naming the failed ones with
/// their facts (and, for a materialization invariant, the weights it examined: the build's
/// or a loaded checkpoint's); skip when the spec declares none.
Verdict state_invariants(const CaseEvidence& ev);

/// ModuleParity: skip unless the case ran the spec's parity cases (the reference does);
/// every declared case in check/module_parity.json raised nothing, left no trainable parameter
/// of its candidate unmapped, and passed each observation (output, input and parameter
/// gradients) at the tolerance the spec declares for it (spec.resolved.json's
/// module_parity_cases: tolerance for output and aux_loss, grad_tolerance for the gradients).
/// The failure names the case and the first failing observation with its relative error,
/// tolerance and max abs error, and the file.
/// Throws: mih::Error{kFailedPrecondition} when an observation records another tolerance than
///   the declared one, or a `passed` its error and tolerance contradict (edited evidence).
Verdict module_parity(const CaseEvidence& ev);

/// ActivationCheckpointEquivalence: skip unless activation checkpointing is on; regions
/// declared and enabled in check/activation_checkpoint.json, and recomputed as the runtime
/// counted it ("steps": per step and region, the forwards run under checkpointing whose output
/// needs a gradient, and the recomputes backward ran): some region ran under checkpointing, and
/// each such forward was recomputed once. Passes saying how many recomputes it examined.
Verdict activation_checkpoint_enabled(const CaseEvidence& ev);

/// CommVolume: the bytes each mesh axis moved per step (metrics comm_bytes, and per call site
/// comm_sites) against the config and the model: nothing on an axis of degree 1; dp_shard
/// exactly the FSDP count from the parameter table (per FSDP parameter with chunk c rows of k
/// elements, W = dp_shard, e the element size: all-gather c*k in forward and, when it has a
/// gradient (not frozen), reduce-scatter W*c*k in backward; per forward that uses it: every
/// micro-batch, less those that never used it, a vision tower on a text-only batch, as the
/// metrics' fsdp_gather_forwards record) plus the
/// gathers for backward each non-root unit whose output needed a gradient declared
/// (ParallelContext::fsdp_forward: c*k per parameter of the unit); on tp, cp and
/// dp_replicate every call site exactly what the layers declare (comm_expected: each
/// tensor-parallel layer's all-gathers, reduce-scatters and all-reduces, the cross entropy's
/// three reductions, CP attention's K/V gather and its reduce-scatter; per call, so
/// micro-batches and activation-checkpoint recomputes count) plus the gradient
/// synchronization of the parameter table (the gradients whose domain is tp all-reduced over
/// tp; every gradient over dp_replicate and cp; none of a frozen parameter), naming the site and the layers on a
/// mismatch; dp_cp and world at least 16 bytes (the valid-token count and the loss; the grad
/// norm before and after clipping; a model may add its own, e.g. an MoE's global expert
/// counts); every step the same (dp_shard between steps that used the same parameters). A checkpoint load's traffic is recorded apart
/// (checkpoint/load_rank<r>.json), not in a step's.
Verdict comm_volume(const CaseEvidence& ev);

/// The pipeline schedule every rank ran (performance_rank<r>.jsonl "pipeline_order", per
/// step): for each pp group, pp::order_problems of the pp ranks' orders is empty, i.e. every
/// forward and backward of every stage and micro-batch ran once, on the rank its stage lives
/// on, each backward after its forward, in an order the ranks can run, within the schedule's
/// bound on activations in flight. Fails naming the step, the ranks and the first problem.
Verdict pipeline_schedule(const CaseEvidence& ev);

}  // namespace mih::verdicts
