// `mih check` of evidence another writer produced (docs/evidence.md: a PyTorch loop through
// python/mih_evidence.py, a team's own trainer): case directories that follow the evidence
// contract and whose stamp names a writer other than mih's session. No spec of theirs is
// compiled into mih, so what a verdict applies comes from this binary alone: the
// cross-topology tolerance of the run's dtype (spec::Tolerances' defaults). Each case is judged
// by every suite of the suite table whose declared reads (harness/compare/suite_reads.h:
// MIH_SUITE_READS in the suite's file) it and the case its environment.json names
// (`case.compare_to`, a sibling directory <root>/<spec>/<compare_to>) hold, through the suite's
// own verdicts, as tests Foreign/<Suite>.<Test>/<spec>/<case> (the suite's TEST_P names):
// NumericParity (metrics, probes and watch list of both), InputIdentity (both input
// identities), CheckpointRoundTrip (a save's and its load's captures), ReplicaConsistency and
// GradientSync (every rank's digests of its parameter and gradient pieces). The check's header
// says which suites ran, what the others need, and which judge records only mih's session
// writes.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "harness/compare/suite_reads.h"

namespace mih::cases {

/// The case directories of `evidence` (itself when it is one, else <evidence>/<spec>/<case>)
/// whose environment.json stamp names a writer other than mih ("mih ..."); empty when none
/// does. A directory whose stamp cannot be read counts as mih's (its own checks say why).
std::vector<std::filesystem::path> foreign_case_dirs(const std::filesystem::path& evidence);

/// Runs the suites (above) on `evidence` under GoogleTest with `args` (--gtest_*
/// flags, --no-progress). Returns the exit status: 0 every test passed, 1 a test failed.
/// Throws: mih::Error{kFailedPrecondition} (exit 12) when a case directory, or the reference
///   it names, breaks the contract or is missing, or when the root mixes mih's evidence with
///   another writer's; kInvalidSpec (11) when no case names a reference (nothing to check),
///   a filter selects no test, or an argument is not one of those.
/// `suites`: the suite table with each suite's declared reads, in order (the caller links the
/// suites: conformance::declared_reads(), suites/suite_table.h).
int check_foreign_evidence(const std::filesystem::path& evidence, const std::vector<std::string>& args,
                           const std::vector<verdicts::DeclaredReads>& suites);

}  // namespace mih::cases
