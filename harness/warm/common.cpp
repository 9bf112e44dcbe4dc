// What the warm front and server share: the identity a request must match, the socket
// directory, the request encoding and fd passing.
#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string_view>

#include "harness/warm/warm.h"
#include "harness/warm/warm_internal.h"

extern char** environ;

namespace mih::warm {
namespace internal {
namespace {

void field(std::string* out, const std::string& name, const std::string& value) {
  *out += name;
  *out += ' ';
  *out += std::to_string(value.size());
  *out += ':';
  *out += value;
  *out += '\n';
}

std::string file_text(const char* path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void put_u32(std::string* out, uint32_t v) { out->append(reinterpret_cast<const char*>(&v), sizeof v); }
void put_u64(std::string* out, uint64_t v) { out->append(reinterpret_cast<const char*>(&v), sizeof v); }

template <typename T>
bool take(const std::string& in, size_t* at, T* v) {
  if (in.size() - *at < sizeof(T)) return false;
  std::memcpy(v, in.data() + *at, sizeof(T));
  *at += sizeof(T);
  return true;
}

}  // namespace

std::string encode(const RunRequest& r) {
  std::string out;
  put_u64(&out, r.identity.size());
  out += r.identity;
  put_u32(&out, r.umask);
  put_u64(&out, r.blocked);
  put_u64(&out, r.ignored);
  for (const auto* list : {&r.argv, &r.env}) {
    put_u32(&out, static_cast<uint32_t>(list->size()));
    for (const auto& a : *list) {
      out += a;
      out.push_back('\0');
    }
  }
  return out;
}

bool decode(const std::string& in, RunRequest* r) {
  size_t at = 0;
  uint64_t n = 0;
  if (!take(in, &at, &n) || in.size() - at < n) return false;
  r->identity = in.substr(at, n);
  at += n;
  if (!take(in, &at, &r->umask) || !take(in, &at, &r->blocked) || !take(in, &at, &r->ignored)) return false;
  for (auto* list : {&r->argv, &r->env}) {
    uint32_t count = 0;
    if (!take(in, &at, &count)) return false;
    for (uint32_t i = 0; i < count; ++i) {
      const size_t end = in.find('\0', at);
      if (end == std::string::npos) return false;
      list->push_back(in.substr(at, end - at));
      at = end + 1;
    }
  }
  return !r->argv.empty() && at == in.size();
}

std::string socket_dir(std::string* why) {
  const uid_t uid = ::getuid();
  std::string dir;
  if (const char* d = std::getenv(kDirVar); d && *d) {
    dir = d;
  } else if (const char* x = std::getenv("XDG_RUNTIME_DIR"); x && x[0] == '/') {
    struct stat st {};
    if (::stat(x, &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == uid) dir = std::string(x) + "/mih";
  }
  if (dir.empty()) dir = "/tmp/mih-" + std::to_string(uid);
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    *why = "cannot create '" + dir + "': " + std::strerror(errno);
    return "";
  }
  // Another user's directory, or one others may enter, could hand this user a server of theirs.
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != uid || (st.st_mode & 077) != 0) {
    *why = "'" + dir + "' is not a directory of this user's that only it may enter (mode 0700); remove it or set " +
           kDirVar;
    return "";
  }
  return dir;
}

std::string key_of(const std::string& identity) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a: names a socket only; the identity itself is compared
  for (unsigned char c : identity) {
    h ^= c;
    h *= 1099511628211ull;
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return hex;
}

bool write_all(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool read_all(int fd, void* data, size_t n) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t r = ::recv(fd, p, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

bool send_request(int fd, const Header& header, const std::vector<int>& fds, const std::string& payload) {
  msghdr msg{};
  iovec iov{const_cast<Header*>(&header), sizeof header};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(4 * sizeof(int))] = {};
  if (!fds.empty()) {
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(fds.size() * sizeof(int));
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(fds.size() * sizeof(int));
    std::memcpy(CMSG_DATA(c), fds.data(), fds.size() * sizeof(int));
  }
  ssize_t w;
  do {
    w = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
  } while (w < 0 && errno == EINTR);
  if (w < 0) return false;
  if (static_cast<size_t>(w) < sizeof header &&
      !write_all(fd, reinterpret_cast<const char*>(&header) + w, sizeof header - static_cast<size_t>(w))) {
    return false;
  }
  return write_all(fd, payload.data(), payload.size());
}

bool receive_header(int fd, Header* header, std::vector<int>* fds) {
  msghdr msg{};
  iovec iov{header, sizeof *header};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(4 * sizeof(int))] = {};
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  ssize_t r;
  do {
    r = ::recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
  } while (r < 0 && errno == EINTR);
  if (r <= 0) return false;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < n; ++i) {
      int v;
      std::memcpy(&v, CMSG_DATA(c) + i * sizeof(int), sizeof v);
      fds->push_back(v);
    }
  }
  if ((msg.msg_flags & MSG_CTRUNC) != 0) return false;
  if (static_cast<size_t>(r) < sizeof *header &&
      !read_all(fd, reinterpret_cast<char*>(header) + r, sizeof *header - static_cast<size_t>(r))) {
    return false;
  }
  return true;
}

