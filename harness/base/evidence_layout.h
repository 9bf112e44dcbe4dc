// The evidence layout (DESIGN.md section 6) as code: the name of every file of a run root and
// of a case directory, so that every writer and every reader names a file through one
// constant (as findings/codes.h does for finding codes). Torch-free.
//
//   <root>/                       a run root (--evidence-root)
//     results.jsonl               one line per finished test, a start and an end line per process
//     run.json                    the run's matrix, registrations and init sources
//     <spec>/.<case>.lock         the case lock (one run of a case at a time over the root)
//     <spec>/<case>/              a case directory (case_dir): see the constants below
//
// How to add a file: add one constant here (a path relative to the directory it lives in;
// a per-step or per-rank file is a function), describe it in one comment line, and name it
// only through the constant in its writer and its readers.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

namespace mih::layout {

// ---- The run root ------------------------------------------------------------------------
inline constexpr char kResults[] = "results.jsonl";  ///< one JSON line per finished test
inline constexpr char kRunRecord[] = "run.json";     ///< the run's matrix, registrations, init sources

// ---- A case directory <root>/<spec>/<case>/ ----------------------------------------------
inline constexpr char kCaseRecord[] = "case_run.json";   ///< the parent's record: outcome, state, digests
inline constexpr char kCaseRequest[] = "run/case.json";  ///< the resolved case every rank reads
inline constexpr char kEnvironment[] = "environment.json";
inline constexpr char kIntegrationState[] = "integration_state.json";
inline constexpr char kSpecResolved[] = "spec.resolved.json";
inline constexpr char kConfigResolved[] = "config.resolved.json";
inline constexpr char kFindings[] = "check/findings.json";
/// A resume's save phase: a case directory of its own inside the case's.
inline constexpr char kBeforeSave[] = "before_save";

/// <root>/<spec>/<case>.
std::filesystem::path case_dir(const std::filesystem::path& root, const std::string& spec, const std::string& case_name);
/// <root>/<spec>/.<case>.lock (cases::CaseLock).
std::filesystem::path case_lock(const std::filesystem::path& root, const std::string& spec, const std::string& case_name);

}  // namespace mih::layout
