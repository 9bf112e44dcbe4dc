// The c10d stores behind store.h: FileStore, TCPStore, HashStore and PrefixStore views, with
// their failures as mih::Errors naming the store and the key.
#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "harness/base/error.h"
#include "harness/compat/c10d_internal.h"
#include "harness/compat/store.h"

// Where the hosted TCPStore listens. c10d's server binds the wildcard address (every
// interface) and, before libtorch 2.3, takes no bind address. From 2.3 mih binds the socket
// itself and hands it over (TCPStoreOptions::masterListenFd). On 1.13 mih rewrites the
// wildcard in the bind() calls the TCPStore constructor makes on this thread (its server
// binds synchronously, IPv6 first, then IPv4), and fails closed if no bind was rewritten.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
#define MIH_TCPSTORE_LISTEN_FD 1
#else
#define MIH_TCPSTORE_LISTEN_FD 0
#endif

namespace {

// The address a bind of the wildcard is rewritten to, on the thread constructing a server.
struct BindTarget {
  sockaddr_storage address{};  // AF_INET or AF_INET6, port unset
  int rewritten = 0;           // binds rewritten so far
};

#if !MIH_TCPSTORE_LISTEN_FD
thread_local BindTarget* t_bind_target = nullptr;

// Rewrites `addr` (a wildcard bind) for `target`: the same family gets the address itself;
// an IPv6 socket asked to serve an IPv4 address gets it IPv4-mapped (::ffff:a.b.c.d, dual
// stack), so the IPv6-first server still listens on that one address. False: leave it alone
// (not a wildcard), or refuse it (`refuse`: an IPv4 socket for an IPv6 address).
bool rewrite_wildcard(const sockaddr* addr, socklen_t len, const BindTarget& target, sockaddr_storage& out,
                      socklen_t& out_len, bool& refuse) {
  refuse = false;
  const auto family = target.address.ss_family;
  if (addr->sa_family == AF_INET6 && len >= sizeof(sockaddr_in6)) {
    sockaddr_in6 a;
    std::memcpy(&a, addr, sizeof a);
    if (!IN6_IS_ADDR_UNSPECIFIED(&a.sin6_addr)) return false;
    if (family == AF_INET6) {
      a.sin6_addr = reinterpret_cast<const sockaddr_in6&>(target.address).sin6_addr;
    } else {
      const auto& v4 = reinterpret_cast<const sockaddr_in&>(target.address).sin_addr;
      std::memset(&a.sin6_addr, 0, sizeof a.sin6_addr);
      a.sin6_addr.s6_addr[10] = 0xff;
      a.sin6_addr.s6_addr[11] = 0xff;
      std::memcpy(&a.sin6_addr.s6_addr[12], &v4, 4);
    }
    std::memcpy(&out, &a, sizeof a);
    out_len = sizeof a;
    return true;
  }
  if (addr->sa_family == AF_INET && len >= sizeof(sockaddr_in)) {
    sockaddr_in a;
    std::memcpy(&a, addr, sizeof a);
    if (a.sin_addr.s_addr != htonl(INADDR_ANY)) return false;
    if (family != AF_INET) {
      refuse = true;
      return false;
    }
    a.sin_addr = reinterpret_cast<const sockaddr_in&>(target.address).sin_addr;
    std::memcpy(&out, &a, sizeof a);
    out_len = sizeof a;
    return true;
  }
  return false;
}
#endif

}  // namespace

#if !MIH_TCPSTORE_LISTEN_FD
// Interposes libc's bind() for the whole process; a plain pass-through except on a thread
// inside make_tcp_store with a bind address (see above).
extern "C" int bind(int fd, const sockaddr* addr, socklen_t len) {
  using BindFn = int (*)(int, const sockaddr*, socklen_t);
  static const BindFn next = reinterpret_cast<BindFn>(::dlsym(RTLD_NEXT, "bind"));
  if (next == nullptr) {
    errno = ENOSYS;
    return -1;
  }
  BindTarget* target = t_bind_target;
  if (target != nullptr && addr != nullptr) {
    sockaddr_storage out{};
    socklen_t out_len = 0;
    bool refuse = false;
    if (rewrite_wildcard(addr, len, *target, out, out_len, refuse)) {
      ++target->rewritten;
      return next(fd, reinterpret_cast<const sockaddr*>(&out), out_len);
    }
    if (refuse) {
      errno = EADDRNOTAVAIL;
      return -1;
    }
  }
  return next(fd, addr, len);
}
#endif