int open_pidfd(pid_t pid) {
#ifdef SYS_pidfd_open
  return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
#else
  (void)pid;
  errno = ENOSYS;
  return -1;
#endif
}

std::string bad_settings() {
  if (const char* v = std::getenv(kWarmVar)) {
    const std::string s = v;
    if (s != "0" && s != "1" && s != "false" && s != "true" && s != "no" && s != "yes" && s != "off" && s != "on") {
      return std::string(kWarmVar) + "='" + s + "': expected 0, 1, false, true, no, yes, off or on";
    }
  }
  for (const auto& [var, max] : {std::pair<const char*, long>{kIdleVar, 86400}, {kTimeoutVar, 3600}}) {
    const char* v = std::getenv(var);
    if (!v) continue;
    char* end = nullptr;
    errno = 0;
    const long n = std::strtol(v, &end, 10);
    if (!*v || *end || errno != 0 || n < 1 || n > max) {
      return std::string(var) + "='" + v + "': expected whole seconds from 1 to " + std::to_string(max);
    }
  }
  return "";
}

bool switched_off(const char* var) {
  const char* v = std::getenv(var);
  if (!v) return false;
  const std::string s = v;
  return s == "0" || s == "false" || s == "no" || s == "off";
}

}  // namespace internal

std::string identity(const std::string& core) {
  using internal::field;
  std::string out;
  struct stat st {};
  if (::stat(core.c_str(), &st) != 0) return "";
  field(&out, "core", std::to_string(st.st_dev) + " " + std::to_string(st.st_ino) + " " + std::to_string(st.st_size) +
                          " " + std::to_string(st.st_mtim.tv_sec) + "." + std::to_string(st.st_mtim.tv_nsec));
  std::string creds = std::to_string(::getuid()) + " " + std::to_string(::geteuid()) + " " +
                      std::to_string(::getgid()) + " " + std::to_string(::getegid());
  gid_t groups[256];
  const int ngroups = ::getgroups(256, groups);
  for (int i = 0; i < ngroups; ++i) creds += " " + std::to_string(groups[i]);
  field(&out, "creds", creds);
  errno = 0;
  field(&out, "nice", std::to_string(::getpriority(PRIO_PROCESS, 0)));
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  if (::sched_getaffinity(0, sizeof cpus, &cpus) == 0) {
    std::string mask;
    for (int c = 0; c < CPU_SETSIZE; ++c) mask += CPU_ISSET(c, &cpus) ? '1' : '0';
    field(&out, "affinity", mask.substr(0, mask.find_last_of('1') + 1));
  }
  for (int r = 0; r < RLIM_NLIMITS; ++r) {
    rlimit lim{};
    if (::getrlimit(static_cast<__rlimit_resource>(r), &lim) == 0) {
      field(&out, "rlimit" + std::to_string(r), std::to_string(lim.rlim_cur) + " " + std::to_string(lim.rlim_max));
    }
  }
  for (const char* ns : {"cgroup", "ipc", "mnt", "net", "pid", "pid_for_children", "time", "time_for_children", "user",
                         "uts"}) {
    char link[256] = {0};
    const std::string path = std::string("/proc/self/ns/") + ns;
    const ssize_t n = ::readlink(path.c_str(), link, sizeof link - 1);
    field(&out, std::string("ns ") + ns, n > 0 ? std::string(link, static_cast<size_t>(n)) : "");
  }
  field(&out, "cgroup", internal::file_text("/proc/self/cgroup"));
  std::istringstream status(internal::file_text("/proc/self/status"));
  for (std::string line; std::getline(status, line);) {
    for (const char* key : {"Cap", "NoNewPrivs:", "Seccomp:"}) {
      if (line.rfind(key, 0) == 0) field(&out, "status", line);
    }
  }
  // The environment as libraries read it when they load (OPENBLAS_NUM_THREADS, OMP_*, LD_*,
  // MALLOC_*...): all of it but what a shell changes from one command to the next and no
  // library reads; the command gets the request's environment, these included.
  std::string env;
  size_t count = 0;
  for (char** e = environ; e && *e; ++e) {
    const std::string_view entry(*e);
    const std::string_view name = entry.substr(0, entry.find('='));
    if (name == "_" || name == "PWD" || name == "OLDPWD" || name == "SHLVL" || name.rfind("MIH_WARM", 0) == 0) {
      continue;  // MIH_WARM*: read by the front, or by a server when it starts (its creator's)
    }
    field(&env, "", *e);
    ++count;
  }
  field(&out, "environ " + std::to_string(count), env);
  return out;
}

}  // namespace mih::warm
