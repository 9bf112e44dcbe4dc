// What the warm front and server share: the identity of a process as the kernel reports it, the
// socket directory, the request encoding and fd passing.
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "harness/warm/warm.h"
#include "harness/warm/warm_internal.h"

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

// What a file under a /proc/<pid> directory says (at most 64 MiB: an environment is far
// smaller); false with *err = errno when it cannot be read.
bool read_at(int dir, const char* name, std::string* out, int* err) {
  const int fd = ::openat(dir, name, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    *err = errno;
    return false;
  }
  out->clear();
  char buf[16384];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 || out->size() > (64u << 20)) {
      *err = n < 0 ? errno : EFBIG;
      ::close(fd);
      return false;
    }
    if (n == 0) break;
    out->append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return true;
}

// The value of a `Key:\tvalue` line of /proc/<pid>/status, or "(absent)".
std::string status_value(const std::string& status, const std::string& key) {
  for (size_t at = 0; at < status.size();) {
    const size_t end = std::min(status.find('\n', at), status.size());
    if (status.compare(at, key.size(), key) == 0 && at + key.size() < end && status[at + key.size()] == ':') {
      size_t v = at + key.size() + 1;
      while (v < end && (status[v] == ' ' || status[v] == '\t')) ++v;
      return status.substr(v, end - v);
    }
    at = end + 1;
  }
  return "(absent)";
}

// Fields of /proc/<pid>/status that exec passes on (Seccomp_filters: the kernel shows how many
// filters, not which; securebits it does not show another process at all).
constexpr const char* kStatusKeys[] = {"Uid", "Gid", "Groups", "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb",
                                       "NoNewPrivs", "Seccomp", "Seccomp_filters", "Cpus_allowed_list",
                                       "Mems_allowed_list"};
constexpr const char* kNamespaces[] = {"cgroup", "ipc", "mnt", "net", "pid", "pid_for_children", "time",
                                       "time_for_children", "user", "uts"};

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
  iovec iov[2] = {{const_cast<Header*>(&header), sizeof header},
                  {const_cast<char*>(payload.data()), payload.size()}};
  msg.msg_iov = iov;
  msg.msg_iovlen = payload.empty() ? 1 : 2;
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
  const size_t sent = static_cast<size_t>(w);
  if (sent < sizeof header &&
      !write_all(fd, reinterpret_cast<const char*>(&header) + sent, sizeof header - sent)) {
    return false;
  }
  const size_t payload_sent = sent > sizeof header ? sent - sizeof header : 0;
  return write_all(fd, payload.data() + payload_sent, payload.size() - payload_sent);
}

namespace {

// One recvmsg into `iov`: the attached fds appended to *fds (close-on-exec), the sender's
// credentials in *sender when the message carried them (pid 0 otherwise). The byte count, or -1.
ssize_t receive_message(int fd, iovec* iov, size_t iov_count, std::vector<int>* fds, ucred* sender) {
  msghdr msg{};
  msg.msg_iov = iov;
  msg.msg_iovlen = iov_count;
  alignas(cmsghdr) char control[CMSG_SPACE(4 * sizeof(int)) + CMSG_SPACE(sizeof(ucred))] = {};
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  ssize_t r;
  do {
    r = ::recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
  } while (r < 0 && errno == EINTR);
  if (r <= 0) return -1;
  if (sender) *sender = ucred{};
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET) continue;
    if (c->cmsg_type == SCM_CREDENTIALS && sender && c->cmsg_len >= CMSG_LEN(sizeof(ucred))) {
      std::memcpy(sender, CMSG_DATA(c), sizeof *sender);
    } else if (c->cmsg_type == SCM_RIGHTS) {
      const size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < n; ++i) {
        int v;
        std::memcpy(&v, CMSG_DATA(c) + i * sizeof(int), sizeof v);
        fds->push_back(v);
      }
    }
  }
  return (msg.msg_flags & MSG_CTRUNC) != 0 ? -1 : r;
}

}  // namespace

bool receive_header(int fd, Header* header, std::vector<int>* fds) {
  iovec iov{header, sizeof *header};
  const ssize_t r = receive_message(fd, &iov, 1, fds, nullptr);
  if (r < 0) return false;
  if (static_cast<size_t>(r) < sizeof *header &&
      !read_all(fd, reinterpret_cast<char*>(header) + r, sizeof *header - static_cast<size_t>(r))) {
    return false;
  }
  return true;
}

bool receive_echo(int fd, Header* header, uint64_t* nonce, std::vector<int>* fds, ucred* sender) {
  // One piece: a unix stream socket that passes credentials never joins bytes of two senders
  // in one read, so the nonce and the credentials are the same sender's.
  iovec iov[2] = {{header, sizeof *header}, {nonce, sizeof *nonce}};
  const ssize_t r = receive_message(fd, iov, 2, fds, sender);
  return r == static_cast<ssize_t>(sizeof *header + sizeof *nonce) && sender->pid > 0;
}

std::string serialize(const Fields& fields) {
  std::string out;
  for (const auto& [name, value] : fields) field(&out, name, value);
  return out;
}

bool parse(const std::string& text, Fields* fields) {
  fields->clear();
  for (size_t at = 0; at < text.size();) {
    const size_t space = text.find(' ', at), colon = text.find(':', at);
    if (space == std::string::npos || colon == std::string::npos || colon < space || colon - space < 2 ||
        colon - space > 10) {
      return false;
    }
    size_t n = 0;
    for (size_t i = space + 1; i < colon; ++i) {
      if (text[i] < '0' || text[i] > '9') return false;
      n = n * 10 + static_cast<size_t>(text[i] - '0');
    }
    if (text.size() - colon - 1 < n + 1 || text[colon + 1 + n] != '\n') return false;
    fields->emplace_back(text.substr(at, space - at), text.substr(colon + 1, n));
    at = colon + 2 + n;
  }
  return true;
}

