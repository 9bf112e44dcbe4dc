// A case's evidence, launched once per evidence root and memoized (DESIGN.md section 3): the
// first test that needs a case (or its reference, or a resume's uninterrupted twin) launches
// it under a file lock; later ones, in this process or another sharing the evidence root
// (ctest runs one process per case), read its evidence. In verify-only mode nothing is
// launched: the evidence was produced elsewhere (torchrun/srun on a GPU cluster). Torch-free.
#pragma once

#include <chrono>
#include <filesystem>
#include <iosfwd>
#include <string>

#include "harness/base/case_outcome.h"
#include "harness/base/error.h"
#include "harness/cases/registrations.h"

namespace mih::cases {

/// One case of one registration: the parameter of every conformance TEST_P.
struct CaseParam {
  std::string prefix, spec, matrix, training_backend, case_name;
};
/// GoogleTest: "llama/DpShard2".
void PrintTo(const CaseParam& p, std::ostream* os);

/// How a case's launch (or its verify-only evidence) ended.
struct CaseOutcome {
  std::filesystem::path evidence;
  /// How it ended (case_outcome.h): kNotRun when it could not start (error says why),
  /// kVerifyOnly for evidence produced elsewhere whose record names no outcome.
  Outcome outcome = Outcome::kNotRun;
  std::string error;
  Code code = Code::kOk;
  double seconds = 0;
  bool launched_here = false;
};

/// The case's evidence: launched (under the case lock) unless this evidence root already
/// holds a run of it with the same fingerprint (binary, matrix, training backend, fault, the
/// checkpoint it starts from: ConformanceRun::init_sources, the reference's as every other's).
/// Throws: mih::Error{kInvalidSpec} for an unknown spec, matrix or case;
///   kFailedPrecondition when verify-only evidence is missing or belongs to another case.
const CaseOutcome& ensure_case(const CaseParam& p);

/// What produced a case's evidence, as a short hex digest: this binary (size and mtime), the
/// spec, the resolved case (config, steps, kind, what it is compared with), the training
/// backend, the fault, both timeouts and the checkpoint the port was initialized from
/// (`init_from_sha256`, its checkpoint_digest; "" for the seed's weights). Evidence with
/// another fingerprint is relaunched, never reused; `mih run` writes the same one as `mih
/// test`, so either reuses the other's.
std::string case_fingerprint(const std::string& spec, const spec::Case& c, const std::string& training_backend,
                             const std::string& fault, std::chrono::milliseconds case_timeout,
                             std::chrono::milliseconds collective_timeout, const std::string& init_from_sha256);

/// The fault of the catalog injected in the case's ranks ("" for none: the case is not
/// one of --fault-cases).
std::string fault_of(const CaseParam& p);

/// The resolved case `p` names (from resolved_matrix). Throws: as CaseMatrix::at.
const spec::Case& case_of(const CaseParam& p);

/// "[mih   12.3s] line" on stderr when RunOptions::progress.
void progress(const std::string& line);

}  // namespace mih::cases
