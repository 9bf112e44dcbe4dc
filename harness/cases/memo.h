// A case's evidence, launched once per evidence root and memoized (DESIGN.md section 3): the
// first test that needs a case (or its reference, or a resume's uninterrupted twin) launches
// it under a file lock; later ones, in this process or another sharing the evidence root
// (ctest runs one process per case), read its evidence. In verify-only mode nothing is
// launched: the evidence was produced elsewhere (torchrun/srun on a GPU cluster). Torch-free.
#pragma once

#include <filesystem>
#include <iosfwd>
#include <memory>
#include <string>

#include "harness/contract/case_outcome.h"
#include "harness/contract/case_request.h"
#include "harness/base/error.h"
#include "harness/cases/case_runner.h"
#include "harness/cases/registrations.h"

namespace mih::cases {

/// One case of one registration: the parameter of every conformance TEST_P, its request as
/// the run resolved it once (case_request), shared by every test of the case.
struct CaseParam {
  std::shared_ptr<const CaseRequest> request;
};
/// GoogleTest: "llama/DpShard2".
void PrintTo(const CaseParam& p, std::ostream* os);

/// How a case's launch (or its verify-only evidence) ended: its record (case_run.json, as its
/// run wrote it or as this run read it), its evidence directory and code (CaseRunResult), and
/// whether this process launched it. A case without a record of its run has record_of(request)
/// with the outcome: kNotRun when it could not start (error says why), kTransportFailure for a
/// night's job that did not complete, kVerifyOnly for evidence produced elsewhere whose record
/// names no outcome.
struct CaseOutcome : CaseRunResult {
  bool launched_here = false;
};

/// The evidence of the case `request` names: launched (under the case lock) unless this
/// evidence root already holds a run of it with the request's fingerprint (case_fingerprint:
/// binary, case, training backend, fault, timeouts, the checkpoint it starts from).
/// Memoized for the process by spec, case, training backend and matrix source.
/// Throws: mih::Error{kFailedPrecondition} when verify-only evidence is missing or belongs to
///   another case.
const CaseOutcome& ensure_case(const CaseRequest& request);

/// "[mih   12.3s] line" on stderr when RunOptions::progress.
void progress(const std::string& line);

}  // namespace mih::cases
