// WriterLock (writer_lock.h): flock on the case directory's .writer.lock, naming its holder.
#include "harness/session/writer_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "harness/base/error.h"
#include "harness/contract/evidence_layout.h"
#include "harness/base/safe_open.h"

namespace mih::session_internal {
namespace {

std::string holder_of(int fd) {
  char buffer[256] = {};
  const ssize_t n = ::pread(fd, buffer, sizeof buffer - 1, 0);
  std::string holder(buffer, n > 0 ? static_cast<size_t>(n) : 0);
  while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
  return holder.empty() ? "another process" : "'" + holder + "'";
}

}  // namespace

WriterLock::WriterLock(const std::filesystem::path& case_dir) {
  const std::filesystem::path file = case_dir / kWriterLock;
  std::string why;
  fd_ = open_own_file(file, O_RDWR, &why);
  MIH_CHECK_CODE(fd_ >= 0, Code::kFailedPrecondition, "TrainerSession: cannot open the writer lock ", file.string(),
                 ": ", why, "; write to a new case directory");
  while (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    if (err == EINTR) continue;
    const std::string holder = err == EWOULDBLOCK ? holder_of(fd_) : std::string();
    ::close(fd_);
    MIH_CHECK_CODE(err != EWOULDBLOCK, Code::kFailedPrecondition, "TrainerSession: ", case_dir.string(),
                   " is being written by ", holder, " (", file.string(),
                   " is locked): one writer per case directory; wait for it to end, or write to another directory");
    MIH_THROW(Code::kFailedPrecondition, "TrainerSession: cannot lock ", file.string(), ": ", std::strerror(err));
  }
}

WriterLock::~WriterLock() { ::close(fd_); }

void WriterLock::name_holder() const {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  const std::string holder = "mih TrainerSession pid " + std::to_string(::getpid()) + " on " + host + "\n";
  if (::ftruncate(fd_, 0) != 0) return;  // the holder unnamed: a refused writer says "another process"
  [[maybe_unused]] const ssize_t written = ::pwrite(fd_, holder.data(), holder.size(), 0);
}

std::string held_by(const std::filesystem::path& case_dir) {
  const int fd = ::open((case_dir / kWriterLock).c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return "";
  const bool held = ::flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK;
  const std::string out = held ? "; being written now by " + holder_of(fd) : "";
  ::close(fd);
  return out;
}

std::string earlier_file(const std::filesystem::path& case_dir) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(case_dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name != layout::kBeforeSave && name != kWriterLock) return name;
  }
  return "";
}

}  // namespace mih::session_internal
