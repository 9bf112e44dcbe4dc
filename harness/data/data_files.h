// Listing the files of a data directory (a text corpus, an image folder) deterministically.
#pragma once

#include <filesystem>
#include <string_view>
#include <vector>

namespace mih::data {

/// Every regular file under `dir`, recursively, symlinks followed (each directory visited
/// once, so symlink loops end), sorted by path. Shared by the text and image pipelines.
/// `fix` ends every error message ("pass --corpus DIR with text files").
/// Throws: mih::Error{kFailedPrecondition} naming the path when `dir` is missing or not a
///   directory, or a directory under it cannot be listed.
std::vector<std::filesystem::path> list_data_files(const std::filesystem::path& dir, std::string_view fix);

}  // namespace mih::data