namespace mih::compat {

namespace {

// Parses a numeric IPv4 or IPv6 address.
// Throws: mih::Error{kInvalidSpec} naming it otherwise.
sockaddr_storage numeric_address(const std::string& text) {
  sockaddr_storage out{};
  auto* v4 = reinterpret_cast<sockaddr_in*>(&out);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&out);
  if (::inet_pton(AF_INET, text.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
  } else if (::inet_pton(AF_INET6, text.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
  } else {
    MIH_THROW(Code::kInvalidSpec, "TCPStore bind address '", text,
              "' is not a numeric IPv4 or IPv6 address (e.g. 127.0.0.1 or 10.0.0.5)");
  }
  return out;
}

#if MIH_TCPSTORE_LISTEN_FD
// A listening socket on `address`:`port` (0: any free port), close-on-exec; returns the fd
// and sets `port` to the bound port.
// Throws: mih::Error{kUnavailable} naming the address and errno.
int listen_on(const sockaddr_storage& address, const std::string& text, uint16_t& port) {
  sockaddr_storage a = address;
  socklen_t len = a.ss_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
  if (a.ss_family == AF_INET) {
    reinterpret_cast<sockaddr_in&>(a).sin_port = htons(port);
  } else {
    reinterpret_cast<sockaddr_in6&>(a).sin6_port = htons(port);
  }
  const int fd = ::socket(a.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  auto fail = [&](const char* what) {
    const int err = errno;
    if (fd >= 0) ::close(fd);
    MIH_THROW(Code::kUnavailable, "cannot host the TCPStore on ", text, ":", port, ": ", what, ": ",
              std::strerror(err), "; is the port in use, or the address not this host's?");
  };
  if (fd < 0) fail("socket");
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&a), len) != 0) fail("bind");
  if (::listen(fd, SOMAXCONN) != 0) fail("listen");
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) fail("getsockname");
  port = ntohs(a.ss_family == AF_INET ? reinterpret_cast<sockaddr_in&>(a).sin_port
                                      : reinterpret_cast<sockaddr_in6&>(a).sin6_port);
  return fd;
}
#endif

}  // namespace

using internal::short_what;
using internal::StoreImpl;

void Store::set(const std::string& key, const std::string& value) {
  impl_->store->set(key, std::vector<uint8_t>(value.begin(), value.end()));
}

std::string Store::get(const std::string& key) {
  std::vector<uint8_t> bytes;
  try {
    bytes = impl_->store->get(key);
  } catch (const std::exception& e) {
    MIH_THROW(Code::kDeadlineExceeded, "store ", impl_->description, ": key '", key,
              "' did not appear within ", impl_->store->getTimeout().count(), " ms (",
              short_what(e), ")");
  }
  return std::string(bytes.begin(), bytes.end());
}

int64_t Store::add(const std::string& key, int64_t delta) {
  try {
    return impl_->store->add(key, delta);
  } catch (const std::exception& e) {
    MIH_THROW(Code::kUnavailable, "store ", impl_->description, ": add('", key, "') failed: ",
              short_what(e));
  }
}

bool Store::check(const std::vector<std::string>& keys) {
  try {
    return impl_->store->check(keys);
  } catch (const std::exception& e) {
    MIH_THROW(Code::kUnavailable, "store ", impl_->description, ": check failed: ", short_what(e));
  }
}

