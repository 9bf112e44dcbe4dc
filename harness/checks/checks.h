// The checks of a validation session (DESIGN.md section 6; every check of the Python tool mih
// grew from, and more). Each returns its findings and the evidence it
// writes; the session decides where the files go. A check that reads only this rank's state
// is rank-local (its findings are merged across ranks by the session); one marked
// "collective" must be called on every rank of the mesh in the same order.
//
// Finding codes: the named constants of harness/findings/codes.h (one per code, with its
// meaning), used by the check that emits each and the suite that asserts on it.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/data/batch.h"
#include "harness/parallel/shared_state.h"
#include "harness/findings/findings.h"
#include "harness/spec/model_spec.h"
#include "harness/training/trainer.h"

namespace mih::checks {

/// What a check found and the evidence that shows it.
struct CheckOutput {
  FindingReport findings;
  nlohmann::json evidence = nlohmann::json::object();
};

/// Structure (rank-local): per parameter its owner module, gradient domain, mesh axes,
/// placements, global and local shape (checked against the placements), dtype and device;
/// no non-finite parameter or buffer; the spec's tied pairs are one parameter; every other
/// name of a parameter (ShardedParameter::aliases) is declared tied to it, else
/// MIH-STRUCT-008 naming both (undeclared_aliases); FSDP units cover every sharded parameter
/// once and hold one dtype and mesh. Evidence: {"parameters", "buffers", "fsdp_units"}.
CheckOutput check_structure(const TrainingState& state, const spec::ModelSpec& spec);

/// Two FQNs of one tensor: `fqn` (the first registration) and `alias` (a later one).
struct UndeclaredAlias {
  std::string fqn;
  std::string alias;
};

/// The aliases of `ctx`'s parameters that `tied` (ModelSpec checkpoint.tied: pairs of FQN
/// globs, either order) does not declare: an alias is declared when a pair joins it to
/// another name of the same parameter. In parameter order. Issue 52: a Qwen3-style port's
/// q_norm registered again as k_norm trained one tensor for both, silently.
std::vector<UndeclaredAlias> undeclared_aliases(const ParallelContext& ctx,
                                                const std::vector<std::pair<std::string, std::string>>& tied);

/// The structure check's finite values again (rank-local), on parameters set after the build
/// (a Hugging Face or resume checkpoint loaded into the built model): a parameter with NaN or
/// Inf elements on this rank's piece is MIH-STRUCT finding kStructNonFinite naming it,
/// `weights` (where the values came from, in words) and the count. Records no run of its own
/// (check_structure's covers the code). Evidence: {"weights", "parameters", "non_finite"}.
CheckOutput check_loaded_values(const ParallelContext& ctx, const std::string& weights);

/// check/parameter_ownership.csv: fqn,owner,aliases,grad_domain,placements,global_shape,
/// local_shape,dtype,device,fsdp_unit (one row per logical parameter, this rank's view).
std::string parameter_ownership_csv(const ParallelContext& ctx);

/// Optimizer layout (rank-local): every trainable parameter in exactly one group, no frozen
/// parameter, no tensor that is not the live sharded parameter (an optimizer built before
/// sharding holds the full tensors), each group's weight decay as declared (0 for the
/// parameters matching options.no_weight_decay(), options.weight_decay() otherwise), no
/// weight decay on a 1-D parameter (a norm scale, a bias) unless it matches `decayed_1d`
/// (ModelSpec::decayed_1d), and every optimizer state of the parameter's local shape.
/// Evidence: {"groups": [...]}.
CheckOutput check_optimizer_layout(const TrainingState& state, const TrainerOptions& options, spec::Phase phase,
                                   const std::vector<std::string>& decayed_1d = {});

/// Where in a step check_frozen_parameters looks.
enum class FrozenPoint {
  kBuilt,           ///< the model built and sharded with its optimizer (or just loaded)
  kAfterBackward,   ///< gradients synchronized, before clipping
  kAfterOptimizer,  ///< after the optimizer step
};

/// Frozen parameters (rank-local) against `frozen` (ModelSpec::frozen, FQN globs over the
/// FQN and tied aliases), on this rank's pieces after sharding: at every point each declared
/// parameter has requires_grad false (MIH-FROZEN-001) and every parameter with requires_grad
/// false is declared (MIH-FROZEN-002: a parameter silently not trained); after backward a
/// declared one has no gradient, not even a zero-filled one (MIH-FROZEN-003); after the
/// optimizer step it has no AdamW state (MIH-FROZEN-004). Records a run over every parameter
/// (a spec without frozen parameters still checks that none is frozen). Evidence:
/// {"point", "step", "frozen": [fqn...], "trainable": n}.
CheckOutput check_frozen_parameters(const TrainingState& state, const std::vector<std::string>& frozen,
                                    FrozenPoint point, int64_t step);

/// Data contract (rank-local), on the global batch of step 0: each field has one owner (the
/// pipeline, or the runtime for data.runtime_fields), every declared field is produced, and
/// for causal LM data the labels are the next input token on every valid position when
/// declared shifted (the same token when not). Evidence: data/field_ownership.json.
CheckOutput check_data_contract(const spec::DataSpec& data, const Batch& global_batch);

/// The pipeline's outputs against the raw documents (rank-local), on the global batch of step
/// 0, with code that shares nothing with the pipeline: from Batch::provenance (the spans each
/// row's window of S + 1 tokens was cut from, and the documents' bytes) it rebuilds each row as
/// the model should get it and compares input_ids, labels, position_ids, loss_mask,
/// attention_mask and a placeholder index field (BatchProvenance::prefix_index_field):
///  - tokens: a document is BOS + its bytes + EOS; a packed window is its spans back to back,
///    each one after the first starting a document and each before the last ending one; a
///    padded row is one document from its start, then PAD;
///  - labels: the next token when it is in the same document, else -100 (a label never crosses
///    a document boundary; padding takes no loss);
///  - position_ids: tokens since the later of the row's start and the start of the token's
///    document (packed), 0..S-1 (padded); placeholders count like tokens, and a document start
///    they cover is no boundary;
///  - loss_mask: labels != -100; attention_mask: 1 on every input but padding (packed rows hold
///    no padding: they attend across their documents, and a port that masks by document takes
///    the boundaries from position_ids);
///  - placeholders (prefix_tokens): the placeholder token, label -100, index 0.. there, -1 elsewhere;
///  - a document field (BatchProvenance::document_field, e.g. TextPipelineOptions::document_ids):
///    the index of the row's span that holds each input (what a block-causal mask reads).
/// A field that differs is MIH-DATA-009 naming the field, how many positions differ, and the
/// first (row, position, recomputed value, the pipeline's); a batch without provenance when
/// `data.rows_from_documents` declares it, or a span that does not fit its document, too.
/// Records a run over the batch's positions. Evidence: data/batch_documents.json.
CheckOutput check_batch_documents(const spec::DataSpec& data, const Batch& global_batch);

/// The first micro-batch as the model receives it holds every forward field the spec
/// declares. Evidence: data/observed_forward_fields.json.
CheckOutput check_forward_fields(const spec::DataSpec& data, const Batch& micro_batch);

/// The model's per-token losses follow the labels it is given (rank-local): zero at every
/// position whose label is the ignore index (-100), and, for float32/float64 losses, non-zero
/// at every valid position (an exact 0 is a target the model never scored). A model that
/// shifts already-shifted labels again scores position t against label t + 1, so both rules
/// break wherever a row has an ignored label or ends. Independent of any reference run.
/// Shape: token_losses [b, S/CP], like micro_batch.labels. Evidence: data/token_losses.json.
CheckOutput check_token_losses(const Batch& micro_batch, const at::Tensor& token_losses);

/// The SHA-256 of one step's global batch, independent of how its rows are split over dp
/// ranks and micro-batches and of the cp layout: every row of every field is hashed whole
/// (values widened to int64 or float64, so the storage dtype does not count) with its global
/// row index; a field's hash is over its rows in global order, the global hash over the
/// fields by name. Feed it each micro-batch as the model receives it, then finish().
class InputIdentity {
 public:
  /// `sequence_fields`: the fields (besides input_ids, labels, position_ids) sharded on
  /// dim 1 under cp; `cp_replicated`: the fields every cp rank holds whole.
  InputIdentity(std::vector<std::string> sequence_fields, std::vector<std::string> cp_replicated);
  /// Records a micro-batch whose first row is row `first_row` of the global batch. Under
  /// cp the sequence-sharded fields are gathered over `cp` (a collective over the cp axis)
  /// and put back in token order with `layout`. cp may be null when cp == 1.
  /// Shape: batch [b, S/CP] -> rows [b, S] hashed.
  void add(int64_t first_row, const Batch& micro_batch, Communicator* cp, CpLayout layout);
  /// Collective over the mesh: gathers the row digests over dp, compares cp-replicated
  /// fields over cp and the result over tp. Returns {"global": hex, "fields": {name: hex},
  /// "rows": n} and adds INPUT-* findings to `findings`; clears the recorded rows.
  nlohmann::json finish(DeviceMesh& mesh, int64_t step, FindingReport* findings, c10::Device device);

