// write_file_atomic, append_whole, read_file and tail_lines.
#include "harness/base/files.h"

#include <fcntl.h>
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

namespace mih {

void write_file_atomic(const std::filesystem::path& path, std::string_view contents, Durability durability) {
  std::error_code ec;
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path(), ec);
  MIH_CHECK_CODE(!ec, Code::kFailedPrecondition, "cannot create directory '", path.parent_path().string(),
                 "': ", ec.message(), "; choose a writable evidence/run directory");
  std::string tmp = path.string() + ".tmp." + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  MIH_CHECK_CODE(fd >= 0, Code::kFailedPrecondition, "cannot write '", path.string(), "': ", std::strerror(errno),
                 "; choose a writable evidence/run directory");
  const char* data = contents.data();
  size_t left = contents.size();
  while (left > 0) {
    ssize_t n = ::write(fd, data, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      MIH_THROW(Code::kFailedPrecondition, "cannot write '", path.string(), "': ", std::strerror(err), " (",
                free_space_text(path), ")");
    }
    data += n;
    left -= static_cast<size_t>(n);
  }
  bool synced = durability == Durability::kDeferred || ::fsync(fd) == 0;
  int err = errno;
  ::close(fd);
  if (!synced || ::rename(tmp.c_str(), path.c_str()) != 0) {
    if (synced) err = errno;
    ::unlink(tmp.c_str());
    MIH_THROW(Code::kFailedPrecondition, "cannot write '", path.string(), "': ", std::strerror(err), " (",
              free_space_text(path), ")");
  }
}

void append_whole(const std::filesystem::path& path, std::string_view text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  MIH_CHECK_CODE(fd >= 0, Code::kFailedPrecondition, "cannot open ", path.string(), " to append: ", std::strerror(errno),
                 " (", free_space_text(path), ")");
  struct stat before {};
  const bool sized = ::fstat(fd, &before) == 0;
  ssize_t n;
  do {
    n = ::write(fd, text.data(), text.size());  // one write: the line lands whole or not at all
  } while (n < 0 && errno == EINTR);
  const int err = n < 0 ? errno : ENOSPC;
  if (n != static_cast<ssize_t>(text.size()) && n > 0 && sized) {
    if (::ftruncate(fd, before.st_size) != 0) {
      // The torn line stays; readers drop a last line without its newline.
    }
  }
  ::close(fd);
  MIH_CHECK_CODE(n == static_cast<ssize_t>(text.size()), Code::kFailedPrecondition, "cannot append to ",
                 path.string(), ": ", std::strerror(err), " (", free_space_text(path), "); nothing of the line was kept");
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
