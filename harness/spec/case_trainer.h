// A case's own trainer: the changes a case of a matrix makes to its spec's TrainerOptions (an
// optimizer other than the spec's, a learning-rate schedule), so the main job runs SGD and a
// warmup-cosine schedule on every reference spec without another spec or golden. A case with
// changes is named with their suffix and compared with the world-size-1 reference of the same
// changes ("DpShard2SgdCosine" with "ReferenceSgdCosine"), which resolve_matrix adds.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/contract/case_request.h"
#include "harness/training/trainer.h"

namespace mih::spec {

/// The fields a case's "trainer" may set: "optimizer" ("adamw", "adam", "sgd"), "momentum",
/// "warmup_steps", "decay_steps", "min_lr", "max_grad_norm".
/// Throws: mih::Error{kInvalidSpec} naming `where` and the field for another field, a value of
///   the wrong type, or an unknown optimizer.
void check_case_trainer(const nlohmann::json& trainer, const std::string& where);

/// `base` with the case's changes applied. Throws: as check_case_trainer.
TrainerOptions with_case_trainer(TrainerOptions base, const nlohmann::json& trainer);

/// The suffix of a case name with these changes: the optimizer's name ("Sgd", "Adam",
/// "Adamw") when set, then "Cosine" when a schedule is (warmup_steps or decay_steps). The
/// other fields do not change the name: two cases differing only there are refused as a name
/// collision. "" for no changes.
std::string case_trainer_suffix(const nlohmann::json& trainer);

/// Reads a listed case's "trainer" (`listed`, at `where`) into `c` and appends its suffix to
/// c.name and, unless c.compare_to is empty, to c.compare_to (the twin with the same changes).
/// Throws: as check_case_trainer. (resolve_matrix rejects such a case in a reduced-precision
///   lane, whose noise calibration is the spec's trainer's, with that reason.)
void read_case_trainer(const nlohmann::json& listed, Case& c, const std::string& where);

/// Why a case with these changes cannot run in a reduced-precision lane (`reduced`), whose
/// tolerances are calibrated on the spec's trainer: "" without changes or in the float64 lane.
std::string case_trainer_lane_problem(const nlohmann::json& trainer, bool reduced);

/// The world-size-1 references the cases with changes are compared with: per distinct suffix
/// one train case "Reference<suffix>" (float64 on CPU, parameter-init seed `seed`, as the
/// Reference) with the changes, compared with nothing (as the Reference).
std::vector<Case> case_trainer_references(const std::vector<Case>& cases, uint64_t seed);

}  // namespace mih::spec
