// `mih check` of evidence another writer produced (docs/evidence.md: a PyTorch loop through
// python/mih_evidence.py, a team's own trainer): case directories that follow the evidence
// contract and whose stamp names a writer other than mih's session. No spec of theirs is
// compiled into mih, so what a verdict applies comes from this binary alone: the
// cross-topology tolerance of the run's dtype (spec::Tolerances' defaults), and only the
// suites that judge measured evidence, each case against the case its environment.json names
// (`case.compare_to`, a sibling directory <root>/<spec>/<compare_to>):
//   Foreign/NumericParity.MatchesReference/<spec>/<case>   (compare_evidence: loss, grad norms,
//     lr, every watched tensor and module activation at every step and stage; the first
//     divergence localized)
//   Foreign/InputIdentity.SameInputsAsReference/<spec>/<case>   (the global batch of every
//     step, field by field)
//   Foreign/ReplicaConsistency.ReplicasAgreeAfterEveryStep/<spec>/<case>   (where the writer
//     recorded each rank's SHA-256 of every parameter after the optimizer: all equal)
// The suites that judge the findings of mih's session checks or its runtime's records are not
// instantiated for such evidence, and the check says which and why.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace mih::cases {

/// The case directories of `evidence` (itself when it is one, else <evidence>/<spec>/<case>)
/// whose environment.json stamp names a writer other than mih ("mih ..."); empty when none
/// does. A directory whose stamp cannot be read counts as mih's (its own checks say why).
std::vector<std::filesystem::path> foreign_case_dirs(const std::filesystem::path& evidence);

/// Runs the foreign suites (above) on `evidence` under GoogleTest with `args` (--gtest_*
/// flags, --no-progress). Returns the exit status: 0 every test passed, 1 a test failed.
/// Throws: mih::Error{kFailedPrecondition} (exit 12) when a case directory, or the reference
///   it names, breaks the contract or is missing, or when the root mixes mih's evidence with
///   another writer's; kInvalidSpec (11) when no case names a reference (nothing to check),
///   a filter selects no test, or an argument is not one of those.
int check_foreign_evidence(const std::filesystem::path& evidence, const std::vector<std::string>& args);

}  // namespace mih::cases