 private:
  std::vector<std::string> sequence_fields_, cp_replicated_;
  // field -> global row -> digest; cp-replicated field -> global row -> local digest.
  std::map<std::string, std::map<int64_t, std::string>> rows_;
  std::map<std::string, std::map<int64_t, std::string>> replicated_;
};

/// The input identity of a whole global batch on one process (the reference's view).
nlohmann::json input_identity_of(const Batch& global_batch);

/// Checkpoint coverage (rank-local): every parameter and persistent buffer is loaded
/// (one external key), transformed (several), or declared training-only; each reversible
/// transform round-trips a test tensor of the parameter's shape bit for bit; with
/// `source_keys` (the keys of an external checkpoint), each is expected or declared
/// inference-only, and each expected key is present. Evidence: checkpoint/coverage.json.
CheckOutput check_checkpoint_coverage(const ParallelContext& ctx, const spec::CheckpointSpec& checkpoint,
                                      const std::vector<std::string>* source_keys);

/// A tensor checkpoint coverage examines: a parameter (its canonical FQN, its other names)
/// or a persistent buffer, with its global shape.
struct CoverageTarget {
  std::string fqn;
  std::vector<std::string> aliases;
  std::vector<int64_t> shape;
};
/// This rank's targets: its parameters, then its persistent buffers.
std::vector<CoverageTarget> coverage_targets(const ParallelContext& ctx);
/// The same over `targets` (under pp, every stage's: a target one of whose names an earlier
/// target already has, a tied parameter's copy on a later stage, is covered once).
CheckOutput check_checkpoint_coverage(const std::vector<CoverageTarget>& targets, const spec::CheckpointSpec& checkpoint,
                                      const std::vector<std::string>* source_keys);

/// Shared state of one step's forwards (rank-local) against the spec: every declared key
/// published by its producer and consumed by each declared consumer, no consume before its
/// publish, no key published twice in one forward (an activation-checkpoint recompute
/// included), no undeclared key. A key that requires a field (SharedStateSpec::requires_field)
/// need not be published nor consumed in a step whose micro-batches on this rank did not hold
/// it (`fields_seen`: the fields this rank's micro-batches held; null: every field).
/// Evidence: {"events": [...], "not_required": [keys whose field the step lacked]}.
CheckOutput check_shared_state(const std::vector<SharedStateEvent>& events,
                               const std::vector<spec::SharedStateSpec>& declared, int64_t step,
                               const std::set<std::string>* fields_seen = nullptr);

/// Modality gradients (collective over the ranks of this pipeline stage, MeshAxis::kStage:
/// the world without pp), after backward: for each modality whose
/// field reached the model this step, every parameter of its group has a defined, finite,
/// non-zero gradient on every rank that holds a non-empty piece of it. Evidence: per
/// modality and parameter the ranks without a gradient, with a non-finite or an all-zero one.
CheckOutput check_modality_gradients(const ParallelContext& ctx, const std::vector<spec::ModalitySpec>& modalities,
                                     const std::set<std::string>& fields_seen, int64_t step);

/// Gradient reductions (rank-local), after synchronization: every trainable parameter's
/// gradient was reduced over exactly the axes of its grad_domain() (ParallelContext::
/// gradient_reductions() against the parameter table), else MIH-GRAD-001 naming the axes
/// left out or added. Evidence: {"step", "parameters": {fqn: {grad_domain, reduced_over}}}.
CheckOutput check_gradient_reductions(const ParallelContext& ctx, int64_t step);

/// Tensor-parallel partial gradients (collective over tp), before synchronization: for each
/// trainable parameter replicated over tp, whether its local gradients differ across the tp
/// ranks (a partial sum: each rank saw only its tokens under sequence parallelism, or only its
/// heads, as a per-head QK norm at any tp > 1) is measured, independently of the
/// declaration, and held against ParamSpec::tp_partial_grad: partial but undeclared is
/// MIH-GRAD-002 (never all-reduced over tp), whole but declared is MIH-GRAD-003 (all-reduced
/// into tp times the gradient). Gradients zero on every tp rank are not examined.
/// Evidence: {"step", "parameters": {fqn: {partial_over_tp, declared_partial, relative_spread}}}.
CheckOutput check_tp_partial_gradients(const ParallelContext& ctx, int64_t step);

/// The trainable parameters of this pipeline stage no rank's backward gave a gradient this
/// step (collective over the stage's ranks, MeshAxis::kStage: the world without pp), after
/// synchronization: on every rank the gradient is undefined or was
/// zero-filled only for the collectives (ParallelContext::kNoGradient in
/// gradient_reductions()). Canonical FQNs, in parameter order. Measured here, not taken from
/// the runtime's parameters_without_gradient().
std::vector<std::string> parameters_without_gradient(const ParallelContext& ctx);

/// What the optimizer step did to the parameters no rank gave a gradient (rank-local): each
/// must hold exactly the value it had before the step (`before`: canonical FQN -> this rank's
/// piece before it), as PyTorch's optimizers skip a grad of None; a changed one (zeros fed to
/// AdamW, which decays the parameter and moves it by its momentum) is MIH-OPTIM-008 naming it,
/// the step and the largest change. Records a run over `trainable` parameters (every
/// trainable parameter's presence was examined). Evidence: {"step", "without_gradient":
/// [fqn...], "moved": {fqn: max_abs_change}}.
CheckOutput check_update_without_gradient(const ParallelContext& ctx, const std::map<std::string, at::Tensor>& before,
                                          int64_t step, int64_t trainable);

/// A parameter by its names: the canonical FQN and its tied aliases (ShardedParameter's), kept
/// where the parameters themselves may be gone (a session's finish, after the backend).
struct ParameterNames {
  std::string fqn;
  std::vector<std::string> aliases;
};

/// Over a whole run (rank-local; run on every rank with the same inputs): every parameter of
/// `trainable` (in parameter order) not in `received` (those some rank's backward gave a
/// gradient at some step of `steps`) is MIH-GRAD-004 unless a pattern of `unused`
/// (ModelSpec::unused_parameters, FQN globs over the FQN and tied aliases) names it. Records a
/// run over the trainable parameters. Evidence: {"steps", "trainable", "never_received":
/// [every trainable parameter without a gradient in all of `steps`], "declared_unused": [those
/// `unused` names]}.
CheckOutput check_gradients_received(const std::vector<ParameterNames>& trainable, const std::set<std::string>& received,
                                     const std::vector<int64_t>& steps, const std::vector<std::string>& unused);

/// Runs the spec's invariants of `phase` (rank-local; an invariant that throws is a failed
/// invariant with the exception's message). Evidence: {name: {passed, facts}}.
CheckOutput run_invariants(const std::vector<spec::StateInvariant>& invariants, spec::Phase phase,
                           const TrainingState& state);

/// True if `name` matches the fnmatch glob `pattern`.
bool glob_match(const std::string& pattern, const std::string& name);

}  // namespace mih::checks
