// The case directory's writer lock: one writer of a case directory at a time, a TrainerSession
// and python/mih_evidence.py alike (both flock the same file, kWriterLock), so that two runs
// never mix their evidence in one directory (issue 53).
#pragma once

#include <filesystem>
#include <string>

namespace mih::session_internal {

/// The lock's name in the case directory (mih_evidence.py's WRITER_LOCK; contract.json lists it).
inline constexpr char kWriterLock[] = ".writer.lock";

/// Holds <case_dir>/kWriterLock flock'ed (LOCK_EX, opened O_NOFOLLOW, a file of this user's) from
/// construction to destruction. Throws mih::Error (kFailedPrecondition) naming the directory and
/// the holder (what it wrote into the file: program, pid, host) while another writer holds it,
/// or naming the OS error when the file cannot be opened.
class WriterLock {
 public:
  explicit WriterLock(const std::filesystem::path& case_dir);
  ~WriterLock();
  WriterLock(const WriterLock&) = delete;
  WriterLock& operator=(const WriterLock&) = delete;

  /// Writes "mih TrainerSession pid <pid> on <host>" into the file, for a writer refused later.
  void name_holder() const;

 private:
  int fd_ = -1;
};

/// "; being written now by <holder>" while another writer holds `case_dir`'s lock, else "":
/// never creates the lock file.
std::string held_by(const std::filesystem::path& case_dir);

/// The name of a file an earlier run left in `case_dir` ("" when none, or no such directory):
/// its save phase's before_save/ and the writer lock are not one.
std::string earlier_file(const std::filesystem::path& case_dir);

}  // namespace mih::session_internal
