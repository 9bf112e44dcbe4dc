// write_file_atomic, append_whole, read_file and tail_lines.
#include "harness/base/files.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "harness/base/error.h"
#include "harness/base/safe_open.h"

namespace mih {

namespace {

// The file's directory, opened to create the temp file in and rename it from: both names are
// then in one directory whatever is renamed on the way there.
int open_parent(const std::filesystem::path& path) {
  const std::filesystem::path dir = path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  MIH_CHECK_CODE(!ec, Code::kFailedPrecondition, "cannot create directory '", dir.string(), "': ", ec.message(),
                 "; choose a writable evidence/run directory");
  const int fd = ::open(dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
  MIH_CHECK_CODE(fd >= 0, Code::kFailedPrecondition, "cannot open directory '", dir.string(), "': ",
                 std::strerror(errno), "; choose a writable evidence/run directory");
  return fd;
}

bool write_all(int fd, std::string_view contents) {
  const char* data = contents.data();
  size_t left = contents.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, data, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data += n;
    left -= static_cast<size_t>(n);
  }
  return true;
}

// Why writing `path` failed, in words: the free space only where space is the cause (a FIFO, a
// directory or the file size limit read as a full disk before).
std::string write_failure(int err, const std::filesystem::path& path) {
  if (err == ENOSPC || err == EDQUOT) return std::string(std::strerror(err)) + " (" + free_space_text(path) + ")";
  if (err == EISDIR) return "it is a directory, not a file";
  if (err != EFBIG) return std::strerror(err);
  struct rlimit limit {};
  const std::string bytes = ::getrlimit(RLIMIT_FSIZE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY
                                ? std::to_string(limit.rlim_cur) + " bytes"
                                : "unknown";
  return "File too large: the file size limit (ulimit -f, RLIMIT_FSIZE: " + bytes +
         ") is reached: raise it (ulimit -f unlimited)";
}

// The errno of a write that wrote only part of `size` bytes at `offset`: past the file size
// limit, or out of space.
int short_write_error(off_t offset, size_t size) {
  struct rlimit limit {};
  const bool past_limit = ::getrlimit(RLIMIT_FSIZE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY &&
                          static_cast<rlim_t>(offset) + size > limit.rlim_cur;
  return past_limit ? EFBIG : ENOSPC;
}

}  // namespace

void write_file_atomic(const std::filesystem::path& path, std::string_view contents, Durability durability) {
  const int dir = open_parent(path);
  const std::string name = path.filename().string();
  // A name nobody can plant a link at first, created only if new (issue 53: a guessable
  // "<file>.tmp.<pid>" opened with O_TRUNC wrote through another user's link).
  const std::string tmp = name + ".tmp." + std::to_string(::getpid()) + "." + unguessable_suffix();
  const int fd = create_new_file_at(dir, tmp, 0644);
  if (fd < 0) {
    const int err = errno;
    ::close(dir);
    MIH_THROW(Code::kFailedPrecondition, "cannot write '", path.string(), "': ", write_failure(err, path),
              "; choose a writable evidence/run directory");
  }
  bool ok = write_all(fd, contents) && (durability == Durability::kDeferred || ::fsync(fd) == 0);
  int err = errno;
  ::close(fd);
  // rename replaces a link standing at the target; it never writes through it.
  if (ok && ::renameat(dir, tmp.c_str(), dir, name.c_str()) != 0) {
    ok = false;
    err = errno;
  }
  if (!ok) ::unlinkat(dir, tmp.c_str(), 0);
  ::close(dir);
  MIH_CHECK_CODE(ok, Code::kFailedPrecondition, "cannot write '", path.string(), "': ", write_failure(err, path),
                 err == EISDIR ? "; remove it, or choose another evidence/run directory" : "");
}

void append_whole(const std::filesystem::path& path, std::string_view text) {
  std::string why;
  const int fd = open_own_file(path, O_WRONLY | O_APPEND, &why);  // never through a link (issue 53)
  const int open_err = errno;
  MIH_CHECK_CODE(fd >= 0, Code::kFailedPrecondition, "cannot open ", path.string(), " to append: ",
                 open_err == 0 ? why : write_failure(open_err, path),
                 "; remove it, or choose another evidence/run directory");
  struct stat before {};
  const bool sized = ::fstat(fd, &before) == 0;
  ssize_t n;
  do {
    n = ::write(fd, text.data(), text.size());  // one write: the line lands whole or not at all
  } while (n < 0 && errno == EINTR);
  const int err = n < 0 ? errno : short_write_error(sized ? before.st_size : 0, text.size());
  if (n != static_cast<ssize_t>(text.size()) && n > 0 && sized) {
    if (::ftruncate(fd, before.st_size) != 0) {
      // The torn line stays; readers drop a last line without its newline.
    }
  }
  ::close(fd);
  MIH_CHECK_CODE(n == static_cast<ssize_t>(text.size()), Code::kFailedPrecondition, "cannot append to ",
                 path.string(), ": ", write_failure(err, path), "; nothing of the line was kept");
}

std::string free_space_text(const std::filesystem::path& path) {
  std::filesystem::path p = path;
  std::error_code ec;
  while (!p.empty() && !std::filesystem::exists(p, ec)) p = p.parent_path();
  struct statvfs fs {};
  if (p.empty() || ::statvfs(p.c_str(), &fs) != 0) return "";
  const double mib = 1024.0 * 1024.0;
  char text[96];
  std::snprintf(text, sizeof text, "%.1f MiB free of %.1f MiB", static_cast<double>(fs.f_bavail) * fs.f_frsize / mib,
                static_cast<double>(fs.f_blocks) * fs.f_frsize / mib);
  return text;
}

int open_regular_file(const std::filesystem::path& path, std::string* why, bool* special) {
  if (special != nullptr) *special = false;
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) {
    if (why != nullptr) *why = std::strerror(errno);
    return -1;
  }
  struct stat st {};
  const char* kind = nullptr;
  if (::fstat(fd, &st) != 0) {
    if (why != nullptr) *why = std::strerror(errno);
    kind = "";
  } else if (S_ISFIFO(st.st_mode)) {
    kind = "a FIFO";
  } else if (S_ISDIR(st.st_mode)) {
    kind = "a directory";
  } else if (S_ISCHR(st.st_mode)) {
    kind = "a character device";
  } else if (S_ISBLK(st.st_mode)) {
    kind = "a block device";
  } else if (!S_ISREG(st.st_mode)) {
    kind = "a socket or another special file";
  }
  if (kind == nullptr) {
    const int flags = ::fcntl(fd, F_GETFL);
    if (flags >= 0 && ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) == 0) return fd;
    if (why != nullptr) *why = std::strerror(errno);
  } else if (*kind != '\0') {
    if (why != nullptr) *why = std::string("it is ") + kind + ", not a regular file";
    if (special != nullptr) *special = true;
  }
  ::close(fd);
  return -1;
}

bool read_file(const std::filesystem::path& path, std::string* contents) {
  const int fd = open_regular_file(path);
  if (fd < 0) return false;
  std::string text;
  struct stat st {};
  if (::fstat(fd, &st) == 0 && st.st_size > 0) text.reserve(static_cast<size_t>(st.st_size));
  char buffer[1 << 16];
  while (true) {
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      ::close(fd);
      return false;
    }
    if (n == 0) break;
    text.append(buffer, static_cast<size_t>(n));
  }
  ::close(fd);
  *contents = std::move(text);
  return true;
}

std::string tail_lines(const std::filesystem::path& path, size_t lines, size_t max_bytes) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return "";
  std::streamoff size = in.tellg();
  std::streamoff start = size > static_cast<std::streamoff>(max_bytes) ? size - static_cast<std::streamoff>(max_bytes) : 0;
  in.seekg(start);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (start > 0) text.erase(0, text.find('\n') + 1);  // drop the partial first line
  std::vector<std::string_view> all;
  std::string_view rest(text);
  while (!rest.empty()) {
    size_t eol = rest.find('\n');
    all.push_back(rest.substr(0, eol));
    rest = eol == std::string_view::npos ? std::string_view() : rest.substr(eol + 1);
  }
  std::string out;
  for (size_t i = all.size() > lines ? all.size() - lines : 0; i < all.size(); ++i) {
    out.append(all[i]);
    out.push_back('\n');
  }
  return out;
}

}  // namespace mih
