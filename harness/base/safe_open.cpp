// unguessable_suffix, create_new_file_at, open_own_file and make_secure_directory (see safe_open.h).
#include "harness/base/safe_open.h"

#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <set>
#include <vector>

#include "harness/base/error.h"

namespace mih {
namespace {

namespace fs = std::filesystem;

// This user and root: root owns the system's directories (/, /tmp) and can write anywhere anyway.
bool trusted_owner(uid_t uid) { return uid == ::geteuid() || uid == 0; }

std::string user_text(uid_t uid) {
  const struct passwd* pw = ::getpwuid(uid);
  return pw != nullptr ? "user '" + std::string(pw->pw_name) + "' (uid " + std::to_string(uid) + ")"
                       : "uid " + std::to_string(uid);
}

std::string group_text(gid_t gid) {
  const struct group* gr = ::getgrgid(gid);
  return gr != nullptr ? "group '" + std::string(gr->gr_name) + "' (gid " + std::to_string(gid) + ")"
                       : "gid " + std::to_string(gid);
}

std::string mode_text(mode_t mode) {
  char text[8];
  std::snprintf(text, sizeof text, "%04o", static_cast<unsigned>(mode & 07777));
  return text;
}

// What stands at a name mih would write, when it is not a regular file.
std::string not_regular_text(mode_t mode) {
  if (S_ISLNK(mode)) return "it is a symbolic link, and mih never writes through one";
  if (S_ISFIFO(mode)) return "it is a FIFO, not a regular file";
  if (S_ISDIR(mode)) return "it is a directory, not a regular file";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "it is a device, not a regular file";
  return "it is a socket or another special file, not a regular file";
}

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { if (fd_ >= 0) ::close(fd_); }
  int get() const { return fd_; }
  void reset(int fd) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_;
};

// A sticky directory every user may write, the last one on the path (the evidence root itself):
// said once per directory and process.
void warn_everyone_writable(const struct stat& st, const fs::path& at, bool last, const std::string& fix) {
  if (!last || (st.st_mode & S_IWOTH) == 0) return;  // sticky, or it was refused
  static std::mutex mutex;
  static std::set<std::string> warned;
  const std::lock_guard<std::mutex> lock(mutex);
  if (!warned.insert(at.string()).second) return;
  std::fprintf(stderr,
               "mih: warning: directory %s (mode %s) is writable by every user: they could plant entries in it (mih "
               "refuses to write through a link or into a directory it does not own, so the run may be refused); "
               "chmod go-w %s, or %s\n",
               at.c_str(), mode_text(st.st_mode).c_str(), at.c_str(), fix.c_str());
}

// `at` may hold what mih writes: ours or root's, and not open to every user but through a sticky bit.
void check_directory(int fd, const fs::path& dir, const fs::path& at, bool last, const std::string& fix) {
  struct stat st {};
  MIH_CHECK_CODE(::fstat(fd, &st) == 0, Code::kFailedPrecondition, "directory ", dir.string(),
                 " cannot be created: cannot stat ", at.string(), ": ", std::strerror(errno), "; ", fix);
  MIH_CHECK_CODE(trusted_owner(st.st_uid), Code::kFailedPrecondition, "directory ", dir.string(),
                 " cannot be created safely: ", at.string(), " belongs to ", user_text(st.st_uid),
                 ", who could plant links in it that send mih's writes elsewhere: expected a directory of yours (uid ",
                 ::geteuid(), ") or root's; chown it, or ", fix);
  MIH_CHECK_CODE((st.st_mode & S_IWOTH) == 0 || (st.st_mode & S_ISVTX) != 0, Code::kFailedPrecondition, "directory ",
                 dir.string(), " cannot be created safely: ", at.string(), " is writable by every user (mode ",
                 mode_text(st.st_mode), ", no sticky bit), who could plant links in it that send mih's writes "
                 "elsewhere: expected a directory others cannot write; chmod o-w ",
                 at.string(), ", or ", fix);
  // A member of that group could rename an entry we checked and put a link in its place before
  // we write below it (paths are resolved again at each write); the sticky bit forbids renaming
  // another user's entries.
  MIH_CHECK_CODE((st.st_mode & S_IWGRP) == 0 || st.st_gid == ::getegid() || (st.st_mode & S_ISVTX) != 0,
                 Code::kFailedPrecondition, "directory ", dir.string(), " cannot be created safely: ", at.string(),
                 " is writable by ", group_text(st.st_gid), " (mode ", mode_text(st.st_mode),
                 ", no sticky bit), whose members could swap a directory in it for a link that sends mih's writes "
                 "elsewhere: expected a directory only you, your group (gid ", ::getegid(),
                 ") or root can write, or a sticky one; chmod g-w ", at.string(), " (or chmod +t), or ", fix);
  warn_everyone_writable(st, at, last, fix);
}

// The directory `name` in `parent`, created when missing. A link is followed only when this user
// or root made it.
int enter(int parent, const std::string& name, const fs::path& dir, const fs::path& at, const std::string& fix) {
  for (int attempt = 0; attempt < 3; ++attempt) {
    const int fd = ::openat(parent, name.c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd >= 0) return fd;
    const int err = errno;
    if (err == ENOENT) {
      MIH_CHECK_CODE(::mkdirat(parent, name.c_str(), 0777) == 0 || errno == EEXIST, Code::kFailedPrecondition,
                     "directory ", dir.string(), " cannot be created: ", at.string(), ": ", std::strerror(errno), "; ",
                     fix);
      continue;
    }
    struct stat st {};
    const bool lstat_ok = ::fstatat(parent, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0;
    MIH_CHECK_CODE((err == ELOOP || err == ENOTDIR) && lstat_ok, Code::kFailedPrecondition, "directory ", dir.string(),
                   " cannot be created: ", at.string(), ": ", std::strerror(err), "; ", fix);
    MIH_CHECK_CODE(S_ISLNK(st.st_mode), Code::kFailedPrecondition, "directory ", dir.string(), " cannot be created: ",
                   at.string(), " is a file, not a directory; ", fix);
    MIH_CHECK_CODE(trusted_owner(st.st_uid), Code::kFailedPrecondition, "directory ", dir.string(),
                   " cannot be created safely: ", at.string(), " is a symbolic link of ", user_text(st.st_uid),
                   ", which would send mih's writes elsewhere: expected a directory, or a link of yours (uid ",
                   ::geteuid(), ") or root's; remove it, or ", fix);
    const int followed = ::openat(parent, name.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
    MIH_CHECK_CODE(followed >= 0, Code::kFailedPrecondition, "directory ", dir.string(), " cannot be created: ",
                   at.string(), ": ", std::strerror(errno), "; ", fix);
    return followed;
  }
  MIH_THROW(Code::kFailedPrecondition, "directory ", dir.string(), " cannot be created: ", at.string(),
            " keeps appearing and disappearing (another process is changing it); ", fix);
}

}  // namespace

std::string unguessable_suffix() {
  unsigned char bytes[8];
  size_t got = 0;
  while (got < sizeof bytes) {
    const ssize_t n = ::getrandom(bytes + got, sizeof bytes - got, 0);
    if (n < 0 && errno == EINTR) continue;
    MIH_CHECK_CODE(n > 0, Code::kInternal, "getrandom: ", std::strerror(errno));
    got += static_cast<size_t>(n);
  }
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char b : bytes) {
    out.push_back(kHex[b >> 4]);
    out.push_back(kHex[b & 15]);
  }
  return out;
}

int create_new_file_at(int dir_fd, const std::string& name, int mode) {
  return ::openat(dir_fd, name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
}

int open_own_file(const fs::path& path, int flags, std::string* why) {
  // O_NONBLOCK: a FIFO planted there fails (no reader) instead of blocking the open forever.
  const int fd = ::open(path.c_str(), flags | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int err = errno;
    struct stat st {};
    // ELOOP, or EACCES where the kernel checks a link in a sticky directory first; ENXIO for a
    // FIFO without a reader, EISDIR for a directory.
    const bool known = ::lstat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode);
    *why = known ? not_regular_text(st.st_mode) : std::strerror(err);
    errno = known ? 0 : err;
    return -1;
  }
  struct stat st {};
  int err = 0;
  if (::fstat(fd, &st) != 0) {
    err = errno;
    *why = std::strerror(err);
  } else if (!S_ISREG(st.st_mode)) {
    *why = not_regular_text(st.st_mode);
  } else if (st.st_uid != ::geteuid()) {
    *why = "it belongs to " + user_text(st.st_uid) + ", not to you (uid " + std::to_string(::geteuid()) +
           "): mih writes only into files it made";
  } else if (st.st_nlink > 1) {
    *why = "it has " + std::to_string(st.st_nlink) + " hard links: another name could be any file (another user "
           "may have linked here one of yours they can write); mih writes only into files it made";
  } else if (::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0) {
    err = errno;
    *why = std::strerror(err);
  } else {
    return fd;
  }
  ::close(fd);
  errno = err;
  return -1;
}

void make_secure_directory(const fs::path& dir, const std::string& fix) {
  const fs::path full = fs::absolute(dir).lexically_normal();
  std::vector<std::string> parts;
  for (const auto& part : full.relative_path()) {
    if (!part.empty() && part != ".") parts.push_back(part.string());
  }
  Fd fd(::open("/", O_PATH | O_DIRECTORY | O_CLOEXEC));
  MIH_CHECK_CODE(fd.get() >= 0, Code::kFailedPrecondition, "cannot open /: ", std::strerror(errno));
  fs::path at = "/";
  check_directory(fd.get(), full, at, parts.empty(), fix);
  for (size_t i = 0; i < parts.size(); ++i) {
    at /= parts[i];
    fd.reset(enter(fd.get(), parts[i], full, at, fix));
    check_directory(fd.get(), full, at, i + 1 == parts.size(), fix);
  }
}

}  // namespace mih
