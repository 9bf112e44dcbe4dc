// `mih check <evidence>` (internal to harness/cli): the `mih test` options and GoogleTest filter
// a check derives from the evidence it judges: a case directory (its spec, matrix, checkpoint,
// fault) or a run root (the tests its processes recorded in results.jsonl, else every spec
// with evidence there).
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace mih::cli {

/// The arguments of the verify-only run that checks `target`, with the filter it must run in
/// `*filter` and, for a run root, the tests its run recorded in `*recorded` (every one must be
/// a test of this binary).
/// Throws: mih::Error{kFailedPrecondition} for a target that is no case directory or run root,
///   or whose records cannot be read or name another binary's tests; kInvalidSpec for a spec
///   not compiled in.
std::vector<std::string> check_arguments(const std::filesystem::path& target, std::string* filter,
                                         std::vector<std::string>* recorded);

}  // namespace mih::cli
