// Small file helpers every component needs: atomic whole-file writes (temp + rename, so a
// reader never sees half a file; fsync'ed unless deferred) and reading a file's last lines.
#pragma once

#include <cstddef>
#include <filesystem>
#include <string>
#include <string_view>

namespace mih {

/// When a written file reaches the disk.
enum class Durability {
  /// fsync before the rename: the file survives a crash of the machine once the call returns.
  kFsync,
  /// Left to the kernel's writeback: still atomic for every reader and after a crash of the
  /// process, but a crash of the machine may lose it or leave it empty. For files a later
  /// digest vouches for (a case's evidence: case_run.json records the SHA-256 of every file,
  /// and evidence whose digest does not match is never reused or verified), where an fsync
  /// per file (about 1 ms each here) is most of a validation session's cost per step.
  kDeferred,
};

/// Writes `contents` to `path` atomically: a temp file in the same directory, fsync (unless
/// `durability` is kDeferred), then rename over `path`. Creates missing parent directories.
/// Throws: mih::Error{kFailedPrecondition} naming the path and the OS error if the
///   directory cannot be created or the file written.
void write_file_atomic(const std::filesystem::path& path, std::string_view contents,
                       Durability durability = Durability::kFsync);

/// Appends `text` (whole lines) to `path` with one O_APPEND write, creating the file: a write
/// cut short (a full disk) is undone by truncating the file back, so it holds whole lines
/// or nothing new.
/// Throws: mih::Error{kFailedPrecondition} naming the path, the OS error and the free space.
void append_whole(const std::filesystem::path& path, std::string_view text);

/// "<N> MiB free of <M> MiB" on the filesystem holding `path` (or its nearest existing
/// parent); "" if it cannot be asked.
std::string free_space_text(const std::filesystem::path& path);

/// Opens `path` read-only without ever blocking on what it names: the open itself is
/// non-blocking (a FIFO with no writer would block a plain open forever), then fstat refuses
/// anything but a regular file. Returns the descriptor (O_CLOEXEC, back in blocking mode) or
/// -1 with *why (may be null) set: the OS error ("No such file or directory") or "it is a
/// FIFO, not a regular file" (a directory, a character device, a block device likewise; then
/// *special, when given, is set to true: the path exists but names no regular file).
int open_regular_file(const std::filesystem::path& path, std::string* why = nullptr, bool* special = nullptr);

/// Reads the whole file into *contents; returns false if it cannot be read or is not a
/// regular file (a FIFO, a device, a directory: open_regular_file, so never blocks).
bool read_file(const std::filesystem::path& path, std::string* contents);

/// Returns the last `lines` lines of the file (all of it if shorter; "" if unreadable),
/// reading at most the last `max_bytes` bytes.
std::string tail_lines(const std::filesystem::path& path, size_t lines, size_t max_bytes = 64 * 1024);

}  // namespace mih
