// The finding codes (MIH-<AREA>-NNN) as named constants: the check that emits a finding and
// the suite that asserts on it name the same constant, so a code can be neither misspelt
// nor asserted without an emitter (kAllCodes lists every one, with its area and meaning).
#pragma once

#include <array>
#include <string_view>

namespace mih::codes {

// Structure (checks/structure.cpp).
inline constexpr const char* kStructLocalShape = "MIH-STRUCT-001";     ///< local shape inconsistent with placements
inline constexpr const char* kStructDtypeDevice = "MIH-STRUCT-002";    ///< wrong dtype or device
inline constexpr const char* kStructNonFinite = "MIH-STRUCT-003";      ///< non-finite parameter or buffer
inline constexpr const char* kStructTie = "MIH-STRUCT-004";            ///< declared tie is not one parameter
inline constexpr const char* kStructFsdpUnit = "MIH-STRUCT-005";       ///< FSDP parameter outside a declared unit
inline constexpr const char* kStructUnitMixed = "MIH-STRUCT-006";      ///< FSDP unit mixes dtypes, meshes or gradient domains
inline constexpr const char* kStructExpertInRoot = "MIH-STRUCT-007";   ///< expert parameter in the root FSDP unit
inline constexpr const char* kStructAliasUndeclared = "MIH-STRUCT-008";///< one tensor under two FQNs, no declared tie
// Optimizer layout (checks/structure.cpp).
inline constexpr const char* kOptimNotLive = "MIH-OPTIM-001";          ///< optimizer tensor that is not a live parameter
inline constexpr const char* kOptimTwoGroups = "MIH-OPTIM-002";        ///< parameter in two groups (or twice)
inline constexpr const char* kOptimFrozen = "MIH-OPTIM-003";           ///< frozen parameter in the optimizer
inline constexpr const char* kOptimMissing = "MIH-OPTIM-004";          ///< trainable parameter in no group
inline constexpr const char* kOptimWeightDecay = "MIH-OPTIM-005";      ///< weight decay not as declared
inline constexpr const char* kOptimStateShape = "MIH-OPTIM-006";       ///< state shape != local shape
inline constexpr const char* kOptimDecayOnNorm = "MIH-OPTIM-007";      ///< weight decay on a 1-D parameter (norm, bias)
// Gradient presence (checks/runtime_checks.cpp).
inline constexpr const char* kOptimMovedWithoutGradient = "MIH-OPTIM-008";  ///< optimizer moved a parameter no rank gave a gradient
// Data contract (checks/data.cpp).
inline constexpr const char* kDataNoOwner = "MIH-DATA-001";            ///< field without an owner
inline constexpr const char* kDataNotProduced = "MIH-DATA-002";        ///< declared field not produced
inline constexpr const char* kDataTwoOwners = "MIH-DATA-003";          ///< field with two owners
inline constexpr const char* kDataLabelsShift = "MIH-DATA-004";        ///< labels shift != declaration
inline constexpr const char* kDataForwardField = "MIH-DATA-005";       ///< required forward field missing
inline constexpr const char* kDataLossLabels = "MIH-DATA-006";         ///< per-token loss not where labels are valid
inline constexpr const char* kDataValidTokens = "MIH-DATA-007";        ///< trainer's valid-token count != the labels seen
inline constexpr const char* kDataLossNormalizer = "MIH-DATA-008";     ///< a rank's loss divided by another count
inline constexpr const char* kDataNotFromDocuments = "MIH-DATA-009";   ///< a field differs from its recomputation from the raw documents
// Input identity (checks/data.cpp).
inline constexpr const char* kInputCpReplicated = "MIH-INPUT-001";     ///< cp-replicated field differs over cp
inline constexpr const char* kInputTpRanks = "MIH-INPUT-002";          ///< tp ranks saw other inputs
// Checkpoint coverage (checks/structure.cpp).
inline constexpr const char* kCkptTargetKey = "MIH-CKPT-001";          ///< target key neither loaded nor training-only
inline constexpr const char* kCkptRoundTrip = "MIH-CKPT-002";          ///< key-map transform does not round-trip
inline constexpr const char* kCkptUnexpectedSource = "MIH-CKPT-003";   ///< unexpected source key
inline constexpr const char* kCkptMissingSource = "MIH-CKPT-004";      ///< mapped key absent in the source
// Shared state (checks/runtime_checks.cpp).
inline constexpr const char* kSharedNoProducer = "MIH-SHARED-001";     ///< declared key never published
inline constexpr const char* kSharedNoConsumer = "MIH-SHARED-002";     ///< declared consumer never consumed
inline constexpr const char* kSharedBeforePublish = "MIH-SHARED-003";  ///< consumed before published
inline constexpr const char* kSharedTwice = "MIH-SHARED-004";          ///< published twice in one forward
inline constexpr const char* kSharedWrongProducer = "MIH-SHARED-005";  ///< published by another layer
inline constexpr const char* kSharedUndeclared = "MIH-SHARED-006";     ///< undeclared key published or consumed
// Modality gradients (checks/runtime_checks.cpp).
inline constexpr const char* kModalNoGradient = "MIH-MODAL-001";       ///< no finite, non-zero gradient
// State invariants (checks/structure.cpp).
inline constexpr const char* kInvarFailed = "MIH-INVAR-001";           ///< invariant failed
inline constexpr const char* kInvarThrew = "MIH-INVAR-002";            ///< invariant threw
// Frozen parameters (checks/structure.cpp).
inline constexpr const char* kFrozenTrainable = "MIH-FROZEN-001";      ///< declared frozen, requires_grad true
inline constexpr const char* kFrozenUndeclared = "MIH-FROZEN-002";     ///< requires_grad false, not declared frozen
inline constexpr const char* kFrozenGradient = "MIH-FROZEN-003";       ///< frozen parameter has a gradient
inline constexpr const char* kFrozenOptimizerState = "MIH-FROZEN-004"; ///< frozen parameter has optimizer state
// Gradient synchronization (checks/runtime_checks.cpp).
inline constexpr const char* kGradReduction = "MIH-GRAD-001";          ///< reduced over axes other than its domain
inline constexpr const char* kGradTpPartialUndeclared = "MIH-GRAD-002";///< partial over tp (this rank's tokens or heads), domain omits tp
inline constexpr const char* kGradTpPartialWhole = "MIH-GRAD-003";     ///< whole on every tp rank, domain has tp
inline constexpr const char* kGradNeverReceived = "MIH-GRAD-004";      ///< trainable, no gradient at any step, not declared unused
// Probes (probes/probes.cpp).
inline constexpr const char* kProbeReplicas = "MIH-PROBE-001";         ///< replicas disagree after a step

// The checks that emit them (the names of findings.json "checks", FindingReport::ran).
inline constexpr const char* kCheckStructure = "structure";                  ///< parameters
inline constexpr const char* kCheckTies = "ties";                            ///< declared tied pairs
inline constexpr const char* kCheckFsdpUnits = "fsdp_units";                 ///< FSDP-sharded parameters
inline constexpr const char* kCheckOptimizer = "optimizer_layout";           ///< parameters
inline constexpr const char* kCheckDataContract = "data_contract";           ///< fields of the global batch
inline constexpr const char* kCheckForwardFields = "forward_fields";         ///< declared forward fields
inline constexpr const char* kCheckTokenLosses = "token_losses";             ///< tokens
inline constexpr const char* kCheckValidTokens = "valid_tokens";             ///< steps
inline constexpr const char* kCheckLossNormalizer = "loss_normalizer";       ///< normalizers reported
inline constexpr const char* kCheckBatchDocuments = "batch_documents";       ///< rows recomputed from documents
inline constexpr const char* kCheckInputTp = "input_identity_tp";           ///< tp ranks compared
inline constexpr const char* kCheckInputCp = "input_identity_cp";           ///< cp-replicated fields compared
inline constexpr const char* kCheckCoverage = "checkpoint_coverage";         ///< parameters and buffers
inline constexpr const char* kCheckSource = "checkpoint_source";             ///< source checkpoint keys
inline constexpr const char* kCheckSharedState = "shared_state";             ///< declared keys
inline constexpr const char* kCheckSharedEvents = "shared_state_events";    ///< publish/consume events
inline constexpr const char* kCheckUndeclared = "shared_state_undeclared";  ///< steps whose events were read
inline constexpr const char* kCheckModality = "modality_gradients";          ///< parameters of modality groups
inline constexpr const char* kCheckInvariants = "invariants";                ///< invariants run
inline constexpr const char* kCheckReplicas = "replica_consistency";         ///< parameters
inline constexpr const char* kCheckFrozen = "frozen_parameters";             ///< parameters
inline constexpr const char* kCheckGradReduction = "grad_reduction";         ///< trainable parameters
inline constexpr const char* kCheckTpPartial = "tp_partial_gradients";       ///< tp-replicated parameters
inline constexpr const char* kCheckUpdateWithoutGradient = "update_without_gradient";  ///< trainable parameters
inline constexpr const char* kCheckGradientsReceived = "gradients_received";  ///< trainable parameters

struct CodeRow {
  const char* code;
  const char* check;  ///< the check that emits it
};

/// Every code above with its check, in order (for tests that every asserted code has an
/// emitter, and for verdicts that require the emitting check to have run).
inline constexpr std::array<CodeRow, 49> kAllCodes = {{
    {kStructLocalShape, kCheckStructure},       {kStructDtypeDevice, kCheckStructure},
    {kStructNonFinite, kCheckStructure},        {kStructTie, kCheckTies},
    {kStructFsdpUnit, kCheckFsdpUnits},         {kStructUnitMixed, kCheckFsdpUnits},
    {kStructExpertInRoot, kCheckFsdpUnits},     {kStructAliasUndeclared, kCheckStructure},
    {kOptimNotLive, kCheckOptimizer},           {kOptimTwoGroups, kCheckOptimizer},
    {kOptimFrozen, kCheckOptimizer},            {kOptimMissing, kCheckOptimizer},
    {kOptimWeightDecay, kCheckOptimizer},       {kOptimStateShape, kCheckOptimizer},
    {kOptimDecayOnNorm, kCheckOptimizer},       {kDataNoOwner, kCheckDataContract},
    {kDataNotProduced, kCheckDataContract},     {kDataTwoOwners, kCheckDataContract},
    {kDataLabelsShift, kCheckDataContract},     {kDataForwardField, kCheckForwardFields},
    {kDataLossLabels, kCheckTokenLosses},       {kDataValidTokens, kCheckValidTokens},
    {kDataLossNormalizer, kCheckLossNormalizer}, {kDataNotFromDocuments, kCheckBatchDocuments},
    {kInputCpReplicated, kCheckInputCp},        {kInputTpRanks, kCheckInputTp},
    {kCkptTargetKey, kCheckCoverage},           {kCkptRoundTrip, kCheckCoverage},
    {kCkptUnexpectedSource, kCheckSource},      {kCkptMissingSource, kCheckSource},
    {kSharedNoProducer, kCheckSharedState},     {kSharedNoConsumer, kCheckSharedState},
    {kSharedBeforePublish, kCheckSharedEvents}, {kSharedTwice, kCheckSharedEvents},
    {kSharedWrongProducer, kCheckSharedState},  {kSharedUndeclared, kCheckUndeclared},
    {kModalNoGradient, kCheckModality},         {kInvarFailed, kCheckInvariants},
    {kInvarThrew, kCheckInvariants},            {kProbeReplicas, kCheckReplicas},
    {kFrozenTrainable, kCheckFrozen},           {kFrozenUndeclared, kCheckFrozen},
    {kFrozenGradient, kCheckFrozen},            {kFrozenOptimizerState, kCheckFrozen},
    {kGradReduction, kCheckGradReduction},      {kGradTpPartialUndeclared, kCheckTpPartial},
    {kGradTpPartialWhole, kCheckTpPartial},
    {kOptimMovedWithoutGradient, kCheckUpdateWithoutGradient},
    {kGradNeverReceived, kCheckGradientsReceived},
}};

/// The check that emits `code`, or "" for a code not in kAllCodes.
constexpr std::string_view check_of(std::string_view code) {
  for (const auto& row : kAllCodes) {
    if (code == row.code) return row.check;
  }
  return "";
}

}  // namespace mih::codes