void Store::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  try {
    impl_->store->wait(keys, timeout);
    return;
  } catch (const std::exception& e) {
    std::vector<std::string> missing;
    for (const auto& k : keys) {
      if (!check({k})) missing.push_back(k);
    }
    std::ostringstream list;
    for (size_t i = 0; i < missing.size(); ++i) list << (i ? ", " : "") << "'" << missing[i] << "'";
    MIH_THROW(Code::kDeadlineExceeded, "store ", impl_->description, ": timed out after ",
              timeout.count(), " ms waiting for key(s) [", list.str(), "] (", short_what(e), ")");
  }
}

Store Store::prefixed(const std::string& prefix) const {
  auto impl = std::make_shared<StoreImpl>();
  impl->store = c10::make_intrusive<c10d::PrefixStore>(prefix, impl_->store);
  impl->description = impl_->description + "/" + prefix;
  impl->port = impl_->port;
  return Store(std::move(impl));
}

const std::string& Store::description() const { return impl_->description; }

uint16_t Store::port() const { return impl_->port; }

Store make_file_store(const std::string& path, int world_size, std::chrono::milliseconds timeout) {
  auto impl = std::make_shared<StoreImpl>();
  try {
    impl->store = c10::make_intrusive<c10d::FileStore>(path, world_size);
  } catch (const std::exception& e) {
    MIH_THROW(Code::kFailedPrecondition, "cannot open the FileStore '", path, "': ", short_what(e),
              "; the run directory must be writable");
  }
  impl->store->setTimeout(timeout);
  impl->description = "file:" + path;
  return Store(std::move(impl));
}

Store make_tcp_store(const TcpStoreOptions& options) {
  c10d::TCPStoreOptions o;
  o.port = options.port;
  o.isServer = options.is_server;
  if (options.world_size > 0) o.numWorkers = static_cast<size_t>(options.world_size);
  o.waitWorkers = false;  // a hosting launcher must return before its workers exist
  o.timeout = options.timeout;
  auto impl = std::make_shared<StoreImpl>();
  std::string address = mih::internal::str("tcp://", options.host, ":", options.port);
  const bool bound = options.is_server && !options.bind_address.empty();
  BindTarget target;
  if (bound) target.address = numeric_address(options.bind_address);
#if MIH_TCPSTORE_LISTEN_FD
  if (bound) {
    o.masterListenFd = listen_on(target.address, options.bind_address, o.port);
    o.useLibUV = false;  // the backend that introduced masterListenFd
  }
#endif
  try {
#if !MIH_TCPSTORE_LISTEN_FD
    struct Scope {  // the bind() rewrite, for this constructor only
      explicit Scope(BindTarget* t) { t_bind_target = t; }
      ~Scope() { t_bind_target = nullptr; }
    } scope(bound ? &target : nullptr);
#endif
    auto tcp = c10::make_intrusive<c10d::TCPStore>(options.host, o);
    impl->port = tcp->getPort();
    impl->store = tcp;
  } catch (const std::exception& e) {
    MIH_THROW(Code::kUnavailable, options.is_server ? "cannot host" : "cannot reach",
              " the TCPStore at ", address, " within ", options.timeout.count(), " ms: ",
              short_what(e),
              !options.is_server ? "; check MASTER_ADDR/MASTER_PORT and that the store host is up"
              : bound ? mih::internal::str(" (mih binds ", options.bind_address, " in c10d's place of the wildcard",
                                           " address above); is the port in use, and is ", options.bind_address,
                                           " an address of this host?")
                      : std::string("; is the port in use?"));
  }
  MIH_INTERNAL_ASSERT(!bound || MIH_TCPSTORE_LISTEN_FD || target.rewritten > 0,
                      "the TCPStore server did not bind through bind(), so it could not be kept to ",
                      options.bind_address, "; it may listen on every interface");
  impl->store->setTimeout(options.timeout);
  impl->description = mih::internal::str("tcp://", options.host, ":", impl->port);
  return Store(std::move(impl));
}

Store make_hash_store(std::chrono::milliseconds timeout) {
  auto impl = std::make_shared<StoreImpl>();
  impl->store = c10::make_intrusive<c10d::HashStore>();
  impl->store->setTimeout(timeout);
  impl->description = "hash";
  return Store(std::move(impl));
}

}  // namespace mih::compat
