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
inline constexpr const char* kStructUnitMixed = "MIH-STRUCT-006";      ///< FSDP unit mixes dtypes or meshes
// Optimizer layout (checks/structure.cpp).
inline constexpr const char* kOptimNotLive = "MIH-OPTIM-001";          ///< optimizer tensor that is not a live parameter
inline constexpr const char* kOptimTwoGroups = "MIH-OPTIM-002";        ///< parameter in two groups (or twice)
inline constexpr const char* kOptimFrozen = "MIH-OPTIM-003";           ///< frozen parameter in the optimizer
inline constexpr const char* kOptimMissing = "MIH-OPTIM-004";          ///< trainable parameter in no group
inline constexpr const char* kOptimWeightDecay = "MIH-OPTIM-005";      ///< weight decay not as declared
inline constexpr const char* kOptimStateShape = "MIH-OPTIM-006";       ///< state shape != local shape
// Data contract (checks/data.cpp).
inline constexpr const char* kDataNoOwner = "MIH-DATA-001";            ///< field without an owner
inline constexpr const char* kDataNotProduced = "MIH-DATA-002";        ///< declared field not produced
inline constexpr const char* kDataTwoOwners = "MIH-DATA-003";          ///< field with two owners
inline constexpr const char* kDataLabelsShift = "MIH-DATA-004";        ///< labels shift != declaration
inline constexpr const char* kDataForwardField = "MIH-DATA-005";       ///< required forward field missing
inline constexpr const char* kDataLossLabels = "MIH-DATA-006";         ///< per-token loss not where labels are valid
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
inline constexpr const char* kSharedUndeclared = "MIH-SHARED-006";     ///< undeclared key (a warning)
// Modality gradients (checks/runtime_checks.cpp).
inline constexpr const char* kModalNoGradient = "MIH-MODAL-001";       ///< no finite, non-zero gradient
// State invariants (checks/structure.cpp).
inline constexpr const char* kInvarFailed = "MIH-INVAR-001";           ///< invariant failed
inline constexpr const char* kInvarThrew = "MIH-INVAR-002";            ///< invariant threw
// Probes (probes/probes.cpp).
inline constexpr const char* kProbeReplicas = "MIH-PROBE-001";         ///< replicas disagree after a step

/// Every code above, in order (for tests that every asserted code has an emitter).
inline constexpr std::array<const char*, 34> kAllCodes = {
    kStructLocalShape,   kStructDtypeDevice,  kStructNonFinite,      kStructTie,          kStructFsdpUnit,
    kStructUnitMixed,    kOptimNotLive,       kOptimTwoGroups,       kOptimFrozen,        kOptimMissing,
    kOptimWeightDecay,   kOptimStateShape,    kDataNoOwner,          kDataNotProduced,    kDataTwoOwners,
    kDataLabelsShift,    kDataForwardField,   kDataLossLabels,       kInputCpReplicated,  kInputTpRanks,
    kCkptTargetKey,      kCkptRoundTrip,      kCkptUnexpectedSource, kCkptMissingSource,  kSharedNoProducer,
    kSharedNoConsumer,   kSharedBeforePublish, kSharedTwice,         kSharedWrongProducer, kSharedUndeclared,
    kModalNoGradient,    kInvarFailed,        kInvarThrew,           kProbeReplicas};

}  // namespace mih::codes
