// The c10d stores behind store.h: FileStore, TCPStore, HashStore and PrefixStore views, with
// their failures as mih::Errors naming the store and the key.
#include <chrono>
#include <cstdint>
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

namespace mih::compat {

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
  try {
    auto tcp = c10::make_intrusive<c10d::TCPStore>(options.host, o);
    impl->port = tcp->getPort();
    impl->store = tcp;
  } catch (const std::exception& e) {
    MIH_THROW(Code::kUnavailable, options.is_server ? "cannot host" : "cannot reach",
              " the TCPStore at ", address, " within ", options.timeout.count(), " ms: ",
              short_what(e),
              options.is_server ? "; is the port in use?"
                                : "; check MASTER_ADDR/MASTER_PORT and that the store host is up");
  }
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