std::string differing(const Fields& a, const Fields& b) {
  std::string out;
  auto add = [&](const std::string& name) {
    if (out.find(name) == std::string::npos) out += (out.empty() ? "" : ", ") + name;
  };
  for (const auto& [name, value] : a) {
    const auto it = std::find_if(b.begin(), b.end(), [&](const auto& f) { return f.first == name; });
    if (it == b.end() || it->second != value) add(name);
  }
  for (const auto& f : b) {
    if (std::find_if(a.begin(), a.end(), [&](const auto& g) { return g.first == f.first; }) == a.end()) add(f.first);
  }
  return out;
}

bool read_process(int proc, Fields* fields, std::vector<std::string>* environ_out, std::string* why) {
  fields->clear();
  int err = 0;
  std::string text;
  auto fail = [&](const std::string& what) {
    *why = "cannot read " + what + ": " + std::strerror(err);
    // Its ns/* links need PTRACE_MODE_READ: denied to a reader in a Landlock domain the process
    // is not in (confinement.cpp).
    if (err == EACCES || err == EPERM) *why += " (not the reader's to examine: confined apart, e.g. by Landlock)";
    return false;
  };
  if (!read_at(proc, "status", &text, &err)) return fail("status");
  for (const char* key : kStatusKeys) fields->emplace_back(key, status_value(text, key));
  // nice (field 19), rt_priority (40), policy (41) of `pid (comm) state ...`, comm being anything.
  if (!read_at(proc, "stat", &text, &err)) return fail("stat");
  std::vector<std::string> stat;
  for (size_t at = text.rfind(')') == std::string::npos ? text.size() : text.rfind(')') + 1; at < text.size();) {
    const size_t start = text.find_first_not_of(" \n", at);
    if (start == std::string::npos) break;
    const size_t end = std::min(text.find_first_of(" \n", start), text.size());
    stat.push_back(text.substr(start, end - start));
    at = end;
  }
  if (stat.size() < 39) {
    err = EPROTO;
    return fail("stat");
  }
  fields->emplace_back("sched", "nice " + stat[16] + " rt_priority " + stat[37] + " policy " + stat[38]);
  if (!read_at(proc, "oom_score_adj", &text, &err)) return fail("oom_score_adj");
  fields->emplace_back("oom_score_adj", text);
  if (!read_at(proc, "limits", &text, &err)) return fail("limits");
  fields->emplace_back("limits", text);
  for (const char* ns : kNamespaces) {
    char link[256] = {0};
    const std::string path = std::string("ns/") + ns;
    const ssize_t n = ::readlinkat(proc, path.c_str(), link, sizeof link - 1);
    if (n < 0 && errno != ENOENT) {  // ENOENT: a kind this kernel does not have
      err = errno;
      return fail(path);
    }
    fields->emplace_back(path, n > 0 ? std::string(link, static_cast<size_t>(n)) : "(absent)");
  }
  if (!read_at(proc, "cgroup", &text, &err)) return fail("cgroup");
  fields->emplace_back("cgroup", text);
  for (const char* attr : {"attr/current", "attr/apparmor/current"}) {
    if (read_at(proc, attr, &text, &err)) {
      fields->emplace_back(attr, text);
    } else if (err == ENOENT || err == EINVAL || err == EOPNOTSUPP) {  // no such LSM
      fields->emplace_back(attr, "(none)");
    } else {
      return fail(attr);
    }
  }
  // The environment as libraries read it when they load (OPENBLAS_NUM_THREADS, OMP_*, LD_*,
  // MALLOC_*...): all of it but what a shell changes from one command to the next and no
  // library reads; the command gets all of it, these included. The kernel keeps what exec
  // was given, whatever the process did with its `environ` since.
  if (!read_at(proc, "environ", &text, &err)) return fail("environ");
  if (environ_out) environ_out->clear();
  std::string env;
  size_t count = 0;
  for (size_t at = 0; at < text.size();) {
    const size_t end = std::min(text.find('\0', at), text.size());
    const std::string_view entry(text.data() + at, end - at);
    at = end + 1;
    if (environ_out) environ_out->emplace_back(entry);
    const std::string_view name = entry.substr(0, entry.find('='));
    if (name == "_" || name == "PWD" || name == "OLDPWD" || name == "SHLVL" || name.rfind("MIH_WARM", 0) == 0) {
      continue;  // MIH_WARM*: read by the front, or by a server when it starts (its creator's)
    }
    field(&env, "", std::string(entry));
    ++count;
  }
  fields->emplace_back("environ", std::to_string(count) + "\n" + env);
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

bool pidfd_alive(int pidfd) {
#ifdef SYS_pidfd_send_signal
  return pidfd >= 0 && ::syscall(SYS_pidfd_send_signal, pidfd, 0, nullptr, 0) == 0;
#else
  (void)pidfd;
  return false;
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
  struct stat st {};
  if (::stat(core.c_str(), &st) != 0) return "";
  internal::Fields fields = {
      {"core", std::to_string(st.st_dev) + " " + std::to_string(st.st_ino) + " " + std::to_string(st.st_size) + " " +
                   std::to_string(st.st_mtim.tv_sec) + "." + std::to_string(st.st_mtim.tv_nsec)}};
  const int proc = ::open("/proc/self", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (proc < 0) return "";
  internal::Fields process;
  std::string why;
  const bool read = internal::read_process(proc, &process, nullptr, &why);
  ::close(proc);
  if (!read) return "";
  fields.insert(fields.end(), process.begin(), process.end());
  return internal::serialize(fields);
}

}  // namespace mih::warm
