// The files a command wrote into a directory of the user's (`mih scaffold`, `mih export`), and
// the refusal to overwrite or delete any other: the command records each file it wrote with
// the SHA-256 of its bytes, and a later run writes into the directory only when every file
// there that it would replace is one it wrote and nobody has edited since.
#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace mih {

/// Refuses to write into `dir` unless mih owns what would be replaced: `dir` does not exist,
/// or is empty, or holds `record` (a JSON object whose "files" maps each relative path the
/// command wrote to the SHA-256 of its bytes, see file_digests) listing each of `paths`
/// (relative to `dir`) that exists, as a regular file whose bytes still have that digest.
/// `command` opens every message ("scaffold", "export").
/// Throws: mih::Error{kFailedPrecondition} naming the path and saying nothing was written: `dir`
///   is a file or cannot be read; it holds files and no `record`; `record` lists no files; a
///   path exists that `record` does not list, that is not a regular file (a link, a folder, a
///   FIFO), or whose bytes were edited since mih wrote them.
void check_owned(const std::filesystem::path& dir, const std::string& record, const std::vector<std::string>& paths,
                 const std::string& command);

/// Every entry under `dir` (files, folders, links; recursively, links not followed) as a path
/// relative to `dir`, sorted, but `except`. Empty when `dir` does not exist.
std::vector<std::string> entries_under(const std::filesystem::path& dir, const std::string& except);

/// Relative path -> SHA-256 of every regular file under `dir` but `except`: the "files" of the
/// record a command writes last.
/// Throws: mih::Error{kFailedPrecondition} naming a file that cannot be read.
std::map<std::string, std::string> file_digests(const std::filesystem::path& dir, const std::string& except);

/// SHA-256 of the file's bytes (64 lower-case hex digits), read 1 MiB at a time.
/// Throws: mih::Error{kFailedPrecondition} naming the file when it is not a regular file or
///   cannot be read.
std::string sha256_of_file(const std::filesystem::path& file);

}  // namespace mih
