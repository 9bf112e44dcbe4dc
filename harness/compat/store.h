// Rendezvous key-value stores (c10d FileStore, TCPStore, HashStore, PrefixStore) behind one
// handle type, so no code outside harness/compat names a c10d type. Same calls on libtorch
// 1.13 and 2.x; see docs/libtorch-compat.md section 1.3.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace mih::compat {

namespace internal {
struct StoreImpl;
}

/// A shared handle to a c10d store. Copies refer to the same store. Thread-safe as the
/// underlying c10d store is (all of FileStore, TCPStore and HashStore are).
class Store {
 public:
  /// Sets `key` to `value` (bytes, not necessarily UTF-8).
  void set(const std::string& key, const std::string& value);
  /// Returns the value of `key`, waiting for it up to the store timeout.
  /// Throws: mih::Error{kDeadlineExceeded} naming the key if it does not appear in time.
  std::string get(const std::string& key);
  /// Atomically adds `delta` to the integer at `key` (0 if absent); returns the new value.
  int64_t add(const std::string& key, int64_t delta);
  /// Returns true iff every key exists now (does not wait).
  bool check(const std::vector<std::string>& keys);
  /// Waits until every key exists.
  /// Throws: mih::Error{kDeadlineExceeded} listing the keys still missing after `timeout`.
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);
  /// Returns a view of this store whose keys are prefixed with `prefix` + "/".
  Store prefixed(const std::string& prefix) const;
  /// Returns how the store was reached: "file:<path>", "tcp://<host>:<port>", "hash".
  const std::string& description() const;
  /// Returns the TCP port of a TCPStore (the bound port when created with port 0), else 0.
  uint16_t port() const;

  /// For harness/compat only: the c10d store behind the handle.
  const std::shared_ptr<internal::StoreImpl>& impl() const { return impl_; }
  explicit Store(std::shared_ptr<internal::StoreImpl> impl) : impl_(std::move(impl)) {}

 private:
  std::shared_ptr<internal::StoreImpl> impl_;
};

/// Opens (or creates) a FileStore at `path` shared by `world_size` processes. The file must
/// not be left over from an earlier run (a stale file makes the rendezvous hang), so local
/// launches create it in a fresh run directory.
/// Throws: mih::Error{kFailedPrecondition} if the file cannot be opened.
Store make_file_store(const std::string& path, int world_size,
                      std::chrono::milliseconds timeout);

/// Options of make_tcp_store. Only the fields common to libtorch 1.13 and 2.x.
struct TcpStoreOptions {
  std::string host = "127.0.0.1";
  /// 0 with is_server: let the OS pick a free port (read it back with Store::port()).
  uint16_t port = 29500;
  bool is_server = false;
  /// Number of clients the server waits for; 0 = do not wait.
  int world_size = 0;
  /// Timeout of connecting and of every blocking call.
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
  /// With is_server: the numeric IPv4 or IPv6 address the server listens on ("127.0.0.1":
  /// loopback only); empty: every interface (c10d's default, what a multi-host store whose
  /// address is a host name needs). `host` should then be this address.
  std::string bind_address;
};

/// Connects to (or, with is_server, hosts) a TCPStore.
/// Throws: mih::Error{kUnavailable} if the server cannot be bound or reached in time, with
/// the address in the message; mih::Error{kInvalidSpec} if bind_address is not a numeric
/// address; mih::Error{kInternal} if the server could not be kept to bind_address.
Store make_tcp_store(const TcpStoreOptions& options);

/// Returns an in-process store, for ranks that are threads of one process (unit tests).
Store make_hash_store(std::chrono::milliseconds timeout);

}  // namespace mih::compat
