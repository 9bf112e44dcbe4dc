// Writing into a directory another user may reach (an evidence root) without being led by what
// they planted there: temp files under names nobody can guess, opened only if new; appends and
// locks that never follow a link or a second hard link; directories entered one component at a
// time, refusing a link or a directory that another user owns or can write (issue 53).
#pragma once

#include <filesystem>
#include <string>

namespace mih {

/// 16 random lower-case hex digits (getrandom): a name another user cannot plant ahead of us.
/// Throws: mih::Error{kInternal} when the kernel gives no random bytes.
std::string unguessable_suffix();

/// Creates the new file `dir_fd`/`name` with O_CREAT | O_EXCL | O_NOFOLLOW and `mode`: never an
/// existing file, never through a link. Returns the descriptor (O_WRONLY, O_CLOEXEC) or -1
/// with errno set.
int create_new_file_at(int dir_fd, const std::string& name, int mode);

/// Opens `path` with `flags` (O_RDWR or O_WRONLY | O_APPEND; O_CREAT is added) never through a
/// link (O_NOFOLLOW), then fstat: it must be a regular file owned by this process's user, with
/// one name (another user may hard-link any file of ours they can write, fs.protected_hardlinks
/// allowing it, at the name we append to). Returns the descriptor (O_CLOEXEC) or -1 with *why
/// set ("it is a symbolic link", "it is a FIFO, not a regular file", "it belongs to user 1001",
/// "it has 2 hard links", the OS error) and errno the OS error (0 for a refusal).
int open_own_file(const std::filesystem::path& path, int flags, std::string* why);

/// Creates `dir` and its missing parents, walking the path one component at a time (openat with
/// O_NOFOLLOW | O_DIRECTORY, mkdirat): a component may be a symbolic link only if this user or
/// root owns the link, and every directory on the way must be owned by this user or root and
/// writable by no other user or group unless sticky (/tmp): another user could otherwise plant a
/// link, or swap a directory we checked for one (rename), that sends the writes elsewhere. No
/// descriptor is kept: writes below `dir` resolve its path again, which is sound because nobody
/// else may rename or replace an entry on it (the sticky bit forbids renaming another user's
/// entries). A directory writable by the group of this process (its effective gid) is allowed.
/// The last directory, when sticky and writable by every user, is warned about on stderr, once
/// per process. `fix` ends each message ("pass another --evidence-root").
/// Throws: mih::Error{kFailedPrecondition} naming the component, its owner, group or mode, the
/// chmod that makes it safe, and `fix`.
void make_secure_directory(const std::filesystem::path& dir, const std::string& fix);

}  // namespace mih
